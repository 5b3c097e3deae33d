"""The tap: bounded hand-off from the proxy to analysis, its worker and its lifecycle."""

from __future__ import annotations

import asyncio
import itertools

import orjson
import pytest

from semhealth.agent.analysis.tap import BATCH, Outcome, Tap, TapStream
from semhealth.collectors.collector import StreamCollector
from semhealth.collectors.config import Config, Limits
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import StreamRecord

_clock = itertools.count(1_000_000_000, 1_000_000)


def _exchange(path: str = "/v1/chat/completions") -> Exchange:
    return Exchange(
        method="POST",
        path=path,
        start_ns=next(_clock),
        status=200,
        content_type="text/event-stream",
        content_encoding=None,
        response_ns=next(_clock),
        request_body=b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
    )


def _delta(text: str) -> bytes:
    chunk = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _send(stream: TapStream, *texts: str) -> None:
    for text in texts:
        stream.offer(_delta(text), next(_clock))


def _close(stream: TapStream) -> None:
    stream.close(Outcome(end_ns=next(_clock)))


def _config(queue_size: int = 4096, queue_ends: int = 4096, queue_bytes: int = 8 << 20) -> Config:
    return Config(
        limits=Limits(
            tap_queue_size=queue_size, tap_queue_ends=queue_ends, tap_queue_bytes=queue_bytes
        )
    )


class _Sink:
    """The consumer: keeps records; ``wait`` resumes as soon as the worker has handed over ``n``."""

    def __init__(self) -> None:
        self.records: list[StreamRecord] = []
        self._arrived = asyncio.Event()

    def __call__(self, record: StreamRecord) -> None:
        self.records.append(record)
        self._arrived.set()

    @property
    def texts(self) -> list[str]:
        return [r.output_text for r in self.records]

    async def wait(self, n: int, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.records) < n:
                self._arrived.clear()
                await self._arrived.wait()


async def test_records_reach_the_consumer_in_the_order_streams_end() -> None:
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    try:
        first, second, third = (tap.open_stream(_exchange()) for _ in range(3))
        _send(second, "two")
        _send(first, "one")
        _send(third, "three")
        _close(second)
        _close(first)
        _close(third)
        await sink.wait(3)
    finally:
        await tap.shutdown()
    assert sink.texts == ["two", "one", "three"]
    assert tap.stats.records == 3
    assert (tap.stats.streams_opened, tap.stats.streams_closed) == (3, 3)


async def test_interleaved_chunks_of_streams_stay_apart() -> None:
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    try:
        a, b = tap.open_stream(_exchange()), tap.open_stream(_exchange())
        for x, y in zip("abc", "xyz", strict=True):
            _send(a, x)
            _send(b, y)
        _close(a)
        _close(b)
        await sink.wait(2)
    finally:
        await tap.shutdown()
    assert sink.texts == ["abc", "xyz"]
    assert [len(r.delta_ns) for r in sink.records] == [3, 3]


async def test_outcome_reaches_the_record() -> None:
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    try:
        stream = tap.open_stream(_exchange())
        _send(stream, "partial")
        stream.close(
            Outcome(end_ns=next(_clock), upstream_aborted=True, error_type="upstream_aborted")
        )
        await sink.wait(1)
    finally:
        await tap.shutdown()
    assert sink.records[0].upstream_aborted
    assert sink.records[0].error_type == "upstream_aborted"
    assert not sink.records[0].shed


async def test_full_queue_marks_the_stream_shed() -> None:
    sink = _Sink()
    tap = Tap(_config(queue_size=2), sink)
    await tap.start()
    try:
        stream = tap.open_stream(_exchange())
        # No await between offers: the worker cannot drain, so the third chunk finds it full.
        _send(stream, "a", "b", "c", "d", "e")
        assert stream.shed
        _close(stream)
        await sink.wait(1)
    finally:
        await tap.shutdown()
    (record,) = sink.records
    assert record.shed
    assert record.output_text == "ab"  # what was queued before the queue filled


async def test_every_dropped_chunk_is_counted_and_the_stream_once() -> None:
    tap = Tap(_config(queue_size=2), lambda record: None)
    await tap.start()
    try:
        stream = tap.open_stream(_exchange())
        _send(stream, "a", "b", "c", "d", "e")
        assert tap.stats.chunks_dropped == 3
        assert tap.stats.streams_shed == 1
    finally:
        await tap.shutdown()


async def test_shedding_one_stream_leaves_the_next_one_whole() -> None:
    sink = _Sink()
    tap = Tap(_config(queue_size=2), sink)
    await tap.start()
    try:
        flooded = tap.open_stream(_exchange())
        _send(flooded, "a", "b", "c")
        _close(flooded)
        await sink.wait(1)  # the worker drains the queue
        calm = tap.open_stream(_exchange())
        _send(calm, "x", "y")
        _close(calm)
        await sink.wait(2)
    finally:
        await tap.shutdown()
    assert [(r.shed, r.output_text) for r in sink.records] == [(True, "ab"), (False, "xy")]
    assert tap.stats.streams_shed == 1


async def test_a_chunk_past_the_queued_bytes_sheds_its_stream_and_is_counted() -> None:
    size = len(_delta("a"))
    tap = Tap(_config(queue_bytes=3 * size), lambda record: None)
    await tap.start()
    try:
        stream = tap.open_stream(_exchange())
        _send(stream, "a", "b", "c")
        assert (stream.shed, tap.stats.queue_bytes) == (False, 3 * size)
        _send(stream, "d", "e")
        assert stream.shed
        assert (tap.stats.chunks_dropped, tap.stats.streams_shed) == (2, 1)
        assert (tap.stats.queue_depth, tap.stats.queue_bytes) == (3, 3 * size)
    finally:
        await tap.shutdown()


async def test_one_large_chunk_is_shed_by_bytes_while_the_count_has_room() -> None:
    tap = Tap(_config(queue_bytes=1024), lambda record: None)
    await tap.start()
    try:
        stream = tap.open_stream(_exchange())
        stream.offer(b"data: " + b"x" * 2048 + b"\n\n", next(_clock))
        assert stream.shed
        assert (tap.stats.chunks_dropped, tap.stats.queue_depth, tap.stats.queue_bytes) == (1, 0, 0)
    finally:
        await tap.shutdown()


async def test_analysed_chunks_give_their_bytes_back_to_the_bound() -> None:
    # The bound holds three chunks; nine pass through it, three streams one after another.
    sink = _Sink()
    tap = Tap(_config(queue_bytes=3 * len(_delta("a"))), sink)
    await tap.start()
    try:
        for n in range(3):
            stream = tap.open_stream(_exchange())
            _send(stream, "a", "b", "c")
            _close(stream)
            await sink.wait(n + 1)
            assert tap.stats.queue_bytes == 0
    finally:
        await tap.shutdown()
    assert sink.texts == ["abc"] * 3
    assert tap.stats.chunks_dropped == 0


async def test_the_queued_bytes_are_those_waiting_when_a_time_slice_ends_inside_a_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("semhealth.agent.analysis.tap._SLICE_NS", 0)  # a yield every 8 chunks
    tap = Tap(_config(), lambda record: None)
    await tap.start()
    partial_waits = 0
    try:
        stream = tap.open_stream(_exchange())
        _send(stream, *(f"{i} " for i in range(2 * BATCH + 3)))
        while stream.pending:
            await asyncio.sleep(0)  # the worker analyses 8 chunks, then yields
            waiting = sum(len(chunk) for _, chunk in stream.pending)
            assert stream.pending_bytes == waiting
            assert tap.stats.queue_bytes == waiting
            partial_waits += bool(stream.pending)
    finally:
        await tap.shutdown()
    assert partial_waits >= 2  # the slices ended inside the stream's wait
    assert tap.stats.queue_bytes == 0


@pytest.mark.parametrize(
    "bound",
    [{"queue_size": 128}, {"queue_bytes": 128 * len(_delta("a"))}],
    ids=["chunks", "bytes"],
)
async def test_many_streams_each_below_a_batch_are_analysed_before_they_fill_a_bound(
    bound: dict[str, int],
) -> None:
    # 64 streams of 3 chunks, room for 128 chunks (or their bytes): no stream reaches BATCH,
    # yet once half the bound waits every stream's chunks go to the worker, so none is shed.
    sink = _Sink()
    tap = Tap(_config(**bound), sink)
    await tap.start()
    try:
        streams = [tap.open_stream(_exchange()) for _ in range(64)]
        for stream in streams:
            _send(stream, "a", "b", "c")
            await asyncio.sleep(0)  # the worker's turn, as the forwarding loop would give it
        assert not any(stream.shed for stream in streams)
        for stream in streams:
            _close(stream)
        await sink.wait(64)
    finally:
        await tap.shutdown()
    assert tap.stats.chunks_dropped == 0
    assert {r.output_text for r in sink.records} == {"abc"}


async def test_a_long_stream_is_analysed_in_order_across_batches_and_time_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("semhealth.agent.analysis.tap._SLICE_NS", 0)  # a yield every 8 chunks
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    texts = [f"{i} " for i in range(3 * BATCH + 5)]
    try:
        stream = tap.open_stream(_exchange())
        for text in texts:
            _send(stream, text)
            await asyncio.sleep(0)
        _close(stream)
        await sink.wait(1)
    finally:
        await tap.shutdown()
    (record,) = sink.records
    assert record.output_text == "".join(texts)
    assert len(record.delta_ns) == len(texts)
    assert list(record.delta_ns) == sorted(record.delta_ns)


async def test_chunks_below_a_batch_wait_in_the_stream_until_it_ends() -> None:
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    try:
        stream = tap.open_stream(_exchange())
        _send(stream, "a", "b")
        await asyncio.sleep(0.01)
        assert stream.collector is None  # nothing analysed yet: two chunks wait
        assert tap.stats.queue_depth == 2
        _close(stream)
        await sink.wait(1)
    finally:
        await tap.shutdown()
    assert sink.texts == ["ab"]
    assert tap.stats.queue_depth == 0


async def test_at_most_queue_ends_stream_ends_wait_and_the_rest_are_counted() -> None:
    sink = _Sink()
    tap = Tap(_config(queue_ends=2), sink)
    await tap.start()
    try:
        streams = [tap.open_stream(_exchange()) for _ in range(3)]
        for stream, text in zip(streams, ("a", "b", "c"), strict=True):
            _send(stream, text)
        # No await between closes: the worker cannot drain, so the third end finds two waiting.
        for stream in streams:
            _close(stream)
        await sink.wait(2)
    finally:
        await tap.shutdown()
    assert sink.texts == ["a", "b"]
    assert tap.stats.records == 2
    assert tap.stats.records_shed == 1
    assert tap.stats.streams_closed == 3
    assert streams[2].pending_bytes == 0  # the shed end's chunk gave its bytes back at once


async def test_the_chunks_of_a_stream_whose_end_was_shed_are_not_analysed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fed: list[bytes] = []
    feed = StreamCollector.feed

    def counting_feed(self: StreamCollector, chunk: bytes, t: int) -> None:
        fed.append(chunk)
        feed(self, chunk, t)

    monkeypatch.setattr(StreamCollector, "feed", counting_feed)
    tap = Tap(_config(queue_ends=2), lambda record: None)
    await tap.start()
    ended, also_ended, late = (tap.open_stream(_exchange()) for _ in range(3))
    _close(ended)
    _close(also_ended)
    _send(late, "queued before its end found two ends waiting")
    _close(late)
    await tap.shutdown()
    assert (tap.stats.records, tap.stats.records_shed) == (2, 1)
    assert fed == []


async def test_a_failing_consumer_is_counted_and_the_worker_carries_on() -> None:
    sink = _Sink()

    def consume(record: StreamRecord) -> None:
        if record.output_text == "bad":
            raise RuntimeError("consumer bug")
        sink(record)

    tap = Tap(_config(), consume)
    await tap.start()
    try:
        for text in ("bad", "good"):
            stream = tap.open_stream(_exchange())
            _send(stream, text)
            _close(stream)
        await sink.wait(1)
    finally:
        await tap.shutdown()
    assert sink.texts == ["good"]
    assert tap.stats.analysis_errors == 1
    assert tap.stats.records == 2  # both were produced; one consumer failed on its record


async def test_analysis_failure_costs_only_that_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    feed = StreamCollector.feed
    doomed_calls = 0

    def failing_feed(self: StreamCollector, chunk: bytes, t: int) -> None:
        nonlocal doomed_calls
        if b"doomed" in chunk:
            doomed_calls += 1
            raise ValueError("decoder bug")
        feed(self, chunk, t)

    monkeypatch.setattr(StreamCollector, "feed", failing_feed)
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    try:
        broken, healthy = tap.open_stream(_exchange()), tap.open_stream(_exchange())
        _send(broken, "doomed", "doomed", "doomed")
        _send(healthy, "fine")
        _close(broken)
        _close(healthy)
        await sink.wait(1)
        later = tap.open_stream(_exchange())
        _send(later, "later")
        _close(later)
        await sink.wait(2)
    finally:
        await tap.shutdown()
    assert sink.texts == ["fine", "later"]
    assert tap.stats.analysis_errors == 1
    assert doomed_calls == 1  # the stream's later chunks were skipped, not retried
    assert broken.failed


async def test_shutdown_without_start_is_a_no_op() -> None:
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.shutdown()
    assert sink.records == []
    assert tap.stats.records == 0


async def test_shutdown_twice_drains_once_and_sheds_what_comes_after() -> None:
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    stream = tap.open_stream(_exchange())
    _send(stream, "one", "two")
    _close(stream)
    await tap.shutdown()
    await tap.shutdown()
    assert [r.output_text for r in sink.records] == ["onetwo"]
    late = tap.open_stream(_exchange())
    _send(late, "three")
    assert late.shed
    assert tap.stats.streams_shed == 1
    assert len(sink.records) == 1


async def test_shutdown_drains_queued_streams() -> None:
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    for i in range(20):
        stream = tap.open_stream(_exchange())
        _send(stream, f"s{i}", "!")
        _close(stream)
    # Nothing has been analysed yet: the worker has not had the loop since.
    assert sink.records == []
    await tap.shutdown(timeout_s=5.0)
    assert sink.texts == [f"s{i}!" for i in range(20)]


async def test_shutdown_keeps_to_its_deadline_when_analysis_is_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    feed = StreamCollector.feed

    def slow_feed(self: StreamCollector, chunk: bytes, t: int) -> None:
        # Blocks the loop like a pathological decoder would: the deadline must still hold.
        loop_time = asyncio.get_running_loop().time
        end = loop_time() + 0.01
        while loop_time() < end:
            pass
        feed(self, chunk, t)

    monkeypatch.setattr(StreamCollector, "feed", slow_feed)
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    stream = tap.open_stream(_exchange())
    _send(stream, *["x"] * 1000)  # ~10 s of analysis
    _close(stream)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await tap.shutdown(timeout_s=0.2)
    assert loop.time() - began < 2.0
    assert sink.records == []


async def test_offers_after_shutdown_are_shed_not_queued() -> None:
    sink = _Sink()
    tap = Tap(_config(), sink)
    await tap.start()
    stream = tap.open_stream(_exchange())
    await tap.shutdown()
    _send(stream, "late", "later")
    assert stream.shed
    assert tap.stats.chunks_dropped == 2
    assert tap.stats.streams_shed == 1
    assert tap.stats.queue_depth == 0
    assert sink.records == []


async def test_streams_opened_after_shutdown_are_shed() -> None:
    tap = Tap(_config(), lambda record: None)
    await tap.start()
    await tap.shutdown()
    stream = tap.open_stream(_exchange())
    _send(stream, "late")
    assert stream.shed
    assert tap.stats.chunks_dropped == 1
    assert tap.stats.streams_shed == 1


async def test_a_fresh_tap_on_the_same_config_starts_after_another_shut_down() -> None:
    config = _config()
    sink = _Sink()
    first = Tap(config, sink)
    await first.start()
    await first.shutdown()
    second = Tap(config, sink)
    await second.start()
    try:
        stream = second.open_stream(_exchange())
        _send(stream, "again")
        _close(stream)
        await sink.wait(1)
    finally:
        await second.shutdown()
    assert sink.texts == ["again"]
