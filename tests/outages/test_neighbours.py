"""Every neighbour fails, with traffic flowing throughout through ``semhealth run``.

For each: the agent does not crash, forwarding is unaffected (every answer the upstream gave
reaches the client whole), what was lost is counted, and once the neighbour is back the
signals and pages flow again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import aiohttp
import pytest

from tests.alerts.alertmanager_server import (
    AlertmanagerServer,
    ScriptedAlertmanager,
    WebhookReceiver,
    page,
)
from tests.outages.conftest import Upstream
from tests.outages.harness import Collector, eventually, flowing, sidecar

BASE = """\
upstream: {{url: '{upstream}', timeouts: {{read_s: 0.5}}}}
listen: {{proxy: '@PROXY@', admin: '@ADMIN@'}}
analysis: {{stall_threshold_s: 0.3}}
"""


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    server = Collector(slow_s=3.0)
    await server.set("up")
    try:
        yield server
    finally:
        await server.close()


# --------------------------------------------------------------------------- the OTLP collector


@pytest.mark.parametrize("failure", ["down", "refusing", "slow"])
async def test_collector_outage_loses_no_answer_and_exports_resume(
    tmp_path: Path, upstream: Upstream, collector: Collector, failure: str
) -> None:
    config = BASE.format(upstream=upstream.url) + (
        f"telemetry: {{otlp: {{endpoint: '{collector.endpoint}', protocol: http/protobuf,"
        " interval_s: 0.5, timeout_s: 1}}\n"
    )
    async with sidecar(tmp_path, config) as agent, flowing(agent.proxy_url) as traffic:
        await eventually(lambda: _pushed(collector, 1))
        await collector.set(failure)
        await eventually(lambda: _positive(agent.total("semhealth_otlp_export_failures_total")))
        await eventually(traffic.answered(20))
        served = traffic.ok
        await collector.set("up")
        # Counters are cumulative: once an export gets through, it carries every request
        # answered during the outage.
        await eventually(
            lambda: _at_least(collector.latest_sum("semantic_health_requests"), served)
        )
        assert traffic.wrong == []


async def _pushed(collector: Collector, count: int) -> bool:
    return len(collector.received) >= count


async def _positive(value: Awaitable[float]) -> bool:
    return await value > 0


async def _at_least(value: float, floor: float) -> bool:
    return value >= floor


async def _reaches(value: Awaitable[float], floor: float) -> bool:
    return await value >= floor


# --------------------------------------------------------------------------- Alertmanager

ALWAYS_FIRING = """\
alerts:
  default_rules: false
  evaluation_interval_s: 0.2
  resend_delay_s: 1
  alertmanager: {{urls: ['{alertmanager}'], timeout_s: 1}}
  rules:
    - {{name: TrafficSeen, signal: operation_duration, aggregation: p50, window: 30s,
       op: '>', threshold: 0, min_samples: 1, for: 0s}}
"""


async def test_unreachable_alertmanager_gets_the_still_firing_alert_once_back(
    tmp_path: Path,
    upstream: Upstream,
    alertmanager: AlertmanagerServer,
    webhook: WebhookReceiver,
) -> None:
    await alertmanager.stop()
    config = BASE.format(upstream=upstream.url) + ALWAYS_FIRING.format(
        alertmanager=alertmanager.url
    )
    async with sidecar(tmp_path, config) as agent, flowing(agent.proxy_url) as traffic:
        await eventually(
            lambda: _positive(agent.total("semhealth_alertmanager_alerts_total", outcome="failed"))
        )
        await alertmanager.start()
        await webhook.wait_for(page("TrafficSeen"), timeout_s=15)
        await eventually(traffic.answered(10))
        assert traffic.wrong == []


async def test_alertmanager_answering_500_gets_the_still_firing_alert_once_it_heals(
    tmp_path: Path,
    upstream: Upstream,
    alertmanager: AlertmanagerServer,
    webhook: WebhookReceiver,
) -> None:
    healthy = False
    front = ScriptedAlertmanager(lambda _n: 200 if healthy else 500, forward_to=alertmanager.url)
    await front.start()
    try:
        config = BASE.format(upstream=upstream.url) + ALWAYS_FIRING.format(
            alertmanager=front.base_url
        )
        async with sidecar(tmp_path, config) as agent, flowing(agent.proxy_url) as traffic:
            await eventually(
                lambda: _positive(
                    agent.total("semhealth_alertmanager_alerts_total", outcome="failed")
                )
            )
            assert webhook.payloads == []
            healthy = True
            await webhook.wait_for(page("TrafficSeen"), timeout_s=15)
            await eventually(traffic.answered(10))
            assert traffic.wrong == []
    finally:
        await front.stop()


# --------------------------------------------------------------------------- the upstream


async def test_flapping_upstream_gets_marked_502s_while_down_and_nothing_else_changes(
    tmp_path: Path, upstream: Upstream
) -> None:
    async with sidecar(tmp_path, BASE.format(upstream=upstream.url)) as agent:
        async with flowing(agent.proxy_url) as traffic:
            for _ in range(3):
                await upstream.set("down")
                assert await _proxy_error(agent.proxy_url) == (502, "upstream_unreachable")
                await upstream.set("ok")
                await eventually(traffic.answered(5))
            assert set(traffic.wrong) <= {"status 502"}
        # A record follows its exchange's end within the wire's hold of it (250 ms).
        requests = "semantic_health_requests_total"
        await eventually(lambda: _reaches(agent.total(requests, status_class="5xx"), 3))
        await eventually(lambda: _reaches(agent.total(requests, status_class="2xx"), 15))


async def test_slow_upstream_headers_are_cut_with_a_marked_504_and_recover(
    tmp_path: Path, upstream: Upstream
) -> None:
    async with sidecar(tmp_path, BASE.format(upstream=upstream.url)) as agent:
        async with flowing(agent.proxy_url) as traffic:
            await upstream.set("slow_headers")
            status, kind = await _proxy_error(agent.proxy_url)
            assert (status, kind) == (504, "upstream_timeout")
            await upstream.set("ok")
            await eventually(traffic.answered(10))
            assert set(traffic.wrong) <= {"status 504"}


async def test_slow_upstream_body_reaches_the_client_whole_and_stalls_are_counted(
    tmp_path: Path, upstream: Upstream
) -> None:
    await upstream.set("slow_body")
    async with sidecar(tmp_path, BASE.format(upstream=upstream.url)) as agent:
        async with flowing(agent.proxy_url) as traffic:
            await eventually(traffic.answered(5))
            assert traffic.wrong == []
        await eventually(
            lambda: _positive(agent.total("semantic_health_stream_stalls_total")), timeout_s=10
        )


async def _proxy_error(proxy_url: str) -> tuple[int, str]:
    """The status and ``X-Semhealth-Error`` of one request while the upstream misbehaves."""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "q?"}]}
    async with aiohttp.ClientSession() as client:
        async with client.post(proxy_url + "/v1/chat/completions", json=body) as response:
            await response.read()
            return response.status, response.headers.get("X-Semhealth-Error", "")
