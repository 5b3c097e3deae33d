"""The forwarder's end of the tap wire: copies of the relay's traffic, framed
(``semhealth.agent.wire``) and sent to the analysis process over a Unix socket in batches,
never awaited: copies wait up to five seconds, a stream's open and its end (with what waits
before either) up to 250 ms, and once 128 KiB wait they go at the end of the loop iteration.
A copy read when the last batch went five seconds ago goes in the wake-up its read made, not
the timer's. The forwarder's counters (``STATS``) go with a batch once half a second old, and on
their own only after a second without one, and then only if they changed: an idle forwarder
never wakes analysis.

The forwarder's side keeps the bytes it has not yet handed to the kernel under a budget:
past it, data frames are shed and counted (``dropped{stage="tap"}``) and the stream is
marked shed. Control frames are small and one per exchange end; if even they do not fit
under twice the budget, analysis is stuck, and the wire is dropped and reconnected, which
costs analysis the streams in flight (counted), never the client a byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import cast

import orjson

from semhealth.agent.wire import (
    DATA,
    HEADER,
    STATS,
    ForwarderStats,
    Outcome,
    encode_close,
    encode_open,
)
from semhealth.collectors.exchange import Exchange

log = logging.getLogger(__name__)

_RECONNECT_S = (0.05, 2.0)  # first and longest wait between connection attempts
FLUSH_S = 0.25  # the longest a stream's end waits in the forwarder before it is sent
# The longest a stream's open waits: live shadowing starts its candidate's request when
# analysis sees it.
OPEN_FLUSH_S = 0.25
DATA_FLUSH_S = 5.0  # the longest a trickle of copies waits
# This much waiting goes at the end of the loop iteration. Twice as much measured no better
# at 50 and 200 streams (see _schedule_flush).
FLUSH_BYTES = 128 * 1024


class _WireStream:
    """The relay's handle on one exchange's copies."""

    __slots__ = ("closed", "id", "lost", "shed", "wire")

    def __init__(self, wire: WireTap, stream_id: int, lost: bool) -> None:
        self.wire = wire
        self.id = stream_id
        self.shed = lost  # opened while analysis was unreachable: nothing of it is sent
        self.lost = lost
        self.closed = False

    def offer(self, chunk: bytes, t: int) -> None:
        self.wire.offer(self, chunk, t)

    def close(self, outcome: Outcome) -> None:
        if not self.closed:
            self.closed = True
            self.wire.close_stream(self, outcome)


class WireTap:
    """The forwarder's tap: holds copies and control frames in order, framed into one write."""

    def __init__(
        self,
        path: str,
        *,
        budget_bytes: int,
        worker: int = 0,
        stats_interval_s: float = 1.0,
        relay_stats: Callable[[], tuple[int, dict[str, int], dict[str, int]]] | None = None,
    ) -> None:
        self._path = path
        self._budget = budget_bytes
        self._stats_interval_s = stats_interval_s
        self._relay_stats = relay_stats  # (active, rejected, errors) from the relay
        self.stats = ForwarderStats(worker=worker, pid=os.getpid())
        # Frames waiting, in order: control frames encoded, copies as (stream id, arrival
        # time, bytes), framed at the flush; and their size as the wire will carry them.
        self._frames: list[bytes | tuple[int, int, bytes]] = []
        self._held = 0
        self._backlog = 0  # the transport's write buffer when last asked (drains till a write)
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flush_due = 0.0  # the loop time the timer fires at
        self._flush_soon = False  # a flush is queued for the end of this loop iteration
        self._batch_due_ns = 0  # a copy read from then on (monotonic_ns) goes with its read
        self._stats_sent: bytes | None = None  # the counters analysis has
        self._stats_timer: asyncio.TimerHandle | None = None
        self._stats_ride_ns = 0  # from then on (monotonic_ns) the counters go with a batch
        self._transport: asyncio.WriteTransport | None = None
        self._streams: dict[int, _WireStream] = {}
        self._next_id = 0
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = asyncio.Event()
        self._stopping = False

    @property
    def connected(self) -> bool:
        return self._transport is not None

    # -- the relay's side (TapSink)

    def unanalysed(self, reason: str) -> None:
        counts = self.stats.requests_unanalysed
        counts[reason] = counts.get(reason, 0) + 1
        self.poke()

    def open_stream(self, exchange: Exchange) -> _WireStream:
        self.stats.streams_opened += 1
        self.poke()
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        stream = _WireStream(self, self._next_id, lost=self._transport is None)
        if stream.lost:
            self.stats.streams_shed += 1
            return stream
        self._streams[stream.id] = stream
        self._append(encode_open(stream.id, exchange), within_s=OPEN_FLUSH_S)
        return stream

    def offer(self, stream: _WireStream, chunk: bytes, t: int) -> None:
        if stream.shed:
            self.stats.chunks_dropped += 1
            return
        frame = HEADER.size + len(chunk)  # the frame, as the wire carries it
        held = self._held + frame
        # The transport's buffer drains but never grows between writes: the figure last
        # asked bounds it, and the transport is asked again only when that bound is too
        # close. A copy is framed at the flush. At one stream, framing and asking per copy
        # cost the forwarder 0.8 ms of about 11 a request (eight interleaved pairs).
        if held + self._backlog > self._budget:
            if not self._room_for(frame):
                stream.shed = True
                self.stats.streams_shed += 1
                self.stats.chunks_dropped += 1
                return
            held = self._held + frame  # what waited may have gone to the kernel
        self._held = held
        self._frames.append((stream.id, t, chunk))
        if t >= self._batch_due_ns:
            # A batch is due and this read woke the forwarder already: sent now, the timer
            # never fires while copies keep coming. At one stream, with one-second batches,
            # that was five wake-ups a request of about seventy, 3-4 % of the forwarder's CPU.
            self._schedule_flush(0.0)
        elif self._flush_timer is None or held >= FLUSH_BYTES:
            self._schedule_flush(DATA_FLUSH_S)

    def close_stream(self, stream: _WireStream, outcome: Outcome) -> None:
        if stream.lost or self._streams.pop(stream.id, None) is None:
            return
        self._append(encode_close(stream.id, outcome, stream.shed), within_s=FLUSH_S)

    # -- buffering

    def _room_for(self, frame: int) -> bool:
        """Whether the budget holds a frame of ``frame`` bytes once what waits has gone to
        the kernel: the budget bounds what the forwarder holds, and the socket of an analysis
        process that keeps up takes what waits at once. Without that, a budget as small as
        MIN_TAP_BUDGET would shed the largest chunk whenever a batch waited."""
        if self._held + frame + self._kernel_backlog() <= self._budget:
            return True
        # With bytes in the transport's buffer (analysis behind) a flush would only move what
        # waits there. A transport that is closing waits for _run to reset the wire; uvloop's
        # raises on a write once closed, and this runs in the relay's read callback.
        transport = self._transport
        if not self._frames or self._backlog or transport is None or transport.is_closing():
            return False
        self._flush()
        return frame + self._backlog <= self._budget

    def _kernel_backlog(self) -> int:
        transport = self._transport
        self._backlog = transport.get_write_buffer_size() if transport is not None else 0
        return self._backlog

    def _append(self, frame: bytes, *, within_s: float) -> None:
        """Queue a control frame: small, one an exchange end, never shed under the budget."""
        if self._transport is None:
            return
        if self._held + self._kernel_backlog() + len(frame) > 2 * self._budget:
            log.warning("analysis is not reading the tap: resetting the wire")
            self._reset()
            return
        self._frames.append(frame)
        self._held += len(frame)
        self._schedule_flush(within_s)

    def _schedule_flush(self, within_s: float) -> None:
        # Copies carry their arrival times, so when analysis gets them changes no signal,
        # and each write wakes the analysis process: fewer, larger writes cost both
        # processes less. Copies wait up to DATA_FLUSH_S; a stream's end waits up to FLUSH_S,
        # so its record follows the end within that; once FLUSH_BYTES wait, everything goes
        # at the end of this loop iteration. 32 KiB against 4 KiB, 50 streams of 64 tokens at
        # 20 ms gaps on 2 cores (relevance off): the analysis process read its wire a fifth as
        # often (2.5 -> 0.5 reads a request) and spent 1.24 ms a request instead of 1.94. A
        # second against 250 ms at one stream: 5.5 -> 2.2 reads a request, 28-30 -> 23-25 µs
        # of analysis an event; five seconds against one (the counters joining waiting
        # copies): 2.17 -> 1.17 reads a request, 24.8-27.1 -> 18.3-21.6 µs an event. A batch
        # after a pause costs analysis more than the same batch straight after another
        # (bench/analysis_batches.py: a stream alone 1.8-1.9 times as much), so ends wait
        # 250 ms and batches go at 128 KiB, against 50 ms and 32 KiB: in steady traffic of
        # 50 streams, ends came every 27 ms and 50 ms capped a batch at about two streams.
        # bench/proxy_overhead.py's steady rounds, on equally busy runs: 25.2 -> 15.8 µs an
        # event at 50 streams, 18.8 -> 14.8 at 200 (its waves, where a round's ends come
        # together, cannot show it). Nothing in analysis reads a stream's copies before its
        # end but the record.
        if self._flush_soon:
            return
        loop = self._loop or asyncio.get_running_loop()
        if self._held >= FLUSH_BYTES:
            self._flush_soon = True
            if self._flush_timer is not None:
                self._flush_timer.cancel()
                self._flush_timer = None
            loop.call_soon(self._flush)
            return
        if self._flush_timer is not None and within_s >= DATA_FLUSH_S:
            return  # set earlier for at most DATA_FLUSH_S: due no later (no clock read a chunk)
        due = loop.time() + within_s
        if self._flush_timer is not None:
            if self._flush_due <= due:
                return
            self._flush_timer.cancel()
        self._flush_due = due
        self._flush_timer = loop.call_at(due, self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        transport = self._transport
        if transport is None or transport.is_closing() or not self._frames:
            self._clear()  # a closing wire's streams are counted lost when _run resets it
            return
        now = time.monotonic_ns()
        if self._stats_timer is not None and now >= self._stats_ride_ns:
            # Half an interval since the counters went: they ride this batch, and their
            # timer, pushed back, never wakes the forwarder while batches keep going.
            frame = self._stats_frame(always=False)
            if frame is not None:
                self._frames.append(frame)
        transport.write(_encoded(self._frames))
        self._clear()
        self._backlog = transport.get_write_buffer_size()
        self._batch_due_ns = now + int(DATA_FLUSH_S * 1e9)

    def _clear(self) -> None:
        self._frames.clear()
        self._held = 0

    def _reset(self) -> None:
        """Drop the connection; every stream in flight is lost to analysis (counted)."""
        transport, self._transport = self._transport, None
        self._clear()
        self._backlog = 0
        self.stats.wire_resets += 1
        for stream in self._streams.values():
            stream.lost = True
            if not stream.shed:
                stream.shed = True
                self.stats.streams_shed += 1
        self._streams.clear()
        self._connected.clear()
        self._stop_stats()
        if transport is not None:
            transport.abort()

    # -- connection

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = self._loop.create_task(self._run(), name="semhealth-tap-wire")

    async def wait_connected(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), timeout_s)
        return self._transport is not None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay = _RECONNECT_S[0]
        while not self._stopping:
            lost = loop.create_future()
            try:
                connected, _ = await loop.create_unix_connection(
                    functools.partial(_WireProtocol, lost), self._path
                )
            except OSError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RECONNECT_S[1])
                continue
            delay = _RECONNECT_S[0]
            transport = cast(asyncio.WriteTransport, connected)  # uvloop's is no subclass
            self._transport = transport
            self._connected.set()
            self._send_stats()
            try:
                await lost
            finally:
                if self._transport is transport:
                    self._reset()

    # -- counters

    def _send_stats(self, *, always: bool = True, within_s: float = 0.0) -> None:
        """The counters, sent within ``within_s``: by default in the wake-up that made them
        (waiting would cost the forwarder a second one); unless ``always``, only if analysis
        does not have them."""
        frame = self._stats_frame(always=always)
        if frame is not None:
            self._append(frame, within_s=within_s)

    def poke(self) -> None:
        """The counters may have changed: they are checked within an interval. An idle
        forwarder keeps no check (see ``_stats_frame``); this arms one."""
        if self._stats_timer is None and self._transport is not None:
            self._arm_stats()

    def _arm_stats(self) -> None:
        loop = self._loop or asyncio.get_running_loop()
        self._stats_timer = loop.call_later(self._stats_interval_s, self._stats_tick)

    def _stats_tick(self) -> None:
        # No batch took the counters for a whole interval. Unchanged, they are not sent:
        # an idle forwarder does not wake analysis. Changed, they join the copies waiting,
        # if any, and go with them within another interval: a write of counters alone woke
        # analysis 0.7 times a request at one stream.
        self._stats_timer = None
        self._send_stats(always=False, within_s=self._stats_interval_s if self._frames else 0.0)

    def _stats_frame(self, *, always: bool) -> bytes | None:
        """The counters as a STATS frame, or None if unchanged and not ``always``; the next
        are due an interval from now, or with a batch from half that. Unchanged with nothing
        in flight, none are due until ``poke``: an idle forwarder does not wake for them."""
        stats = self.stats
        if self._relay_stats is not None:
            active, rejected, errors = self._relay_stats()
            stats.active_streams = active
            stats.requests_rejected = dict(rejected)
            stats.relay_errors = dict(errors)
        payload = orjson.dumps(asdict(stats))
        unchanged = payload == self._stats_sent and not always
        self._stop_stats()
        if unchanged and stats.active_streams == 0:
            return None  # idle: the relay and the tap poke when something counts
        self._arm_stats()
        now = time.monotonic_ns()
        self._stats_ride_ns = now + int(self._stats_interval_s / 2 * 1e9)
        if unchanged:
            return None
        self._stats_sent = payload
        return HEADER.pack(STATS, 0, now, len(payload)) + payload

    def _stop_stats(self) -> None:
        if self._stats_timer is not None:
            self._stats_timer.cancel()
            self._stats_timer = None

    async def shutdown(self, timeout_s: float = 2.0) -> None:
        """Send the last counters and what is buffered, then close."""
        self._stopping = True
        transport = self._transport
        if transport is not None:
            self._send_stats()
            self._stop_stats()
            self._flush()
            deadline = time.monotonic() + timeout_s
            # A bare transport has no drain event; this runs once, at shutdown.
            while transport.get_write_buffer_size() and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            transport.close()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _encoded(frames: list[bytes | tuple[int, int, bytes]]) -> bytearray:
    """The frames as the wire carries them; a new buffer each flush, so the transport may
    keep it without a copy."""
    out = bytearray()
    for frame in frames:
        if isinstance(frame, tuple):
            stream_id, t, chunk = frame
            out += HEADER.pack(DATA, stream_id, t, len(chunk))
            out += chunk
        else:
            out += frame
    return out


class _WireProtocol(asyncio.Protocol):
    """The forwarder never reads from the wire; it only learns when it closes."""

    def __init__(self, lost: asyncio.Future[None]) -> None:
        self._lost = lost

    def data_received(self, data: bytes) -> None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)
