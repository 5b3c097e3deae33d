"""A loopback embedding server behind a bearer token, as TEI with ``--api-key`` or a hosted API.

``keyed_server`` is ``loopback.EmbeddingServer`` (the real model behind ``/embed``, ``/info``
and ``/v1/embeddings``) with one gate in front: a request without ``Authorization: Bearer
<key>`` gets 401, with a body that echoes what it was sent, as careless servers do; the
client must never pass that body on. ``Gate`` records what it let through and refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware

from semhealth.embeddings.local import LocalBackend
from tests.embeddings.loopback import EmbeddingServer, Script

# Looks like a real key on purpose: a test that finds it in a log or a message means a leak.
KEY = "sk-semhealth-test-7f3a9c2e51d04b68"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Gate:
    key: str
    passed: list[str] = field(default_factory=list)  # "METHOD /path" of each request let in
    refused: list[str] = field(default_factory=list)  # the same, for each 401


def _guard(gate: Gate) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        what = f"{request.method} {request.path}"
        sent = request.headers.get("Authorization", "")
        if sent != f"Bearer {gate.key}":
            gate.refused.append(what)
            return web.json_response({"error": f"bad Authorization {sent!r}"}, status=401)
        gate.passed.append(what)
        return await handler(request)

    return guard


@asynccontextmanager
async def keyed_server(
    model: LocalBackend, gate: Gate, script: Script | None = None
) -> AsyncIterator[EmbeddingServer]:
    server = EmbeddingServer(model, script or Script(info={"max_client_batch_size": 32}))
    # The app is not frozen until the server starts, so the gate can still go in front.
    server.server.app.middlewares.append(_guard(gate))
    await server.server.start_server()
    try:
        yield server
    finally:
        await server.server.close()
