"""Admin endpoints: liveness, readiness, metrics, alerts and the shadow summary, on their
own listener.

They live apart from the proxy so that a scrape or a probe never shares a
port, a path space or a queue with the application's traffic.

Two apps serve them: ``build_admin_app`` (the agent's own, in one process and in the
analysis process) and ``build_front_app`` (the admin port of ``semhealth run``, in the
forwarding process: health answered there, ``/metrics``, ``/alerts`` and ``/shadow``
fetched from the analysis process). Both are locked down the same way by an ``AdminGate``:
the web configuration (``semhealth.agent.admin.webconfig``) gives TLS, response headers, a
rate limit and basic auth. ``/healthz`` and ``/readyz`` stay open for kubelet probes (over
TLS when TLS is on); everything else needs credentials when users are configured.
``/alerts`` can be off; ``/shadow`` answers 404 when no ``shadow:`` block shadows.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

# Not semhealth.agent.telemetry.pipeline's: that module brings the OpenTelemetry SDK, numpy and grpc
# into the forwarding process, which imports this one for its admin front.
from prometheus_client.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE

from semhealth.agent.admin.answer import Answer
from semhealth.agent.admin.webconfig import (
    Authenticator,
    TokenBucket,
    WebConfig,
    WebConfigSource,
    sans_allowed,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter


OPEN_PATHS = frozenset({"/healthz", "/readyz"})
AUTH_FAILURES = "semhealth_admin_auth_failures"  # exporters add _total
AUTH_FAILURES_HELP = (
    "Admin requests refused for missing or wrong credentials, or a client certificate "
    "outside client_allowed_sans."
)
_ALERTS_OFF = b'{"enabled": false, "reason": "the /alerts endpoint is turned off"}\n'
_ALERTING_OFF = b'{"enabled": false, "reason": "alerts.enabled is false"}\n'
_SHADOW_OFF = b'{"enabled": false, "reason": "no shadow: block in the configuration"}\n'
_ANALYSIS_TIMEOUT_S = 30.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminAccess:
    """Who may read the admin endpoints, and which are served."""

    web_config_file: str | None = None  # exporter-toolkit web.yml; None: open, plain HTTP
    alerts_endpoint: bool = True  # False: /alerts answers 404


class AdminGate:
    """The web configuration, applied to every admin request."""

    def __init__(self, access: AdminAccess) -> None:
        self.access = access
        # Loaded now: a bad file stops start-up, before anything listens.
        self.source = WebConfigSource(access.web_config_file) if access.web_config_file else None
        self._auth = Authenticator()
        self._bucket = TokenBucket()

    @property
    def failures(self) -> int:
        return self._auth.stats.failures

    @property
    def scheme(self) -> str:
        return "https" if self.source is not None and self.source.tls_at_start else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        return self.source.listening_context() if self.source is not None else None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.source is None:
            return await handler(request)
        config = self.source.current()
        refused = await self._refuse(request, config)
        if refused is not None:
            return _with_headers(refused, config)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(config.headers)
            raise
        return _with_headers(response, config)

    async def _refuse(self, request: web.Request, config: WebConfig) -> web.Response | None:
        tls = config.tls
        if tls is not None and tls.client_allowed_sans is not None:
            peercert = request.transport.get_extra_info("peercert") if request.transport else None
            if not sans_allowed(tls.client_allowed_sans, peercert):
                self._auth.stats.failures += 1
                return web.Response(status=403, text="client certificate not allowed\n")
        if request.path in OPEN_PATHS:
            return None
        if not self._bucket.allow(config.rate_limit):
            self._auth.stats.rate_limited += 1
            return web.Response(status=429, text="Too Many Requests\n")
        if not config.users:
            return None
        if await self._auth.check(config.users, request.headers.get("Authorization")):
            return None
        self._auth.stats.failures += 1
        return web.Response(
            status=401, text="Unauthorized\n", headers={"WWW-Authenticate": "Basic"}
        )

    def close(self) -> None:
        self._auth.close()


def _with_headers(response: web.StreamResponse, config: WebConfig) -> web.StreamResponse:
    response.headers.update(config.headers)
    return response


def observe_auth_failures(meter: Meter, failures: Callable[[], int]) -> None:
    """``semhealth_admin_auth_failures_total`` among the agent's metrics (``failures``:
    ``AdminGate.failures``, read at collection)."""
    # Here, not at the top: only the analysis process registers metrics.
    from opentelemetry.metrics import Observation

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(failures())]

    meter.create_observable_counter(AUTH_FAILURES, [callback], description=AUTH_FAILURES_HELP)


def auth_failures_text(gate: AdminGate) -> bytes:
    """The same counter in Prometheus' text format, for the front to add to what it relays."""
    name = AUTH_FAILURES + "_total"
    return (
        f"# HELP {name} {AUTH_FAILURES_HELP}\n# TYPE {name} counter\n{name} {gate.failures}.0\n"
    ).encode()


def build_admin_app(
    *,
    ready: Callable[[], bool],
    render_metrics: Callable[[], bytes],
    render_alerts: Callable[[], bytes] | None = None,
    render_shadow: Callable[[], bytes] | None = None,
    gate: AdminGate | None = None,
) -> web.Application:
    alerts_endpoint = gate is None or gate.access.alerts_endpoint

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def metrics(_request: web.Request) -> web.Response:
        # Collecting every series takes milliseconds; the proxy shares this loop.
        response = web.Response(body=await asyncio.to_thread(render_metrics))
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def alerts(_request: web.Request) -> web.Response:
        if not alerts_endpoint:
            return web.Response(status=404, body=_ALERTS_OFF, content_type="application/json")
        if render_alerts is None:
            return web.Response(status=404, body=_ALERTING_OFF, content_type="application/json")
        # Many groups make a large document; render it off the loop, like /metrics.
        body = await asyncio.to_thread(render_alerts)
        return web.Response(body=body, content_type="application/json")

    async def shadow(_request: web.Request) -> web.Response:
        if render_shadow is None:
            return web.Response(status=404, body=_SHADOW_OFF, content_type="application/json")
        # Bootstrap intervals over the window's pairs: off the loop, like /metrics.
        body = await asyncio.to_thread(render_shadow)
        return web.Response(body=body, content_type="application/json")

    app = web.Application(middlewares=[gate.middleware] if gate is not None else [])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/alerts", alerts)
    app.router.add_get("/shadow", shadow)
    return app


# --------------------------------------------------------------------------- the front


def _answer(answer: Answer) -> web.Response:
    headers = {"Cache-Control": "no-store"}
    if answer.error is not None:
        headers["X-Semhealth-Error"] = answer.error
    return web.Response(
        status=answer.status, body=answer.body, content_type=answer.content_type, headers=headers
    )


def build_front_app(
    *,
    health: Callable[[], Answer],
    readiness: Callable[[], Answer],
    analysis_down: Callable[[], Answer | None],
    analysis_socket: str,
    gate: AdminGate,
) -> web.Application:
    """The admin port of ``semhealth run``: health from the forwarding process itself (a
    restarting analysis process never makes the pod unready), ``/metrics``, ``/alerts`` and
    ``/shadow`` from the analysis process over its Unix socket. ``analysis_down`` answers for
    it while it is not serving."""
    session: dict[str, aiohttp.ClientSession] = {}

    async def healthz(_request: web.Request) -> web.Response:
        return _answer(health())

    async def readyz(_request: web.Request) -> web.Response:
        return _answer(readiness())

    async def relayed(request: web.Request) -> web.Response:
        if request.path == "/alerts" and not gate.access.alerts_endpoint:
            return web.Response(status=404, body=_ALERTS_OFF, content_type="application/json")
        down = analysis_down()
        if down is not None:
            return _answer(down)
        try:
            status, body, content_type = await _fetch(session["client"], request.path_qs)
        except (aiohttp.ClientError, TimeoutError):
            down = analysis_down()
            return _answer(down) if down is not None else _unreachable()
        if request.path == "/metrics" and status == 200:
            body += auth_failures_text(gate)
        response = web.Response(status=status, body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def open_session(_app: web.Application) -> None:
        session["client"] = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=analysis_socket),
            timeout=aiohttp.ClientTimeout(total=_ANALYSIS_TIMEOUT_S),
            auto_decompress=False,
        )

    async def close_session(_app: web.Application) -> None:
        client = session.pop("client", None)
        if client is not None:
            await client.close()
        gate.close()

    app = web.Application(middlewares=[gate.middleware])
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", relayed)
    app.router.add_get("/alerts", relayed)
    app.router.add_get("/shadow", relayed)
    return app


def _unreachable() -> web.Response:
    body = (
        b'{"error": {"type": "analysis_restarting", "message": "the analysis process did not '
        b'answer; forwarding goes on", "source": "semhealth"}}'
    )
    return web.Response(
        status=503,
        body=body,
        content_type="application/json",
        headers={"X-Semhealth-Error": "analysis_restarting", "Cache-Control": "no-store"},
    )


async def _fetch(client: aiohttp.ClientSession, path_qs: str) -> tuple[int, bytes, str]:
    async with client.get("http://semhealth-analysis" + path_qs) as response:
        body = await response.read()
        content_type = response.headers.get("Content-Type", "application/octet-stream")
        return response.status, body, content_type


async def start_site(
    runner: web.BaseRunner, host: str, port: int, gate: AdminGate | None
) -> tuple[str, int]:
    """Listen on ``host:port`` (TLS when the web configuration says so); the bound address."""
    context = gate.ssl_context() if gate is not None else None
    await web.TCPSite(runner, host, port, reuse_address=True, ssl_context=context).start()
    bound: Any = runner.addresses[-1]  # the bound port matters when 0 was asked for
    return bound[0], bound[1]
