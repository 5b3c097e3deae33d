"""The admin port of ``semhealth run``, served by the forwarding process (worker 0).

``/healthz`` and ``/readyz`` are answered here, by the forwarding process itself, so a
restarting analysis process never makes the pod unready; ``/metrics``, ``/alerts`` and
``/shadow`` are fetched from the analysis process's admin server over its Unix socket (and
``analysis_down`` answers for it while it is not serving). Every request passes the
``AdminGate`` first, as on the agent's own admin app.

HTTP/1.1 is h11's (sans-IO, pure Python) on asyncio streams, not aiohttp's: the front serves
five GET paths, and aiohttp alone is about 9 MiB of the forwarding process's 60 MiB budget.
What aiohttp's server gave besides is kept: keep-alive, ``HEAD``, 404 and 405, a bound on the
request head (431) and body (413), 400 for what does not parse, and connections that go
quiet (75 s between requests, 10 s within one) closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11

from semhealth.agent.admin.answer import Answer
from semhealth.agent.admin.gate import ALERTS_OFF, AdminGate, auth_failures_text

KEEPALIVE_S = 75.0  # between requests on one connection (aiohttp's keep-alive default)
REQUEST_S = 10.0  # from a request's first byte to its end, and for a TLS handshake
ANALYSIS_TIMEOUT_S = 30.0  # a fetch from the analysis process; also a client's slow read
MAX_HEAD = 16 * 1024  # request line and headers
MAX_BODY = 16 * 1024  # the front's requests are GETs: a body is read and dropped up to this
_READ = 64 * 1024
_ANALYSIS_HOST = "semhealth-analysis"

_OWN = frozenset({"/healthz", "/readyz"})
_RELAYED = frozenset({"/metrics", "/alerts", "/shadow"})
_METHODS = frozenset({b"GET", b"HEAD"})
_NOT_FOUND = Answer(404, b"not found\n")
_NOT_ALLOWED = Answer(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
_ALERTS_OFF = Answer(404, ALERTS_OFF, "application/json")
_UNREACHABLE = Answer(
    503,
    b'{"error": {"type": "analysis_restarting", "message": "the analysis process did not '
    b'answer; forwarding goes on", "source": "semhealth"}}',
    "application/json",
    "analysis_restarting",
)


@dataclass(frozen=True, slots=True)
class _Request:
    method: bytes
    target: bytes
    authorization: str | None


class _Malformed(Exception):
    """A request this server will not read further: answered with ``status`` and closed."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Front:
    """The admin port of ``semhealth run``: ``start`` listens, ``close`` stops and closes
    the connections still open."""

    def __init__(
        self,
        *,
        health: Callable[[], Answer],
        readiness: Callable[[], Answer],
        analysis_down: Callable[[], Answer | None],
        analysis_socket: str,
        gate: AdminGate,
    ) -> None:
        self._health = health
        self._readiness = readiness
        self._analysis_down = analysis_down
        self._analysis_socket = analysis_socket
        self._gate = gate
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task[Any]] = set()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host:port`` (TLS when the web configuration says so); the bound
        address, which matters when port 0 was asked for."""
        context = self._gate.ssl_context()
        tls: dict[str, Any] = {}
        if context is not None:
            tls = {"ssl": context, "ssl_handshake_timeout": REQUEST_S}
        self._server = await asyncio.start_server(
            self._serve, host, port, reuse_address=True, **tls
        )
        bound = self._server.sockets[-1].getsockname()
        return bound[0], bound[1]

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        serving = list(self._serving)
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        self._gate.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        try:
            await self._requests(conn, reader, writer)
        except _Malformed as exc:
            await _refuse(conn, writer, exc.status)
        except (OSError, TimeoutError, h11.LocalProtocolError):
            pass  # the client went away or stalled: nothing to answer
        except asyncio.CancelledError:
            # close() ends the connection. Not raised on: the streams' callback logs a
            # cancelled connection task as an error, and close() awaits nothing from it.
            pass
        finally:
            if task is not None:
                self._serving.discard(task)
            writer.close()

    async def _requests(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peercert = writer.get_extra_info("peercert")
        while True:
            request = await _read_request(conn, reader)
            if request is None:
                return
            answer, headers = await self._answer(request, peercert)
            await _send(conn, writer, request.method, answer, headers)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # either side said Connection: close
            conn.start_next_cycle()

    async def _answer(
        self, request: _Request, peercert: Mapping[str, Any] | None
    ) -> tuple[Answer, Mapping[str, str]]:
        path_bytes = request.target.partition(b"?")[0]
        path = path_bytes.decode("ascii", "replace")  # h11 admits only visible ASCII there
        verdict = await self._gate.admit(path, peercert, request.authorization)
        if verdict.refusal is not None:
            return verdict.refusal, verdict.headers
        if path not in _OWN and path not in _RELAYED:
            return _NOT_FOUND, verdict.headers
        if request.method not in _METHODS:
            return _NOT_ALLOWED, verdict.headers
        if path == "/healthz":
            return self._health(), verdict.headers
        if path == "/readyz":
            return self._readiness(), verdict.headers
        return await self._relayed(path, request.target), verdict.headers

    async def _relayed(self, path: str, target: bytes) -> Answer:
        if path == "/alerts" and not self._gate.access.alerts_endpoint:
            return _ALERTS_OFF
        down = self._analysis_down()
        if down is not None:
            return down
        try:
            async with asyncio.timeout(ANALYSIS_TIMEOUT_S):
                answer = await fetch(self._analysis_socket, target)
        except (OSError, TimeoutError, h11.ProtocolError):
            down = self._analysis_down()
            return down if down is not None else _UNREACHABLE
        if path == "/metrics" and answer.status == 200:
            return Answer(200, answer.body + auth_failures_text(self._gate), answer.content_type)
        return answer


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> _Request | None:
    """The next request on ``conn``, its body read and dropped; None when the client closed
    the connection or left it idle ``KEEPALIVE_S``."""
    loop = asyncio.get_running_loop()
    deadline: float | None = None  # set by the request's first byte
    request: h11.Request | None = None
    body = 0
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise _Malformed(exc.error_status_hint) from exc
        if event is h11.NEED_DATA:
            if deadline is None:
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        data = await reader.read(_READ)
                except TimeoutError:
                    return None
                deadline = loop.time() + REQUEST_S
            else:
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await reader.read(_READ)
                except TimeoutError:
                    raise _Malformed(408) from None
            conn.receive_data(data)  # b"": the client closed its side
        elif isinstance(event, h11.Request):
            # h11 bounds a head still arriving; one that came whole is bounded here.
            if _head_size(event) > MAX_HEAD:
                raise _Malformed(431)
            request = event
            deadline = deadline if deadline is not None else loop.time() + REQUEST_S
        elif isinstance(event, h11.Data):
            body += len(event.data)
            if body > MAX_BODY:
                raise _Malformed(413)
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None  # h11 sends a Request before its end
            authorization = _header(request.headers, b"authorization")
            return _Request(request.method, request.target, authorization)
        else:  # ConnectionClosed: the client closed its side
            return None


def _head_size(request: h11.Request) -> int:
    """The request head's size, give or take its line ends and spaces."""
    size = len(request.method) + len(request.target)
    return size + sum(len(name) + len(value) + 4 for name, value in request.headers)


def _header(headers: Any, lower: bytes) -> str | None:
    for name, value in headers:
        if name == lower:
            return bytes(value).decode("latin-1")
    return None


async def _send(
    conn: h11.Connection,
    writer: asyncio.StreamWriter,
    method: bytes,
    answer: Answer,
    extra: Mapping[str, str],
) -> None:
    headers = [
        ("Content-Type", answer.content_type),
        ("Content-Length", str(len(answer.body))),
        ("Cache-Control", "no-store"),
    ]
    if answer.error is not None:
        headers.append(("X-Semhealth-Error", answer.error))
    headers += answer.headers
    headers += extra.items()
    response = h11.Response(
        status_code=answer.status, headers=headers, reason=_reason(answer.status)
    )
    data = conn.send(response)
    if method != b"HEAD":  # h11 knows a HEAD answer has no body, whatever its length says
        data += conn.send(h11.Data(data=answer.body))
    data += conn.send(h11.EndOfMessage())
    writer.write(data)
    async with asyncio.timeout(ANALYSIS_TIMEOUT_S):
        await writer.drain()


async def _refuse(conn: h11.Connection, writer: asyncio.StreamWriter, status: int) -> None:
    """Answer a request that will not be read further, when a response can still start."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = f"{status} {_reason(status)}\n".encode()
    headers = [
        ("Content-Type", "text/plain"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    with contextlib.suppress(h11.LocalProtocolError, OSError, TimeoutError):
        data = conn.send(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
        data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        writer.write(data)
        async with asyncio.timeout(REQUEST_S):
            await writer.drain()


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # a status of analysis' own that the standard does not name
        return ""


async def fetch(socket_path: str, target: bytes) -> Answer:
    """``GET target`` from the analysis process's admin server on ``socket_path``: its
    status, content type and body, on a connection of its own (scrapes are seconds apart)."""
    reader, writer = await asyncio.open_unix_connection(socket_path)
    try:
        conn = h11.Connection(h11.CLIENT)
        request = h11.Request(
            method="GET", target=target, headers=[("Host", _ANALYSIS_HOST), ("Connection", "close")]
        )
        writer.write(conn.send(request) + conn.send(h11.EndOfMessage()))
        response: h11.Response | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(_READ))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the analysis process closed before it answered")
        assert response is not None  # h11 gives the response head before its end
        content_type = _header(response.headers, b"content-type") or "application/octet-stream"
        return Answer(response.status_code, bytes(body), content_type)
    finally:
        writer.close()
