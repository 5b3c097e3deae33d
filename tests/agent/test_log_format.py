"""``log.format: json``: one JSON object per line, in every process ``semhealth run`` starts."""

from __future__ import annotations

import asyncio
import io
import logging
import signal
import sys
from pathlib import Path

import aiohttp
import orjson

from semhealth.agent.demo.simulator import Script, SimulatedUpstream
from semhealth.agent.runtime import JsonFormatter
from tests.agent.test_cli import _env, _wait_ready
from tests.servers import free_port

CANARY = "zebra-canary-7f3a"


def _logged(logger: logging.Logger, emit: object) -> dict[str, object]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        emit()  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    parsed: dict[str, object] = orjson.loads(line)
    return parsed


def test_a_json_line_has_time_level_logger_message_and_the_structured_fields() -> None:
    logger = logging.getLogger("semhealth.test.json")
    logger.setLevel(logging.INFO)
    line = _logged(logger, lambda: logger.warning("shed %d chunks", 3, extra={"stage": "tap"}))
    assert {k: line[k] for k in ("level", "logger", "message", "stage")} == {
        "level": "warning",
        "logger": "semhealth.test.json",
        "message": "shed 3 chunks",
        "stage": "tap",
    }
    assert str(line["time"]).endswith("Z") and "T" in str(line["time"])


def test_an_exception_is_one_field_of_the_same_line() -> None:
    logger = logging.getLogger("semhealth.test.json.exc")

    def fail() -> None:
        try:
            raise ValueError("bad")
        except ValueError:
            logger.exception("stage failed")

    line = _logged(logger, fail)
    assert line["message"] == "stage failed"
    assert "ValueError: bad" in str(line["exception"])


async def test_semhealth_run_writes_only_json_lines_from_every_process(tmp_path: Path) -> None:
    config = tmp_path / "semhealth.yaml"
    config.write_text("log:\n  level: info\n  format: json\n")
    upstream = SimulatedUpstream(lambda _r: Script(pieces=(CANARY,), ttft_s=0.01))
    await upstream.start()
    proxy, admin = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run", "--config", str(config),
        "--upstream", upstream.url,
        "--listen", f"127.0.0.1:{proxy}", "--admin-listen", f"127.0.0.1:{admin}",
        stderr=asyncio.subprocess.PIPE, env=_env(),
    )  # fmt: skip
    try:
        await _wait_ready(f"http://127.0.0.1:{admin}", deadline_s=60)
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": CANARY}]}
        async with aiohttp.ClientSession() as client:
            async with client.post(f"http://127.0.0.1:{proxy}/v1/chat/completions", json=body) as r:
                assert CANARY in (await r.read()).decode()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.stderr is not None
        stderr = await asyncio.wait_for(process.stderr.read(), 30)
        await process.wait()
        await upstream.shutdown()
    lines = [orjson.loads(line) for line in stderr.splitlines() if line.strip()]
    assert lines, "semhealth run logged nothing"
    loggers = {line["logger"] for line in lines}
    assert "semhealth.agent.dataplane.forwarder" in loggers  # the forwarding worker's own
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert CANARY.encode() not in stderr
