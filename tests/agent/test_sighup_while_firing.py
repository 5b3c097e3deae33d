"""SIGHUP while an alert is firing: the reload carries the alert over by rule name, as a
Prometheus reload does. It keeps firing from the same start, Alertmanager is never told it
resolved, and the resends go on after the reload."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from semhealth.agent.demo.simulator import Script, SimulatedUpstream
from tests.agent.test_cli import _env, _wait_ready, _wait_rules
from tests.alerts.alertmanager_server import AlertmanagerServer, WebhookReceiver, page
from tests.servers import free_port

FAILING = (
    "  - {name: UpstreamFailing, signal: request_success_rate, aggregation: ratio, window: 30s,\n"
    "     op: '<', threshold: 0.5, min_samples: 1, for: 0s, labels: {severity: page}}\n"
)
QUIET = (
    "  - {name: NeverSlow, signal: operation_duration, aggregation: p50, window: 30s,\n"
    "     op: '>', threshold: 3600, min_samples: 1}\n"
)


def _config(upstream: str, proxy: int, admin: int, alertmanager: str, rules: str) -> str:
    return (
        f"upstream: {{url: '{upstream}'}}\n"
        f"listen: {{proxy: '127.0.0.1:{proxy}', admin: '127.0.0.1:{admin}'}}\n"
        "alerts:\n"
        "  default_rules: false\n"
        "  evaluation_interval_s: 0.2\n"
        "  resend_delay_s: 1\n"
        f"  alertmanager: {{urls: ['{alertmanager}'], timeout_s: 2}}\n"
        "  rules:\n" + rules
    )


async def _firing(admin: str, rule: str) -> dict[str, Any] | None:
    async with aiohttp.ClientSession() as client, client.get(admin + "/alerts") as r:
        document = orjson.loads(await r.read())
    for found in document["rules"]:
        for group in found["groups"] if found["name"] == rule else ():
            if group["state"] == "firing":
                return dict(group)
    return None


async def _eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = 15.0) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not (found := await check()):
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.1)
    return found


@contextlib.asynccontextmanager
async def _failing_traffic(url: str) -> AsyncIterator[None]:
    async def run() -> None:
        async with aiohttp.ClientSession() as client:
            while True:
                async with client.post(url, json={"messages": []}) as r:
                    await r.read()
                await asyncio.sleep(0.1)

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_sighup_keeps_a_firing_alert_firing_and_paged(
    tmp_path: Path, alertmanager: AlertmanagerServer, webhook: WebhookReceiver
) -> None:
    upstream = SimulatedUpstream(lambda r: Script(status=500))
    await upstream.start()
    proxy, admin_port = free_port(), free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    config = tmp_path / "semhealth.yaml"
    config.write_text(_config(upstream.url, proxy, admin_port, alertmanager.url, FAILING))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run", "--config", str(config),
        env=_env(), stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_ready(admin)
        async with _failing_traffic(f"http://127.0.0.1:{proxy}/v1/chat/completions"):
            before = await _eventually(lambda: _firing(admin, "UpstreamFailing"))
            await webhook.wait_for(page("UpstreamFailing"))
            held = await alertmanager.wait_for_alert("UpstreamFailing")

            config.write_text(
                _config(upstream.url, proxy, admin_port, alertmanager.url, FAILING + QUIET)
            )
            process.send_signal(signal.SIGHUP)
            await _wait_rules(admin, lambda names: "NeverSlow" in names)
            after = await _eventually(lambda: _firing(admin, "UpstreamFailing"))

            # Carried over: the same group, firing since the same moment.
            assert after["labels"] == before["labels"]
            assert (after["active_at"], after["fired_at"]) == (
                before["active_at"],
                before["fired_at"],
            )

            # Resends go on after the reload: Alertmanager's endsAt moves forward, while
            # its startsAt stays where the alert first fired.
            async def resent() -> dict[str, Any] | None:
                now = await alertmanager.wait_for_alert("UpstreamFailing")
                return now if now["endsAt"] > held["endsAt"] else None

            later = await _eventually(resent)
            assert later["startsAt"] == held["startsAt"]
            assert later["status"]["state"] == "active"
        assert not any(page("UpstreamFailing", status="resolved")(p) for p in webhook.payloads)
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0
        assert b"alert rules reloaded from" in err
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await upstream.shutdown()
