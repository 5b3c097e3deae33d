"""Taking neighbours away while traffic flows: the sidecar as users run it (``semhealth run``,
forwarding and analysis in their own processes), a client that checks every answer, a
collector whose failure mode a test switches, and the agent's own counters.

Each outage test follows one shape: traffic flows; a neighbour goes away (or turns slow, or
refuses); traffic keeps flowing and every answer is still right; what was lost is counted;
the neighbour comes back; signals and pages flow again.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import free_port

PIECES = ("The ", "answer ", "is ", "forty-two.")
EXPECTED = "".join(PIECES)


def env(relevance: bool = False) -> dict[str, str]:
    """A clean environment: no stray SEMHEALTH_*/OTEL_* setting changes what is tested.
    Relevance is off unless asked for: loading a model costs seconds."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SEMHEALTH_", "OTEL_"))}
    return keep if relevance else {**keep, "SEMHEALTH_RELEVANCE__ENABLED": "false"}


@dataclass
class Sidecar:
    process: asyncio.subprocess.Process
    proxy_url: str
    admin_url: str
    log: Path

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample of ``/metrics`` by (name, labels)."""
        async with aiohttp.ClientSession() as client:
            async with client.get(self.admin_url + "/metrics") as response:
                text = await response.text()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def total(self, name: str, **labels: str) -> float:
        """The sum of ``name`` over the series whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(
            value
            for (found, series), value in (await self.metrics()).items()
            if found == name and wanted <= series
        )


@contextlib.asynccontextmanager
async def sidecar(
    workdir: Path, config: str, *args: str, relevance: bool = False
) -> AsyncIterator[Sidecar]:
    """``semhealth run`` on ``config`` (YAML; ``@PROXY@`` and ``@ADMIN@`` are filled in),
    ready; stopped with SIGTERM at the end, which must exit 0."""
    proxy, admin = free_port(), free_port()
    path = workdir / "semhealth.yaml"
    path.write_text(
        config.replace("@PROXY@", f"127.0.0.1:{proxy}").replace("@ADMIN@", f"127.0.0.1:{admin}")
    )
    log = workdir / "semhealth.log"
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "semhealth.agent.cli", "run", "--config", str(path), *args,
            env=env(relevance), stderr=stderr,
        )  # fmt: skip
    running = Sidecar(process, f"http://127.0.0.1:{proxy}", f"http://127.0.0.1:{admin}", log)
    try:
        await eventually(lambda: _ready(running), timeout_s=30)
        yield running
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 20)
        assert code == 0, f"semhealth exited {code}: {log.read_text()[-2000:]}"
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _ready(sidecar: Sidecar) -> bool:
    if sidecar.process.returncode is not None:
        raise AssertionError(f"semhealth exited: {sidecar.log.read_text()[-2000:]}")
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(sidecar.admin_url + "/readyz") as response:
                return response.status == 200
    except aiohttp.ClientError:
        return False


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout_s: float = 15.0, every_s: float = 0.1
) -> Any:
    """``check()``'s first truthy answer; fails the test after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not (found := await check()):
        if loop.time() > end:
            raise AssertionError(f"not true after {timeout_s:g} s")
        await asyncio.sleep(every_s)
    return found


@dataclass
class Traffic:
    """Streamed chat requests through the proxy, one after another, until stopped. Every
    answer is checked: status 200, the scripted text in order, the end-of-stream marker."""

    url: str
    pause_s: float = 0.02
    # A new question each time: the sidecar caches embeddings, so repeated texts would be
    # scored without asking the encoder at all.
    vary: bool = False
    ok: int = 0
    wrong: list[str] = field(default_factory=list)  # what was wrong with each bad answer
    crashed: BaseException | None = None  # what stopped the loop, if anything did

    async def run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:
            # Any error of the client's own (an answer it cannot parse, a bug here) is a
            # wrong answer: the loop stops, so no later answer could be checked.
            self.crashed = exc
            self.wrong.append(f"the traffic loop crashed: {type(exc).__name__}: {exc}")
            raise

    async def _loop(self) -> None:
        async with aiohttp.ClientSession() as client:
            for sent in itertools.count():
                question = f"question {sent}?" if self.vary else "q?"
                body = {
                    "model": "m",
                    "stream": True,
                    "messages": [{"role": "user", "content": question}],
                }
                try:
                    async with client.post(self.url + "/v1/chat/completions", json=body) as r:
                        raw = await r.read()
                        status = r.status
                except aiohttp.ClientError as exc:
                    self.wrong.append(f"{type(exc).__name__}")
                else:
                    self._check(status, raw)
                await asyncio.sleep(self.pause_s)

    def _check(self, status: int, raw: bytes) -> None:
        if status != 200:
            self.wrong.append(f"status {status}")
            return
        text = ""
        for line in raw.split(b"\n"):
            if line.startswith(b"data: {"):
                for choice in orjson.loads(line[6:]).get("choices", []):
                    text += (choice.get("delta") or {}).get("content") or ""
        if text != EXPECTED or not raw.rstrip().endswith(b"data: [DONE]"):
            self.wrong.append("body differs from the upstream's")
            return
        self.ok += 1

    def answered(self, more: int) -> Callable[[], Awaitable[bool]]:
        """An ``eventually`` check: ``more`` good answers beyond those so far."""
        target = self.ok + more

        async def check() -> bool:
            if self.crashed is not None:
                raise AssertionError(self.wrong[-1]) from self.crashed
            return self.ok >= target

        return check


@contextlib.asynccontextmanager
async def flowing(url: str, *, vary: bool = False) -> AsyncIterator[Traffic]:
    traffic = Traffic(url, vary=vary)
    task = asyncio.create_task(traffic.run())
    try:
        await eventually(traffic.answered(3))
        yield traffic
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # Reached when the test's own block passed: a loop that died after its last look at
    # the traffic fails the test all the same.
    if traffic.crashed is not None:
        raise AssertionError(traffic.wrong[-1]) from traffic.crashed


class Collector:
    """An OTLP/HTTP metrics collector on a fixed loopback port, whose behaviour a test
    switches while the agent pushes to it: ``up`` (200), ``refusing`` (503), ``slow``
    (answers after ``slow_s``) or ``down`` (nothing listens)."""

    def __init__(self, slow_s: float = 5.0) -> None:
        self.port = free_port()
        self.mode = "down"
        self.slow_s = slow_s
        self.received: list[ExportMetricsServiceRequest] = []
        self.attempts = 0
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/metrics"

    async def set(self, mode: str) -> None:
        if mode == "down":
            await self._stop()
        elif self._runner is None:
            await self._start()
        self.mode = mode

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/metrics", self._export)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def _stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _export(self, request: web.Request) -> web.Response:
        self.attempts += 1
        body = await request.read()
        if self.mode == "refusing":
            return web.Response(status=503, text="collector refusing")
        if self.mode == "slow":
            await asyncio.sleep(self.slow_s)
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.received.append(ExportMetricsServiceRequest.FromString(body))
        return web.Response(
            body=ExportMetricsServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def latest_sum(self, name: str) -> float:
        """The latest cumulative value of counter ``name``, summed over its series."""
        for request in reversed(self.received):
            total, seen = 0.0, False
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name == name:
                            seen = True
                            total += sum(p.as_double or p.as_int for p in metric.sum.data_points)
            if seen:
                return total
        return 0.0

    async def close(self) -> None:
        await self._stop()
