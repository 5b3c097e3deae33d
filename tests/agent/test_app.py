"""The agent's lifecycle and admin endpoints, on real loopback listeners."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.analysis.agent import Agent
from semhealth.agent.demo.simulator import Script, ScriptRequest
from semhealth.agent.wire import Outcome
from semhealth.collectors.exchange import Exchange
from tests.agent.conftest import agent_config, running_stack
from tests.servers import free_port

CHAT = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
UNUSED_UPSTREAM = "http://127.0.0.1:9"  # never contacted: these tests send no traffic


def _hello(_request: ScriptRequest) -> Script:
    return Script(pieces=("Hel", "lo"))


@contextmanager
def _occupied_port() -> Iterator[int]:
    """A loopback port another socket is listening on, for as long as the block runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


async def _refuses_connections(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _exchange() -> Exchange:
    return Exchange(
        method="POST",
        path="/v1/chat/completions",
        start_ns=1,
        status=200,
        content_type="text/event-stream",
        content_encoding=None,
        response_ns=1,
        request_body=orjson.dumps(CHAT),
    )


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


async def test_shutdown_without_start_is_a_no_op() -> None:
    agent = Agent(agent_config(UNUSED_UPSTREAM))
    await agent.shutdown()
    assert not agent.ready()


async def test_shutdown_twice_is_safe() -> None:
    agent = Agent(agent_config(UNUSED_UPSTREAM))
    await agent.start()
    await agent.shutdown()
    await agent.shutdown()
    assert not agent.ready()


async def test_a_fresh_agent_on_the_same_config_starts_after_another_shut_down() -> None:
    config = agent_config(UNUSED_UPSTREAM)
    first = Agent(config)
    await first.start()
    assert first.ready()
    await first.shutdown()
    second = Agent(config)
    await second.start()
    try:
        assert second.ready()
        async with aiohttp.ClientSession() as session:
            assert await _get(session, second.admin_url + "/healthz") == (200, "ok\n")
    finally:
        await second.shutdown()


async def test_healthz_and_readyz_answer_200_while_running() -> None:
    agent = Agent(agent_config(UNUSED_UPSTREAM))
    await agent.start()
    try:
        async with aiohttp.ClientSession() as session:
            assert await _get(session, agent.admin_url + "/healthz") == (200, "ok\n")
            assert await _get(session, agent.admin_url + "/readyz") == (200, "ready\n")
    finally:
        await agent.shutdown()


async def test_admin_listener_is_apart_from_the_proxy() -> None:
    agent = Agent(agent_config(UNUSED_UPSTREAM))
    await agent.start()
    try:
        assert agent.admin_address != agent.proxy_address
    finally:
        await agent.shutdown()


async def test_metrics_serve_prometheus_text_with_the_agent_counters() -> None:
    agent = Agent(agent_config(UNUSED_UPSTREAM))
    await agent.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(agent.admin_url + "/metrics") as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                samples = _samples(await response.text())
    finally:
        await agent.shutdown()
    assert samples[("semhealth_records_total", ())] == 0
    assert samples[("semhealth_dropped_total", (("stage", "tap"),))] == 0
    assert samples[("semhealth_streams_active", ())] == 0


async def test_streams_that_end_past_the_ends_budget_count_as_dropped_records() -> None:
    agent = Agent(agent_config(UNUSED_UPSTREAM, **{"limits.tap_queue_ends": 1}))
    await agent.start()
    try:
        first, second = (agent.tap.open_stream(_exchange()) for _ in range(2))
        # No await between the ends: the worker cannot take the first before the second comes.
        first.close(Outcome(end_ns=2))
        second.close(Outcome(end_ns=3))
        async with aiohttp.ClientSession() as session:
            async with session.get(agent.admin_url + "/metrics") as response:
                samples = _samples(await response.text())
    finally:
        await agent.shutdown()
    assert samples[("semhealth_dropped_total", (("stage", "records"),))] == 1


async def test_record_count_rises_after_one_proxied_request() -> None:
    async with running_stack(_hello) as stack:
        metrics_url = stack.agent.admin_url + "/metrics"
        async with aiohttp.ClientSession() as session:
            _, before = await _get(session, metrics_url)
            async with session.post(
                stack.agent.proxy_url + "/v1/chat/completions", json=CHAT
            ) as response:
                assert response.status == 200
                await response.read()
            await stack.wait_records(1)
            _, after = await _get(session, metrics_url)
    assert _samples(before)[("semhealth_records_total", ())] == 0
    assert _samples(after)[("semhealth_records_total", ())] == 1
    assert stack.records[0].output_text == "Hello"


async def test_start_that_fails_half_way_closes_the_admin_listener() -> None:
    admin_port = free_port()
    with _occupied_port() as proxy_port:
        agent = Agent(
            agent_config(
                UNUSED_UPSTREAM,
                **{
                    "listen.proxy": f"127.0.0.1:{proxy_port}",
                    "listen.admin": f"127.0.0.1:{admin_port}",
                },
            )
        )
        with pytest.raises(OSError):
            await agent.start()
        assert not agent.ready()
        assert await _refuses_connections(admin_port)


async def test_a_fresh_agent_starts_after_a_failed_start() -> None:
    admin_port = free_port()
    settings = {"listen.admin": f"127.0.0.1:{admin_port}"}
    with _occupied_port() as proxy_port:
        failed = Agent(
            agent_config(UNUSED_UPSTREAM, **settings, **{"listen.proxy": f"127.0.0.1:{proxy_port}"})
        )
        with pytest.raises(OSError):
            await failed.start()
    agent = Agent(agent_config(UNUSED_UPSTREAM, **settings))
    await agent.start()
    try:
        assert agent.admin_address == ("127.0.0.1", admin_port)
    finally:
        await agent.shutdown()


async def test_readyz_is_503_once_shutdown_begins() -> None:
    # A stream still being relayed holds the proxy's shutdown open; the admin listener,
    # closed last, answers meanwhile.
    def slow(_request: ScriptRequest) -> Script:
        return Script(pieces=tuple("abcdefghij"), gaps_s=0.05)

    async with running_stack(slow) as stack:
        agent = stack.agent
        async with aiohttp.ClientSession() as session:
            async with session.post(agent.proxy_url + "/v1/chat/completions", json=CHAT) as r:
                await r.content.readany()
                stopping = asyncio.create_task(agent.shutdown())
                await asyncio.sleep(0.05)
                assert not stopping.done()
                assert not agent.ready()
                assert await _get(session, agent.admin_url + "/readyz") == (503, "not ready\n")
                await r.read()
            await stopping
        assert stack.records[0].output_text == "abcdefghij"


async def test_shutdown_closes_both_listeners() -> None:
    agent = Agent(agent_config(UNUSED_UPSTREAM))
    await agent.start()
    assert agent.proxy_address is not None
    assert agent.admin_address is not None
    proxy_port, admin_port = agent.proxy_address[1], agent.admin_address[1]
    await agent.shutdown()
    assert await _refuses_connections(proxy_port)
    assert await _refuses_connections(admin_port)
