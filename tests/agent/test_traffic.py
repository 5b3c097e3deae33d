"""The demo traffic generator sends a realistic mix, reads every answer and counts outcomes."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from semhealth.agent.demo.simulator import (
    CORPUS,
    DemoProfile,
    Script,
    ScriptRequest,
    SimulatedUpstream,
    best_entry,
    demo_script,
    query_text,
)
from semhealth.agent.demo.traffic import TrafficGenerator, build_request

# Fast and healthy: millisecond streams, no stalls or 429s unless a test asks for them.
FAST = DemoProfile(
    ttft_median_s=0.002,
    gap_min_s=0.0005,
    gap_max_s=0.001,
    gap_jitter_s=0.0,
    stall_rate=0.0,
    rate_limit_rate=0.0,
)


@pytest.fixture
async def upstream_for() -> AsyncIterator[Callable[[Callable[[ScriptRequest], Any]], Any]]:
    started: list[SimulatedUpstream] = []

    async def start(script_for: Callable[[ScriptRequest], Any]) -> SimulatedUpstream:
        upstream = SimulatedUpstream(script_for)
        await upstream.start()
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        await upstream.shutdown()


def _demo(profile: DemoProfile, seed: int = 0) -> Callable[[ScriptRequest], Script]:
    rng = random.Random(seed)
    return lambda request: demo_script(request, rng, profile)


async def _run(generator: TrafficGenerator) -> None:
    await generator.start()
    try:
        await asyncio.wait_for(generator.wait(), timeout=15)
    finally:
        await generator.shutdown()


async def test_sends_max_requests_and_every_one_is_answered(upstream_for: Any) -> None:
    upstream = await upstream_for(_demo(FAST))
    generator = TrafficGenerator(
        upstream.url, FAST, random.Random(1), concurrency=8, rate_per_s=500, max_requests=30
    )
    await _run(generator)
    stats = generator.stats
    assert (stats.sent, stats.ok, stats.in_flight) == (30, 30, 0)
    assert dict(stats.by_status) == {200: 30}
    assert len(upstream.received) == 30


async def test_stats_add_up_when_the_upstream_rate_limits(upstream_for: Any) -> None:
    profile = DemoProfile(
        ttft_median_s=0.002, gap_min_s=0.0005, gap_max_s=0.001, stall_rate=0, rate_limit_rate=0.5
    )
    upstream = await upstream_for(_demo(profile))
    generator = TrafficGenerator(
        upstream.url, profile, random.Random(2), concurrency=8, rate_per_s=500, max_requests=40
    )
    await _run(generator)
    stats = generator.stats
    assert stats.sent == stats.ok + stats.http_errors + stats.failed + stats.cancelled == 40
    assert stats.http_errors == stats.by_status[429] > 0
    assert stats.ok == stats.by_status[200] > 0


async def test_a_connection_broken_mid_stream_counts_as_failed(upstream_for: Any) -> None:
    upstream = await upstream_for(lambda _r: Script(pieces=("a", "b", "c"), die_after=1))
    generator = TrafficGenerator(
        upstream.url, FAST, random.Random(3), concurrency=2, rate_per_s=500, max_requests=5
    )
    await _run(generator)
    assert (generator.stats.failed, generator.stats.ok) == (5, 0)


async def test_an_unreachable_base_url_counts_as_failed(upstream_for: Any) -> None:
    upstream = await upstream_for(_demo(FAST))
    url = upstream.url
    await upstream.shutdown()
    generator = TrafficGenerator(url, FAST, random.Random(4), rate_per_s=500, max_requests=3)
    await _run(generator)
    assert generator.stats.failed == 3


async def test_the_mix_reaches_every_api_with_queries_and_contexts(upstream_for: Any) -> None:
    upstream = await upstream_for(_demo(FAST))
    generator = TrafficGenerator(
        upstream.url, FAST, random.Random(5), concurrency=8, rate_per_s=1000, max_requests=60
    )
    await _run(generator)
    paths = Counter(r.path for r in upstream.received)
    assert set(paths) == {"/v1/chat/completions", "/v1/responses", "/v1/messages"}
    assert all(query_text(r.json) for r in upstream.received)


async def test_shutdown_cancels_requests_past_its_deadline(upstream_for: Any) -> None:
    arrived: list[ScriptRequest] = []
    three_arrived = asyncio.Event()

    def stalled(request: ScriptRequest) -> Script:
        arrived.append(request)
        if len(arrived) == 3:
            three_arrived.set()
        return Script(pieces=("a", "b"), gaps_s=30.0)

    upstream = await upstream_for(stalled)
    generator = TrafficGenerator(
        upstream.url, FAST, random.Random(6), concurrency=3, rate_per_s=500
    )
    await generator.start()
    await asyncio.wait_for(three_arrived.wait(), timeout=5)
    await asyncio.wait_for(generator.shutdown(deadline_s=0.1), timeout=5)
    stats = generator.stats
    assert (stats.sent, stats.cancelled, stats.in_flight) == (3, 3, 0)


async def test_shutdown_is_safe_without_start_and_twice(upstream_for: Any) -> None:
    upstream = await upstream_for(_demo(FAST))
    generator = TrafficGenerator(upstream.url, FAST, random.Random(7))
    await generator.shutdown()
    await generator.start()
    await generator.shutdown()
    await generator.shutdown()
    fresh = TrafficGenerator(upstream.url, FAST, random.Random(7), rate_per_s=500, max_requests=2)
    await _run(fresh)
    assert fresh.stats.ok == 2


def test_contexts_are_sometimes_about_the_query_and_sometimes_not() -> None:
    rng = random.Random(8)
    profile = DemoProfile(related_context_rate=0.5, mix_chat_json=0, mix_chat_tool=0)
    fits: Counter[bool] = Counter()
    for _ in range(60):
        request = build_request(profile, rng)
        entry = best_entry(query_text(request.body))
        assert entry is not None
        fits[entry.document in _context_of(request.body)] += 1
    assert fits[True] > 10
    assert fits[False] > 10


def _context_of(body: dict[str, Any]) -> str:
    """All text of the request except the query: system prompt, instructions, documents."""
    parts = [str(body.get("system", "")), str(body.get("instructions", ""))]
    for message in body.get("messages", []):
        content = message["content"]
        if message["role"] == "system":
            parts.append(content)
        elif isinstance(content, list):
            parts += [b["source"]["data"] for b in content if b["type"] == "document"]
    return "\n".join(parts)


def test_some_requests_are_in_chinese() -> None:
    rng = random.Random(9)
    langs: Counter[str] = Counter()
    for _ in range(60):
        entry = best_entry(query_text(build_request(DemoProfile(), rng).body))
        assert entry is not None
        langs[entry.lang] += 1
    assert langs["zh"] > 5
    assert langs["en"] > 5


def test_anthropic_requests_attach_documents_and_a_system_prompt() -> None:
    only_anthropic = DemoProfile(
        mix_chat_stream=0, mix_chat_json=0, mix_chat_tool=0, mix_responses=0, mix_anthropic=1
    )
    request = build_request(only_anthropic, random.Random(10))
    (message,) = request.body["messages"]
    kinds = [block["type"] for block in message["content"]]
    assert kinds == ["document", "document", "text"]
    assert request.body["system"]
    assert request.headers["anthropic-version"]


def test_json_and_tool_requests_ask_for_structure() -> None:
    rng = random.Random(11)
    json_only = DemoProfile(mix_chat_stream=0, mix_chat_tool=0, mix_responses=0, mix_anthropic=0)
    tool_only = DemoProfile(mix_chat_stream=0, mix_chat_json=0, mix_responses=0, mix_anthropic=0)
    assert build_request(json_only, rng).body["response_format"]["type"] in (
        "json_object",
        "json_schema",
    )
    assert build_request(tool_only, rng).body["tools"][0]["type"] == "function"


def test_build_request_is_reproducible_from_the_seed() -> None:
    first = build_request(DemoProfile(), random.Random(12))
    again = build_request(DemoProfile(), random.Random(12))
    assert first == again


def test_corpus_has_english_and_chinese_entries() -> None:
    assert {e.lang for e in CORPUS} == {"en", "zh"}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        TrafficGenerator("http://127.0.0.1:1", FAST, random.Random(), concurrency=0)
    with pytest.raises(ValueError, match="rate_per_s"):
        TrafficGenerator("http://127.0.0.1:1", FAST, random.Random(), rate_per_s=0)
