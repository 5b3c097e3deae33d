"""``--record`` then ``replay``: the replay of what a live agent recorded gives the records,
relevance scores and alert decisions the live agent computed.

The live agent is real (in-process, in front of the scripted upstream, fed by the real
``openai`` SDK, scoring with the real MiniLM model); so is the replay, through the same
collectors, recorder, scorer and rules.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.demo.simulator import RawScript, ScriptRequest, SimulatedUpstream
from semhealth.agent.relevance import LoadedEncoders
from semhealth.agent.replay.inputs import ExchangeInput, read_file
from semhealth.agent.replay.pipeline import build_records
from semhealth.agent.replay.run import Options, replay
from semhealth.agent.replay.settings import RecordSettings
from semhealth.collectors import StreamRecord
from semhealth.embeddings import RelevanceScores
from tests.agent.conftest import agent_config
from tests.agent.replay.traffic import comparable, key, script_for, send_traffic
from tests.agent.test_cli import _env
from tests.agent.test_planes import _until, sidecar

# Rules that the test traffic decides: the abandoned stream is one failure in four; every
# scored answer has an answer relevance. Default rules off: they need minutes of traffic.
RULES = [
    {
        "name": "ReplayFailures",
        "signal": "request_success_rate",
        "aggregation": "ratio",
        "window": "10m",
        "op": "<",
        "threshold": 0.9,
        "min_samples": 1,
        "for": "0s",
        "group_by": ["route"],
    },
    {
        "name": "ReplayAnswered",
        "signal": "answer_relevance_score",
        "aggregation": "mean",
        "window": "10m",
        "op": ">=",
        "threshold": 0.0,
        "min_samples": 1,
        "for": "0s",
        "group_by": ["route", "model"],
    },
    {
        "name": "ReplayNeverFires",
        "signal": "time_to_first_token",
        "aggregation": "p50",
        "window": "10m",
        "op": ">",
        "threshold": 60.0,
        "min_samples": 1,
        "for": "0s",
    },
]


def _config(upstream_url: str) -> Any:
    return agent_config(
        upstream_url,
        **{
            "relevance.enabled": True,
            "relevance.profile": "fast",
            "alerts.default_rules": False,
            "alerts.rules": RULES,
            "alerts.evaluation_interval_s": 60,
        },
    )


async def _live_run(
    path: Path, loaded: LoadedEncoders
) -> tuple[list[StreamRecord], list[tuple[StreamRecord, RelevanceScores]], set[Any], Any]:
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    records: list[StreamRecord] = []
    scores: list[tuple[StreamRecord, RelevanceScores]] = []
    config = _config(upstream.url)
    agent = Agent(
        config,
        Settings(
            consumers=[records.append],
            loaded_encoders=loaded,
            record=RecordSettings(path=str(path)),
        ),
    )
    try:
        await agent.start()
        assert agent.relevance is not None
        agent.relevance.also_record(lambda record, s: scores.append((record, s)))
        await send_traffic(agent.proxy_url)
        for _ in range(200):
            if len(records) == 4 and agent.relevance.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert agent.alerting is not None
        await agent.alerting.evaluate_now()
        firing = {
            (alert.rule, tuple(sorted(alert.labels.items())))
            for alert in agent.alerting.active()
            if alert.state == "firing"
        }
    finally:
        await agent.shutdown()
        await upstream.shutdown()
    return records, scores, firing, config


async def test_replay_of_a_recording_gives_the_live_records_scores_and_alerts(
    tmp_path: Path, fast_encoders: LoadedEncoders
) -> None:
    path = tmp_path / "traffic.jsonl"
    live, live_scores, live_firing, config = await _live_run(path, fast_encoders)
    assert len(live) == 4
    assert sum(record.client_aborted for record in live) == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    # Records: field by field, times as offsets from each record's start.
    built = build_records(read_file(str(path)), config)
    assert built.problems == []
    replayed = [item.record for item in built.records]
    assert sorted(map(key, replayed)) == sorted(map(key, live))
    by_key = {key(record): record for record in replayed}
    for record in live:
        assert comparable(by_key[key(record)]) == comparable(record)
    kinds = {(r.streamed, bool(r.tool_calls), bool(r.validity)) for r in replayed}
    assert (True, True, True) in kinds  # the tool call, its arguments checked
    assert (False, False, True) in kinds  # JSON mode, checked

    # Scores and alerts: the same model, the same rules, on the recording's clock.
    outcome = await replay([str(path)], config, Options(loaded_encoders=fast_encoders))
    run = outcome.run
    assert len(run.results) == 4 and run.problems == ()
    scored = {key(record): s for record, s in live_scores}
    assert len(scored) == 3  # the abandoned stream is not scored
    results = {(r.id, r.line): r for r in run.results}
    for item in built.records:
        result = results[(item.id, item.line)]
        live_score = scored.get(key(item.record))
        if live_score is None:
            assert result.context_relevance is None
            assert result.relevance_skipped == "incomplete"
            continue
        assert result.context_relevance == pytest.approx(live_score.context, abs=1e-5)
        assert result.answer_relevance == pytest.approx(live_score.answer, abs=1e-5)
    replay_firing = _firing_at_end(run.alerts)
    assert replay_firing == live_firing
    assert {rule for rule, _labels in replay_firing} == {"ReplayFailures", "ReplayAnswered"}
    # Transitions are stamped inside the replayed span.
    assert run.start is not None and run.end is not None
    for alert in run.alerts:
        assert run.start <= alert.time <= run.end + config.alerts.evaluation_interval_s


def _firing_at_end(alerts: Any) -> set[Any]:
    state: dict[Any, str] = {}
    for alert in alerts:
        state[(alert.rule, tuple(sorted(alert.labels.items())))] = alert.state
    return {group for group, last in state.items() if last == "firing"}


async def test_semhealth_run_record_in_its_own_processes_then_replay(tmp_path: Path) -> None:
    """The two planes as ``semhealth run`` starts them: the analysis process records."""
    path = tmp_path / "live.jsonl"
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    try:
        async with sidecar(upstream.url, "--record", str(path)) as running:
            await send_traffic(running.proxy)

            async def recorded() -> bool:
                metrics = await running.metrics()
                return metrics.get("semhealth_recorded_exchanges_total", 0) >= 4

            await _until(recorded)
    finally:
        await upstream.shutdown()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    stdout, results = await replay_cli(path, tmp_path / "results.jsonl")
    assert len(results) == 4
    assert sorted(r["error_type"] for r in results) == ["", "", "", "client_aborted"]
    assert sum(bool(r["validity"]) for r in results) == 2  # JSON mode and the tool call
    assert b"chat_completions" in stdout


async def replay_cli(path: Path, out: Path) -> tuple[bytes, list[dict[str, Any]]]:
    """``semhealth replay`` of ``path`` in its own process, relevance off: its stdout, and
    the results it wrote to ``out``."""
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "replay", str(path),
        "-o", str(out), "--no-relevance",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(),
    )  # fmt: skip
    stdout, stderr = await done.communicate()
    assert done.returncode == 0, stderr.decode()
    written = await asyncio.to_thread(out.read_bytes)
    return stdout, [orjson.loads(line) for line in written.splitlines()]


def _sse(i: int) -> bytes:
    return f'data: {{"choices":[{{"delta":{{"content":"piece {i:03d} "}}}}]}}\n\n'.encode()


GZIP_STREAM = (lambda c: c.compress(b"".join(_sse(i) for i in range(20))) + c.flush())(
    zlib.compressobj(wbits=31)
)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _raw_script(request: ScriptRequest) -> RawScript:
    """Byte-exact answers: gzip in three chunks, or a stream longer than the analysis cap."""
    if request.path.endswith("/gzip/chat/completions"):
        third = len(GZIP_STREAM) // 3
        parts = (GZIP_STREAM[:third], GZIP_STREAM[third : 2 * third], GZIP_STREAM[2 * third :])
        return RawScript(
            chunks=parts,
            gaps_s=0.01,
            content_type="text/event-stream",
            headers={"Content-Encoding": "gzip"},
        )
    return RawScript(
        chunks=tuple(_sse(i) for i in range(120)), gaps_s=0.002, content_type="text/event-stream"
    )


async def test_gzip_truncated_and_traced_exchanges_replay_to_the_same_records(
    tmp_path: Path,
) -> None:
    path = tmp_path / "raw.jsonl"
    upstream = SimulatedUpstream(_raw_script)
    await upstream.start()
    records: list[StreamRecord] = []
    # A 2 KiB analysis cap: the long stream is truncated, and only its first ~2 KiB recorded.
    config = agent_config(
        upstream.url, **{"limits.max_response_bytes": 2048, "limits.max_frame_bytes": 1024}
    )
    agent = Agent(
        config, Settings(consumers=[records.append], record=RecordSettings(path=str(path)))
    )
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    try:
        await agent.start()
        async with aiohttp.ClientSession(auto_decompress=False) as client:
            for where in ("/gzip/chat/completions", "/v1/chat/completions"):
                async with client.post(
                    agent.proxy_url + where, json=body, headers={"traceparent": TRACEPARENT}
                ) as response:
                    assert response.status == 200
                    await response.read()
        for _ in range(200):
            if len(records) == 2:
                break
            await asyncio.sleep(0.02)
    finally:
        await agent.shutdown()
        await upstream.shutdown()
    built = build_records(read_file(str(path)), config)
    assert built.problems == []
    replayed = {
        record.route + str(record.truncated): record for record in map(_record, built.records)
    }
    live = {record.route + str(record.truncated): record for record in records}
    assert set(replayed) == set(live) and len(live) == 2
    for name, record in live.items():
        assert comparable(replayed[name]) == comparable(record)
    truncated = next(r for r in live.values() if r.truncated)
    assert truncated.response_bytes == sum(len(_sse(i)) for i in range(120))
    gzipped = next(r for r in live.values() if not r.truncated)
    assert gzipped.output_text == "".join(f"piece {i:03d} " for i in range(20))
    assert gzipped.trace is not None and gzipped.trace.trace_id == TRACEPARENT.split("-")[1]
    # The long stream's bytes past the cap are counted, not stored.
    inputs = [item for item in read_file(str(path)) if isinstance(item, ExchangeInput)]
    (long,) = [item.recorded for item in inputs if item.recorded.elided_bytes]
    stored = sum(len(chunk) for _offset, chunk in long.chunks)
    # Chunks are what TCP delivered: the one that crossed the cap is the last one kept.
    assert stored - len(long.chunks[-1][1]) <= 2048 < stored
    assert stored + long.elided_bytes == truncated.response_bytes


def _record(replayed: Any) -> StreamRecord:
    record: StreamRecord = replayed.record
    return record


async def test_an_oversized_request_replays_to_the_prompt_class_its_size_gave_live(
    tmp_path: Path,
) -> None:
    # The body is not recorded (over limits.max_request_bytes); its size is, and it classes it.
    path = tmp_path / "oversized.jsonl"
    upstream = SimulatedUpstream(lambda r: RawScript(chunks=(b"{}",), content_type="text/plain"))
    await upstream.start()
    records: list[StreamRecord] = []
    config = agent_config(
        upstream.url, **{"limits.max_request_bytes": 1000, "analysis.long_context_tokens": 1000}
    )
    agent = Agent(
        config, Settings(consumers=[records.append], record=RecordSettings(path=str(path)))
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
    try:
        await agent.start()
        async with aiohttp.ClientSession() as client:
            async with client.post(agent.proxy_url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
        for _ in range(200):
            if records:
                break
            await asyncio.sleep(0.02)
    finally:
        await agent.shutdown()
        await upstream.shutdown()
    built = build_records(read_file(str(path)), config)
    assert built.problems == []
    (replayed,) = map(_record, built.records)
    (live,) = records
    assert live.request.skip_reason == "oversized"
    assert (replayed.prompt_class, live.prompt_class) == ("long_context", "long_context")
