"""Relevance scored by a remote encoder the YAML names: a real ``semhealth scorer`` on loopback.

The scorer serves the real all-MiniLM-L6-v2; the agent is configured only through its file
(``backend: scorer``), so it builds and connects the remote backend as it does in production.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import Config, load_config
from semhealth.agent.demo.simulator import SimulatedUpstream
from semhealth.agent.errors import RelevanceStartError
from semhealth.embeddings.backend import Backend
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.config import Batching
from semhealth.embeddings.remote_scorer import RemoteScorerBackend
from semhealth.embeddings.scorer_guard import ScorerGuard, ScorerTls
from semhealth.embeddings.scorer_service import ScorerServer, serve_scorer
from tests.agent.test_relevance_e2e import (
    RELEVANT,
    answer,
    chat,
    metrics,
    post,
    post_one_and_wait_scored,
    value,
    wait_for,
)
from tests.embeddings.certs import make_pki
from tests.embeddings.wrappers import Gated

SERVED = "default"


@asynccontextmanager
async def scorer_serving(backend: Backend) -> AsyncIterator[ScorerServer]:
    batcher = MicroBatcher(backend, Batching())
    await batcher.start()
    server = await serve_scorer({SERVED: batcher})
    try:
        await server.wait_ready()
        yield server
    finally:
        await server.shutdown(1.0)
        await batcher.shutdown(1.0)


def scorer_config(
    tmp_path: Path,
    url: str,
    *,
    enabled: str,
    upstream_url: str = "http://127.0.0.1:9",
    timeout_s: float = 2.0,
) -> Config:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            upstream:
              url: {upstream_url}
            relevance:
              enabled: {enabled}
              route_cjk_to: null
              encoders:
                - name: default
                  backend: scorer
                  remote:
                    url: "{url}"
                    timeout_s: {timeout_s}
            """
        )
    )
    return load_config(
        str(path), {}, {"listen.proxy": "127.0.0.1:0", "listen.admin": "127.0.0.1:0"}
    )


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_a_request_is_scored_through_the_configured_scorer(
    minilm: Backend, tmp_path: Path
) -> None:
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    try:
        async with scorer_serving(minilm) as server:
            url = f"127.0.0.1:{server.port}"
            config = scorer_config(tmp_path, url, enabled="true", upstream_url=upstream.url)
            agent = Agent(config, Settings())
            await agent.start()
            try:
                async with aiohttp.ClientSession() as session:
                    await post_one_and_wait_scored(session, agent)
                    samples = await metrics(session, agent)
                    count = "semantic_health_context_relevance_score_count"
                    assert value(samples, count, model="fits") == 1
                assert server.stats().texts > 0
            finally:
                await agent.shutdown()
    finally:
        await upstream.shutdown()


@asynccontextmanager
async def agent_on(config: Config) -> AsyncIterator[Agent]:
    agent = Agent(config, Settings())
    await agent.start()
    try:
        yield agent
    finally:
        await agent.shutdown()


async def fill_the_queue(server: ScorerServer, gated: Gated, batcher: MicroBatcher) -> list[Any]:
    """Four texts held in the model, four more filling a queue of four: no room left."""
    client = RemoteScorerBackend(f"127.0.0.1:{server.port}", SERVED, timeout_s=30.0)
    first = asyncio.create_task(client.embed([f"held {i}" for i in range(4)]))
    await gated.entered.wait()
    second = asyncio.create_task(client.embed([f"queued {i}" for i in range(4)]))
    async with asyncio.timeout(10.0):
        while batcher.stats().waiting < 4:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return [client, first, second]


@pytest.mark.parametrize("overload", ["queue_full", "deadline"])
async def test_a_scorer_that_sheds_or_misses_the_deadline_counts_as_dropped(
    minilm: Backend, tmp_path: Path, overload: str
) -> None:
    """RESOURCE_EXHAUSTED from a full scorer, or DEADLINE_EXCEEDED from a slow one, is shed
    work for the sidecar: semhealth_dropped_total{stage="relevance"}, not an error."""
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    gated = Gated(minilm)
    batcher = MicroBatcher(gated, Batching(queue_size=4, max_batch=4, flush_timeout_s=0.0))
    await batcher.start()
    server = await serve_scorer({SERVED: batcher})
    held: list[Any] = []
    try:
        if overload == "queue_full":
            held = await fill_the_queue(server, gated, batcher)
        url = f"127.0.0.1:{server.port}"
        config = scorer_config(
            tmp_path, url, enabled="true", upstream_url=upstream.url, timeout_s=1.5
        )
        async with agent_on(config) as agent, aiohttp.ClientSession() as session:
            query, context = RELEVANT[0]
            await post(session, agent.proxy_url, chat("fits", query, context))

            async def dropped() -> bool:
                samples = await metrics(session, agent)
                return value(samples, "semhealth_dropped_total", stage="relevance") == 1

            await wait_for(dropped)
            samples = await metrics(session, agent)
            assert value(samples, "semhealth_relevance_errors_total") == 0
            assert value(samples, "semhealth_relevance_scored_total") == 0
        stats = server.stats()
        if overload == "queue_full":
            assert stats.rejected == {"queue_full": 1}
        else:
            assert stats.expired == 1
    finally:
        gated.release()
        if held:
            client, *calls = held
            await asyncio.gather(*calls)
            await client.aclose()
        await server.shutdown(1.0)
        await batcher.shutdown(1.0)
        await upstream.shutdown()


async def test_a_request_is_scored_through_a_scorer_behind_mutual_tls_and_a_token(
    minilm: Backend, tmp_path: Path
) -> None:
    """remote.tls and api_key_env, as the YAML gives them, reach the sidecar's channel."""
    pki = make_pki(tmp_path)
    client = pki.client(tmp_path, "sidecar")
    tls = ScorerTls(cert_file=pki.server.cert, key_file=pki.server.key, client_ca_file=pki.ca)
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    batcher = MicroBatcher(minilm, Batching())
    await batcher.start()
    guard = ScorerGuard(token="sidecar-token-77")
    server = await serve_scorer({SERVED: batcher}, credentials=tls.credentials(), guard=guard)
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            upstream:
              url: {upstream.url}
            relevance:
              enabled: true
              route_cjk_to: null
              encoders:
                - name: default
                  backend: scorer
                  remote:
                    url: "localhost:{server.port}"
                    api_key_env: SCORER_TOKEN
                    tls:
                      ca_file: {pki.ca}
                      cert_file: {client.cert}
                      key_file: {client.key}
                      server_name: localhost
            """
        )
    )
    overrides = {"listen.proxy": "127.0.0.1:0", "listen.admin": "127.0.0.1:0"}
    config = load_config(str(path), {"SCORER_TOKEN": "sidecar-token-77"}, overrides)
    try:
        async with agent_on(config) as agent, aiohttp.ClientSession() as session:
            await post_one_and_wait_scored(session, agent)
        assert server.stats().texts > 0
        assert guard.refused["unauthenticated"] == 0
    finally:
        await server.shutdown(1.0)
        await batcher.shutdown(1.0)
        await upstream.shutdown()


async def test_a_scorer_that_does_not_answer_fails_the_start_when_enabled(
    tmp_path: Path,
) -> None:
    config = scorer_config(tmp_path, f"127.0.0.1:{closed_port()}", enabled="true")
    agent = Agent(config, Settings())
    with pytest.raises(
        RelevanceStartError, match=r"encoder 'default' .*did not answer at start-up"
    ):
        await agent.start()
    assert not agent.ready()


async def test_a_scorer_that_does_not_answer_turns_scoring_off_under_auto(
    tmp_path: Path,
) -> None:
    config = scorer_config(tmp_path, f"127.0.0.1:{closed_port()}", enabled="auto")
    agent = Agent(config, Settings())
    try:
        await agent.start()
        assert agent.relevance is None
    finally:
        await agent.shutdown()


def test_scoring_through_a_scorer_never_imports_torch(tmp_path: Path) -> None:
    # A fresh interpreter: this one already loaded torch for the model fixture.
    script = textwrap.dedent(
        """
        import asyncio, sys, textwrap
        import numpy as np
        from semhealth.agent.relevance import plan_relevance
        from semhealth.agent.config import load_config
        from semhealth.embeddings.batcher import MicroBatcher
        from semhealth.embeddings.config import Batching
        from semhealth.embeddings.scorer_service import serve_scorer
        from semhealth.embeddings.factory import open_scorer

        class Ones:
            name, dim = "ones", 4
            async def embed(self, texts):
                return np.ones((len(texts), 4), dtype=np.float32) / 2
            async def aclose(self):
                pass

        async def main(path):
            served = MicroBatcher(Ones(), Batching())
            await served.start()
            server = await serve_scorer({"default": served})
            await server.wait_ready()
            with open(path, "w") as file:
                file.write(textwrap.dedent(f'''
                    upstream: {{url: "http://127.0.0.1:9"}}
                    relevance:
                      enabled: auto
                      route_cjk_to: null
                      encoders: [{{name: default, backend: scorer,
                                   remote: {{url: "127.0.0.1:{server.port}"}}}}]
                '''))
            relevance = load_config(path, {}, {}).relevance
            assert plan_relevance(relevance).embeddings is relevance.embeddings
            async with open_scorer(relevance.embeddings) as scorer:
                scores = await scorer.score("q", ("c",), None)
            await server.shutdown(1.0)
            await served.shutdown(1.0)
            assert scores.context_raw is not None
            print("torch" in sys.modules)

        asyncio.run(main(sys.argv[1]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "semhealth.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
