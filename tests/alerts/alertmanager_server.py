"""Test support: a real Alertmanager (Debian's ``prometheus-alertmanager``) on loopback, the
webhook receiver it pages, and scripted stand-ins that misbehave on purpose.

``AlertmanagerServer`` writes a config that routes every alert to its own group
(``group_by: ['...']``) and pages at once (``group_wait: 0s``, ``group_interval: 1s``),
starts Alertmanager with clustering off and its storage in a temporary folder, and waits for
``/-/ready``. ``stop()`` and ``start()`` again reuse the same port, so a notifier pointed at it
sees the outage and the return. ``WebhookReceiver`` is an aiohttp server on loopback that
collects the webhook payloads and waits for one that matches a predicate.
``ScriptedAlertmanager`` answers ``POST .../api/v2/alerts`` with a scripted status per
request, or hangs, and records what it was sent.

A missing binary skips the test with the reason, unless ``REQUIRE_REAL_SERVERS=1`` (CI sets
it), where it fails: CI must never pass by skipping what it was meant to run.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from tests.servers import free_port
from tests.servers import require_binary as _require

BINARY = "prometheus-alertmanager"
GROUP_INTERVAL_S = 1.0

_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 5.0
_POLL_S = 0.05
_START_ATTEMPTS = 3  # a free port can be taken between our probe and Alertmanager's bind

Payload = dict[str, Any]


def require_binary(name: str = BINARY) -> str:
    """The path of Alertmanager; see ``tests.servers``."""
    return _require(name, "prometheus-alertmanager")


def dead_url() -> str:
    """A loopback URL nothing listens on: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}"


def _config(webhook_url: str) -> str:
    return (
        "route:\n"
        "  receiver: webhook\n"
        "  group_by: ['...']\n"  # every alert its own group: one page per alert
        "  group_wait: 0s\n"
        f"  group_interval: {GROUP_INTERVAL_S:g}s\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: webhook\n"
        "    webhook_configs:\n"
        f"      - url: '{webhook_url}'\n"
        "        send_resolved: true\n"
    )


class AlertmanagerError(AssertionError):
    """Alertmanager did not start, or answered with an error."""


class AlertmanagerServer:
    """One ``prometheus-alertmanager`` process paging ``webhook_url``; the same port across
    ``stop()`` and ``start()``."""

    def __init__(self, webhook_url: str, workdir: Path) -> None:
        self._binary = require_binary()
        self._webhook_url = webhook_url
        self._workdir = workdir
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = workdir / "alertmanager.log"
        self._port: int | None = None

    @property
    def url(self) -> str:
        if self._port is None:
            raise AlertmanagerError("Alertmanager was never started")
        return f"http://127.0.0.1:{self._port}"

    async def start(self) -> None:
        """Start on a free port the first time, on the same port afterwards."""
        config = self._workdir / "alertmanager.yml"
        config.write_text(_config(self._webhook_url))
        fixed = self._port is not None
        for _ in range(1 if fixed else _START_ATTEMPTS):
            port = self._port if self._port is not None else free_port()
            self._spawn(config, port)
            self._port = port
            if await self._wait_ready():
                return
            await self.stop()
            if not fixed:
                self._port = None
        raise AlertmanagerError(f"alertmanager did not become ready:\n{self.log_tail()}")

    def _spawn(self, config: Path, port: int) -> None:
        args = [
            self._binary,
            f"--config.file={config}",
            f"--storage.path={self._workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip: a lone instance, no port of its own
            "--log.level=warn",
        ]
        with self._log_path.open("ab") as log:
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    async def _wait_ready(self) -> bool:
        """True once ``/-/ready`` answers 200; False if the process exits or time runs out."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < deadline:
                if self._process is None or self._process.poll() is not None:
                    return False
                try:
                    async with session.get(f"{self.url}/-/ready") as response:
                        if response.status == 200:
                            return True
                except (aiohttp.ClientError, TimeoutError):
                    pass  # not listening yet
                await asyncio.sleep(_POLL_S)
        return False

    async def stop(self) -> None:
        """Terminate, then kill after a grace period. Safe to call twice."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, _STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait, _STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 30) -> str:
        if not self._log_path.exists():
            return "(no log)"
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    async def alerts(self) -> list[Payload]:
        """The alerts Alertmanager holds (``GET /api/v2/alerts``), with their stored times."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
            async with session.get(f"{self.url}/api/v2/alerts") as response:
                if response.status != 200:
                    raise AlertmanagerError(f"GET /api/v2/alerts answered {response.status}")
                return list(orjson.loads(await response.read()))

    async def wait_for_alert(self, name: str, timeout_s: float = 10.0) -> Payload:
        """The alert named ``name`` once Alertmanager holds it."""
        deadline = time.monotonic() + timeout_s
        while True:
            held = await self.alerts()
            for alert in held:
                if alert["labels"].get("alertname") == name:
                    return alert
            if time.monotonic() > deadline:
                raise AlertmanagerError(f"after {timeout_s:g} s no alert {name!r}; it holds {held}")
            await asyncio.sleep(_POLL_S)


class _LoopbackServer:
    """An aiohttp application on a free loopback port."""

    def __init__(self, app: web.Application) -> None:
        # Handlers that hang are released on stop(); the short timeout bounds the rest.
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        self.url = ""

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        await self._runner.cleanup()


class WebhookReceiver(_LoopbackServer):
    """Collects Alertmanager's webhook payloads, POSTed to ``hook_url``."""

    def __init__(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        super().__init__(app)
        self.payloads: list[Payload] = []
        self._arrived = asyncio.Condition()

    @property
    def hook_url(self) -> str:
        return f"{self.url}/hook"

    async def _hook(self, request: web.Request) -> web.Response:
        payload = orjson.loads(await request.read())
        async with self._arrived:
            self.payloads.append(payload)
            self._arrived.notify_all()
        return web.Response()

    async def wait_for(
        self, predicate: Callable[[Payload], bool], timeout_s: float = 10.0
    ) -> Payload:
        """The first payload, received so far or later, for which ``predicate`` holds."""

        def found() -> Payload | None:
            return next((p for p in self.payloads if predicate(p)), None)

        try:
            async with asyncio.timeout(timeout_s):
                async with self._arrived:
                    await self._arrived.wait_for(lambda: found() is not None)
        except TimeoutError:
            raise AlertmanagerError(
                f"after {timeout_s:g} s no matching webhook among {self.payloads}"
            ) from None
        match = found()
        assert match is not None
        return match


def page(name: str, status: str = "firing") -> Callable[[Payload], bool]:
    """A ``wait_for`` predicate: a webhook with ``status`` carrying alert ``name``."""

    def predicate(payload: Payload) -> bool:
        return payload.get("status") == status and any(
            alert["labels"].get("alertname") == name for alert in payload.get("alerts", [])
        )

    return predicate


def alert_in(payload: Payload, name: str) -> Payload:
    """The alert named ``name`` in a webhook payload."""
    return next(a for a in payload["alerts"] if a["labels"].get("alertname") == name)


@dataclass(frozen=True)
class Received:
    """One POST a scripted Alertmanager received."""

    path: str
    headers: Mapping[str, str]
    alerts: list[Payload]


HANG = -1  # a scripted answer: accept the request and never answer it


class ScriptedAlertmanager(_LoopbackServer):
    """Answers ``POST <prefix>/api/v2/alerts`` with ``script(n)`` for the n-th request
    (1-based): an HTTP status, or ``HANG``. Records every request in ``received``.

    With ``forward_to`` (a real Alertmanager's URL), a request scripted 200 is passed on
    as it came and answered with what Alertmanager answered (kept in ``answers``): so the
    wire form is judged by Alertmanager's own API validation, not by this stand-in.
    """

    def __init__(
        self, script: Callable[[int], int], prefix: str = "", forward_to: str | None = None
    ) -> None:
        app = web.Application()
        app.router.add_post(f"{prefix}/api/v2/alerts", self._alerts)
        super().__init__(app)
        self.prefix = prefix
        self.received: list[Received] = []
        self._script = script
        self._forward_to = forward_to
        self.answers: list[tuple[int, str]] = []  # Alertmanager's (status, body) per forward
        self._release = asyncio.Event()
        self._arrived = asyncio.Condition()

    @property
    def base_url(self) -> str:
        return f"{self.url}{self.prefix}"

    @property
    def alerts(self) -> list[Payload]:
        return [alert for request in self.received for alert in request.alerts]

    async def _alerts(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = orjson.loads(raw)
        status = self._script(len(self.received) + 1)
        if status == 200 and self._forward_to is not None:
            status, text = await self._forward(raw, request.headers.get("Content-Type", ""))
        else:
            text = f"scripted answer {status}"
        async with self._arrived:
            self.received.append(Received(request.path, dict(request.headers), body))
            self._arrived.notify_all()
        if status == HANG:
            await self._release.wait()
            return web.Response(status=503)
        return web.Response(status=status, text=text)

    async def _forward(self, raw: bytes, content_type: str) -> tuple[int, str]:
        assert self._forward_to is not None
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(
                f"{self._forward_to}/api/v2/alerts",
                data=raw,
                headers={"Content-Type": content_type},
            ) as response:
                answer = (response.status, await response.text())
        self.answers.append(answer)
        return answer

    async def wait_for_requests(self, count: int, timeout_s: float = 5.0) -> list[Received]:
        async with asyncio.timeout(timeout_s):
            async with self._arrived:
                await self._arrived.wait_for(lambda: len(self.received) >= count)
        return self.received

    async def stop(self) -> None:
        self._release.set()
        await super().stop()


class ScriptedFactory(Protocol):
    """The ``scripted`` fixture: builds and starts a ``ScriptedAlertmanager``."""

    def __call__(
        self, script: Callable[[int], int], prefix: str = ""
    ) -> Awaitable[ScriptedAlertmanager]: ...


def always(status: int) -> Callable[[int], int]:
    return lambda _: status


def failing_first(failures: int, status: int, then: int = 200) -> Callable[[int], int]:
    """Answer ``status`` to the first ``failures`` requests, ``then`` afterwards."""
    return lambda n: status if n <= failures else then
