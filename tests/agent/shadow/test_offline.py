"""``semhealth diff`` offline: recorded requests sent again to a candidate, and two recordings
of the same requests, give the pair measures their known differences imply."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream
from semhealth.agent.relevance import LoadedEncoders
from semhealth.agent.replay.settings import RecordSettings
from semhealth.agent.shadow.diff import default_segmenter
from semhealth.agent.shadow.offline import (
    Candidate,
    ask_candidate,
    candidate_url,
    diff_candidate,
    diff_recordings,
    exchanges,
)
from semhealth.agent.shadow.pairs import PairResult
from tests.agent.conftest import agent_config

SEGMENT = default_segmenter()
PARIS = ("The ", "capital ", "of ", "France ", "is ", "Paris", ".")
LYON = ("The ", "capital ", "of ", "France ", "is ", "Lyon", ".")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def answering(pieces: Sequence[str]) -> SimulatedUpstream:
    def script(request: ScriptRequest) -> Script:
        if b"response_format" in request.body:
            city = "Paris" if "Paris" in pieces else "Lyon"
            return Script(pieces=('{"city": ', f'"{city}"', "}"))
        return Script(pieces=tuple(pieces))

    return SimulatedUpstream(script)


async def ask(proxy_url: str, requests: int) -> None:
    """``requests`` streamed questions, then one JSON-mode one, through the openai SDK."""
    client = openai.AsyncOpenAI(base_url=proxy_url + "/v1", api_key="k")
    for _ in range(requests):
        stream = await client.chat.completions.create(
            model="m",
            messages=QUESTION,
            stream=True,  # type: ignore[arg-type]
        )
        async for _chunk in stream:
            pass
    await client.chat.completions.create(
        model="m",
        messages=QUESTION,  # type: ignore[arg-type]
        response_format={"type": "json_object"},
    )
    await client.close()


async def record_traffic(upstream_url: str, path: Path, requests: int = 4) -> None:
    """Streamed questions (and one JSON-mode one) through a sidecar that records them."""
    agent = Agent(agent_config(upstream_url), Settings(record=RecordSettings(path=str(path))))
    await agent.start()
    try:
        await ask(agent.proxy_url, requests)
    finally:
        await agent.shutdown()


def _text_pairs(pairs: Sequence[PairResult]) -> list[PairResult]:
    return [pair for pair in pairs if pair.json is None]


async def test_a_candidate_that_differs_by_one_word_gives_the_known_measures(
    tmp_path: Path, fast_encoders: LoadedEncoders
) -> None:
    primary, candidate = answering(PARIS), answering(LYON)
    await primary.start()
    await candidate.start()
    try:
        recording = tmp_path / "primary.jsonl"
        await record_traffic(primary.url, recording)
        compared = await diff_candidate(
            [str(recording)],
            Candidate(url=candidate.url + "/v1"),
            agent_config(primary.url, **{"relevance.enabled": True, "relevance.profile": "fast"}),
            SEGMENT,
            loaded=fast_encoders,
        )
    finally:
        await primary.shutdown()
        await candidate.shutdown()
    # A base URL ending in /v1, as the docs write it, never doubles the recorded /v1.
    assert {r.path for r in candidate.received} == {r.path for r in primary.received}
    assert all(r.path.startswith("/v1/") and "/v1/v1/" not in r.path for r in candidate.received)
    assert compared.problems == []
    assert len(compared.pairs) == 5
    assert {pair.result for pair in compared.pairs} == {"differs"}
    for pair in _text_pairs(compared.pairs):
        assert pair.tokens is not None
        assert pair.tokens.first_divergence == 5
        assert pair.tokens.distance == pytest.approx(1 / 7)
        assert pair.agreement is not None and 0 < pair.agreement < 1
        assert pair.shadow.ttft_s is not None
    (json_pair,) = [pair for pair in compared.pairs if pair.json is not None]
    assert json_pair.json is not None
    assert (json_pair.json.equal, json_pair.json.paths) == (False, ("$.city",))


async def test_two_recordings_of_the_same_requests_pair_up_with_the_same_measures(
    tmp_path: Path,
) -> None:
    primary, candidate = answering(PARIS), answering(LYON)
    await primary.start()
    await candidate.start()
    try:
        ours, theirs = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        await record_traffic(primary.url, ours)
        await record_traffic(candidate.url, theirs)
        compared = await diff_recordings(str(ours), str(theirs), agent_config(primary.url), SEGMENT)
    finally:
        await primary.shutdown()
        await candidate.shutdown()
    assert compared.unpaired == 0
    assert len(compared.pairs) == 5
    for pair in _text_pairs(compared.pairs):
        assert pair.tokens is not None
        assert (pair.tokens.first_divergence, pair.tokens.distance) == (5, pytest.approx(1 / 7))
    assert compared.relevance_off is not None  # relevance off in this config: no agreement
    assert all(pair.agreement is None for pair in compared.pairs)


async def test_a_candidate_that_is_down_gives_candidate_errors(tmp_path: Path) -> None:
    primary = answering(PARIS)
    await primary.start()
    config = agent_config(primary.url)
    try:
        recording = tmp_path / "primary.jsonl"
        await record_traffic(primary.url, recording, requests=2)
    finally:
        await primary.shutdown()
    compared = await diff_candidate(
        [str(recording)], Candidate(url="http://127.0.0.1:9/v1", timeout_s=5), config, SEGMENT
    )
    assert [pair.result for pair in compared.pairs] == ["candidate_error"] * 3
    assert {pair.shadow.status for pair in compared.pairs} == {502}


async def test_a_candidate_that_dies_mid_stream_gives_candidate_errors_with_its_partial_answer(
    tmp_path: Path,
) -> None:
    primary = answering(PARIS)
    dying = SimulatedUpstream(lambda _request: Script(pieces=LYON, ttft_s=0.2, die_after=3))
    await primary.start()
    await dying.start()
    config = agent_config(primary.url)
    recording = tmp_path / "primary.jsonl"
    try:
        await record_traffic(primary.url, recording, requests=2)
        candidate = Candidate(url=dying.url + "/v1")
        compared = await diff_candidate([str(recording)], candidate, config, SEGMENT)
        (streamed, *_rest) = exchanges([str(recording)], [])
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            record = await ask_candidate(session, candidate, streamed.recorded, config.collectors)
    finally:
        await primary.shutdown()
        await dying.shutdown()
    assert [pair.result for pair in compared.pairs] == ["candidate_error"] * 3
    for pair in compared.pairs:
        # As the proxy records a stream the upstream cut: its 200, not a 502 of its own.
        assert (pair.shadow.status, pair.shadow.error_type) == (200, "upstream_aborted")
    streamed_pairs = [pair for pair in compared.pairs if pair.primary.valid is None]  # not JSON
    assert len(streamed_pairs) == 2
    for pair in streamed_pairs:
        assert pair.shadow.ttft_s is not None and 0.2 <= pair.shadow.ttft_s < 1.2
    assert (record.status, record.error_type, record.upstream_aborted) == (
        200,
        "upstream_aborted",
        True,
    )
    assert record.output_text == "The capital of "
    assert len(record.delta_ns) == 3


async def recorded_pair(folder: Path) -> tuple[Path, Path]:
    """The same requests recorded against a primary answering PARIS and a candidate
    answering LYON (one word in seven differs)."""
    primary, candidate = answering(PARIS), answering(LYON)
    await primary.start()
    await candidate.start()
    try:
        ours, theirs = folder / "a.jsonl", folder / "b.jsonl"
        await record_traffic(primary.url, ours)
        await record_traffic(candidate.url, theirs)
    finally:
        await primary.shutdown()
        await candidate.shutdown()
    return ours, theirs


async def test_the_diff_command_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    ours, theirs = await recorded_pair(tmp_path)
    out = tmp_path / "diff.json"
    returncode, stdout = await _diff(str(ours), str(theirs), "--no-relevance", "--json", str(out))
    assert returncode == 0
    header, row = stdout.splitlines()[:2]
    assert header.split()[:3] == ["route", "pairs", "exact"]
    assert row.split()[:4] == ["chat_completions", "5", "0", "0"]
    assert "insufficient" in row  # 5 pairs are too few for a verdict
    document = orjson.loads(out.read_bytes())
    (route,) = document["routes"]
    assert route["token_distance"]["n"] == 5
    assert "Paris" not in stdout + out.read_text()  # numbers and ids, never text


async def _diff(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "diff", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None, stderr.decode()
    return process.returncode, stdout.decode()


async def test_the_diff_command_judges_with_the_configured_tolerances(tmp_path: Path) -> None:
    ours, theirs = await recorded_pair(tmp_path)
    # One word in seven: distance 1/7, within the default 0.5, past 0.1.
    tight = tmp_path / "tight.yaml"
    tight.write_text(
        "shadow:\n"
        "  upstream: {url: 'http://candidate:8000'}\n"
        "  tolerances: {max_token_distance: 0.1, min_pairs: 5}\n"
    )
    defaults_json, tight_json = tmp_path / "defaults.json", tmp_path / "tight.json"
    code, _ = await _diff(str(ours), str(theirs), "--no-relevance", "--json", str(defaults_json))
    assert code == 0  # 5 pairs: too few for a verdict under the default min_pairs (30)
    (route,) = orjson.loads(defaults_json.read_bytes())["routes"]
    assert route["verdict"]["verdict"] == "insufficient"
    code, stdout = await _diff(
        str(ours), str(theirs), "--no-relevance", "--config", str(tight), "--json", str(tight_json)
    )
    assert code == 1
    assert stdout.splitlines()[1].split()[-1] == "fail"
    document = orjson.loads(tight_json.read_bytes())
    assert document["tolerances"]["max_token_distance"] == 0.1
    (route,) = document["routes"]
    checks = {check["name"]: check for check in route["verdict"]["checks"]}
    assert (checks["token_distance"]["limit"], checks["token_distance"]["passed"]) == (0.1, False)
    assert route["verdict"]["verdict"] == "fail"


async def test_a_candidate_that_answers_404_to_everything_is_named_in_the_first_line(
    tmp_path: Path,
) -> None:
    primary = answering(PARIS)
    missing = SimulatedUpstream(lambda _request: Script(status=404))
    await primary.start()
    await missing.start()
    base = missing.url + "/api"
    try:
        recording = tmp_path / "primary.jsonl"
        await record_traffic(primary.url, recording, requests=30)  # past min_pairs
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "semhealth.agent.cli", "diff",
            "--candidate", base, str(recording), "--no-relevance",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    finally:
        await primary.shutdown()
        await missing.shutdown()
    first, _header, row = stdout.decode().splitlines()[:3]
    assert "404 to every request" in first and base in first, stderr.decode()
    assert row.split()[-1] == "fail"  # every request an error: the error-rate check fails
    assert process.returncode == 1


async def test_the_diff_command_wants_two_recordings_or_a_candidate(tmp_path: Path) -> None:
    one = tmp_path / "a.jsonl"
    one.write_text("")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "diff", str(one),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert b"give two recordings to compare, or --candidate URL" in stderr


def _measures(pairs: Sequence[PairResult]) -> list[tuple[object, ...]]:
    return sorted(
        (
            pair.result,
            None if pair.tokens is None else round(pair.tokens.distance, 9),
            None if pair.tokens is None else pair.tokens.first_divergence,
            None if pair.json is None else pair.json.paths,
        )
        for pair in pairs
    )


async def test_diff_on_a_recording_gives_the_pair_measures_live_shadowing_gave(
    tmp_path: Path,
) -> None:
    from semhealth.agent.config import ShadowSettings, ShadowUpstream, Timeouts

    primary, candidate = answering(PARIS), answering(LYON)
    await primary.start()
    await candidate.start()
    recording = tmp_path / "live.jsonl"
    shadow = ShadowSettings(
        upstream=ShadowUpstream(url=candidate.url + "/", timeouts=Timeouts(total_s=30.0)),
        routes=("chat_completions",),
        sample_rate=1.0,
    )
    agent = Agent(
        agent_config(primary.url),
        Settings(record=RecordSettings(path=str(recording)), shadow=shadow),
    )
    await agent.start()
    try:
        await ask(agent.proxy_url, 3)
        assert agent.shadow is not None
        for _ in range(200):
            if len(agent.shadow.recent_pairs()) >= 4:
                break
            await asyncio.sleep(0.05)
        live = agent.shadow.recent_pairs()
    finally:
        await agent.shutdown()
    try:
        offline = await diff_candidate(
            [str(recording)],
            Candidate(url=candidate.url + "/v1"),
            agent_config(primary.url),
            SEGMENT,
        )
    finally:
        await primary.shutdown()
        await candidate.shutdown()
    assert len(live) == 4
    assert _measures(offline.pairs) == _measures(live)


@pytest.mark.parametrize(
    ("base", "path", "url"),
    [
        ("http://c:8000/v1", "/v1/chat/completions", "http://c:8000/v1/chat/completions"),
        ("http://c:8000/v1/", "/v1/chat/completions", "http://c:8000/v1/chat/completions"),
        ("http://c:8000", "/v1/chat/completions", "http://c:8000/v1/chat/completions"),
        ("http://c:8000/", "/v1/messages", "http://c:8000/v1/messages"),
        ("http://c/openai", "/v1/chat/completions", "http://c/openai/v1/chat/completions"),
        ("http://c/v1", "/v1beta/models/g:streamGenerateContent?alt=sse",
         "http://c/v1/v1beta/models/g:streamGenerateContent?alt=sse"),
        ("http://c/v1", "/v1?x=1", "http://c/v1?x=1"),
        ("https://c/openai", "/openai/deployments/d/chat/completions?api-version=1",
         "https://c/openai/deployments/d/chat/completions?api-version=1"),
    ],
)  # fmt: skip
def test_a_candidate_base_url_is_joined_with_a_path_without_doubling_its_prefix(
    base: str, path: str, url: str
) -> None:
    assert candidate_url(base, path) == url
