"""A background task of the analysis plane that dies is logged (without its message),
counted, and turns /readyz to 503 in one process."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from semhealth.agent.analysis.health import Health
from semhealth.agent.analysis.tap import Tap
from semhealth.agent.demo.simulator import RawScript
from tests.agent.conftest import running_stack

CANARY = "canary-9c1e-prompt-text"


def test_a_failure_is_counted_logged_without_its_message_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[str] = []
    health = Health(heard.append)
    try:
        raise ValueError(f"bad chunk near {CANARY}")
    except ValueError as exc:
        health.reporter("tap")(exc)
    assert health.failures == {"tap": 1} and health.failed
    assert heard == ["tap"]
    assert "ValueError" in caplog.text
    assert CANARY not in caplog.text


async def test_a_cancelled_task_is_a_normal_stop() -> None:
    health = Health()
    task = asyncio.create_task(asyncio.sleep(10))
    health.watch(task, "idle")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert not health.failed


async def test_a_dead_tap_worker_turns_readyz_to_503_and_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def dies(self: Tap) -> None:
        raise RuntimeError("the worker broke")

    monkeypatch.setattr(Tap, "_run", dies)
    async with running_stack(lambda r: RawScript(chunks=(b"ok",))) as stack:
        await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as client:
            async with client.get(stack.agent.admin_url + "/readyz") as r:
                assert r.status == 503
            async with client.get(stack.agent.admin_url + "/metrics") as r:
                text = await r.text()
            # Forwarding goes on: the bytes still reach the client.
            async with client.get(stack.agent.proxy_url + "/v1/models") as r:
                assert await r.read() == b"ok"
    assert 'semhealth_background_failures_total{task="tap"} 1.0' in text


def test_failures_log_at_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    Health().failure("alerts", RuntimeError("x"))
    assert any(r.levelno == logging.ERROR for r in caplog.records)
