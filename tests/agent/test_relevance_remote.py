"""Relevance scored by a remote encoder the YAML names: a real ``semhealth scorer`` on loopback.

The scorer serves the real all-MiniLM-L6-v2; the agent is configured only through its file
(``backend: scorer``), so it builds and connects the remote backend as it does in production.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from semhealth.agent.app import Agent, Settings
from semhealth.agent.config import Config, load_config
from semhealth.agent.errors import RelevanceStartError
from semhealth.agent.simulator import SimulatedUpstream
from semhealth.embeddings.backend import Backend
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.config import Batching
from semhealth.embeddings.scorer_service import ScorerServer, serve_scorer
from tests.agent.test_relevance_e2e import (
    answer,
    metrics,
    post_one_and_wait_scored,
    value,
)

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
    tmp_path: Path, url: str, *, enabled: str, upstream_url: str = "http://127.0.0.1:9"
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
                    timeout_s: 2
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
