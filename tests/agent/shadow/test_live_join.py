"""The shadow component on its own and its opt-in diff log: the join table expires pairs
whose partner never comes (counted), the budget refills with time, and the diff log is off
unless configured and, when on, private (0600) and capped. A failing open hook never costs
the tap its stream."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from semhealth.agent.analysis.tap import Tap
from semhealth.agent.config import (
    TLS,
    ConfigError,
    DiffLog,
    ShadowSettings,
    ShadowUpstream,
    Timeouts,
    Tolerances,
    load_config,
)
from semhealth.agent.demo.simulator import SimulatedUpstream
from semhealth.agent.shadow.live import Shadow, TokenBucket
from semhealth.agent.shadow.offline import send_request
from semhealth.agent.wire import Outcome
from semhealth.collectors import Exchange, StreamRecord
from tests.agent.conftest import agent_config
from tests.agent.shadow.test_live import LYON, PARIS, ROUTE, answering, ask, shadowed

BODY = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "?"}]})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_token_bucket_allows_its_rate_and_refills_with_time() -> None:
    clock = Clock()
    bucket = TokenBucket(2, clock)
    assert [bucket.take(), bucket.take(), bucket.take()] == [True, True, False]
    clock.now += 30.0  # one request's worth at 2 a minute
    assert [bucket.take(), bucket.take()] == [True, False]


def test_bad_settings_are_refused_naming_the_key() -> None:
    settings = ShadowSettings(
        upstream=ShadowUpstream(url="ftp://x"), sample_rate=2.0, max_concurrent=0
    )
    problems = [str(issue) for issue in settings.validate()]
    assert any(p.startswith("upstream.url") for p in problems)
    assert any(p.startswith("sample_rate") for p in problems)
    assert any(p.startswith("max_concurrent") for p in problems)
    with pytest.raises(ValueError, match=r"shadow\.sample_rate"):
        Shadow(settings, agent_config("http://127.0.0.1:1").collectors)


async def test_a_shadow_whose_primary_never_comes_expires_and_is_counted() -> None:
    primary, candidate = SimulatedUpstream(answering(PARIS)), SimulatedUpstream(answering(LYON))
    await primary.start()
    await candidate.start()
    collectors = agent_config(primary.url).collectors
    clock = Clock()
    shadow = Shadow(
        ShadowSettings(
            upstream=ShadowUpstream(url=candidate.url),
            routes=(ROUTE,),
            sample_rate=1.0,
            join_timeout_s=60.0,
        ),
        collectors,
        clock=clock,
    )
    await shadow.start()
    try:
        # A real primary answer, analysed as the tap would; the shadow is told of its
        # exchange (same start) but never gets the record: it stays waiting.
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            record = await send_request(
                session, primary.url, {}, "POST", "/v1/chat/completions", BODY, collectors
            )
        exchange = Exchange(
            method="POST",
            path="/v1/chat/completions",
            start_ns=record.start_ns,
            status=200,
            content_type="text/event-stream",
            content_encoding=None,
            response_ns=record.response_ns,
            request_body=BODY,
        )
        shadow.on_open(exchange)
        deadline = time.monotonic() + 5.0
        while len(candidate.received) < 1 or shadow.stats.in_flight:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert shadow.stats.waiting == 1
        assert shadow.expire() == 0  # not yet late
        clock.now += 61.0
        assert shadow.expire() == 1
        shadow.consume_record(record)  # too late: its shadow is gone
        await asyncio.sleep(0.05)
    finally:
        await shadow.shutdown()
        await primary.shutdown()
        await candidate.shutdown()
    assert shadow.stats.shed == {(ROUTE, "expired"): 1}
    assert shadow.stats.pairs == {(ROUTE, "shed"): 1}
    assert shadow.recent_pairs() == []
    assert shadow.stats.waiting == 0 and shadow.stats.errors == 0


async def test_the_diff_log_is_off_by_default() -> None:
    assert ShadowSettings(upstream=ShadowUpstream(url="http://x")).diff_log is None
    async with shadowed(
        answering(PARIS), answering(LYON), shadow={"tolerances": Tolerances(max_token_distance=0.1)}
    ) as run:
        client = run.client()
        await ask(client)
        await client.close()
        await run.settled(1)
    assert run.stats.pairs == {(ROUTE, "differs"): 1}  # a bad pair, and nothing written
    assert (run.stats.diff_log_lines, run.stats.diff_log_dropped) == (0, 0)


async def test_the_diff_log_when_on_holds_the_worst_pairs_private_and_capped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "diff.jsonl"
    path.write_bytes(b"")
    path.chmod(0o644)  # an existing file is made private too: it will hold text
    cap = 500
    settings = {
        "tolerances": Tolerances(max_token_distance=0.1),  # one word in seven is too many
        "diff_log": DiffLog(path=str(path), max_bytes=cap),
    }
    async with shadowed(answering(PARIS), answering(LYON), shadow=settings) as run:
        client = run.client()
        for _ in range(3):
            await ask(client)
        await client.close()
        await run.settled(3)
        deadline = time.monotonic() + 5.0
        while run.stats.diff_log_lines + run.stats.diff_log_dropped < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert (run.stats.diff_log_lines, run.stats.diff_log_dropped) == (1, 2)
    data = path.read_bytes()
    assert len(data) <= cap
    (line,) = [orjson.loads(raw) for raw in data.splitlines()]
    assert line["exchange_id"] in {pair.exchange_id for pair in run.pairs()}
    assert (line["primary_text"], line["shadow_text"]) == ("".join(PARIS), "".join(LYON))
    assert line["token_distance"] == pytest.approx(1 / 7)
    assert line["first_divergence"] == 5


async def test_a_failing_open_hook_is_counted_and_the_stream_still_analysed() -> None:
    records: list[StreamRecord] = []

    def broken(_exchange: Exchange) -> None:
        raise RuntimeError("a bug in the hook")

    tap = Tap(agent_config("http://127.0.0.1:1").collectors, records.append, on_open=broken)
    await tap.start()
    exchange = Exchange(
        method="POST",
        path="/v1/chat/completions",
        start_ns=time.monotonic_ns(),
        status=200,
        content_type="application/json",
        content_encoding=None,
        response_ns=time.monotonic_ns(),
        request_body=BODY,
    )
    stream = tap.open_stream(exchange)
    stream.offer(b'{"choices":[{"message":{"content":"ok"}}]}', time.monotonic_ns())
    stream.close(Outcome(end_ns=time.monotonic_ns()))
    await tap.shutdown()
    assert tap.stats.analysis_errors == 1
    assert [record.output_text for record in records] == ["ok"]


def test_the_yaml_shadow_block_becomes_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:9'}\n"
        "shadow:\n"
        "  upstream:\n"
        "    url: https://candidate:8443\n"
        "    tls: {verify: false}\n"
        "    timeouts: {connect_s: 2, read_s: 30, total_s: 60}\n"
        "    headers: {Authorization: Bearer c}\n"
        "    drop_headers: [X-Internal-Token]\n"
        "  rewrite: {model: m2}\n"
        "  routes: [chat_completions]\n"
        "  sample_rate: 0.25\n"
        "  tolerances: {min_agreement: 0.9}\n"
        "  diff_log: {path: /var/lib/semhealth/diff.jsonl}\n"
    )
    settings = load_config(str(path), {}, {}).shadow
    assert settings is not None
    assert settings.upstream == ShadowUpstream(
        url="https://candidate:8443",
        tls=TLS(verify=False),
        timeouts=Timeouts(connect_s=2, read_s=30, total_s=60),
        headers={"Authorization": "Bearer c"},
        drop_headers=("X-Internal-Token",),
    )
    assert "x-internal-token" in settings.upstream.dropped_headers()
    assert (settings.rewrite_model, settings.routes, settings.sample_rate) == (
        "m2",
        ("chat_completions",),
        0.25,
    )
    assert settings.methods == ("POST",) and settings.max_per_minute == 60
    assert settings.tolerances == Tolerances(min_agreement=0.9)
    assert settings.diff_log == DiffLog(path="/var/lib/semhealth/diff.jsonl")
    assert settings.validate() == []
    assert load_config(None, {}, {"upstream.url": "http://127.0.0.1:9"}).shadow is None


def test_a_bad_shadow_block_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:9'}\n"
        "shadow: {upstream: {url: 'ftp://candidate'}, sample_rate: 0.5}\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(str(path), {}, {})
    assert "shadow.upstream.url" in str(raised.value)
