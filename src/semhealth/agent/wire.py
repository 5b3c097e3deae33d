"""The tap wire, the one boundary between the planes: what the relay hands analysis, and
how it is framed between the forwarding process and the analysis process.

What the relay hands analysis is one handle per exchange, fed chunk copies, closed once
(``TapSink``, ``StreamTap``, ``Outcome``). Two sinks implement it: the in-process ``Tap``
(tests, the demo, embedding) and the forwarder's ``WireTap``, which frames copies for the
analysis process. Neither may block or raise into the relay: a sink that cannot keep up
sheds and counts.

A frame is a fixed header, ``<BIQI``: kind, stream id, monotonic ns, payload length, then
the payload. ``OPEN`` carries the exchange's facts (JSON; keys added since are optional, so
neighbouring versions of the two ends read each other; while shadowing, the request headers
the relay copied, its credentials denylist already applied) and the request body copy, ``DATA`` a
body chunk as it arrived, ``CLOSE`` the outcome, ``STATS`` the forwarder's own counters
(absolute values, so a restarted analysis process picks them up whole). Both processes
import this module; it imports neither plane.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from semhealth.collectors.exchange import Exchange

HEADER = struct.Struct("<BIQI")
OPEN, DATA, CLOSE, STATS = 1, 2, 3, 4
_META = struct.Struct("<I")
_MAX_PAYLOAD = 64 * 1024 * 1024  # a frame longer than this means the stream is corrupt
# The largest chunk the relay offers: one read of the event loop, which asyncio's and
# uvloop's socket and TLS transports cap at 256 KiB (tests/agent/test_tapwire.py checks it).
MAX_CHUNK_BYTES = 256 * 1024
# The smallest forwarder budget (``dataplane.tap_buffer_bytes``) that holds such a chunk's
# DATA frame; below it, every copy of a chunk that large is shed.
MIN_TAP_BUDGET = HEADER.size + MAX_CHUNK_BYTES


@dataclass(slots=True, kw_only=True)
class Outcome:
    """How an exchange ended, from the relay's side."""

    end_ns: int
    client_aborted: bool = False
    upstream_aborted: bool = False
    error_type: str | None = None


class StreamTap(Protocol):
    def offer(self, chunk: bytes, t: int) -> None:
        """A copy of body bytes already written to the client, with their arrival time."""

    def close(self, outcome: Outcome) -> None:
        """The exchange ended; called once."""


class TapSink(Protocol):
    def open_stream(self, exchange: Exchange) -> StreamTap: ...

    def unanalysed(self, reason: str) -> None:
        """A request forwarded without its body copied for analysis (``oversized``)."""


@dataclass(slots=True)
class ForwarderStats:
    """One forwarding process's counters, sent whole in every ``STATS`` frame."""

    worker: int = 0
    pid: int = 0
    active_streams: int = 0
    streams_opened: int = 0
    chunks_dropped: int = 0
    streams_shed: int = 0
    wire_resets: int = 0
    analysis_restarts: int = 0  # worker 0 supervises the analysis process
    requests_unanalysed: dict[str, int] = field(default_factory=dict)
    requests_rejected: dict[str, int] = field(default_factory=dict)
    relay_errors: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- encoding


def encode_open(stream_id: int, exchange: Exchange) -> bytes:
    meta = orjson.dumps(
        {
            "method": exchange.method,
            "path": exchange.path,
            "status": exchange.status,
            "content_type": exchange.content_type,
            "content_encoding": exchange.content_encoding,
            "response_ns": exchange.response_ns,
            "request_skip": exchange.request_skip,
            "ratelimit_source": exchange.ratelimit_source,
            "has_body": exchange.request_body is not None,
            **_optional(exchange),
        }
    )
    body = exchange.request_body or b""
    size = _META.size + len(meta) + len(body)
    head = HEADER.pack(OPEN, stream_id, exchange.start_ns, size) + _META.pack(len(meta))
    return head + meta + body


def decode_open(start_ns: int, payload: bytes) -> Exchange:
    (meta_len,) = _META.unpack_from(payload)
    end = _META.size + meta_len
    meta = orjson.loads(payload[_META.size : end])
    return Exchange(
        method=meta["method"],
        path=meta["path"],
        start_ns=start_ns,
        status=meta["status"],
        content_type=meta["content_type"],
        content_encoding=meta["content_encoding"],
        response_ns=meta["response_ns"],
        request_body=payload[end:] if meta["has_body"] else None,
        request_skip=meta["request_skip"],
        ratelimit_source=meta["ratelimit_source"],
        traceparent=meta.get("traceparent"),
        request_headers=_headers(meta.get("request_headers")),
        request_bytes=meta.get("request_bytes", 0),
    )


def _optional(exchange: Exchange) -> dict[str, Any]:
    """Keys an OPEN frame carries only when set. The meta is a JSON object read by key, so a
    key added here is ignored by an older reader and absent keys read as unset by a newer one:
    forwarders and analysis of neighbouring versions still understand each other."""
    optional: dict[str, Any] = {}
    if exchange.traceparent is not None:
        optional["traceparent"] = exchange.traceparent
    if exchange.request_headers is not None:  # only while shadowing: the relay's denylist applied
        optional["request_headers"] = exchange.request_headers
    if exchange.request_bytes:
        optional["request_bytes"] = exchange.request_bytes
    return optional


def _headers(pairs: list[list[str]] | None) -> tuple[tuple[str, str], ...] | None:
    return None if pairs is None else tuple((name, value) for name, value in pairs)


def encode_close(stream_id: int, outcome: Outcome, shed: bool) -> bytes:
    payload = orjson.dumps(
        {
            "client_aborted": outcome.client_aborted,
            "upstream_aborted": outcome.upstream_aborted,
            "error_type": outcome.error_type,
            "shed": shed,
        }
    )
    return HEADER.pack(CLOSE, stream_id, outcome.end_ns, len(payload)) + payload


def decode_close(end_ns: int, payload: bytes) -> tuple[Outcome, bool]:
    meta = orjson.loads(payload)
    outcome = Outcome(
        end_ns=end_ns,
        client_aborted=meta["client_aborted"],
        upstream_aborted=meta["upstream_aborted"],
        error_type=meta["error_type"],
    )
    return outcome, bool(meta["shed"])


# --------------------------------------------------------------------------- decoding


class WireDecoder:
    """Frames out of a byte stream; sans-IO so it can be property-tested on any split."""

    def __init__(self) -> None:
        self._rest = bytearray()  # the start of a frame a later read completes

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        """Complete frames as (kind, stream id, time ns, payload); raises on a corrupt one."""
        rest = self._rest
        if rest:
            # A frame split over reads: gathered here until whole (an OPEN with a large
            # request body spans many), then parsed with what follows it.
            rest += data
            if _incomplete(rest):
                return []
            data = bytes(rest)
            rest.clear()
        frames = []
        pos = 0
        size = len(data)
        while size - pos >= HEADER.size:
            kind, stream_id, t, length = HEADER.unpack_from(data, pos)
            if kind not in _KINDS or length > _MAX_PAYLOAD:
                raise ValueError(f"corrupt tap frame (kind {kind}, length {length})")
            start = pos + HEADER.size
            end = start + length
            if end > size:
                break
            # One copy per payload, out of the read itself; slicing a buffer first was two.
            frames.append((kind, stream_id, t, data[start:end]))
            pos = end
        if pos < size:
            rest += data[pos:]
        return frames


_KINDS = frozenset({OPEN, DATA, CLOSE, STATS})


def _incomplete(buf: bytearray) -> bool:
    """Whether ``buf`` starts with a frame still to be completed (a corrupt head is not: it is
    refused as soon as it is read, not buffered up to its length)."""
    if len(buf) < HEADER.size:
        return True
    kind, _, _, length = HEADER.unpack_from(buf)
    return kind in _KINDS and length <= _MAX_PAYLOAD and len(buf) < HEADER.size + length


def stats_from(payload: bytes) -> ForwarderStats:
    data: dict[str, Any] = orjson.loads(payload)
    return ForwarderStats(**data)
