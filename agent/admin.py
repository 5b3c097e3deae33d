"""Admin endpoints: liveness, readiness and metrics, on their own listener.

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

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
