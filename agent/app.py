"""The agent process: builds every component, hands each its downstream, and
runs them under one lifecycle.

Start is downstream-first (telemetry, tap, upstream session, admin, then the
proxy listener that lets traffic in); shutdown is upstream-first and shares
one deadline, reporting every failure together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from semhealth.agent.admin import build_admin_app
from semhealth.agent.config import Address, Config
from semhealth.agent.contracts import load_contracts
from semhealth.agent.proxy import Proxy, UpstreamSettings
from semhealth.agent.recorder import RecorderSettings
from semhealth.agent.tap import ConsumeRecord, Tap, TapStats
from semhealth.agent.telemetry import OTLPSettings, Telemetry
from semhealth.agent.telemetry import Settings as TelemetrySettings
from semhealth.collectors.record import StreamRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What code (not the YAML) hands the agent."""

    consumers: Sequence[ConsumeRecord] = ()
    telemetry: TelemetrySettings | None = None  # None: from the configuration
    shutdown_timeout_s: float = 10.0


def telemetry_settings(config: Config) -> TelemetrySettings:
    """The telemetry pipeline as configured; reads route contract files (start-up only)."""
    telemetry = config.telemetry
    otlp = telemetry.otlp
    return TelemetrySettings(
        service_name=telemetry.service_name,
        resource_attributes=telemetry.resource_attributes,
        otlp=None
        if otlp.endpoint is None
        else OTLPSettings(
            endpoint=otlp.endpoint,
            protocol=otlp.protocol,
            headers=otlp.headers,
            interval_s=otlp.interval_s,
            timeout_s=otlp.timeout_s,
            insecure=otlp.insecure,
        ),
        recorder=RecorderSettings(
            stall_threshold_s=config.collectors.analysis.stall_threshold_s,
            validity_window_s=telemetry.validity_window_s,
            max_label_values=telemetry.max_label_values,
            contracts=load_contracts(config.collectors.routes),
        ),
    )


def upstream_settings(config: Config) -> UpstreamSettings:
    upstream = config.upstream
    if upstream.url is None:
        raise ValueError(
            "upstream.url is not set: load_config() reports that before an Agent is built"
        )
    return UpstreamSettings(
        url=upstream.url,
        verify=upstream.tls.verify,
        ca_file=upstream.tls.ca_file,
        client_cert=upstream.tls.client_cert,
        client_key=upstream.tls.client_key,
        connect_timeout_s=upstream.timeouts.connect_s,
        read_timeout_s=upstream.timeouts.read_s,
        total_timeout_s=upstream.timeouts.total_s,
        max_request_bytes=config.collectors.limits.max_request_bytes,
    )


class Agent:
    """The sidecar: proxy listener, admin listener, tap and telemetry."""

    def __init__(self, config: Config, settings: Settings | None = None) -> None:
        self._config = config
        self._settings = settings or Settings()
        stats = TapStats()
        proxy: Proxy | None = None
        self.telemetry = Telemetry(
            self._settings.telemetry or telemetry_settings(config),
            tap_stats=stats,
            active_streams=lambda: proxy.active_streams if proxy is not None else 0,
        )
        self._consumers = (self.telemetry.recorder.consume_record, *self._settings.consumers)
        self.tap = Tap(
            config.collectors,
            self._consume_record,
            stats=stats,
            observe_analysis=self.telemetry.observe_analysis,
        )
        self.proxy = proxy = Proxy(upstream_settings(config), self.tap)
        self._proxy_runner: web.BaseRunner | None = None
        self._admin_runner: web.BaseRunner | None = None
        self._ready = False
        self.proxy_address: tuple[str, int] | None = None
        self.admin_address: tuple[str, int] | None = None

    def _consume_record(self, record: StreamRecord) -> None:
        for consume in self._consumers:
            consume(record)

    @property
    def proxy_url(self) -> str:
        assert self.proxy_address is not None, "agent not started"
        return _url(self.proxy_address)

    @property
    def admin_url(self) -> str:
        assert self.admin_address is not None, "agent not started"
        return _url(self.admin_address)

    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        try:
            await self.tap.start()
            await self.proxy.start()
            admin = build_admin_app(
                ready=self.ready, render_metrics=self.telemetry.render_prometheus
            )
            self._admin_runner = web.AppRunner(
                admin, access_log=None, handle_signals=False, shutdown_timeout=1.0
            )
            self.admin_address = await _listen(self._admin_runner, self._config.listen.admin)
            server = web.Server(self.proxy.handle, handler_cancellation=True, access_log=None)
            # In-flight exchanges get most of the shutdown deadline to finish.
            self._proxy_runner = web.ServerRunner(
                server,
                handle_signals=False,
                shutdown_timeout=self._settings.shutdown_timeout_s * 0.6,
            )
            self.proxy_address = await _listen(self._proxy_runner, self._config.listen.proxy)
        except BaseException:
            await self.shutdown()
            raise
        self._ready = True
        log.info(
            "semhealth listening: proxy %s -> upstream %s, admin %s",
            self.proxy_url,
            self._config.upstream.url,
            self.admin_url,
        )

    async def shutdown(self) -> None:
        """Stop intake, let open exchanges finish within the deadline, flush analysis."""
        self._ready = False
        deadline = time.monotonic() + self._settings.shutdown_timeout_s
        errors: list[Exception] = []

        async def step(name: str, coro: Coroutine[Any, Any, None]) -> None:
            remaining = max(deadline - time.monotonic(), 0.1)
            try:
                await asyncio.wait_for(coro, remaining)
            except Exception as exc:
                log.error("shutdown of %s failed: %r", name, exc)
                errors.append(exc)

        proxy_runner, self._proxy_runner = self._proxy_runner, None
        if proxy_runner is not None:
            await step("proxy listener", proxy_runner.cleanup())
        await step("upstream session", self.proxy.shutdown())
        await step("tap", self.tap.shutdown(max(deadline - time.monotonic(), 0.1)))
        admin_runner, self._admin_runner = self._admin_runner, None
        if admin_runner is not None:
            await step("admin listener", admin_runner.cleanup())
        # The final OTLP export blocks; keep it off the loop and inside the deadline.
        remaining = max(deadline - time.monotonic(), 0.1)
        await step("telemetry", asyncio.to_thread(self.telemetry.shutdown, remaining))
        if errors:
            raise ExceptionGroup("semhealth shutdown had failures", errors)


async def _listen(runner: web.BaseRunner, address: Address) -> tuple[str, int]:
    await runner.setup()
    host, port = address.host, address.port
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    server = site._server  # the bound port matters when 0 was asked for
    assert server is not None
    sockets = getattr(server, "sockets", None) or ()
    bound = sockets[0].getsockname() if sockets else (host, port)
    return bound[0], bound[1]


def _url(address: tuple[str, int]) -> str:
    host, port = address
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
