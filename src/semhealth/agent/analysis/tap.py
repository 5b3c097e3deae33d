"""The tap: copies of the proxy's traffic, handed to analysis without ever waiting.

The proxy owns one ``TapStream`` per exchange and calls it after each chunk
has been written to the client. A stream's chunks wait in it, all streams' together
bounded by ``limits.tap_queue_size`` chunks and ``limits.tap_queue_bytes`` bytes; when a
chunk would pass either bound the stream is marked shed, its later chunks are skipped and
the drop is counted (``dropped["tap"]``), and the client never notices. Streams' ends
have a budget of their own (``limits.tap_queue_ends``): an end that finds that many ended
streams waiting is not analysed, so its stream gets no record (``dropped["records"]``) and
its waiting chunks are dropped with it.

One worker task analyses waiting chunks a stream at a time, once ``BATCH`` of them
wait, the stream ends, or the waiting chunks of all streams reach half either bound:
it drives a sans-IO ``StreamCollector`` per stream and hands each finished
``StreamRecord`` to ``consume_record``. Analysing a stream's chunks back to back
rather than one chunk per wake-up as they come is what makes a chunk cost in the
running process what it costs in ``bench/record_cost.py``: interleaved with the wire's
reads and the loop's callbacks, the same code ran 1.6 times slower (measured with
thread CPU clocks around ``StreamCollector.feed`` in the analysis process).

A ``Tee`` (``semhealth run --record``) gets exactly what the collector got: the
exchange, each chunk with its arrival time, and how it closed, so a replay of it
builds the same record.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from semhealth.agent.telemetry.observe import observe, observe_by, observe_counters
from semhealth.agent.wire import Outcome
from semhealth.collectors.collector import StreamCollector
from semhealth.collectors.config import Config as CollectorsConfig
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import StreamRecord

log = logging.getLogger(__name__)

ConsumeRecord = Callable[[StreamRecord], None]
# Told of each exchange when its stream opens (the response head is in), before any chunk:
# live shadowing starts the candidate's request here. Runs on the forwarding path in one
# process, so it must decide in O(1) and never block.
OnOpen = Callable[[Exchange], None]


class Tee(Protocol):
    """Receives a copy of each exchange the collectors analysed (``--record``)."""

    @property
    def max_exchange_bytes(self) -> int:
        """Body bytes kept per exchange; later chunks are only counted."""

    def capture(
        self,
        exchange: Exchange,
        chunks: list[tuple[int, bytes]],
        elided_bytes: int,
        outcome: Outcome,
        shed: bool,
    ) -> None:
        """One closed exchange; must not block."""


# The worker shares the event loop with forwarding. It yields after this much
# analysis so a chunk waiting to be relayed is never held back longer than that.
_SLICE_NS = 200_000
# A stream's chunks are analysed once this many wait (or it ends). Analysis is behind
# the stream by at most this many chunks; its arrival times travel with the chunks, so
# no signal changes.
BATCH = 32


@dataclass(slots=True)
class TapStats:
    """Counters the telemetry layer reads; plain ints, updated on the loop thread only."""

    streams_opened: int = 0
    streams_closed: int = 0
    records: int = 0
    chunks_dropped: int = 0
    streams_shed: int = 0
    requests_unanalysed: dict[str, int] = field(default_factory=dict)
    analysis_errors: int = 0
    records_shed: int = 0  # streams that ended while the ends' budget was full: no record
    queue_depth: int = 0
    queue_bytes: int = 0  # of the chunks queue_depth counts
    # The forwarders' own, reported over the tap wire (or shared by the in-process relay).
    requests_rejected: dict[str, int] = field(default_factory=dict)  # malformed, by reason
    analysis_restarts: int = 0
    wire_resets: int = 0

    def unanalysed(self, reason: str) -> None:
        self.requests_unanalysed[reason] = self.requests_unanalysed.get(reason, 0) + 1


class TapStream:
    """The proxy's handle on one exchange's analysis."""

    __slots__ = (
        "_tap",
        "analysis_ns",
        "collector",
        "elided_bytes",
        "ended_unanalysed",
        "exchange",
        "failed",
        "outcome",
        "pending",
        "pending_bytes",
        "queued",
        "recorded",
        "recorded_bytes",
        "shed",
    )

    def __init__(self, tap: Tap, exchange: Exchange) -> None:
        self._tap = tap
        self.exchange = exchange
        self.collector: StreamCollector | None = None  # created by the worker, never by the proxy
        self.shed = False
        self.failed = False  # analysis raised; the rest of this stream is skipped
        self.ended_unanalysed = False  # its end was shed: its queued chunks are skipped
        self.analysis_ns = 0  # time the worker spent on this stream
        self.outcome: Outcome | None = None
        self.pending: list[tuple[int, bytes]] = []  # (arrival, chunk) not analysed yet
        self.pending_bytes = 0
        self.queued = False  # in the worker's queue
        # The tee's copy (worker only): what the collector was fed, with arrival times.
        self.recorded: list[tuple[int, bytes]] = []
        self.recorded_bytes = 0
        self.elided_bytes = 0

    def offer(self, chunk: bytes, t: int) -> None:
        """Hand a copy of a chunk that has already been written to the client. Never blocks."""
        self._tap.offer(self, chunk, t)

    def close(self, outcome: Outcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self._tap.close_stream(self)


class Tap:
    """Bounded hand-off from the proxy to the collectors, and the worker that drains it."""

    def __init__(
        self,
        config: CollectorsConfig,
        consume_record: ConsumeRecord,
        *,
        stats: TapStats | None = None,
        observe_analysis: Callable[[float], None] | None = None,
        on_task_failure: Callable[[BaseException], None] | None = None,
        tee: Tee | None = None,
        on_open: OnOpen | None = None,
    ) -> None:
        self._config = config
        self._tee = tee
        self._on_open = on_open
        self._consume_record = consume_record
        self._observe_analysis = observe_analysis
        self._on_task_failure = on_task_failure
        self._capacity = config.limits.tap_queue_size
        self._byte_capacity = config.limits.tap_queue_bytes
        # Past this many waiting chunks or bytes every stream's are queued, so streams that
        # each hold fewer than BATCH cannot fill a bound between them and get shed.
        self._flush_at = max(self._capacity // 2, 1)
        self._flush_bytes = self._byte_capacity // 2
        self._items: collections.deque[TapStream] = collections.deque()  # streams to analyse
        self._waiting: dict[TapStream, None] = {}  # streams with chunks, not yet queued
        self._end_capacity = config.limits.tap_queue_ends
        self._data_items = 0
        self._data_bytes = 0
        self._end_items = 0
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()  # set whenever the worker finds the queue empty
        self._task: asyncio.Task[None] | None = None
        self._accepting = True
        self.stats = stats or TapStats()

    def unanalysed(self, reason: str) -> None:
        self.stats.unanalysed(reason)

    def open_stream(self, exchange: Exchange) -> TapStream:
        self.stats.streams_opened += 1
        if self._on_open is not None:
            try:
                self._on_open(exchange)
            except Exception:
                self.stats.analysis_errors += 1
                log.exception("the open-stream hook failed")
        # After shutdown its first offer finds the tap closed and sheds it, counted once.
        return TapStream(self, exchange)

    def offer(self, stream: TapStream, chunk: bytes, t: int) -> None:
        """``stream.offer``, which the wire's receiver calls straight: a call less a chunk."""
        size = len(chunk)
        if (
            stream.shed
            or not self._accepting
            or self._data_items >= self._capacity
            or self._data_bytes + size > self._byte_capacity
        ):
            if not stream.shed:
                stream.shed = True
                self.stats.streams_shed += 1
            # Every copy left unanalysed counts, not only the one that found the queue full.
            self.stats.chunks_dropped += 1
            return
        pending = stream.pending
        pending.append((t, chunk))
        stream.pending_bytes += size
        self._data_items += 1
        self._data_bytes += size
        stats = self.stats
        stats.queue_depth = self._data_items
        stats.queue_bytes = self._data_bytes
        if stream.queued:
            return
        if len(pending) >= BATCH:
            self._queue(stream)
        else:
            self._waiting[stream] = None
        if self._data_items >= self._flush_at or self._data_bytes >= self._flush_bytes:
            self._queue_waiting()

    def close_stream(self, stream: TapStream) -> None:
        self.stats.streams_closed += 1
        # Ends need a budget too. One arrives per stream, not per open stream: while
        # analysis is slower than streams end (at nice 10 it gets the CPU last) they piled
        # up without limit, each holding its exchange and request body (about 1 KiB a stream
        # in bench/soak.py, up to limits.max_request_bytes), and the analysis process grew
        # with the backlog (51,886 ends, 49 MiB, in a soak slowed by tracemalloc).
        if self._end_items >= self._end_capacity:
            stream.ended_unanalysed = True
            self.stats.records_shed += 1
            self._waiting.pop(stream, None)
            # No record will be built: analysing its chunks is for nothing.
            self._release(stream, len(stream.pending))
            return
        self._end_items += 1
        if not stream.queued:
            self._queue(stream)

    def _queue(self, stream: TapStream) -> None:
        self._waiting.pop(stream, None)
        stream.queued = True
        self._items.append(stream)
        self._wakeup.set()

    def _queue_waiting(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for stream in waiting:
            stream.queued = True
            self._items.append(stream)
        self._wakeup.set()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="semhealth-tap")
            self._task.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._on_task_failure:
            self._on_task_failure(task.exception())  # type: ignore[arg-type]

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop taking chunks, analyse what is queued (within the deadline), stop the worker."""
        self._accepting = False
        self._queue_waiting()
        task, self._task = self._task, None
        if task is None or task.done():
            return  # never started, or died: its failure was reported when it happened
        self._drained.clear()
        self._wakeup.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), timeout_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while True:
            if not self._items:
                self._drained.set()
                self._wakeup.clear()
                await self._wakeup.wait()
            slice_end = time.perf_counter_ns() + _SLICE_NS
            items = self._items
            while items:  # at least one stream's turn a slice, however short
                stream = items[0]
                if self._analyse(stream, slice_end):
                    items.popleft()
                    stream.queued = False
                if time.perf_counter_ns() >= slice_end:
                    break
            self.stats.queue_depth = self._data_items
            self.stats.queue_bytes = self._data_bytes
            await asyncio.sleep(0)

    def _analyse(self, stream: TapStream, slice_end: int) -> bool:
        """Analyse what ``stream`` has waiting, and its end once it has ended; False when the
        time slice ran out first (the rest stays waiting, in order)."""
        if stream.ended_unanalysed:
            return True
        pending = stream.pending
        if pending:
            done = self._feed(stream, slice_end)
            if self._tee is not None:
                for t, chunk in pending[:done]:
                    self._tee_chunk(stream, chunk, t)
            self._release(stream, done)
            if pending:
                return False
        if stream.outcome is not None:
            self._end_items -= 1
            if self._tee is not None:
                self._tee_end(stream)
            self._finish(stream)
        return True

    def _release(self, stream: TapStream, done: int) -> None:
        """Drop the first ``done`` of the stream's waiting chunks from it and from the bounds."""
        pending = stream.pending
        if done == len(pending):  # nearly always: the stream's whole wait was taken
            size = stream.pending_bytes
            pending.clear()
        else:
            size = sum(len(chunk) for _, chunk in pending[:done])
            del pending[:done]
        stream.pending_bytes -= size
        self._data_items -= done
        self._data_bytes -= size

    def _feed(self, stream: TapStream, slice_end: int) -> int:
        """Feed the stream's waiting chunks to its collector, in order, until they or the time
        slice run out; the number taken (chunks of a failed stream are taken unanalysed)."""
        pending = stream.pending
        if stream.failed:
            return len(pending)
        began = time.perf_counter_ns()
        done = 0
        # Analysis must never take the worker down: a bug in a decoder costs one record.
        try:
            if stream.collector is None:
                stream.collector = StreamCollector(stream.exchange, self._config)
            feed = stream.collector.feed
            for t, chunk in pending:
                feed(chunk, t)
                done += 1
                if done % 8 == 0 and time.perf_counter_ns() >= slice_end:
                    break
        except Exception:
            self._failed(stream)
            return len(pending)
        stream.analysis_ns += time.perf_counter_ns() - began
        return done

    def _finish(self, stream: TapStream) -> None:
        """The ended stream's record, to the consumers."""
        if stream.failed:
            return
        outcome = stream.outcome
        assert outcome is not None
        began = time.perf_counter_ns()
        try:
            collector = stream.collector or StreamCollector(stream.exchange, self._config)
            record = collector.finish(
                outcome.end_ns,
                client_aborted=outcome.client_aborted,
                upstream_aborted=outcome.upstream_aborted,
                shed=stream.shed,
                error_type=outcome.error_type,
            )
        except Exception:
            self._failed(stream)
            return
        stream.collector = None
        stream.analysis_ns += time.perf_counter_ns() - began
        self.stats.records += 1
        if self._observe_analysis is not None:
            self._observe_analysis(stream.analysis_ns / 1e9)
        try:
            self._consume_record(record)
        except Exception:
            self.stats.analysis_errors += 1
            log.exception("record consumer failed")

    def _failed(self, stream: TapStream) -> None:
        self.stats.analysis_errors += 1
        log.exception("analysis failed for one stream (route=%s)", _route_of(stream))
        stream.failed = True
        stream.collector = None

    def _tee_chunk(self, stream: TapStream, chunk: bytes, t: int) -> None:
        tee = self._tee
        assert tee is not None
        if stream.recorded_bytes < tee.max_exchange_bytes:
            stream.recorded.append((t, chunk))
            stream.recorded_bytes += len(chunk)
        else:
            stream.elided_bytes += len(chunk)

    def _tee_end(self, stream: TapStream) -> None:
        tee = self._tee
        assert tee is not None and stream.outcome is not None
        recorded, stream.recorded = stream.recorded, []
        try:
            tee.capture(stream.exchange, recorded, stream.elided_bytes, stream.outcome, stream.shed)
        except Exception:
            self.stats.analysis_errors += 1
            log.exception("recording an exchange failed")


def _route_of(stream: TapStream) -> str:
    return stream.collector.route if stream.collector is not None else "?"


def observe_tap(meter: Any, stats: TapStats, active_streams: Callable[[], int]) -> None:
    """The tap's instruments, read from ``stats`` at collection time (the forwarders' counts
    arrive in the same stats over the tap wire)."""
    gauges = {
        "semhealth_streams_active": (active_streams, "Exchanges the proxy is relaying now."),
        "semhealth_tap_queue_depth": (
            lambda: stats.queue_depth,
            "Response chunks waiting for analysis.",
        ),
        "semhealth_tap_queue_bytes": (
            lambda: stats.queue_bytes,
            "Bytes of the response chunks waiting for analysis.",
        ),
    }
    for name, (read, description) in gauges.items():
        meter.create_observable_up_down_counter(name, [observe(read)], description=description)
    observe_counters(
        meter,
        {
            "semhealth_streams_shed": (
                lambda: stats.streams_shed,
                "Exchanges whose analysis was incomplete because the tap shed chunks.",
            ),
            "semhealth_records": (lambda: stats.records, "Exchanges analysed into a record."),
            "semhealth_analysis_errors": (
                lambda: stats.analysis_errors,
                "Exchanges whose analysis failed inside semhealth (a bug: please report).",
            ),
            "semhealth_analysis_restarts": (
                lambda: stats.analysis_restarts,
                "Times the analysis process died and was started again (forwarding went on).",
            ),
            "semhealth_tap_wire_resets": (
                lambda: stats.wire_resets,
                "Times a forwarder dropped its tap wire because analysis stopped reading it.",
            ),
        },
    )
    meter.create_observable_counter(
        "semhealth_requests_unanalysed",
        [observe_by("reason", lambda: dict(stats.requests_unanalysed))],
        description="Requests forwarded without analysing their body, by reason.",
    )
    meter.create_observable_counter(
        "semhealth_requests_rejected",
        [observe_by("reason", lambda: dict(stats.requests_rejected))],
        description="Malformed requests the proxy answered itself, never forwarded "
        "(malformed, header_timeout, head_too_large, method_not_allowed).",
    )
