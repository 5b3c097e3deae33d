"""Forwarding to the next hop against a real collector on loopback (gRPC and HTTP/protobuf).

What it shows: bytes arrive as submitted, on the signal's own service or path, with the
configured headers; while the collector is down, requests wait and all arrive once it is
back; past the byte budget the oldest are dropped and counted, past the age limit they
expire and are counted; permanent refusals are not retried; Retry-After and RetryInfo are
honoured; ``submit`` never waits for any of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from semhealth.agent.otlp.codec import LOGS, METRICS, TRACES
from semhealth.agent.otlp.forward import ForwardSettings, NextHop
from tests.agent.otlp.collector import Collector
from tests.agent.otlp.test_receiver import make_spans, spans_bytes

PROTOCOLS = ["grpc", "http/protobuf"]
FAST = (0.02, 0.2)  # backoff: first and longest pause, so outages in tests stay short


@asynccontextmanager
async def collector() -> AsyncIterator[Collector]:
    running = Collector()
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def endpoint(hop: Collector, protocol: str) -> str:
    return hop.grpc_endpoint if protocol == "grpc" else hop.http_endpoint


@asynccontextmanager
async def next_hop(hop: Collector, protocol: str, **settings: Any) -> AsyncIterator[NextHop]:
    forward = NextHop(
        ForwardSettings(
            endpoint=endpoint(hop, protocol), protocol=protocol, backoff_s=FAST, **settings
        )
    )
    await forward.start()
    try:
        yield forward
    finally:
        await forward.shutdown(2.0)


def bodies(n: int) -> list[bytes]:
    """``n`` distinct, real export requests."""
    return [spans_bytes(make_spans(1, content=f"question {i}")) for i in range(n)]


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_every_signal_arrives_byte_identical_with_the_headers(protocol: str) -> None:
    sent = bodies(3)
    async with collector() as hop:
        headers = (("x-api-key", "k-42"),)
        async with next_hop(hop, protocol, headers=headers) as forward:
            forward.submit(TRACES, sent[0])
            forward.submit(LOGS, sent[1])  # the bytes are opaque to forwarding
            forward.submit(METRICS, sent[2])
            exports = await hop.wait_exports(3)
        transport = "grpc" if protocol == "grpc" else "http"
        assert sorted((e.signal, e.body) for e in exports) == sorted(
            [("traces", sent[0]), ("logs", sent[1]), ("metrics", sent[2])]
        )
        assert all(e.transport == transport and e.headers["x-api-key"] == "k-42" for e in exports)
        assert forward.stats.outcomes == {
            ("traces", "forwarded"): 1,
            ("logs", "forwarded"): 1,
            ("metrics", "forwarded"): 1,
        }
        assert forward.stats.queue_bytes == 0 and forward.stats.queue_requests == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_next_hop_down_then_back_loses_nothing_below_the_limit(protocol: str) -> None:
    sent = bodies(20)
    async with collector() as hop:
        await hop.stop()  # down: connections are refused
        async with next_hop(hop, protocol) as forward:
            started = time.monotonic()
            for body in sent:
                forward.submit(TRACES, body)
            assert time.monotonic() - started < 1.0  # never waits for the hop
            await until(lambda: forward.stats.outcomes.get(("traces", "retried"), 0) >= 3)
            assert forward.stats.queue_requests == 20
            assert forward.stats.queue_bytes == sum(map(len, sent))
            await hop.start()  # back, on the same ports
            await hop.wait_exports(20, timeout_s=20)
            await until(lambda: forward.stats.queue_requests == 0)
        # All of them; senders work side by side, so arrival order is not promised.
        assert sorted(hop.bodies("traces")) == sorted(sent)
        outcomes = forward.stats.outcomes
        assert outcomes[("traces", "forwarded")] == 20
        assert set(outcomes) == {("traces", "forwarded"), ("traces", "retried")}


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_past_the_byte_budget_the_oldest_are_dropped_and_counted(protocol: str) -> None:
    sent = bodies(10)
    budget = sum(map(len, sent[:4])) + len(sent[0]) // 2  # room for four, not five
    async with collector() as hop:
        await hop.stop()
        async with next_hop(hop, protocol, max_queue_bytes=budget) as forward:
            for body in sent:
                forward.submit(TRACES, body)
            assert forward.stats.outcomes[("traces", "dropped_full")] >= 6
            await hop.start()
            await until(lambda: forward.stats.queue_requests == 0)
        arrived = hop.bodies("traces")
        dropped = forward.stats.outcomes[("traces", "dropped_full")]
        assert len(arrived) + dropped == 10
        assert sorted(arrived) == sorted(sent[dropped:])  # the newest are kept
        assert forward.stats.outcomes[("traces", "forwarded")] == len(arrived)


async def test_requests_older_than_max_age_expire_and_are_counted() -> None:
    sent = bodies(3)
    async with collector() as hop:
        await hop.stop()
        async with next_hop(hop, "http/protobuf", max_age_s=0.3) as forward:
            for body in sent:
                forward.submit(TRACES, body)
            await until(lambda: forward.stats.queue_requests == 0)
            assert forward.stats.outcomes[("traces", "dropped_expired")] == 3
            await hop.start()
            fresh = bodies(1)[0]
            forward.submit(TRACES, fresh)
            await hop.wait_exports(1)
        assert hop.bodies("traces") == [fresh]


@pytest.mark.parametrize(
    ("protocol", "refusal"),
    [
        ("http/protobuf", 400),
        ("http/protobuf", 401),
        ("grpc", grpc.StatusCode.INVALID_ARGUMENT),
        # RESOURCE_EXHAUSTED without RetryInfo is permanent (OTLP spec).
        ("grpc", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
async def test_permanent_refusals_are_counted_and_not_retried(protocol: str, refusal: Any) -> None:
    async with collector() as hop:
        if protocol == "grpc":
            hop.fail_grpc = refusal
        else:
            hop.fail_http = refusal
        async with next_hop(hop, protocol) as forward:
            for body in bodies(2):
                forward.submit(LOGS, body)
            await until(lambda: forward.stats.queue_requests == 0)
            await asyncio.sleep(0.2)  # time enough for a retry, were there one
        assert hop.attempts == 2
        assert forward.stats.outcomes == {("logs", "rejected"): 2}


@pytest.mark.parametrize(
    ("protocol", "refusal"),
    [
        ("http/protobuf", 503),
        ("http/protobuf", 429),
        ("grpc", grpc.StatusCode.UNAVAILABLE),
        ("grpc", grpc.StatusCode.RESOURCE_EXHAUSTED),  # with RetryInfo: retryable
    ],
)
async def test_retry_after_and_retry_info_are_honoured(protocol: str, refusal: Any) -> None:
    async with collector() as hop:
        hop.retry_after_s = 1
        if protocol == "grpc":
            hop.fail_grpc = refusal
        else:
            hop.fail_http = refusal
        async with next_hop(hop, protocol) as forward:
            forward.submit(TRACES, bodies(1)[0])
            await until(lambda: hop.attempts >= 1)
            refused_at = time.monotonic()
            hop.fail_grpc = hop.fail_http = None
            await hop.wait_exports(1)
            waited = time.monotonic() - refused_at
        # The backoff alone would have retried after 0.02 s; the hop asked for a second.
        assert waited >= 0.9
        assert hop.attempts == 2
        assert forward.stats.outcomes == {("traces", "retried"): 1, ("traces", "forwarded"): 1}


async def test_shutdown_counts_what_could_not_be_sent_and_later_submits() -> None:
    async with collector() as hop:
        await hop.stop()
        forward = NextHop(
            ForwardSettings(endpoint=hop.grpc_endpoint, protocol="grpc", backoff_s=FAST)
        )
        await forward.start()
        for body in bodies(3):
            forward.submit(TRACES, body)
        await forward.shutdown(0.2)
        forward.submit(TRACES, bodies(1)[0])
        assert forward.stats.outcomes[("traces", "dropped_shutdown")] == 4
        assert forward.stats.queue_requests == 0 and forward.stats.queue_bytes == 0
        await forward.shutdown(0.1)  # twice is fine


async def test_shutdown_sends_what_is_queued_when_the_hop_is_up() -> None:
    sent = bodies(5)
    async with collector() as hop:
        forward = NextHop(ForwardSettings(endpoint=hop.http_endpoint, protocol="http/protobuf"))
        await forward.start()
        for body in sent:
            forward.submit(METRICS, body)
        await forward.shutdown(5.0)
        assert hop.bodies("metrics") == sent
        assert forward.stats.outcomes == {("metrics", "forwarded"): 5}


async def test_shutdown_without_start_and_a_fresh_instance_on_the_same_settings() -> None:
    async with collector() as hop:
        settings = ForwardSettings(endpoint=hop.grpc_endpoint, protocol="grpc")
        await NextHop(settings).shutdown()
        for _ in range(2):
            forward = NextHop(settings)
            await forward.start()
            forward.submit(TRACES, bodies(1)[0])
            await until(lambda f=forward: f.stats.queue_requests == 0)
            await forward.shutdown()
        assert len(hop.bodies("traces")) == 2


async def test_a_request_larger_than_the_whole_budget_is_dropped_at_once() -> None:
    async with collector() as hop:
        async with next_hop(hop, "grpc", max_queue_bytes=10) as forward:
            forward.submit(TRACES, bodies(1)[0])
            assert forward.stats.outcomes == {("traces", "dropped_full"): 1}
            assert forward.stats.queue_bytes == 0
