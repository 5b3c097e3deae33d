"""The aiohttp server: answers each request by its script, on the timing schedule.

Steps go out at absolute times after the response head (see the package docstring);
``die_after`` hangs up mid-body instead of ending it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from semhealth.agent.demo.simulator._openai import openai_error
from semhealth.agent.demo.simulator._plan import Step, default_error_type, make_plan
from semhealth.agent.demo.simulator._script import (
    RawScript,
    Script,
    ScriptFor,
    ScriptRequest,
    timing_offsets,
)
from semhealth.agent.demo.simulator._wires import Wire, wire_for

logger = logging.getLogger(__name__)


class SimulatedUpstream:
    """The scripted upstream server. ``script_for`` decides each response from its request.

    ``received`` lists every request in arrival order. A ``script_for`` that raises is
    answered with a 500 and kept in ``failures`` so a test can see it.
    """

    def __init__(
        self,
        script_for: ScriptFor,
        *,
        shutdown_timeout_s: float = 1.0,
    ) -> None:
        self._script_for = script_for
        self._shutdown_timeout_s = shutdown_timeout_s
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._serials = itertools.count(1)
        self._open = 0
        self.received: list[ScriptRequest] = []
        self.failures: list[BaseException] = []

    @property
    def open_responses(self) -> int:
        """Requests being answered right now (a stream still being written counts)."""
        return self._open

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server, without a trailing slash."""
        if self._url is None:
            raise RuntimeError("SimulatedUpstream is not started")
        return self._url

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if self._runner is not None:
            raise RuntimeError("SimulatedUpstream is already started")
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that hangs up ends its scripted stream at once.
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=self._shutdown_timeout_s,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self._runner, self._url = runner, f"http://{shown}:{bound_port}"

    async def shutdown(self) -> None:
        runner, self._runner, self._url = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    def _next_serial(self) -> str:
        return f"sim{next(self._serials):06d}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self._open += 1
        try:
            return await self._answer(request)
        finally:
            self._open -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        script_request = ScriptRequest(
            path=request.path,
            method=request.method,
            headers=request.headers,
            json=_parse_json(body),
            body=body,
            query=request.query_string,
        )
        self.received.append(script_request)
        try:
            script = self._script_for(script_request)
        except Exception as exc:
            logger.exception("simulator script_for raised %s", type(exc).__name__)
            self.failures.append(exc)
            return web.json_response(openai_error(500, "simulator_error"), status=500)
        if isinstance(script, RawScript):
            return await _serve_raw(request, script)
        wire = wire_for(request.path)
        if wire is None:
            return web.json_response(openai_error(404, "not_found_error"), status=404)
        serial = self._next_serial()
        if not 200 <= script.status < 300:
            return await _serve_error(request, wire, script, serial)
        plan = make_plan(script, script_request, serial)
        if wire.wants_stream(script_request):
            headers = _headers(wire, script, serial, wire.stream_content_type(script_request))
            steps = wire.stream(plan)
            return await _serve_steps(request, script.status, headers, steps, script.die_after)
        headers = _headers(wire, script, serial, "application/json")
        body = orjson.dumps(wire.body(plan))
        return await _serve_body(request, script, headers, body, plan.end_s)


def _parse_json(body: bytes) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _headers(wire: Wire, script: Script, serial: str, content_type: str) -> dict[str, str]:
    headers = {"Content-Type": content_type, "Cache-Control": "no-cache"}
    if wire.request_id_header:
        headers[wire.request_id_header] = f"req_{serial}"
    headers.update(script.headers)
    return headers


async def _sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    delay = deadline - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


def _hang_up(request: web.Request) -> None:
    """Close the TCP connection under the response: no terminating chunk, no end markers."""
    if request.transport is not None:
        request.transport.close()


async def _serve_steps(
    request: web.Request,
    status: int,
    headers: Mapping[str, str],
    steps: list[Step],
    die_after: int | None,
) -> web.StreamResponse:
    """Write each step at its time; with ``die_after``, hang up instead of ending the body."""
    response = web.StreamResponse(status=status, headers=headers)
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        for step in steps[: cut_index(steps, die_after)]:
            await _sleep_until(loop, t0 + step.at_s)
            await response.write(step.data)
    except ConnectionError:
        return response  # the client went away; nothing left to tell it
    if die_after is not None:
        _hang_up(request)
    return response


async def _serve_body(
    request: web.Request, script: Script, headers: Mapping[str, str], body: bytes, at_s: float
) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    await _sleep_until(loop, loop.time() + at_s)
    response = web.StreamResponse(status=script.status, headers=headers)
    response.content_length = len(body)
    await response.prepare(request)
    try:
        if script.die_after is None:
            await response.write(body)
        else:
            await response.write(body[: len(body) // 2])
            _hang_up(request)
    except ConnectionError:
        pass  # the client went away
    return response


async def _serve_error(
    request: web.Request, wire: Wire, script: Script, serial: str
) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    await _sleep_until(loop, loop.time() + script.ttft_s)
    etype = script.error or default_error_type(script.status)
    headers = _headers(wire, script, serial, "application/json")
    return web.Response(
        body=orjson.dumps(wire.error(script.status, etype)), status=script.status, headers=headers
    )


async def _serve_raw(request: web.Request, script: RawScript) -> web.StreamResponse:
    offsets = timing_offsets(script.ttft_s, script.gaps_s, len(script.chunks))
    steps = [Step(at, chunk, "delta") for at, chunk in zip(offsets, script.chunks, strict=True)]
    headers = {"Content-Type": script.content_type, **script.headers}
    has_length = any(name.lower() == "content-length" for name in headers)
    if len(script.chunks) == 1 and script.die_after is None and not has_length:
        # A body the server has whole goes out with its length, as real servers send it.
        headers["Content-Length"] = str(len(script.chunks[0]))
    return await _serve_steps(request, script.status, headers, steps, script.die_after)


def cut_index(steps: list[Step], die_after: int | None) -> int:
    """How many steps go out before the connection is closed (all of them if it is not)."""
    if die_after is None:
        return len(steps)
    seen = 0
    for i, step in enumerate(steps):
        if step.kind == "close":
            return i
        if step.kind == "delta":
            if seen == die_after:
                return i
            seen += 1
            if seen == die_after:
                return i + 1
    return len(steps)
