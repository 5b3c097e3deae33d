"""``semhealth run``: the forwarding process, and the supervisor of everything else.

It relays (``Relay``), sends copies down the tap wire (``WireTap``) and serves the admin
front (``semhealth.agent.admin.front.Front``, worker 0 only): ``/healthz`` and ``/readyz``
itself, ``/metrics``, ``/alerts`` and ``/shadow`` fetched from the analysis process's admin
app over a Unix socket, all behind the web configuration (TLS, basic auth). It starts the
analysis process and, with ``workers`` above one, more forwarding processes on the same
port (``SO_REUSEPORT``), and restarts any that dies, with backoff. Forwarding never
depends on them: a dead analysis process costs analysis (shed, counted), never a client
byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from semhealth.agent.admin.answer import Answer
from semhealth.agent.dataplane.relay import (
    ListenSettings,
    Relay,
    RelayStats,
    UpstreamSettings,
    error_body,
)
from semhealth.agent.dataplane.wiretap import WireTap
from semhealth.agent.errors import CONFIG_EXIT, ConfigRefused
from semhealth.common.cpus import available_cpus
from semhealth.common.heap import process_trim

if TYPE_CHECKING:
    from semhealth.agent.admin.front import Front
    from semhealth.agent.admin.gate import AdminGate

log = logging.getLogger(__name__)

_BACKOFF_S = (0.5, 30.0)  # first and longest wait before a restart
_STABLE_S = 60.0  # a child that ran this long restarts with the first wait again


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwarderSettings:
    upstream: UpstreamSettings
    listen: ListenSettings
    proxy_host: str
    proxy_port: int
    admin_host: str
    admin_port: int
    tap_budget_bytes: int
    workers: int = 1
    shutdown_timeout_s: float = 10.0
    analysis_grace_s: float = 60.0  # start-up wait for the analysis process
    web_config_file: str | None = None  # exporter-toolkit web.yml for the admin port
    alerts_endpoint: bool = True  # False: the admin port answers /alerts with 404
    child_args: tuple[str, ...] = ()  # RunArgs.argv(): what the children start with


def resolve_workers(value: str | int | None) -> int:
    """``auto``: one forwarding process per CPU this process may use (its affinity mask,
    capped by the cgroup quota: a pod limited to 2 CPUs on a 64-core node gets 2)."""
    if value in (None, "", 1, "1"):
        return 1
    if value == "auto":
        return available_cpus()
    workers = int(value)
    if workers < 1:
        raise ValueError(f"workers must be auto or a positive integer, not {value!r}")
    return workers


class Child:
    """A supervised child process, restarted with backoff until stopped.

    One that refuses the configuration at its first start (exit ``CONFIG_EXIT``: it said
    why on stderr) is not restarted, since it would refuse it again: ``refused`` is set.
    After a first start that ran, any exit is restarted, that one too: a file gone bad
    while the agent runs must not stop forwarding.
    """

    def __init__(self, name: str, argv: Sequence[str]) -> None:
        self.name = name
        self._argv = list(argv)
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.refused = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        delay = _BACKOFF_S[0]
        while not self._stopping:
            began = time.monotonic()
            try:
                self.process = await asyncio.create_subprocess_exec(*self._argv)
            except OSError as exc:
                log.error("could not start the %s: %s", self.name, exc)
            else:
                code = await self.process.wait()
                if self._stopping:
                    return
                if code == CONFIG_EXIT and self.restarts == 0:
                    log.error("the %s refused the configuration: not restarted", self.name)
                    self.refused.set()
                    return
                log.warning("the %s exited (code %s); restarting in %.1f s", self.name, code, delay)
            self.restarts += 1
            if time.monotonic() - began > _STABLE_S:
                delay = _BACKOFF_S[0]
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_S[1])

    def signal(self, sig: int) -> None:
        if self.up:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    async def stop(self, timeout_s: float) -> None:
        """SIGTERM, then SIGKILL past the deadline."""
        self._stopping = True
        process = self.process
        if process is not None and process.returncode is None:
            self.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), max(timeout_s, 0.1))
            except TimeoutError:
                log.error("the %s did not stop within its deadline: killed", self.name)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class Forwarder:
    """One forwarding process. Worker 0 also runs the admin front and the children."""

    def __init__(
        self, settings: ForwarderSettings, *, worker: int = 0, runtime_dir: str | None = None
    ) -> None:
        self._settings = settings
        self._worker = worker
        self._own_dir = runtime_dir is None
        self._dir = runtime_dir or tempfile.mkdtemp(prefix="semhealth-")
        self.tap_socket = os.path.join(self._dir, "tap.sock")
        self.admin_socket = os.path.join(self._dir, "admin.sock")
        self.wire = WireTap(
            self.tap_socket,
            budget_bytes=settings.tap_budget_bytes,
            worker=worker,
            relay_stats=self._relay_stats,
        )
        # A burst's buffers, freed, stay resident in malloc's heap unless given back: after
        # 200 streams without gaps, 1.8-2.3 MiB of the 4.3-5.1 the process had grown by.
        self.relay = Relay(
            settings.upstream,
            self.wire,
            listen=settings.listen,
            stats=RelayStats(on_change=self.wire.poke),
            on_quiet=process_trim(),
        )
        self.analysis: Child | None = None
        self.workers: list[Child] = []
        self.front: Front | None = None
        self.gate: AdminGate | None = None
        self._ready = False
        self.proxy_address: tuple[str, int] | None = None
        self.admin_address: tuple[str, int] | None = None

    def _relay_stats(self) -> tuple[int, dict[str, int], dict[str, int]]:
        stats = self.relay.stats
        if self.analysis is not None:
            self.wire.stats.analysis_restarts = self.analysis.restarts
        return self.relay.active, stats.rejected, stats.errors

    @property
    def primary(self) -> bool:
        return self._worker == 0

    def _child_argv(self, module: str, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            module,
            "--tap-socket",
            self.tap_socket,
            "--supervisor",
            str(os.getpid()),
            *extra,
            *self._settings.child_args,
        ]

    async def start(self) -> None:
        settings = self._settings
        reuse_port = settings.workers > 1
        if self.primary:
            self.analysis = Child(
                "analysis process",
                self._child_argv("semhealth.agent.analysis", "--admin-socket", self.admin_socket),
            )
            self.analysis.start()
        await self.wire.start()
        if self.primary:
            # Readiness waits for analysis to load (models: seconds), as the one-process
            # agent did, but not forever: past the grace, forwarding starts without it and
            # the streams until it connects are shed and counted.
            if not await self._analysis_connected(settings.analysis_grace_s):
                log.warning(
                    "the analysis process is not up after %.0f s: forwarding without it",
                    settings.analysis_grace_s,
                )
            self.admin_address = await self._start_front()
        self.proxy_address = await self.relay.start(
            settings.proxy_host, settings.proxy_port, reuse_port=reuse_port
        )
        if self.primary:
            for index in range(1, settings.workers):
                child = Child(
                    f"forwarding worker {index}",
                    self._child_argv("semhealth.agent.dataplane", "--worker", str(index)),
                )
                child.start()
                self.workers.append(child)
        # What start-up built lives as long as the process: out of the collector's sight, the
        # collections that run between chunks have that much less to walk.
        gc.freeze()
        self._ready = True
        log.info(
            "semhealth forwarding on %s:%d -> upstream %s (worker %d of %d)",
            *self.proxy_address,
            settings.upstream.url,
            self._worker,
            settings.workers,
        )

    async def _analysis_connected(self, grace_s: float) -> bool:
        """Whether the analysis process connected within ``grace_s``; raises ``ConfigRefused``
        when it refused the configuration instead (it reads files this process does not)."""
        analysis = self.analysis
        assert analysis is not None
        connected = asyncio.ensure_future(self.wire.wait_connected(grace_s))
        refused = asyncio.ensure_future(analysis.refused.wait())
        try:
            await asyncio.wait({connected, refused}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (connected, refused):
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
        if analysis.refused.is_set():
            raise ConfigRefused(f"the {analysis.name} refused the configuration (see above)")
        return self.wire.connected

    async def _start_front(self) -> tuple[str, int]:
        # Imported by worker 0 only: the other forwarders never load the web configuration's
        # libraries (bcrypt, h11).
        from semhealth.agent.admin.front import Front
        from semhealth.agent.admin.gate import AdminAccess, AdminGate

        settings = self._settings
        self.gate = gate = AdminGate(
            AdminAccess(
                web_config_file=settings.web_config_file,
                alerts_endpoint=settings.alerts_endpoint,
            )
        )
        self.front = Front(
            health=self._health,
            readiness=self._readiness,
            analysis_down=self._analysis_down,
            analysis_socket=self.admin_socket,
            gate=gate,
        )
        return await self.front.start(settings.admin_host, settings.admin_port)

    def _health(self) -> Answer:
        return Answer(200, b"ok\n")

    def _readiness(self) -> Answer:
        """Health answers here, so a restarting analysis process never makes a forwarding
        pod unready."""
        analysis = self.analysis
        state = {
            "forwarding": "ready" if self._ready else "stopping",
            "analysis": self._analysis_state(),
            "tap_wire": "connected" if self.wire.connected else "disconnected",
            "analysis_restarts": analysis.restarts if analysis is not None else 0,
            "workers": self._settings.workers,
        }
        status = 200 if self._ready else 503
        return Answer(status, orjson.dumps(state) + b"\n", "application/json")

    def _analysis_down(self) -> Answer | None:
        if self.wire.connected:
            return None
        # The wire is up exactly while the analysis process serves (it listens last).
        kind = "analysis_restarting"
        body = error_body(kind, "the analysis process is restarting; forwarding goes on")
        return Answer(503, body, "application/json", kind)

    def _analysis_state(self) -> str:
        if self.wire.connected:
            return "up"
        analysis = self.analysis
        if analysis is not None and analysis.restarts == 0:
            return "starting"
        return "restarting"

    def reload(self) -> None:
        """SIGHUP: the analysis process reloads its alert rules."""
        if self.analysis is not None:
            self.analysis.signal(signal.SIGHUP)

    async def shutdown(self) -> None:
        """Readiness off, drain the exchanges in flight, then stop the children in order."""
        self._ready = False
        deadline = time.monotonic() + self._settings.shutdown_timeout_s

        def left() -> float:
            return max(deadline - time.monotonic(), 0.1)

        await self.relay.shutdown(self._settings.shutdown_timeout_s * 0.6)
        for child in self.workers:
            await child.stop(left() / 2)
        await self.wire.shutdown(min(left() / 4, 2.0))
        if self.analysis is not None:
            await self.analysis.stop(left() - 0.2)
        front, self.front = self.front, None
        if front is not None:
            await front.close()
        if self._own_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
