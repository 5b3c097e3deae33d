"""The agent's own admin app: liveness, readiness, metrics, alerts and the shadow summary, on
their own listener, in one process (``semhealth run --in-process``, a receiver alone) and in
the analysis process (behind the front of ``semhealth run``, ``semhealth.agent.admin.front``).

They live apart from the proxy so that a scrape or a probe never shares a
port, a path space or a queue with the application's traffic. Every request passes the
``AdminGate`` (``semhealth.agent.admin.gate``) first. ``/alerts`` can be off; ``/shadow``
answers 404 when no ``shadow:`` block shadows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware

# Not semhealth.agent.telemetry.pipeline's: that module brings the OpenTelemetry SDK, numpy
# and grpc with it.
from prometheus_client.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE

from semhealth.agent.admin.gate import ALERTS_OFF, AUTH_FAILURES, AUTH_FAILURES_HELP, AdminGate

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter


_ALERTING_OFF = b'{"enabled": false, "reason": "alerts.enabled is false"}\n'
_SHADOW_OFF = b'{"enabled": false, "reason": "no shadow: block in the configuration"}\n'

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _gated(gate: AdminGate) -> Middleware:
    """The gate as aiohttp middleware: its refusal instead of the handler's answer, and the
    configured headers on every response."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if gate.source is None:
            return await handler(request)
        peercert = request.transport.get_extra_info("peercert") if request.transport else None
        verdict = await gate.admit(request.path, peercert, request.headers.get("Authorization"))
        refusal = verdict.refusal
        if refusal is not None:
            response: web.StreamResponse = web.Response(
                status=refusal.status,
                body=refusal.body,
                content_type=refusal.content_type,
                headers=dict(refusal.headers),
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                exc.headers.update(verdict.headers)
                raise
        response.headers.update(verdict.headers)
        return response

    return middleware


def observe_auth_failures(meter: Meter, failures: Callable[[], int]) -> None:
    """``semhealth_admin_auth_failures_total`` among the agent's metrics (``failures``:
    ``AdminGate.failures``, read at collection)."""
    # Here, not at the top: only the analysis process registers metrics.
    from opentelemetry.metrics import Observation

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(failures())]

    meter.create_observable_counter(AUTH_FAILURES, [callback], description=AUTH_FAILURES_HELP)


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
            return web.Response(status=404, body=ALERTS_OFF, content_type="application/json")
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

    app = web.Application(middlewares=[_gated(gate)] if gate is not None else [])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/alerts", alerts)
    app.router.add_get("/shadow", shadow)
    return app


async def start_site(
    runner: web.BaseRunner, host: str, port: int, gate: AdminGate | None
) -> tuple[str, int]:
    """Listen on ``host:port`` (TLS when the web configuration says so); the bound address."""
    context = gate.ssl_context() if gate is not None else None
    await web.TCPSite(runner, host, port, reuse_address=True, ssl_context=context).start()
    bound: Any = runner.addresses[-1]  # the bound port matters when 0 was asked for
    return bound[0], bound[1]
