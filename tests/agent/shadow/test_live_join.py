"""The shadow component on its own and its opt-in diff log: the join table expires pairs
whose partner never comes (counted), the budget refills with time, and the diff log is off
unless configured and, when on, private (0600) and capped. A failing open hook never costs
the tap its stream."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.analysis.tap import Tap
from semhealth.agent.config import (
    TLS,
    ConfigError,
    DiffLog,
    ShadowSettings,
    ShadowUpstream,
    Timeouts,
    Tolerances,
    check_config_file,
    load_config,
)
from semhealth.agent.demo.simulator import SimulatedUpstream
from semhealth.agent.shadow.live import Shadow, TokenBucket
from semhealth.agent.shadow.offline import send_request
from semhealth.agent.wire import Outcome
from semhealth.collectors import Exchange, StreamRecord
from semhealth.collectors.config import default_config
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


async def _proxied_record(upstream_url: str) -> StreamRecord:
    """The record the sidecar's proxy makes of one streamed question to ``upstream_url``."""
    records: list[StreamRecord] = []
    agent = Agent(agent_config(upstream_url), Settings(consumers=[records.append]))
    await agent.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                agent.proxy_url + "/v1/chat/completions", data=BODY
            ) as response:
                with contextlib.suppress(aiohttp.ClientPayloadError):  # a cut stream
                    await response.read()
        deadline = time.monotonic() + 5.0
        while not records:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    finally:
        await agent.shutdown()
    (record,) = records
    return record


async def test_a_candidate_that_dies_mid_stream_is_recorded_as_the_proxy_records_it() -> None:
    primary = SimulatedUpstream(answering(PARIS))
    dying = SimulatedUpstream(answering(LYON, ttft_s=0.2, die_after=3))
    await primary.start()
    await dying.start()
    collectors = agent_config(primary.url).collectors
    candidate_records: list[StreamRecord] = []
    shadow = Shadow(
        ShadowSettings(upstream=ShadowUpstream(url=dying.url), routes=(ROUTE,), sample_rate=1.0),
        collectors,
        record_shadow=candidate_records.append,
    )
    await shadow.start()
    try:
        proxied = await _proxied_record(dying.url)
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            record = await send_request(
                session, primary.url, {}, "POST", "/v1/chat/completions", BODY, collectors
            )
        shadow.on_open(_exchange_of(record))
        shadow.consume_record(record)
        deadline = time.monotonic() + 5.0
        while not shadow.recent_pairs():
            assert time.monotonic() < deadline, shadow.stats
            await asyncio.sleep(0.02)
    finally:
        await shadow.shutdown()
        await primary.shutdown()
        await dying.shutdown()
    (candidate,) = candidate_records
    # What the proxy recorded of the same cut stream: a 200 whose body broke off.
    assert (proxied.status, proxied.error_type, proxied.upstream_aborted) == (
        200,
        "upstream_aborted",
        True,
    )
    assert proxied.output_text == "The capital of "
    for name in ("status", "error_type", "upstream_aborted", "output_text", "done", "truncated"):
        assert getattr(candidate, name) == getattr(proxied, name), name
    assert len(candidate.delta_ns) == len(proxied.delta_ns) == 3
    assert candidate.ttft_s is not None and 0.2 <= candidate.ttft_s < 1.2
    (pair,) = shadow.recent_pairs()
    assert pair.result == "candidate_error"
    assert (pair.shadow.status, pair.shadow.error_type) == (200, "upstream_aborted")
    assert pair.shadow.ttft_s == candidate.ttft_s


async def test_a_candidate_silent_before_its_response_head_is_the_proxys_504() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)  # the request, then nothing
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    collectors = agent_config("http://127.0.0.1:1").collectors
    try:
        timeout = aiohttp.ClientTimeout(sock_read=0.3)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            record = await send_request(
                session,
                f"http://127.0.0.1:{port}",
                {},
                "POST",
                "/v1/chat/completions",
                BODY,
                collectors,
            )
    finally:
        server.close()
    assert (record.status, record.error_type, record.upstream_aborted) == (
        504,
        "upstream_timeout",
        False,
    )


def _exchange_of(record: StreamRecord) -> Exchange:
    """The exchange the tap would have opened for ``record``'s request."""
    return Exchange(
        method="POST",
        path="/v1/chat/completions",
        start_ns=record.start_ns,
        status=record.status,
        content_type="text/event-stream",
        content_encoding=None,
        response_ns=record.response_ns,
        request_body=BODY,
    )


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


# The route names a file without ``routes:`` has, in order: what the message lists.
DEFAULT_ROUTES = ", ".join(dict.fromkeys(route.name for route in default_config().routes))


def _issues(path: Path) -> list[str]:
    return [
        f"{issue.path}: {issue.message} (fix: {issue.fix})"
        for issue in check_config_file(str(path), {})
    ]


def test_a_shadow_route_that_names_no_route_is_a_config_error_listing_the_routes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:9'}\n"
        "shadow:\n"
        "  upstream: {url: 'http://127.0.0.1:8'}\n"
        "  routes: [chat_completions, chat_completion]\n"
    )
    assert _issues(path) == [
        "shadow.routes[1]: no route is named 'chat_completion'"
        f" (fix: did you mean 'chat_completions'? (one of: {DEFAULT_ROUTES}))"
    ]
    (issue,) = check_config_file(str(path), {})
    assert issue.line == 4  # the routes line: the config checks locate it in the file


def test_shadow_routes_are_checked_against_the_routes_the_file_defines(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:9'}\n"
        "routes:\n"
        "  - {name: chat, match: /v1/chat/completions}\n"
        "  - {name: rag, match: /rag/answer}\n"
        "shadow:\n"
        "  upstream: {url: 'http://127.0.0.1:8'}\n"
        "  routes: [chat, chat_completions]\n"
    )
    assert _issues(path) == [
        "shadow.routes[1]: no route is named 'chat_completions' (fix: use one of: chat, rag)"
    ]


async def test_semhealth_config_check_refuses_an_unknown_shadow_route(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:9'}\n"
        "shadow: {upstream: {url: 'http://127.0.0.1:8'}, routes: [mesages]}\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "config", "check", str(path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert "shadow.routes[0]: no route is named 'mesages'" in err.decode()
    assert "did you mean 'messages'?" in err.decode()


def test_an_empty_shadow_routes_list_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:9'}\n"
        "shadow: {upstream: {url: 'http://127.0.0.1:8'}, routes: []}\n"
    )
    (issue,) = check_config_file(str(path), {})
    assert issue.path == "shadow.routes"


def test_a_shadow_block_without_a_candidate_is_refused(tmp_path: Path) -> None:
    # It would shadow nothing, and semhealth diff would drop its tolerances, both silently.
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:9'}\nshadow:\n  tolerances: {max_token_distance: 0.1}\n"
    )
    (issue,) = check_config_file(str(path), {})
    assert (issue.path, issue.line) == ("shadow", 2)
    assert "upstream" in issue.message
