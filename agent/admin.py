"""Admin endpoints: liveness, readiness, metrics and alerts, on their own listener.

They live apart from the proxy so that a scrape or a probe never shares a
port, a path space or a queue with the application's traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from semhealth.agent.telemetry import CONTENT_TYPE


def build_admin_app(
    *,
    ready: Callable[[], bool],
    render_metrics: Callable[[], bytes],
    render_alerts: Callable[[], bytes] | None = None,
) -> web.Application:
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
        if render_alerts is None:
            body = b'{"enabled": false, "reason": "alerts.enabled is false"}\n'
            return web.Response(status=404, body=body, content_type="application/json")
        # Many groups make a large document; render it off the loop, like /metrics.
        body = await asyncio.to_thread(render_alerts)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/alerts", alerts)
    return app
