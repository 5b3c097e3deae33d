"""The tap wire: frames survive any split of the byte stream, and the forwarder's side sheds
under its budget instead of waiting."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import AsyncIterator
from typing import cast

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.agent.analysis.receiver import TapReceiver
from semhealth.agent.analysis.tap import Tap
from semhealth.agent.dataplane import wiretap
from semhealth.agent.dataplane.relay import Relay, UpstreamSettings
from semhealth.agent.dataplane.wiretap import (
    FLUSH_BYTES,
    FLUSH_S,
    OPEN_FLUSH_S,
    WireTap,
    _WireStream,
)
from semhealth.agent.wire import (
    CLOSE,
    DATA,
    HEADER,
    MAX_CHUNK_BYTES,
    MIN_TAP_BUDGET,
    OPEN,
    STATS,
    Outcome,
    WireDecoder,
    decode_close,
    decode_open,
    encode_close,
    encode_open,
    stats_from,
)
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import StreamRecord
from tests.agent.conftest import agent_config

exchanges = st.builds(
    Exchange,
    method=st.sampled_from(["GET", "POST"]),
    path=st.text(max_size=30),
    start_ns=st.integers(min_value=0, max_value=2**63 - 1),
    status=st.integers(min_value=100, max_value=599),
    content_type=st.none() | st.text(max_size=20),
    content_encoding=st.none() | st.sampled_from(["gzip", "identity"]),
    response_ns=st.none() | st.integers(min_value=0, max_value=2**63 - 1),
    request_body=st.none() | st.binary(max_size=200),
    request_skip=st.none() | st.just("oversized"),
    ratelimit_source=st.none() | st.text(max_size=10),
    traceparent=st.none() | st.text(max_size=60),
    request_headers=st.none()
    | st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40)), max_size=5).map(tuple),
    request_bytes=st.integers(min_value=0, max_value=2**40),
)


@given(exchange=exchanges, stream_id=st.integers(min_value=0, max_value=2**32 - 1))
def test_open_frames_carry_the_exchange_whole(exchange: Exchange, stream_id: int) -> None:
    ((kind, sid, t, payload),) = WireDecoder().feed(encode_open(stream_id, exchange))
    assert (kind, sid) == (OPEN, stream_id)
    assert decode_open(t, payload) == exchange


@given(
    outcome=st.builds(
        Outcome,
        end_ns=st.integers(min_value=0, max_value=2**63 - 1),
        client_aborted=st.booleans(),
        upstream_aborted=st.booleans(),
        error_type=st.none() | st.sampled_from(["upstream_timeout", "upstream_aborted"]),
    ),
    shed=st.booleans(),
)
def test_close_frames_carry_the_outcome_and_the_shed_flag(outcome: Outcome, shed: bool) -> None:
    ((kind, _, t, payload),) = WireDecoder().feed(encode_close(7, outcome, shed))
    assert kind == CLOSE
    assert decode_close(t, payload) == (outcome, shed)


@settings(max_examples=200)
@given(
    chunks=st.lists(st.binary(max_size=300), min_size=1, max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=15),
)
def test_frames_decode_the_same_however_the_stream_is_split(
    chunks: list[bytes], cuts: list[int]
) -> None:
    wire = b"".join(HEADER.pack(DATA, i, 1000 + i, len(c)) + c for i, c in enumerate(chunks))
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    decoder = WireDecoder()
    frames = []
    for start, end in itertools.pairwise(points):
        frames += decoder.feed(wire[start:end])
    assert frames == [(DATA, i, 1000 + i, c) for i, c in enumerate(chunks)]


def test_a_corrupt_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="corrupt tap frame"):
        WireDecoder().feed(HEADER.pack(99, 1, 2, 3) + b"abc")


@pytest.mark.parametrize(
    "head", [HEADER.pack(99, 1, 2, 3), HEADER.pack(DATA, 1, 2, 1 << 30)], ids=["kind", "length"]
)
def test_a_corrupt_head_split_over_reads_is_refused_once_it_is_read(head: bytes) -> None:
    decoder = WireDecoder()
    assert decoder.feed(head[:5]) == []
    with pytest.raises(ValueError, match="corrupt tap frame"):
        decoder.feed(head[5:])


def _exchange() -> Exchange:
    return Exchange(
        method="POST",
        path="/v1/chat/completions",
        start_ns=1,
        status=200,
        content_type="text/event-stream",
        content_encoding=None,
        response_ns=2,
        request_body=b'{"model": "m", "stream": true}',
    )


async def test_records_reach_analysis_over_the_wire() -> None:
    records: list[StreamRecord] = []
    config = agent_config("http://127.0.0.1:1").collectors
    tap = Tap(config, records.append)
    await tap.start()
    receiver = TapReceiver(tap)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tap.sock")
        await receiver.start(path)
        wire = WireTap(path, budget_bytes=1 << 20)
        await wire.start()
        assert await wire.wait_connected(5)
        stream = wire.open_stream(_exchange())
        event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
        stream.offer(event, 10)
        stream.offer(b"data: [DONE]\n\n", 20)
        stream.close(Outcome(end_ns=30))
        for _ in range(200):
            if records:
                break
            await asyncio.sleep(0.01)
        await wire.shutdown()
        await receiver.shutdown()
    await tap.shutdown()
    (record,) = records
    assert record.output_text == "hi"
    assert record.done
    assert not record.shed


async def test_a_full_budget_sheds_copies_and_counts_them() -> None:
    # Nobody reads the socket: the kernel's buffer fills, then the budget.
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tap.sock")
        server = await asyncio.get_running_loop().create_unix_server(lambda: _Silent(), path)
        wire = WireTap(path, budget_bytes=64 * 1024)
        await wire.start()
        assert await wire.wait_connected(5)
        stream = wire.open_stream(_exchange())
        for _ in range(2000):
            stream.offer(b"x" * 1024, 1)
            await asyncio.sleep(0)
        assert stream.shed
        assert wire.stats.streams_shed == 1
        assert wire.stats.chunks_dropped > 0
        server.close()
        await wire.shutdown(0.1)


class _Paused(asyncio.Protocol):
    """An analysis end that reads nothing until told to, then counts what it reads."""

    def __init__(self) -> None:
        self.transport: asyncio.ReadTransport | None = None
        self.read = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.ReadTransport, transport)
        self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.read += len(data)


async def test_a_backlog_that_drained_since_the_last_write_no_longer_counts_against_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Timers stretched: no write happens between the backlog draining and the copy offered.
    monkeypatch.setattr(wiretap, "OPEN_FLUSH_S", 30.0)
    monkeypatch.setattr(wiretap, "DATA_FLUSH_S", 30.0)
    budget = 256 * 1024
    analysis = _Paused()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tap.sock")
        server = await asyncio.get_running_loop().create_unix_server(lambda: analysis, path)
        wire = WireTap(path, budget_bytes=budget, stats_interval_s=3600)
        await wire.start()
        assert await wire.wait_connected(5)
        first = wire.open_stream(_exchange())
        for _ in range(4000):  # till the kernel's buffer and then the budget are full
            first.offer(b"x" * 1024, 1)
            await asyncio.sleep(0)
            if first.shed:
                break
        assert first.shed
        second = wire.open_stream(_exchange())
        assert analysis.transport is not None
        analysis.transport.resume_reading()
        read = -1
        while read != analysis.read:  # until a pause passes with nothing more to read
            read = analysis.read
            await asyncio.sleep(0.2)
        second.offer(b"y" * (budget // 2), 2)
        assert not second.shed
        assert wire.stats.streams_shed == 1
        server.close()
        await wire.shutdown(0.1)


async def test_streams_opened_while_analysis_is_away_are_shed_not_queued() -> None:
    with tempfile.TemporaryDirectory() as directory:
        wire = WireTap(os.path.join(directory, "nobody.sock"), budget_bytes=1 << 20)
        await wire.start()
        stream = wire.open_stream(_exchange())
        stream.offer(b"chunk", 1)
        stream.close(Outcome(end_ns=2))
        assert stream.shed
        assert (wire.stats.streams_shed, wire.stats.chunks_dropped) == (1, 1)
        await wire.shutdown(0.1)


class _Reads(asyncio.Protocol):
    """Keeps every read of the analysis end of the wire, with the loop time it came."""

    def __init__(self) -> None:
        self.reads: list[tuple[float, bytes]] = []
        self.arrived = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.reads.append((asyncio.get_running_loop().time(), data))
        self.arrived.set()


@contextlib.asynccontextmanager
async def _wired(
    *, stats_interval_s: float, budget_bytes: int = 1 << 20
) -> AsyncIterator[tuple[_Reads, WireTap]]:
    """A connected wire whose analysis end keeps its reads, from after the counters sent on
    connecting (the wire's last batch)."""
    loop = asyncio.get_running_loop()
    reads = _Reads()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tap.sock")
        server = await loop.create_unix_server(lambda: reads, path)
        wire = WireTap(path, budget_bytes=budget_bytes, stats_interval_s=stats_interval_s)
        await wire.start()
        assert await wire.wait_connected(5)
        await asyncio.wait_for(reads.arrived.wait(), 10)
        reads.reads.clear()
        reads.arrived.clear()
        try:
            yield reads, wire
        finally:
            server.close()
            await wire.shutdown(0.1)


def _stretch_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies and opens wait 30 s: whatever a test sees sent sooner, something else sent."""
    monkeypatch.setattr(wiretap, "DATA_FLUSH_S", 30.0)
    monkeypatch.setattr(wiretap, "OPEN_FLUSH_S", 30.0)


def _open_with_a_copy(wire: WireTap) -> _WireStream:
    stream = wire.open_stream(_exchange())
    stream.offer(b"data: 1\n\n", time.monotonic_ns())
    return stream


async def test_copies_wait_for_a_batch_and_a_streams_end_goes_within_flush_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fewer writes wake analysis less, but a stream's record must follow its end promptly:
    # copies wait up to DATA_FLUSH_S, an end (and what waits before it) up to FLUSH_S.
    # DATA_FLUSH_S (and the open's) are stretched so that an end that waited with the copies
    # cannot pass.
    _stretch_timers(monkeypatch)
    loop = asyncio.get_running_loop()
    async with _wired(stats_interval_s=3600) as (reads, wire):
        stream = wire.open_stream(_exchange())
        stream.offer(b"data: 1\n\n", 10)
        await asyncio.sleep(FLUSH_S * 3)
        assert reads.reads == []  # the open and the copy are still waiting
        closed_at = loop.time()
        stream.close(Outcome(end_ns=30))
        await asyncio.wait_for(reads.arrived.wait(), 10)
        (at, data), *_ = reads.reads
        assert [kind for kind, *_ in WireDecoder().feed(data)] == [OPEN, DATA, CLOSE]
        assert at - closed_at < 5  # FLUSH_S, not the copies' 30 s


async def test_a_streams_open_goes_within_open_flush_s_though_copies_may_wait_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Live shadowing starts its candidate when analysis sees the open: it does not wait for
    # the copies' batch.
    monkeypatch.setattr(wiretap, "DATA_FLUSH_S", 30.0)
    loop = asyncio.get_running_loop()
    async with _wired(stats_interval_s=3600) as (reads, wire):
        opened_at = loop.time()
        _open_with_a_copy(wire)
        await asyncio.wait_for(reads.arrived.wait(), 10)
        (at, data), *_ = reads.reads
        assert [kind for kind, *_ in WireDecoder().feed(data)] == [OPEN, DATA]
        assert at - opened_at < 5  # OPEN_FLUSH_S, not the copies' 30 s


async def test_a_copy_read_once_the_last_batch_is_data_flush_s_old_goes_with_its_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The read woke the forwarder already: the batch goes in that wake-up, not the timer's.
    # DATA_FLUSH_S (and the open's) are stretched so that a timer cannot be what sends it.
    _stretch_timers(monkeypatch)
    async with _wired(stats_interval_s=3600) as (reads, wire):
        stream = _open_with_a_copy(wire)
        await asyncio.sleep(FLUSH_S * 3)
        assert reads.reads == []  # read within DATA_FLUSH_S of the last batch: it waits
        stream.offer(b"data: 2\n\n", time.monotonic_ns() + 30 * 10**9)  # read 30 s on
        await asyncio.wait_for(reads.arrived.wait(), 5)
        frames = [frame for _, data in reads.reads for frame in WireDecoder().feed(data)]
        assert [kind for kind, *_ in frames] == [OPEN, DATA, DATA]


async def test_copies_go_in_the_loop_iteration_that_brings_them_to_flush_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under load a batch goes by size, not by a timer, and not before it is full. The timers
    # are stretched so that none can be what sends it.
    _stretch_timers(monkeypatch)
    async with _wired(stats_interval_s=3600) as (reads, wire):
        exchange = _exchange()
        stream = wire.open_stream(exchange)
        waiting = len(encode_open(stream.id, exchange))
        stream.offer(b"x" * (wiretap.FLUSH_BYTES - waiting - HEADER.size - 1), 10)
        await asyncio.sleep(FLUSH_S * 2)
        assert reads.reads == []  # one byte short of a batch
        stream.offer(b"y", 11)
        await asyncio.wait_for(reads.arrived.wait(), 5)
        frames = [frame for _, data in reads.reads for frame in WireDecoder().feed(data)]
        assert [kind for kind, *_ in frames] == [OPEN, DATA, DATA]


async def test_the_counters_ride_a_batch_once_half_their_interval_has_passed() -> None:
    async with _wired(stats_interval_s=4.0) as (reads, wire):
        stream = wire.open_stream(_exchange())
        await asyncio.sleep(2.1)  # past half the interval, well short of the counters' timer
        reads.arrived.clear()  # the open went on its own timer meanwhile
        stream.offer(b"data: 1\n\n", time.monotonic_ns() + 10**10)  # a batch goes now
        await asyncio.wait_for(reads.arrived.wait(), 1.0)
        frames = [frame for _, data in reads.reads for frame in WireDecoder().feed(data)]
        assert [kind for kind, *_ in frames] == [OPEN, DATA, STATS]


async def test_unchanged_counters_are_not_sent_and_changed_ones_within_their_interval() -> None:
    async with _wired(stats_interval_s=0.1) as (reads, wire):
        await asyncio.sleep(1.0)  # ten intervals, nothing counted: analysis is left asleep
        assert reads.reads == []
        wire.unanalysed("oversized")
        await asyncio.wait_for(reads.arrived.wait(), 1.0)
        ((_, data),) = reads.reads
        ((kind, _, _, payload),) = WireDecoder().feed(data)
        assert kind == STATS
        assert stats_from(payload).requests_unanalysed == {"oversized": 1}


async def test_an_idle_wire_stops_checking_its_counters_until_something_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing counts while nothing happens: an idle forwarder does not wake every interval.
    ticks: list[float] = []
    tick = WireTap._stats_tick

    def counted(self: WireTap) -> None:
        ticks.append(asyncio.get_running_loop().time())
        tick(self)

    monkeypatch.setattr(WireTap, "_stats_tick", counted)
    async with _wired(stats_interval_s=0.1) as (reads, wire):
        await asyncio.sleep(1.0)  # ten intervals
        assert len(ticks) <= 1  # the check after connecting found nothing new, then none
        wire.unanalysed("oversized")  # something counts: a check is due again
        await asyncio.wait_for(reads.arrived.wait(), 1.0)
        await asyncio.sleep(0.5)
    assert 2 <= len(ticks) <= 3  # the one that sent it, perhaps one that found it unchanged


async def test_changed_counters_wait_with_the_copies_rather_than_wake_analysis_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The copies' timers are stretched: once the counters' timer has fired, they wait with
    # the copies for another interval at most, so a stream's end in that time takes both.
    _stretch_timers(monkeypatch)
    async with _wired(stats_interval_s=2.0) as (reads, wire):
        stream = _open_with_a_copy(wire)
        wire.unanalysed("oversized")
        await asyncio.sleep(3.0)  # past the counters' timer (2 s), short of their deadline (4 s)
        assert reads.reads == []
        stream.close(Outcome(end_ns=time.monotonic_ns()))
        await asyncio.wait_for(reads.arrived.wait(), 10)
        ((_, data),) = reads.reads
        frames = WireDecoder().feed(data)
        assert [kind for kind, *_ in frames] == [OPEN, DATA, STATS, CLOSE]
        assert stats_from(frames[2][3]).requests_unanalysed == {"oversized": 1}


class _Silent(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.pause_reading()  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the smallest budget


@pytest.mark.parametrize(
    ("budget", "shed"), [(MIN_TAP_BUDGET, False), (MIN_TAP_BUDGET - 1, True)], ids=["min", "below"]
)
async def test_the_smallest_budget_holds_the_frame_of_the_largest_chunk(
    budget: int, shed: bool
) -> None:
    # The budget counts what the forwarder holds: frames, their 17-byte headers included.
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tap.sock")
        server = await asyncio.get_running_loop().create_unix_server(lambda: _Silent(), path)
        wire = WireTap(path, budget_bytes=budget)
        await wire.start()
        assert await wire.wait_connected(5)
        stream = wire.open_stream(_exchange())
        await asyncio.sleep(OPEN_FLUSH_S * 2)  # the OPEN frame goes to the kernel: nothing held
        stream.offer(b"x" * MAX_CHUNK_BYTES, 1)
        assert stream.shed is shed
        assert wire.stats.wire_resets == 0
        server.close()
        await wire.shutdown(0.1)


async def test_at_the_smallest_budget_a_waiting_batch_makes_room_for_the_largest_chunk() -> None:
    # The budget bounds what the forwarder holds; an analysis socket that keeps up takes a
    # waiting batch at once, so the largest chunk fits beside a batch that was waiting.
    async with _wired(stats_interval_s=60.0, budget_bytes=MIN_TAP_BUDGET) as (reads, wire):
        stream = wire.open_stream(_exchange())
        stream.offer(b"x" * (FLUSH_BYTES // 2), time.monotonic_ns())  # waits: under FLUSH_BYTES
        stream.offer(b"y" * MAX_CHUNK_BYTES, time.monotonic_ns())
        assert (stream.shed, wire.stats.chunks_dropped) == (False, 0)
        stream.close(Outcome(end_ns=time.monotonic_ns()))
        decoder, frames = WireDecoder(), []
        while not frames or frames[-1][0] != CLOSE:
            await asyncio.wait_for(reads.arrived.wait(), 10)
            reads.arrived.clear()
            while reads.reads:
                frames += decoder.feed(reads.reads.pop(0)[1])
    sizes = [len(payload) for kind, _, _, payload in frames if kind == DATA]
    assert sizes == [FLUSH_BYTES // 2, MAX_CHUNK_BYTES]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_offer_needing_room_after_the_wire_is_lost_sheds_rather_than_write(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An offer runs in the relay's read callback, and uvloop's transport raises on a write
    # once closed. Between the wire's loss and _run's reset of it (held open here), a copy
    # that needs room must be shed, not make room by writing.
    monkeypatch.setattr(WireTap, "_reset", lambda self: None)
    run = uvloop.run if loop == "uvloop" else asyncio.run
    stream, dropped = run(_offer_after_the_wire_is_lost())
    assert (stream.shed, dropped) == (True, 1)


async def _offer_after_the_wire_is_lost() -> tuple[_WireStream, int]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tap.sock")
        analysis = _Paused()
        server = await asyncio.get_running_loop().create_unix_server(lambda: analysis, path)
        wire = WireTap(path, budget_bytes=MIN_TAP_BUDGET)
        await wire.start()
        assert await wire.wait_connected(5)
        stream = wire.open_stream(_exchange())
        await asyncio.sleep(OPEN_FLUSH_S * 2)  # the OPEN frame goes out: nothing waits
        server.close()
        assert analysis.transport is not None
        analysis.transport.close()
        lost = wire._transport
        assert lost is not None
        await asyncio.sleep(0.2)  # the end reaches the forwarder; its connection_lost runs
        assert lost.is_closing()
        stream.offer(b"x" * (FLUSH_BYTES // 2), time.monotonic_ns())  # waits: under FLUSH_BYTES
        stream.offer(b"y" * MAX_CHUNK_BYTES, time.monotonic_ns())
        await wire.shutdown(0.1)
    return stream, wire.stats.chunks_dropped


class _Chunks:
    """A tap that keeps the size of every chunk the relay offers it."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def open_stream(self, exchange: Exchange) -> _Chunks:
        return self

    def unanalysed(self, reason: str) -> None:
        return None

    def offer(self, chunk: bytes, t: int) -> None:
        self.sizes.append(len(chunk))

    def close(self, outcome: Outcome) -> None:
        return None


async def _relay_one_large_body(size: int) -> list[int]:
    """The chunk sizes the relay offers its tap while it relays one body of ``size`` bytes
    that the upstream writes at once."""

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tap = _Chunks()
    relay = Relay(UpstreamSettings(url=f"http://127.0.0.1:{port}"), tap)
    host, relay_port = await relay.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(host, relay_port)
        writer.write(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(size)
        writer.close()
    finally:
        await relay.shutdown(0.5)
        server.close()
    return tap.sizes


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_no_chunk_the_relay_offers_the_tap_is_larger_than_max_chunk_bytes(loop: str) -> None:
    # MAX_CHUNK_BYTES (and so MIN_TAP_BUDGET) rests on this: a chunk is one read of the event
    # loop, and neither loop `semhealth run` may use reads more than that at once.
    size = 4 * 1024 * 1024
    run = uvloop.run if loop == "uvloop" else asyncio.run
    sizes = run(_relay_one_large_body(size))
    assert sum(sizes) == size
    assert max(sizes) <= MAX_CHUNK_BYTES
