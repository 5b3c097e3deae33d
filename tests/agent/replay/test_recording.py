"""The ``--record`` writer on real files: 0600, size cap and rotation, a full disk
(``/dev/full`` answers every write with ENOSPC) counted while the agent keeps forwarding,
and a full queue shed and counted."""

from __future__ import annotations

import asyncio
import logging
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.demo.simulator import SimulatedUpstream
from semhealth.agent.replay.format import decode_line
from semhealth.agent.replay.recording import Recording
from semhealth.agent.replay.settings import RecordSettings
from semhealth.agent.wire import Outcome
from semhealth.collectors import Exchange
from tests.agent.conftest import agent_config
from tests.agent.replay.traffic import script_for
from tests.agent.test_cli import _env

DEV_FULL = Path("/dev/full")


def _exchange(index: int) -> tuple[Exchange, list[tuple[int, bytes]], Outcome]:
    start = time.monotonic_ns()
    body = f'{{"model": "m", "messages": [{{"role": "user", "content": "q{index}"}}]}}'
    exchange = Exchange(
        method="POST",
        path="/v1/chat/completions",
        start_ns=start,
        status=200,
        content_type="text/event-stream",
        content_encoding=None,
        response_ns=start + 1_000,
        request_body=body.encode(),
    )
    chunks = [
        (start + 2_000 + i, f'data: {{"choices":[{{"delta":{{"content":"t{i}"}}}}]}}\n\n'.encode())
        for i in range(5)
    ]
    chunks.append((start + 9_000, b"\xff\xfe not utf-8"))
    return exchange, chunks, Outcome(end_ns=start + 10_000)


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line]


def test_rotation_keeps_each_file_under_the_cap_and_the_newest_files(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    recording = Recording(
        RecordSettings(path=str(path), max_bytes=4096, keep=2), max_exchange_bytes=1 << 20
    )
    recording.start()
    for index in range(60):
        exchange, chunks, outcome = _exchange(index)
        recording.capture(exchange, chunks, 0, outcome, False)
    recording.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["rec.jsonl", "rec.jsonl.1", "rec.jsonl.2"]
    assert recording.stats.written == 60 and recording.stats.rotations >= 3
    kept = []
    for file in files:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        assert file.stat().st_size <= 4096
        kept += [decode_line(line) for line in _lines(file)]
    # The oldest exchanges rotated out; what is kept is the newest, each line whole.
    questions = sorted(int((r.request_body or b"").split(b'"q')[1].split(b'"')[0]) for r in kept)
    assert questions == list(range(60 - len(kept), 60))
    decoded = kept[0]
    assert decoded.chunks[-1][1] == b"\xff\xfe not utf-8"  # binary chunk, base64 and back
    assert [offset for offset, _ in decoded.chunks] == [2_000, 2_001, 2_002, 2_003, 2_004, 9_000]


def test_an_existing_file_is_appended_to_and_its_mode_tightened(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"")
    path.chmod(0o644)
    recording = Recording(RecordSettings(path=str(path)), max_exchange_bytes=1 << 20)
    recording.start()
    exchange, chunks, outcome = _exchange(1)
    recording.capture(exchange, chunks, 0, outcome, False)
    recording.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(_lines(path)) == 1


def test_a_full_queue_sheds_and_counts_without_blocking(tmp_path: Path) -> None:
    recording = Recording(
        RecordSettings(path=str(tmp_path / "rec.jsonl"), queue_size=2), max_exchange_bytes=1 << 20
    )
    # Not started: nothing drains the queue, as when the disk is slower than the traffic.
    for index in range(5):
        exchange, chunks, outcome = _exchange(index)
        recording.capture(exchange, chunks, 0, outcome, False)
    assert recording.stats.shed == 3


@pytest.mark.skipif(not DEV_FULL.exists(), reason="/dev/full is not available")
async def test_a_full_disk_is_counted_logged_once_and_forwarding_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rec.jsonl"
    path.symlink_to(DEV_FULL)  # every write: ENOSPC, as on a full disk
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    agent = Agent(agent_config(upstream.url), Settings(record=RecordSettings(path=str(path))))
    caplog.set_level(logging.ERROR, logger="semhealth.agent.replay.recording")
    try:
        await agent.start()
        async with aiohttp.ClientSession() as client:
            for _ in range(6):
                async with client.post(
                    agent.proxy_url + "/v1/chat/completions",
                    json={
                        "model": "m",
                        "stream": True,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                ) as response:
                    assert response.status == 200
                    assert b"[DONE]" in await response.read()
        assert agent.recording is not None
        for _ in range(200):
            if agent.recording.stats.failed >= 6:
                break
            await asyncio.sleep(0.02)
        metrics = agent.telemetry.render_prometheus().decode()
    finally:
        await agent.shutdown()
        await upstream.shutdown()
    stats = agent.recording.stats
    assert stats.failed == 6 and stats.written == 0
    assert 'semhealth_recorded_exchanges_total{result="failed"} 6.0' in metrics
    failures = [r for r in caplog.records if "recording to" in r.getMessage()]
    assert len(failures) == 1
    assert "ENOSPC" in failures[0].getMessage()
    assert "hi" not in failures[0].getMessage()


def test_a_record_file_that_cannot_be_opened_stops_start_up(tmp_path: Path) -> None:
    where = tmp_path / "no-such-dir" / "rec.jsonl"
    done = subprocess.run(
        [
            sys.executable, "-m", "semhealth.agent.cli", "run",
            "--upstream", "http://127.0.0.1:9",
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            "--record", str(where),
        ],
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert done.returncode == 1
    assert str(where) in done.stderr and "No such file or directory" in done.stderr
