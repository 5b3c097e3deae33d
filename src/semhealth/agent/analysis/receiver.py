"""The analysis end of the tap wire: frames from every forwarding process, into the tap.

Each forwarder sends its counters whole; what is new since the last ``STATS`` frame of
that worker is added to the analysis process's ``TapStats``, so the exported counters
stay monotonic whether a forwarder reconnects or this process is the restarted one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable

from semhealth.agent.analysis.tap import Tap, TapStream
from semhealth.agent.wire import (
    CLOSE,
    DATA,
    OPEN,
    STATS,
    ForwarderStats,
    Outcome,
    WireDecoder,
    decode_close,
    decode_open,
    stats_from,
)

log = logging.getLogger(__name__)


class TapReceiver:
    """A Unix-socket server for the forwarders' tap wires."""

    def __init__(self, tap: Tap) -> None:
        self._tap = tap
        self._server: asyncio.Server | None = None
        self.forwarders: dict[int, ForwarderStats] = {}  # latest counters, by worker
        self._connections: set[_WireConnection] = set()

    def active_streams(self) -> int:
        return sum(stats.active_streams for stats in self.forwarders.values())

    async def start(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _WireConnection(self), path)

    async def shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for connection in list(self._connections):
                connection.close()
            await server.wait_closed()

    def merge(self, new: ForwarderStats) -> None:
        """Add what this worker counted since its last report to the tap's counters."""
        old = self.forwarders.get(new.worker)
        if old is None or old.pid != new.pid:
            old = ForwarderStats(worker=new.worker, pid=new.pid)
        stats = self._tap.stats
        stats.chunks_dropped += max(new.chunks_dropped - old.chunks_dropped, 0)
        stats.streams_shed += max(new.streams_shed - old.streams_shed, 0)
        stats.wire_resets += max(new.wire_resets - old.wire_resets, 0)
        # Only worker 0 supervises this process, and its count outlives each of us.
        stats.analysis_restarts = max(stats.analysis_restarts, new.analysis_restarts)
        _add_new(stats.requests_unanalysed, new.requests_unanalysed, old.requests_unanalysed)
        _add_new(stats.requests_rejected, new.requests_rejected, old.requests_rejected)
        self.forwarders[new.worker] = new

    def rejected(self) -> dict[str, int]:
        """Malformed requests the forwarders refused, by reason, summed over workers."""
        return _sum(stats.requests_rejected for stats in self.forwarders.values())

    def wire_resets(self) -> int:
        return sum(stats.wire_resets for stats in self.forwarders.values())


def _add_new(total: dict[str, int], now: dict[str, int], before: dict[str, int]) -> None:
    for key, count in now.items():
        added = count - before.get(key, 0)
        if added > 0:
            total[key] = total.get(key, 0) + added


def _sum(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for key, value in one.items():
            total[key] = total.get(key, 0) + value
    return total


class _WireConnection(asyncio.Protocol):
    """One forwarder's wire: its open streams live here, so its loss ends only them."""

    def __init__(self, receiver: TapReceiver) -> None:
        self._receiver = receiver
        self._tap = receiver._tap
        self._decoder = WireDecoder()
        self._streams: dict[int, TapStream] = {}
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._receiver._connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except ValueError as exc:
            log.error("tap wire from a forwarder is corrupt (%s): dropping it", exc)
            self.close()
            return
        streams, offer = self._streams, self._tap.offer
        for kind, stream_id, t, payload in frames:
            if kind == DATA:
                stream = streams.get(stream_id)
                if stream is not None:
                    offer(stream, payload, t)
            elif kind == OPEN:
                streams[stream_id] = self._tap.open_stream(decode_open(t, payload))
            elif kind == CLOSE:
                stream = streams.pop(stream_id, None)
                if stream is not None:
                    outcome, shed = decode_close(t, payload)
                    stream.shed = stream.shed or shed
                    stream.close(outcome)
            elif kind == STATS:
                self._receiver.merge(stats_from(payload))

    def connection_lost(self, exc: Exception | None) -> None:
        self._receiver._connections.discard(self)
        # The forwarder went away mid-stream (restart, reset): what reached us is kept,
        # marked shed, so its partial timings never count as a whole stream's.
        now = time.monotonic_ns()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.shed = True
            stream.close(Outcome(end_ns=now))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
