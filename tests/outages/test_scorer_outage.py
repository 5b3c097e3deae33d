"""The shared scorer goes away, or turns slow, while traffic flows through ``semhealth run``
scoring relevance through it (``backend: scorer``): forwarding is untouched, the scoring that
could not happen is counted, and scores flow again once the scorer is back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from semhealth.embeddings import Batching, LocalBackend, MicroBatcher
from semhealth.embeddings.backend import Backend, Vectors
from semhealth.embeddings.scorer_service import ScorerServer, serve_scorer
from tests.outages.conftest import Upstream
from tests.outages.harness import eventually, flowing, sidecar
from tests.outages.test_neighbours import BASE
from tests.servers import free_port


class Pausable:
    """The real model, which a test can make as slow as a scorer that has fallen behind."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.running = asyncio.Event()
        self.running.set()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        await self.running.wait()
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        return None


@asynccontextmanager
async def scorer_on(port: int, backend: Backend) -> AsyncIterator[ScorerServer]:
    batcher = MicroBatcher(backend, Batching())
    await batcher.start()
    server = await serve_scorer({"default": batcher}, port=port)
    try:
        await server.wait_ready()
        yield server
    finally:
        backend_running = getattr(backend, "running", None)
        if backend_running is not None:
            backend_running.set()  # let held batches finish, so the server can stop
        await server.shutdown(1.0)
        await batcher.shutdown(1.0)


def _config(upstream_url: str, port: int) -> str:
    return (
        BASE.format(upstream=upstream_url)
        + f"""\
relevance:
  enabled: true
  route_cjk_to: null
  encoders:
    - {{name: default, backend: scorer, remote: {{url: "127.0.0.1:{port}", timeout_s: 1}}}}
"""
    )


async def _more(value: Awaitable[float], than: float) -> bool:
    return await value > than


@pytest.mark.parametrize("failure", ["down", "slow"])
async def test_a_scorer_outage_costs_scores_never_answers_and_scoring_resumes(
    tmp_path: Path, upstream: Upstream, minilm: LocalBackend, failure: str
) -> None:
    port = free_port()
    backend = Pausable(minilm)
    scorer = scorer_on(port, backend)
    await scorer.__aenter__()
    try:
        async with sidecar(tmp_path, _config(upstream.url, port), relevance=True) as agent:
            async with flowing(agent.proxy_url, vary=True) as traffic:

                async def lost() -> float:
                    dropped = await agent.total("semhealth_dropped_total", stage="relevance")
                    return dropped + await agent.total("semhealth_relevance_errors_total")

                scored = "semhealth_relevance_scored_total"
                await eventually(lambda: _more(agent.total(scored), 0), timeout_s=30)
                if failure == "down":
                    await scorer.__aexit__(None, None, None)
                else:
                    backend.running.clear()
                await eventually(lambda: _more(lost(), 0), timeout_s=30)
                await eventually(traffic.answered(10))
                before = await agent.total(scored)
                if failure == "down":
                    scorer = scorer_on(port, backend)
                    await scorer.__aenter__()
                else:
                    backend.running.set()
                await eventually(lambda: _more(agent.total(scored), before), timeout_s=30)
                assert traffic.wrong == []
    finally:
        await scorer.__aexit__(None, None, None)
