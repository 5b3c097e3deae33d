"""Live shadowing through the sidecar: a scripted primary, a scripted candidate, the real
``openai`` SDK as the client. The client gets the primary's bytes and never waits for the
candidate; pairs join and give the measures their known difference implies; what is not
shadowed, or cannot be, is counted."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import ShadowSettings, ShadowUpstream, Timeouts, Tolerances
from semhealth.agent.demo.simulator import RawScript, Script, ScriptRequest, SimulatedUpstream
from semhealth.agent.relevance import LoadedEncoders
from semhealth.agent.shadow.live import ShadowStats
from semhealth.agent.shadow.pairs import PairResult
from semhealth.collectors.record import StreamRecord
from tests.agent.conftest import agent_config

PARIS = ("The ", "capital ", "of ", "France ", "is ", "Paris", ".")
LYON = ("The ", "capital ", "of ", "France ", "is ", "Lyon", ".")
QUESTION = "What is the capital of France?"
ROUTE = "chat_completions"


def answering(pieces: Sequence[str], **script: Any) -> Callable[[ScriptRequest], Script]:
    def answer(request: ScriptRequest) -> Script:
        if b"response_format" in request.body:
            city = "Paris" if "Paris" in pieces else "Lyon"
            return Script(pieces=('{"city": ', f'"{city}", ', '"country": "FR"}'), **script)
        return Script(pieces=tuple(pieces), **script)

    return answer


@dataclass
class Shadowed:
    agent: Agent
    primary: SimulatedUpstream
    candidate: SimulatedUpstream
    records: list[StreamRecord] = field(default_factory=list)

    @property
    def stats(self) -> ShadowStats:
        assert self.agent.shadow is not None
        return self.agent.shadow.stats

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.agent.proxy_url + "/v1", api_key="k")

    def pairs(self) -> list[PairResult]:
        assert self.agent.shadow is not None
        return self.agent.shadow.recent_pairs()

    async def settled(self, counted: int, timeout_s: float = 10.0) -> None:
        """Wait until ``counted`` shadowed exchanges have an outcome (a pair or shed)."""
        deadline = time.monotonic() + timeout_s
        while sum(self.stats.pairs.values()) < counted:
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {counted} outcomes, got {self.stats.pairs}")
            await asyncio.sleep(0.02)


def shadow_settings(upstream: ShadowUpstream, **overrides: Any) -> ShadowSettings:
    values: dict[str, Any] = {
        "upstream": upstream,
        "routes": (ROUTE,),
        "sample_rate": 1.0,
        "max_per_minute": 1000,
        "max_concurrent": 16,
    }
    values.update(overrides)
    return ShadowSettings(**values)


@asynccontextmanager
async def shadowed(
    primary_script: Callable[[ScriptRequest], Script | RawScript],
    candidate_script: Callable[[ScriptRequest], Script | RawScript],
    *,
    shadow: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    loaded: LoadedEncoders | None = None,
    shadow_on: bool = True,
    candidate_url: str | None = None,
    timeouts: Timeouts | None = None,
    candidate: dict[str, Any] | None = None,
) -> AsyncIterator[Shadowed]:
    primary, candidate_server = (
        SimulatedUpstream(primary_script),
        SimulatedUpstream(candidate_script),
    )
    await primary.start()
    await candidate_server.start()
    records: list[StreamRecord] = []
    upstream = ShadowUpstream(
        url=candidate_url or candidate_server.url + "/",
        timeouts=timeouts or Timeouts(total_s=30.0),
        **(candidate or {}),
    )
    settings = shadow_settings(upstream, **(shadow or {})) if shadow_on else None
    agent = Agent(
        agent_config(primary.url, **(config or {})),
        Settings(consumers=[records.append], shadow=settings, loaded_encoders=loaded or {}),
    )
    try:
        await agent.start()
        yield Shadowed(agent, primary, candidate_server, records)
    finally:
        await agent.shutdown()
        await primary.shutdown()
        await candidate_server.shutdown()


async def ask(client: openai.AsyncOpenAI, **extra: Any) -> tuple[str, float]:
    """A streamed question; the text the client got and its time to first content."""
    began = time.monotonic()
    first: float | None = None
    text = []
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        **extra,
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.monotonic() - began
            text.append(chunk.choices[0].delta.content)
    assert first is not None
    return "".join(text), first


async def test_pairs_join_and_give_the_known_token_and_json_differences() -> None:
    # The primary streams slowly and the candidate at once: shadows finish first here.
    async with shadowed(answering(PARIS, gaps_s=0.03), answering(LYON)) as run:
        client = run.client()
        for _ in range(4):
            text, _ttft = await ask(client)
            assert text == "".join(PARIS)  # the client's answer is the primary's
        answer = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": QUESTION}],
            response_format={"type": "json_object"},
        )
        assert orjson.loads(answer.choices[0].message.content or "") == {
            "city": "Paris",
            "country": "FR",
        }
        await client.close()
        await run.settled(5)
        metrics = run.agent.telemetry.render_prometheus().decode()
    assert run.stats.pairs == {(ROUTE, "differs"): 5}
    assert len(run.candidate.received) == 5
    pairs = run.pairs()
    text_pairs = [pair for pair in pairs if pair.json is None]
    assert len(text_pairs) == 4
    for pair in text_pairs:
        assert pair.tokens is not None
        assert pair.tokens.first_divergence == 5
        assert pair.tokens.distance == pytest.approx(1 / 7)
        assert pair.shadow.ttft_s is not None and pair.primary.ttft_s is not None
    (json_pair,) = [pair for pair in pairs if pair.json is not None]
    assert json_pair.json is not None
    assert (json_pair.json.equal, json_pair.json.paths) == (False, ("$.city",))
    assert f'semantic_health_shadow_pairs_total{{result="differs",route="{ROUTE}"}} 5.0' in metrics
    assert f'semantic_health_shadow_token_distance_count{{route="{ROUTE}"}} 5.0' in metrics
    first_divergence = "semantic_health_shadow_first_divergence_tokens_bucket"
    assert f'{first_divergence}{{le="5.0",route="{ROUTE}"}} 4.0' in metrics
    assert f'{first_divergence}{{le="2.0",route="{ROUTE}"}} 0.0' in metrics
    assert f'{first_divergence}{{le="10.0",route="{ROUTE}"}} 5.0' in metrics  # JSON: token 6
    # The candidate's own records carry variant="shadow", the client's variant="primary".
    requests = [
        line for line in metrics.splitlines() if line.startswith("semantic_health_requests")
    ]
    shadow_lines = [line for line in requests if 'variant="shadow"' in line]
    primary_lines = [line for line in requests if 'variant="primary"' in line]
    assert shadow_lines and shadow_lines[0].endswith(" 5.0")
    assert primary_lines and primary_lines[0].endswith(" 5.0")
    assert "Lyon" not in metrics and "Paris" not in metrics


async def test_clients_receive_exactly_the_primarys_bytes() -> None:
    body = (
        b'data: {"choices":[{"index":0,"delta":{"content":"Paris"}}]}\n\n',
        b"data: [DONE]\n\n",
    )

    def primary(_request: ScriptRequest) -> RawScript:
        return RawScript(chunks=body, gaps_s=0.02, content_type="text/event-stream")

    async with shadowed(primary, answering(LYON)) as run:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(
                    run.agent.proxy_url + "/v1/chat/completions",
                    json={"model": "m", "stream": True, "messages": [{"role": "user"}]},
                ) as response:
                    assert await response.read() == b"".join(body)
        await run.settled(3)
    assert run.stats.pairs == {(ROUTE, "differs"): 3}


async def test_a_slow_candidate_never_delays_the_client() -> None:
    primary = answering(PARIS, ttft_s=0.05)
    slow = answering(PARIS, ttft_s=2.0)
    async with shadowed(primary, slow, shadow_on=False) as off:
        client = off.client()
        _text, ttft_off = await ask(client)
        await client.close()
    async with shadowed(primary, slow) as on:
        client = on.client()
        began = time.monotonic()
        text, ttft_on = await ask(client)
        whole_answer_s = time.monotonic() - began
        await client.close()
        # The client had its whole answer while the candidate was still on its first token.
        assert on.candidate.open_responses == 1
        await on.settled(1)
    assert text == "".join(PARIS)
    # Generous: the candidate takes 2 s; the client's answer did not wait for it.
    assert ttft_on < ttft_off + 1.0
    assert whole_answer_s < 1.5
    assert on.stats.pairs == {(ROUTE, "exact"): 1}
    (pair,) = on.pairs()
    assert pair.shadow.ttft_s is not None and pair.shadow.ttft_s >= 2.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_candidate_that_is_down_or_times_out_is_counted_and_the_client_is_served() -> None:
    down = f"http://127.0.0.1:{_closed_port()}/"
    async with shadowed(answering(PARIS), answering(LYON), candidate_url=down) as run:
        client = run.client()
        assert (await ask(client))[0] == "".join(PARIS)
        await client.close()
        await run.settled(1)
    assert run.stats.pairs == {(ROUTE, "candidate_error"): 1}
    (pair,) = run.pairs()
    assert (pair.shadow.status, pair.shadow.error_type) == (502, "upstream_unreachable")

    stalled = Timeouts(connect_s=1.0, read_s=0.3)
    async with shadowed(answering(PARIS), answering(LYON, ttft_s=2.0), timeouts=stalled) as run:
        client = run.client()
        assert (await ask(client))[0] == "".join(PARIS)
        await client.close()
        await run.settled(1)
    assert run.stats.pairs == {(ROUTE, "candidate_error"): 1}
    (pair,) = run.pairs()
    # The head came at once, then nothing within read_s: as the proxy records it, the
    # upstream's 200 cut by a timeout (not a 502 of semhealth's own).
    assert (pair.shadow.status, pair.shadow.error_type) == (200, "upstream_timeout")


async def test_a_candidate_answer_cut_at_the_analysis_limit_is_a_candidate_error() -> None:
    # limits.max_response_bytes stops analysis of the candidate's long answer (a truncated
    # record with no error of its own): not its whole answer, so nothing fair to compare.
    config = {"limits.max_response_bytes": 4096, "limits.max_frame_bytes": 4096}
    async with shadowed(answering(PARIS), answering(PARIS * 40), config=config) as run:
        client = run.client()
        assert (await ask(client))[0] == "".join(PARIS)
        await client.close()
        await run.settled(1)
    (primary,) = run.records
    assert not primary.truncated
    (pair,) = run.pairs()
    assert pair.result == "candidate_error"
    assert (pair.shadow.status, pair.shadow.error_type) == (200, "")


async def test_budget_sampling_and_bodies_not_kept_are_shed_and_counted() -> None:
    async with shadowed(answering(PARIS), answering(PARIS), shadow={"max_per_minute": 2}) as run:
        client = run.client()
        for _ in range(5):
            await ask(client)
        await client.close()
        await run.settled(5)
    assert run.stats.pairs == {(ROUTE, "exact"): 2, (ROUTE, "shed"): 3}
    assert run.stats.shed == {(ROUTE, "max_per_minute"): 3}
    assert len(run.candidate.received) == 2

    async with shadowed(
        answering(PARIS), answering(PARIS, ttft_s=1.0), shadow={"max_concurrent": 1}
    ) as run:
        client = run.client()
        for _ in range(3):
            await ask(client)  # each answered while the first shadow is still in flight
        await client.close()
        await run.settled(3)
    assert run.stats.shed == {(ROUTE, "max_concurrent"): 2}
    assert run.stats.pairs[(ROUTE, "exact")] == 1

    async with shadowed(answering(PARIS), answering(PARIS), shadow={"sample_rate": 0.0}) as run:
        client = run.client()
        for _ in range(3):
            await ask(client)
        await client.close()
        await _records(run, 3)
    assert run.stats.skipped == {"sampled_out": 3}
    assert run.stats.pairs == {} and run.candidate.received == []

    # A body past limits.max_request_bytes is forwarded but not copied: never shadowed.
    async with shadowed(
        answering(PARIS), answering(PARIS), config={"limits.max_request_bytes": 200}
    ) as run:
        client = run.client()
        await ask(client, user="u" * 400)
        await client.close()
        await run.settled(1)
    assert run.stats.shed == {(ROUTE, "body_not_kept"): 1}
    assert run.candidate.received == []


async def test_a_shadowed_stream_the_client_abandons_is_shed_not_compared() -> None:
    slow = answering(PARIS * 10, gaps_s=0.05)  # 3.5 s of stream; the client leaves early
    async with shadowed(slow, answering(PARIS * 10)) as run:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                run.agent.proxy_url + "/v1/chat/completions",
                json={"model": "m", "stream": True, "messages": [{"role": "user"}]},
            ) as response:
                await response.content.readany()  # the first chunk, then hang up
        await run.settled(1)
    (primary,) = run.records
    assert primary.client_aborted
    assert run.stats.shed == {(ROUTE, "primary_incomplete"): 1}
    assert run.stats.pairs == {(ROUTE, "shed"): 1}
    assert run.pairs() == []
    assert len(run.candidate.received) == 1  # the candidate was asked; its answer was not used


async def test_a_primary_answer_cut_at_the_analysis_limit_is_shed_not_compared() -> None:
    config = {"limits.max_response_bytes": 4096, "limits.max_frame_bytes": 4096}
    async with shadowed(answering(PARIS * 40), answering(PARIS), config=config) as run:
        client = run.client()
        assert (await ask(client))[0] == "".join(PARIS * 40)  # the client got it all
        await client.close()
        await run.settled(1)
    (primary,) = run.records
    assert primary.truncated
    assert run.stats.shed == {(ROUTE, "primary_incomplete"): 1}
    assert run.pairs() == []


async def _records(run: Shadowed, n: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(run.records) < n:
        assert time.monotonic() < deadline, f"expected {n} records, got {len(run.records)}"
        await asyncio.sleep(0.02)


async def test_unsafe_methods_and_unconfigured_routes_are_never_shadowed() -> None:
    async with shadowed(answering(PARIS), answering(PARIS)) as run:
        async with aiohttp.ClientSession() as session:
            # The route "responses" exists but is not one shadowing was configured for.
            responses = run.agent.proxy_url + "/v1/responses"
            async with session.post(responses, json={"model": "m", "input": QUESTION}) as answer:
                await answer.read()
            url = run.agent.proxy_url + "/v1/chat/completions"
            async with session.put(url, json={"model": "m", "messages": []}) as response:
                await response.read()
        await _records(run, 2)
        await asyncio.sleep(0.2)  # a shadow, were one sent, would have reached the candidate
    assert run.stats.skipped == {"route": 1, "method": 1}
    assert run.candidate.received == []
    assert run.stats.pairs == {}


async def test_a_shadow_block_without_routes_shadows_every_route() -> None:
    primary, candidate = SimulatedUpstream(answering(PARIS)), SimulatedUpstream(answering(PARIS))
    await primary.start()
    await candidate.start()
    config = agent_config(
        primary.url,
        **{
            "shadow.upstream.url": candidate.url,
            "shadow.sample_rate": 1.0,
            "shadow.max_per_minute": 1000,
        },
    )
    agent = Agent(config)
    try:
        await agent.start()
        async with aiohttp.ClientSession() as session:
            chat = {"model": "m", "messages": [{"role": "user", "content": QUESTION}]}
            async with session.post(agent.proxy_url + "/v1/chat/completions", json=chat) as r:
                await r.read()
            answer = {"model": "m", "input": QUESTION}
            async with session.post(agent.proxy_url + "/v1/responses", json=answer) as r:
                await r.read()
        assert agent.shadow is not None
        deadline = time.monotonic() + 5.0
        while sum(agent.shadow.stats.pairs.values()) < 2:
            assert time.monotonic() < deadline, agent.shadow.stats
            await asyncio.sleep(0.02)
        stats = agent.shadow.stats
    finally:
        await agent.shutdown()
        await primary.shutdown()
        await candidate.shutdown()
    assert sorted(r.path for r in candidate.received) == [
        "/v1/chat/completions",
        "/v1/responses",
    ]
    assert stats.pairs == {("chat_completions", "exact"): 1, ("responses", "exact"): 1}
    assert stats.skipped == {}


async def _scrape(admin_url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample the admin port's /metrics serves, by name and label set."""
    async with aiohttp.ClientSession() as session:
        async with session.get(admin_url + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_the_shadow_counters_are_served_on_the_admin_port() -> None:
    async with shadowed(answering(PARIS), answering(PARIS), shadow={"max_per_minute": 2}) as run:
        client = run.client()
        for _ in range(4):
            await ask(client)  # two within max_per_minute, two shed
        await client.close()
        async with aiohttp.ClientSession() as session:
            url = run.agent.proxy_url + "/v1/chat/completions"
            async with session.put(url, json={"model": "m", "messages": []}) as response:
                await response.read()  # never shadowed: method
            answer = {"model": "m", "input": QUESTION}
            async with session.post(run.agent.proxy_url + "/v1/responses", json=answer) as r:
                await r.read()  # never shadowed: a route shadowing was not configured for
        await run.settled(4)
        await _records(run, 6)
        samples = await _scrape(run.agent.admin_url)

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    assert value("semhealth_shadow_shed_total", route=ROUTE, reason="max_per_minute") == 2.0
    assert value("semhealth_shadow_skipped_total", reason="method") == 1.0
    assert value("semhealth_shadow_skipped_total", reason="route") == 1.0
    assert value("semhealth_shadow_errors_total") == 0.0
    assert value("semantic_health_shadow_pairs_total", route=ROUTE, result="exact") == 2.0
    assert value("semantic_health_shadow_pairs_total", route=ROUTE, result="shed") == 2.0


async def test_shadow_json_has_the_verdict_and_worst_ids_and_no_text(
    fast_encoders: LoadedEncoders,
) -> None:
    # One word in seven differs: token distance 1/7 passes, no candidate errors pass, and an
    # agreement below 1 cannot reach 0.99 (TTFT ratios, loopback timings, are left unjudged
    # here: a failed check fails the route whatever they are).
    tolerances = Tolerances(min_pairs=3, min_agreement=0.99)
    async with shadowed(
        answering(PARIS),
        answering(LYON),
        shadow={"tolerances": tolerances},
        config={"relevance.enabled": True, "relevance.profile": "fast"},
        loaded=fast_encoders,
    ) as run:
        client = run.client()
        for _ in range(3):
            await ask(client)
        await client.close()
        await run.settled(3)
        assert run.agent.shadow is not None
        document = run.agent.shadow.render_json()
        metrics = run.agent.telemetry.render_prometheus().decode()
    for text in ("Paris", "Lyon", "capital", "France"):
        assert text.encode() not in document
    parsed = orjson.loads(document)
    (route,) = parsed["routes"]
    assert route["route"] == ROUTE and route["pairs"] == 3
    passed = {check["name"]: check["passed"] for check in route["verdict"]["checks"]}
    assert set(passed) == {
        "token_distance",
        "answer_agreement",
        "ttft_ratio",
        "candidate_error_rate",
    }
    assert (passed["token_distance"], passed["candidate_error_rate"]) == (True, True)
    assert passed["answer_agreement"] is False
    assert route["verdict"]["verdict"] == "fail"
    assert set(route["worst"]) == {pair.exchange_id for pair in run.pairs()}
    assert parsed["counts"]["pairs"] == {ROUTE: {"differs": 3}}
    # Agreement came from the relevance scorer: one word apart, similar but not equal.
    agreement = route["answer_agreement"]
    assert agreement is not None and 0 < agreement["mean"] < 1
    assert f'semantic_health_shadow_answer_agreement_count{{route="{ROUTE}"}} 3.0' in metrics
    # Each side's own relevance, by variant: the candidate's scored by the shadow, the
    # primary's by the relevance stage.
    for variant in ("primary", "shadow"):
        counts = [
            line
            for line in metrics.splitlines()
            if line.startswith("semantic_health_answer_relevance_score_count")
            and f'variant="{variant}"' in line
        ]
        assert counts and counts[0].endswith(" 3.0"), variant


async def test_the_candidate_gets_the_same_request_streamed_as_asked_with_its_model() -> None:
    async with shadowed(
        answering(PARIS), answering(PARIS), shadow={"rewrite_model": "candidate-m"}
    ) as run:
        client = run.client()
        await ask(client, temperature=0.25)
        await client.close()
        await run.settled(1)
    (sent,) = run.primary.received
    (shadowed_request,) = run.candidate.received
    assert (sent.json["model"], shadowed_request.json["model"]) == ("m", "candidate-m")
    assert shadowed_request.json == {**sent.json, "model": "candidate-m"}
    assert shadowed_request.json["stream"] is True
    assert shadowed_request.path == sent.path == "/v1/chat/completions"
    assert run.stats.pairs == {(ROUTE, "exact"): 1}


# What a client sends that the candidate needs to understand the request the same way.
API_HEADERS = {
    "anthropic-version": "2023-06-01",
    "OpenAI-Beta": "assistants=v2",
    "X-Tenant": "blue",
}
# The client's credentials and cookies: never the candidate's business.
CREDENTIALS = {
    "x-api-key": "client-key",
    "api-key": "client-azure-key",
    "Cookie": "session=client",
    "Proxy-Authorization": "Basic Y2xpZW50",
    "X-Internal-Token": "client-internal",  # a name the configuration adds to the denylist
}


async def test_the_candidate_gets_the_clients_headers_less_credentials_plus_its_own() -> None:
    candidate = {
        "headers": {"Anthropic-Version": "2024-10-22", "X-Candidate": "on"},
        "drop_headers": ("x-internal-token",),
    }
    async with shadowed(
        answering(PARIS),
        answering(PARIS),
        candidate=candidate,
        shadow={"rewrite_model": "a-longer-candidate-model-name"},  # the body changes length
    ) as run:
        client = openai.AsyncOpenAI(
            base_url=run.agent.proxy_url + "/v1",
            api_key="client-bearer",
            default_headers={**API_HEADERS, **CREDENTIALS},
        )
        await ask(client)
        await client.close()
        await run.settled(1)
    (primary,) = run.primary.received
    (shadow,) = run.candidate.received
    # The primary got everything the client sent (the relay drops only hop-by-hop fields).
    assert primary.headers["Authorization"] == "Bearer client-bearer"
    assert primary.headers["X-Internal-Token"] == "client-internal"
    assert shadow.headers["OpenAI-Beta"] == "assistants=v2"
    assert shadow.headers["X-Tenant"] == "blue"
    # shadow.upstream.headers add and override, whatever the case of the client's name.
    assert shadow.headers.getall("anthropic-version") == ["2024-10-22"]
    assert shadow.headers["X-Candidate"] == "on"
    for name in ("Authorization", *CREDENTIALS):
        assert name not in shadow.headers, name
    # The body was re-sent whole: its own length, not the client's.
    assert shadow.json["model"] == "a-longer-candidate-model-name"
    assert int(shadow.headers["Content-Length"]) == len(shadow.body)
    assert run.stats.pairs == {(ROUTE, "exact"): 1}


async def test_the_admin_port_serves_the_shadow_summary() -> None:
    async with shadowed(answering(PARIS), answering(LYON)) as run:
        client = run.client()
        for _ in range(2):
            await ask(client)
        await client.close()
        await run.settled(2)
        async with aiohttp.ClientSession() as session:
            async with session.get(run.agent.admin_url + "/shadow") as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("application/json")
                served = orjson.loads(await response.read())
    (route,) = served["routes"]
    assert route["route"] == ROUTE and route["pairs"] == 2
    assert served["counts"]["pairs"] == {ROUTE: {"differs": 2}}


async def test_the_admin_port_says_shadowing_is_off_without_a_shadow_block() -> None:
    async with shadowed(answering(PARIS), answering(PARIS), shadow_on=False) as run:
        async with aiohttp.ClientSession() as session:
            async with session.get(run.agent.admin_url + "/shadow") as response:
                assert response.status == 404
                document = orjson.loads(await response.read())
    assert document["enabled"] is False
    assert "shadow" in document["reason"]
