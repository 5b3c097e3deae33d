"""``semhealth replay`` on each kind of input, and on bad input: HAR captures (bodies as real
servers sent them, one binary), OTLP JSON as the Collector's file exporter writes it (spans
from a real GenAI instrumentation of the real ``openai`` SDK), and a recording with a broken
line in the middle and a truncated last line, through the real command line; and the HTML
report ``--report`` writes from a real recording."""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import load_config
from semhealth.agent.demo.simulator import SimulatedUpstream
from semhealth.agent.replay.run import Options, replay
from semhealth.agent.replay.settings import RecordSettings
from tests.agent.conftest import agent_config
from tests.agent.otlp_receiver import GrpcReceiver, resource_attributes
from tests.agent.replay.test_report import Page
from tests.agent.replay.traffic import CONTEXT, script_for, send_traffic

ROOT = Path(__file__).resolve().parents[3]
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
TIMINGS = {"blocked": 1.5, "dns": -1, "ssl": -1, "connect": -1, "send": 0.2, "wait": 120.3}


def _config() -> Any:
    return load_config(None, {}, {"upstream.url": "http://127.0.0.1:9", "relevance.enabled": True})


# -- HAR ----------------------------------------------------------------------------------------


async def _captured(url: str, body: dict[str, Any]) -> tuple[str, str]:
    """The response body and content type the scripted upstream really sends."""
    async with aiohttp.ClientSession() as client:
        async with client.post(url + "/v1/chat/completions", json=body) as response:
            return await response.text(), response.headers["Content-Type"]


def _entry(
    started: datetime.datetime,
    url: str,
    request: dict[str, Any],
    content_type: str,
    content: dict[str, Any],
    receive_ms: float,
) -> dict[str, Any]:
    """One entry as Chrome's DevTools writes it ("Save all as HAR with content")."""
    wait = sum(v for v in TIMINGS.values() if v > 0)
    return {
        "_resourceType": "fetch",
        "startedDateTime": started.isoformat().replace("+00:00", "Z"),
        "time": wait + receive_ms,
        "request": {
            "method": "POST",
            "url": url,
            "httpVersion": "HTTP/1.1",
            "headers": [{"name": "Content-Type", "value": "application/json"}],
            "queryString": [],
            "cookies": [],
            "headersSize": -1,
            "bodySize": len(orjson.dumps(request)),
            "postData": {"mimeType": "application/json", "text": orjson.dumps(request).decode()},
        },
        "response": {
            "status": 200,
            "statusText": "OK",
            "httpVersion": "HTTP/1.1",
            "headers": [{"name": "content-type", "value": content_type}],
            "cookies": [],
            "content": {"size": len(content.get("text", "")), "mimeType": content_type, **content},
            "redirectURL": "",
            "headersSize": -1,
            "bodySize": -1,
            "_transferSize": 900,
        },
        "cache": {},
        "timings": {**TIMINGS, "receive": receive_ms},
        "serverIPAddress": "127.0.0.1",
    }


async def _har(path: Path) -> None:
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    try:
        messages = [
            {"role": "system", "content": CONTEXT},
            {"role": "user", "content": "What is the capital of France?"},
        ]
        streamed = {
            "model": "gpt-test",
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        json_mode = {
            "model": "gpt-test",
            "messages": [messages[0], {"role": "user", "content": "Answer in JSON: where?"}],
            "response_format": {"type": "json_object"},
        }
        sse, sse_type = await _captured(upstream.url, streamed)
        body, body_type = await _captured(upstream.url, json_mode)
    finally:
        await upstream.shutdown()
    url = "https://llm.example.com/v1/chat/completions?api-version=1"
    t0 = datetime.datetime(2026, 12, 1, 12, 0, 0, 125000, tzinfo=datetime.UTC)
    second = datetime.timedelta(seconds=1)
    entries = [
        _entry(t0, url, streamed, sse_type, {"text": sse}, 210.0),
        # Firefox stores some text bodies as base64: still text, so still replayed.
        _entry(
            t0 + second,
            url,
            json_mode,
            body_type,
            {"text": base64.b64encode(body.encode()).decode(), "encoding": "base64"},
            3.0,
        ),
        _entry(
            t0 + 2 * second,
            url,
            json_mode,
            "image/png",
            {"text": base64.b64encode(PNG).decode(), "encoding": "base64"},
            1.0,
        ),
    ]
    document = {
        "log": {
            "version": "1.2",
            "creator": {"name": "WebInspector", "version": "537.36"},
            "pages": [],
            "entries": entries,
        }
    }
    await asyncio.to_thread(path.write_bytes, orjson.dumps(document, option=orjson.OPT_INDENT_2))


async def test_har_bodies_are_replayed_without_inventing_chunk_times(tmp_path: Path) -> None:
    path = tmp_path / "capture.har"
    await _har(path)
    outcome = await replay([str(path)], _config(), Options())
    run = outcome.run
    (problem,) = run.problems
    assert problem.line == 3 and problem.source_file == str(path)
    assert "HAR entry 3" in problem.error and "binary" in problem.error
    streamed, json_mode = sorted(run.results, key=lambda r: r.time)
    t0 = datetime.datetime(2026, 12, 1, 12, 0, 0, 125000, tzinfo=datetime.UTC).timestamp()
    assert streamed.time == pytest.approx(t0, abs=1e-6)
    assert (streamed.line, json_mode.line) == (1, 2)
    for result in (streamed, json_mode):
        assert not result.chunk_times
        assert result.ttft_s is None and result.continuity_index_s is None
        assert result.ttfb_s == pytest.approx((1.5 + 0.2 + 120.3) / 1000)
        assert result.status == 200 and result.error_type == ""
        assert result.context_relevance is not None and result.answer_relevance is not None
    assert streamed.duration_s == pytest.approx((1.5 + 0.2 + 120.3 + 210.0) / 1000)
    assert streamed.output_tokens == 7
    assert json_mode.validity == (("valid", ()),)


# -- OTLP JSON ----------------------------------------------------------------------------------


def _hex_ids(node: Any) -> Any:
    """protobuf's JSON mapping writes bytes as base64; OTLP JSON writes ids as hex."""
    if isinstance(node, dict):
        return {
            k: base64.b64decode(v).hex()
            if k in ("traceId", "spanId", "parentSpanId")
            else _hex_ids(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids(item) for item in node]
    return node


def test_otlp_json_from_a_real_instrumentation_is_replayed(tmp_path: Path) -> None:
    from tests.agent.otlp.test_genai_instrumented import QUESTION, SERVICE, _records, _run_app

    spans, logs = _run_app("openai_v2", tmp_path)
    path = tmp_path / "traces.json"
    metrics: dict[str, Any] = {"resourceMetrics": [{"resource": {}, "scopeMetrics": []}]}
    lines = [
        orjson.dumps(_hex_ids(MessageToDict(spans))),
        orjson.dumps(metrics),
        orjson.dumps(_hex_ids(MessageToDict(logs))),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    config = load_config(None, {}, {"upstream.url": "http://127.0.0.1:9"})
    run = asyncio.run(replay([str(path)], config, Options(relevance=False))).run
    (problem,) = run.problems
    assert problem.line == 2 and "metrics" in problem.error
    direct, _traces = _records(spans, logs)  # the protobuf, straight into GenAITraces
    assert len(run.results) == len(direct) == 2
    for result, record in zip(sorted(run.results, key=lambda r: r.time), direct, strict=True):
        assert record.trace is not None
        assert result.id == f"{record.trace.trace_id}/{record.trace.span_id}"
        assert result.source == "otlp" and result.route == SERVICE
        assert result.time == record.start_ns / 1e9
        assert result.duration_s == record.duration_s
        assert result.output_tokens == record.usage.output_tokens
        assert result.validity == tuple((v.result, v.reasons) for v in record.validity)
    assert direct[0].request.query == QUESTION


# -- a recording with bad lines, through the command line --------------------------------------


def _env() -> dict[str, str]:
    # The checkout's own package first, then whatever the caller put on the path: replacing
    # PYTHONPATH would run the installed semhealth, not the tree under test.
    paths = [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1"}


def _replay_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semhealth.agent.cli", "replay", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        cwd=ROOT,
    )


async def _record(path: Path) -> None:
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    agent = Agent(agent_config(upstream.url), Settings(record=RecordSettings(path=str(path))))
    try:
        await agent.start()
        await send_traffic(agent.proxy_url)
    finally:
        await agent.shutdown()
        await upstream.shutdown()


async def test_bad_lines_are_named_and_the_rest_is_replayed(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    await _record(path)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 4
    broken = [lines[0], b'{"v": 1, "id": "x", "time": "noon"}', lines[1], lines[2], lines[3][:-40]]
    path.write_bytes(b"\n".join(broken))  # the last line cut mid-way, as a crash leaves it
    out = tmp_path / "results.jsonl"
    done = await asyncio.to_thread(_replay_cli, str(path), "-o", str(out), "--no-relevance")
    assert done.returncode == 0, done.stderr
    problems = [
        line
        for line in done.stderr.splitlines()
        if line.startswith("semhealth replay: " + str(path))
    ]
    assert problems == [
        f"semhealth replay: {path}:2: field 'time' is missing or not of type integer or number",
        f"semhealth replay: {path}:5: not JSON (the line ends early: truncated?)",
    ]
    results = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["line"] for r in results) == [1, 3, 4]
    for result in results:
        assert set(result) >= {"id", "route", "ttft_s", "validity", "context_relevance"}
        assert "What is" not in orjson.dumps(result).decode()  # no text in results
    table = done.stdout.splitlines()
    assert table[0].split()[:3] == ["route", "records", "validity"]
    assert table[2].split()[:2] == ["chat_completions", "3"]


# -- known chunk times ---------------------------------------------------------------------------

MS = 1_000_000  # ns
HEAD_MS = 50  # every response head arrives 50 ms in: the TTFB, which no TTFT may be mistaken for


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    event = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "gpt-test",
        "choices": [choice],
    }
    return "data: " + orjson.dumps(event).decode() + "\n\n"


def _timed_line(n: int, ttft_ms: int) -> bytes:
    """A recording line whose first content delta arrives ``ttft_ms`` after the request;
    a role-only chunk at the head's time comes first, as OpenAI sends it."""
    request = {"model": "gpt-test", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    chunks = [
        [HEAD_MS * MS, _chunk({"role": "assistant", "content": ""})],
        [ttft_ms * MS, _chunk({"content": "Paris"})],
        [(ttft_ms + 10) * MS, _chunk({"content": " it is."})],
        [(ttft_ms + 20) * MS, _chunk({}, "stop") + "data: [DONE]\n\n"],
    ]
    line = {
        "v": 1,
        "id": f"{n:032x}",
        "time": 1_800_000_000 + 10 * n,
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "content_type": "text/event-stream",
        "content_encoding": None,
        "ratelimit_source": None,
        "response_offset_ns": HEAD_MS * MS,
        "request": {"text": orjson.dumps(request).decode()},
        "request_skip": None,
        "chunks": chunks,
        "elided_bytes": 0,
        "outcome": {
            "end_offset_ns": (ttft_ms + 21) * MS,
            "client_aborted": False,
            "upstream_aborted": False,
            "error_type": None,
            "shed": False,
        },
    }
    return orjson.dumps(line) + b"\n"


# Eleven streams whose first content arrives at 100, 200, ... 1100 ms: with linear
# interpolation (NumPy's default) the p50 is the sixth, 600 ms, and the p95 lies halfway
# between the tenth and the eleventh, 1050 ms.
TTFTS_MS = [100 * (i + 1) for i in range(11)]


async def test_a_replayed_records_ttft_is_its_first_content_deltas_time(tmp_path: Path) -> None:
    path = tmp_path / "timed.jsonl"
    path.write_bytes(b"".join(_timed_line(n, ms) for n, ms in enumerate(TTFTS_MS)))
    out = tmp_path / "results.jsonl"
    done = await asyncio.to_thread(_replay_cli, str(path), "-o", str(out), "--no-relevance")
    assert done.returncode == 0, done.stderr
    results = sorted(
        (orjson.loads(line) for line in out.read_bytes().splitlines()), key=lambda r: r["line"]
    )
    assert [r["ttft_s"] for r in results] == [ms * MS / 1e9 for ms in TTFTS_MS]
    assert {r["ttfb_s"] for r in results} == {HEAD_MS * MS / 1e9}


async def test_the_summary_tables_ttft_columns_are_the_p50_and_the_p95(tmp_path: Path) -> None:
    path = tmp_path / "timed.jsonl"
    path.write_bytes(b"".join(_timed_line(n, ms) for n, ms in enumerate(TTFTS_MS)))
    done = await asyncio.to_thread(_replay_cli, str(path), "--no-relevance")
    assert done.returncode == 0, done.stderr
    table = _table(done.stdout)
    assert table["route"] == "chat_completions" and table["records"] == "11"
    assert (table["ttft p50"], table["ttft p95"]) == ("600 ms", "1050 ms")


def _table(stdout: str) -> dict[str, str]:
    """The summary table's first route row, by column name."""
    header, rule, row = stdout.splitlines()[:3]
    # The rule under the header marks each column's span.
    spans = [match.span() for match in re.finditer(r"-+", rule)]
    return {header[a:b].strip(): row[a:b].strip() for a, b in spans}


async def test_the_report_flag_writes_the_page_of_a_real_recording(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    await _record(path)
    report = tmp_path / "report.html"
    out = tmp_path / "results.jsonl"
    done = await asyncio.to_thread(_replay_cli, str(path), "-o", str(out), "--report", str(report))
    assert done.returncode == 0, done.stderr
    page = Page(report.read_text(encoding="utf-8"))
    sections = [attrs.get("id") for tag, attrs in page.tags if tag == "section"]
    assert sections == [
        "overview", "routes", "relevance", "relevance-time", "continuity", "ttft", "validity",
        "alerts", "problems",
    ]  # fmt: skip
    # A plot for what the recording has; none where it has nothing to draw.
    assert sorted(page.svgs()) == ["continuity", "relevance", "relevance-time", "ttft"]
    assert page.section_text("validity").count("no data") == 1  # every JSON answer was valid
    assert page.section_text("alerts").count("no data") == 1
    results = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert f"{len(results)}records replayed" in page.section_text("overview")
    assert str(path) in page.section_text("overview")
    assert "Every line of every file was replayed." in page.section_text("problems")
    # The route row agrees with the results and with the table printed beside it.
    row = next(row for row in page.rows if row and row[0] == "chat_completions")
    errors = sum(1 for result in results if result["error_type"])
    assert row[1:3] == [str(len(results)), str(errors)]
    table = _table(done.stdout)
    assert row[7:9] == [table["ttft p50"], table["ttft p95"]]


async def test_exit_codes(tmp_path: Path) -> None:
    missing = await asyncio.to_thread(_replay_cli, str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    junk = tmp_path / "junk.jsonl"
    junk.write_text("hello\n")
    nothing = await asyncio.to_thread(_replay_cli, str(junk), "--no-relevance")
    assert nothing.returncode == 1
    assert f"{junk}:1: not JSON" in nothing.stderr
    assert "no record could be replayed" in nothing.stderr
    config = tmp_path / "bad.yaml"
    config.write_text("alerts:\n  evaluation_interval_s: -1\n")
    bad = await asyncio.to_thread(_replay_cli, str(junk), "--config", str(config))
    assert bad.returncode == 2 and "alerts.evaluation_interval_s" in bad.stderr


async def test_otlp_push_sends_the_replayed_metrics_once(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    await _record(path)
    receiver = GrpcReceiver()
    await receiver.start()
    try:
        done = await asyncio.to_thread(
            _replay_cli, str(path), "--no-relevance", "--otlp-push", receiver.endpoint
        )
        assert done.returncode == 0, done.stderr
        assert f"metrics pushed to {receiver.endpoint}" in done.stderr
        assert len(receiver.requests) == 1
        values = receiver.values()
        resource = resource_attributes(receiver.requests)
    finally:
        await receiver.shutdown()
    requests = {
        dict(attrs)["error_type"]: value
        for (name, attrs), value in values.items()
        if name == "semantic_health_requests"
    }
    assert requests == {"": 3, "client_aborted": 1}
    assert resource["semhealth.replay"] is True
    # Nothing listens there any more: the push fails, and says so.
    down = await asyncio.to_thread(
        _replay_cli, str(path), "--no-relevance", "--otlp-push", receiver.endpoint
    )
    assert down.returncode == 1
    assert f"metrics could NOT be pushed to {receiver.endpoint}" in down.stderr


async def test_alerts_go_pending_fire_and_resolve_on_the_replayed_clock(tmp_path: Path) -> None:
    """A recorded success and a recorded abandoned stream, laid out over 7 minutes: good,
    then failing, then good again. The rule's ``for`` is counted in replayed time."""
    source = tmp_path / "rec.jsonl"
    await _record(source)
    lines = [orjson.loads(line) for line in source.read_bytes().splitlines()]
    good = next(line for line in lines if not line["outcome"]["client_aborted"])
    bad = next(line for line in lines if line["outcome"]["client_aborted"])
    t0 = 1_790_000_000.0
    timeline = []
    for index in range(30):  # one exchange every 15 s; failing from 150 s to 285 s
        line = dict(bad if 10 <= index < 20 else good, id=f"x{index}", time=t0 + 15 * index)
        timeline.append(orjson.dumps(line))
    path = tmp_path / "timeline.jsonl"
    path.write_bytes(b"\n".join(timeline) + b"\n")
    rule = {
        "name": "Failing",
        "signal": "request_success_rate",
        "aggregation": "ratio",
        "window": "1m",
        "op": "<",
        "threshold": 0.5,
        "min_samples": 1,
        "for": "30s",
    }
    config = load_config(
        None,
        {},
        {
            "upstream.url": "http://127.0.0.1:9",
            "alerts.default_rules": False,
            "alerts.rules": [rule],
            "alerts.evaluation_interval_s": 15,
        },
    )
    run = (await replay([str(path)], config, Options(relevance=False))).run
    assert [(a.rule, a.state) for a in run.alerts] == [
        ("Failing", "pending"),
        ("Failing", "firing"),
        ("Failing", "resolved"),
    ]
    pending, firing, resolved = (a.time - t0 for a in run.alerts)
    assert 150 < pending < 210  # the window turns under 0.5 a few failures in
    assert firing - pending >= 30  # ``for`` counted on the recording's clock
    assert 300 < resolved < 375  # after the failures leave the 1 minute window
    assert run.alerts[1].value is not None and run.alerts[1].value < 0.5
    assert run.start == pytest.approx(t0) and run.end is not None and run.end > t0 + 435
