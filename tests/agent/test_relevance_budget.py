"""``relevance.cpu_budget``: the relevance stage keeps its encoders' CPU within a budget by
scoring a share of eligible streams, and scores everything its ceiling allows when traffic
is light.

The controller is tested against a modelled cost (use proportional to the share); the stage
against a real sidecar with the real e5 encoder, its CPU read from /proc as in production.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from semhealth.agent.analysis.agent import Agent
from semhealth.agent.analysis.agent import Settings as AgentSettings
from semhealth.agent.config import load_config
from semhealth.agent.demo.simulator import SimulatedUpstream
from semhealth.agent.relevance import Budget, RelevanceStage, Settings
from semhealth.embeddings.relevance import RelevanceScores
from tests.agent.test_relevance_e2e import RELEVANT, answer, chat, metrics, post, value, wait_for
from tests.agent.test_relevance_plan import scoreable_record

STREAMS_A_WINDOW = 100


class Modelled:
    """The encoders' cumulative CPU when scoring the share ``rate`` of a demand that would
    take ``full_cores`` to score whole."""

    def __init__(self, full_cores: float) -> None:
        self.full_cores = full_cores
        self.cpu = 0.0
        self.finished = 0
        self.eligible = 0

    def run(self, budget: Budget, windows: int) -> list[float]:
        used = []
        for window in range(1, windows + 1):
            spent = self.full_cores * budget.rate * Budget.WINDOW_S
            self.cpu += spent
            used.append(spent / Budget.WINDOW_S)
            self.eligible += STREAMS_A_WINDOW
            self.finished += round(budget.rate * STREAMS_A_WINDOW)
            budget.update(window * Budget.WINDOW_S, self.finished, self.eligible)
        return used


def modelled_budget(cores: float, ceiling: float, full_cores: float) -> tuple[Budget, Modelled]:
    model = Modelled(full_cores)
    budget = Budget(cores, ceiling, lambda: model.cpu)
    budget.update(0.0, 0, 0)
    return budget, model


def test_four_times_the_budget_settles_at_a_quarter_of_the_streams() -> None:
    budget, model = modelled_budget(0.25, 1.0, full_cores=1.0)
    used = model.run(budget, 20)
    assert budget.rate == pytest.approx(0.25, rel=0.05)
    assert used[-5:] == pytest.approx([0.25] * 5, rel=0.05)


def test_light_traffic_climbs_back_to_the_ceiling() -> None:
    budget, model = modelled_budget(0.25, 0.8, full_cores=1.0)
    model.run(budget, 10)
    model.full_cores = 0.1  # the traffic drops to well under the budget
    model.run(budget, 10)
    assert budget.rate == 0.8


def test_the_share_never_leaves_its_bounds() -> None:
    budget, model = modelled_budget(0.001, 1.0, full_cores=1000.0)
    model.run(budget, 40)
    assert budget.rate == Budget.MIN_RATE
    budget, model = modelled_budget(4.0, 0.5, full_cores=0.0)
    model.run(budget, 5)
    assert budget.rate == 0.5


def test_until_a_stream_has_finished_the_share_halves_while_over_the_budget() -> None:
    cpu = [0.0]
    budget = Budget(0.5, 1.0, lambda: cpu[0])
    budget.update(0.0, 0, 0)
    cpu[0] = 4.0  # two cores over a window, and nothing has finished yet
    budget.update(2.0, 0, 50)
    assert budget.rate == 0.5
    budget.update(4.0, 0, 100)  # no CPU used: under the budget
    assert budget.rate == 1.0


def test_a_cpu_that_cannot_be_read_leaves_the_share_alone() -> None:
    budget = Budget(0.25, 0.7, lambda: None)
    for now in (0.0, 2.0, 4.0):
        budget.update(now, 10, 10)
    assert budget.rate == 0.7
    assert budget.cpu_seconds == 0.0


def test_streams_in_flight_are_bounded_by_what_the_budget_spends_in_its_horizon() -> None:
    cpu = [0.0]
    budget = Budget(0.5, 1.0, lambda: cpu[0])
    assert budget.in_flight_limit() is None  # no stream has finished: nothing to go by
    budget.update(0.0, 0, 0)
    cpu[0] = 2.0
    budget.update(2.0, 10, 10)  # 0.2 s of CPU a stream
    assert budget.cost_s == pytest.approx(0.2)
    assert budget.in_flight_limit() == int(0.5 * Budget.HORIZON_S / 0.2)


class Held:
    """Scores that never finish until released: streams stay in flight."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def score(
        self, query: str, context_chunks: object = (), answer: object = None
    ) -> RelevanceScores:
        await self.release.wait()
        return RelevanceScores(None, None, None, None, 0)


async def test_streams_past_the_in_flight_bound_are_budgeted_out() -> None:
    held = Held()
    stage = RelevanceStage(held, Settings(cpu_budget=0.1), lambda r, s: None, read_cpu=lambda: 0.0)
    assert stage.budget is not None
    stage.budget.cost_s = 0.1  # a stream costs 0.1 s: the budget's horizon holds 2 of them
    for _ in range(5):
        stage.consume_record(scoreable_record("chat"))
    held.release.set()
    await stage.shutdown(timeout_s=5.0)
    assert stage.stats.skipped == {"budgeted_out": 3}
    assert stage.stats.scored == 2


class NoScores:
    async def score(
        self, query: str, context_chunks: object = (), answer: object = None
    ) -> RelevanceScores:
        return RelevanceScores(None, None, None, None, 0)


async def test_streams_left_out_by_the_budget_are_counted_apart_and_in_proportion() -> None:
    stage = RelevanceStage(
        NoScores(),
        Settings(sample_rate=0.8, cpu_budget=1.0, max_in_flight=100_000),
        lambda r, s: None,
        rng=random.Random(7),
        read_cpu=lambda: 0.0,
    )
    assert stage.budget is not None
    stage.budget.rate = 0.2  # as if the budget had settled there
    kept: Counter[str] = Counter()
    stage.also_record(lambda r, s: kept.update([r.route]))
    for i in range(10_000):
        stage.consume_record(scoreable_record("chat" if i % 4 else "search"))
    await stage.shutdown(timeout_s=5.0)
    skipped = stage.stats.skipped
    assert skipped["sampled_out"] == pytest.approx(2000, rel=0.1)
    assert skipped["budgeted_out"] == pytest.approx(6000, rel=0.05)
    assert stage.stats.scored == pytest.approx(2000, rel=0.1)
    # Every route is sampled at the same share: three chat streams for each search stream.
    assert kept["chat"] / kept["search"] == pytest.approx(3.0, rel=0.15)


def sidecar_config(tmp_path: Path, upstream_url: str, cpu_budget: str) -> object:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        f"upstream:\n  url: {upstream_url}\n"
        f"relevance:\n  enabled: true\n  profile: quality\n  cpu_budget: {cpu_budget}\n"
    )
    return load_config(
        str(path), {}, {"listen.proxy": "127.0.0.1:0", "listen.admin": "127.0.0.1:0"}
    )


async def drive(agent: Agent, session: aiohttp.ClientSession, requests: int) -> None:
    for i in range(requests):
        query, context = RELEVANT[i % len(RELEVANT)]
        # A different context each time: the cache would otherwise make repeats free.
        await post(session, agent.proxy_url, chat("fits", query, f"{context} (doc {i})" * 4))


async def test_a_sidecar_over_its_budget_scores_fewer_streams_and_says_so(tmp_path: Path) -> None:
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    # Time to finish what is queued for the encoder when the test stops it.
    agent = Agent(
        sidecar_config(tmp_path, upstream.url, "0.01"), AgentSettings(shutdown_timeout_s=30.0)
    )
    try:
        await agent.start()
        async with aiohttp.ClientSession() as session:
            samples: dict[tuple[str, str], float] = {}

            async def budgeted() -> bool:
                nonlocal samples
                await drive(agent, session, 10)
                samples = await metrics(session, agent)
                return (
                    value(samples, "semhealth_relevance_skipped_total", reason="budgeted_out") > 0
                )

            await wait_for(budgeted, timeout_s=90.0)
        assert value(samples, "semhealth_relevance_sample_rate") < 1.0
        assert value(samples, "semhealth_relevance_cpu_seconds_total") > 0.0
    finally:
        await agent.shutdown()
        await upstream.shutdown()


async def test_a_sidecar_within_its_budget_scores_every_stream(tmp_path: Path) -> None:
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    agent = Agent(sidecar_config(tmp_path, upstream.url, "64"), AgentSettings())
    try:
        await agent.start()
        async with aiohttp.ClientSession() as session:
            await drive(agent, session, 6)
            await asyncio.sleep(2 * Budget.WINDOW_S)  # the budget looks at least twice
            await drive(agent, session, 6)

            async def all_scored() -> bool:
                samples = await metrics(session, agent)
                return value(samples, "semhealth_relevance_scored_total") == 12

            await wait_for(all_scored, timeout_s=60.0)
            samples = await metrics(session, agent)
        assert value(samples, "semhealth_relevance_sample_rate") == 1.0
        assert value(samples, "semhealth_relevance_skipped_total", reason="budgeted_out") == 0
    finally:
        await agent.shutdown()
        await upstream.shutdown()
