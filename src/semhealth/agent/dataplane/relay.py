"""The relay: an HTTP/1.1 reverse proxy to one fixed upstream, at the level of asyncio
Protocols, with llhttp (``httptools``) parsing both directions.

Why by hand: a framework server and client (aiohttp, as before) parse, re-case and rebuild
every header, buffer through two stream readers, and cost 50-60 µs of CPU per chunk. Here a
chunk of the upstream's body is parsed once (to know where the message ends and to give
analysis the decoded body) and the same bytes are written to the client, framing included:
chunk sizes, extensions and trailers reach the client as the upstream sent them. Only the
head is rebuilt, from the raw header fields in their order and case, less the hop-by-hop
fields (RFC 9110 §7.6.1).

A read that is whole chunks of a chunked body (one SSE event a read, most often) is not given
to the parser: it was between two chunks before the read and would be after it, so nothing it
knows changes, and a hand check of the strictest chunk form (``_whole_chunks``) finds the
body. Anything else, and every end, goes through llhttp. At one stream, where each read wakes a
process whose caches others emptied, perf put 7.5 % of the forwarder's samples in the parser's
module alone, its callbacks aside.

Per upstream read: note the arrival time, parse, write to the client, then offer the body
copy to the tap (which never blocks). A slow client pauses reading from the upstream and a
slow upstream pauses reading from the client, so nothing is buffered beyond the transports'
watermarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import httptools
import orjson

from semhealth.agent.wire import Outcome, StreamTap, TapSink
from semhealth.collectors.exchange import Exchange
from semhealth.common.tls import client_context

log = logging.getLogger(__name__)

# RFC 9110 §7.6.1. Transfer-Encoding is handled apart: it goes with the body framing.
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"upgrade", b"proxy-authenticate"}
)
_REQUEST_DROP = _HOP_BY_HOP | {b"host", b"transfer-encoding", b"proxy-authorization", b"trailer"}
_MAX_HEAD_BYTES = 64 * 1024
_Headers = tuple[tuple[str, str], ...]
_RETRY_KEEP_BYTES = 64 * 1024  # a request this small is resent when a pooled connection was stale
# Requests that may be sent twice (RFC 9110 §9.2.2), as Go's http.Transport decides.
_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
_IDEMPOTENCY_KEYS = frozenset({b"idempotency-key", b"x-idempotency-key"})
_POOL_MAX_IDLE = 256
_POOL_IDLE_S = 30.0
_WRITE_HIGH = 64 * 1024
QUIET_S = 1.0  # no exchange in flight for this long after the last: the relay is quiet


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamSettings:
    """Where the relay connects, and how long it waits."""

    url: str  # http(s)://host[:port][/base]
    verify: bool = True
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0
    total_timeout_s: float | None = None
    max_request_bytes: int = 1 << 20  # larger bodies are forwarded, not copied for analysis
    unix_path: str | None = None  # connect here instead of host:port (the admin front)
    # None: the tap gets no request headers. Else it gets every header the client sent but
    # these lowercase names (live shadowing's credentials denylist), the hop-by-hop ones and
    # those the Connection header lists: what is not copied never leaves this process.
    tap_headers_drop: frozenset[bytes] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenSettings:
    header_timeout_s: float = 30.0  # from a request's first byte to its last header
    keepalive_timeout_s: float = 75.0  # an idle client connection is closed after this
    # Past these (0: no limit), a new connection, or a request, gets a marked 503 at once.
    max_client_connections: int = 0
    max_upstream_requests: int = 0  # exchanges relayed upstream at once


@dataclass(slots=True)
class RelayStats:
    """Counters the telemetry reads; plain ints, updated on the relay's loop only."""

    connections: int = 0
    requests: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # malformed requests, by reason
    errors: dict[str, int] = field(default_factory=dict)  # the relay's own 502/504, by kind
    # Told when what the tap wire sends of these (and the exchanges in flight) may have
    # changed: the wire checks its counters only then, so an idle forwarder never wakes.
    on_change: Callable[[], object] | None = field(default=None, repr=False, compare=False)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self.changed()

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.changed()

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


class _Target:
    """The upstream, parsed once."""

    def __init__(self, settings: UpstreamSettings) -> None:
        url = httptools.parse_url(settings.url.encode())
        scheme = (url.schema or b"http").lower()
        if scheme not in (b"http", b"https"):
            raise ValueError(f"upstream url must be http or https, not {scheme.decode()!r}")
        self.tls = scheme == b"https"
        self.host = (url.host or b"").decode()
        self.port = url.port or (443 if self.tls else 80)
        default_port = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = (host if default_port else f"{host}:{self.port}").encode()
        self.base = (url.path or b"").rstrip(b"/")
        self.unix_path = settings.unix_path
        self.ssl = (
            client_context(
                verify=settings.verify,
                ca_file=settings.ca_file,
                client_cert=settings.client_cert,
                client_key=settings.client_key,
            )
            if self.tls
            else None
        )


def error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"error": {"type": kind, "message": message, "source": "semhealth"}})


def _error_response(status: int, reason: bytes, kind: str, message: str, close: bool) -> bytes:
    """The relay's own answers, marked so they are never mistaken for the upstream's."""
    body = error_body(kind, message)
    head = [
        b"HTTP/1.1 %d %s\r\n" % (status, reason),
        b"Content-Type: application/json\r\n",
        b"Content-Length: %d\r\n" % len(body),
        b"X-Semhealth-Error: %s\r\n" % kind.encode(),
    ]
    if close:
        head.append(b"Connection: close\r\n")
    head.append(b"\r\n")
    return b"".join(head) + body


_ERRORS = {
    "upstream_unreachable": (502, b"Bad Gateway", "semhealth could not reach the upstream"),
    "upstream_timeout": (504, b"Gateway Timeout", "the upstream did not answer in time"),
    "upstream_invalid_response": (
        502,
        b"Bad Gateway",
        "the upstream's response was not valid HTTP/1.1",
    ),
    "not_ready": (503, b"Service Unavailable", "semhealth is starting or stopping"),
    "upstream_concurrency_limit": (
        503,
        b"Service Unavailable",
        "semhealth has dataplane.max_upstream_requests requests upstream already; retry",
    ),
}
# Answered as the connection opens, before its request is read; then the write side is
# shut and what the client sends is read and dropped, so it can read the answer before
# the connection ends (closing with its request unread would reset it).
_TOO_MANY = _error_response(
    503,
    b"Service Unavailable",
    "too_many_connections",
    "semhealth has dataplane.max_client_connections connections open; retry",
    True,
)
_LINGER_S = 2.0

_REJECTS = {
    "malformed": (400, b"Bad Request"),
    "header_timeout": (408, b"Request Timeout"),
    "head_too_large": (431, b"Request Header Fields Too Large"),
    "method_not_allowed": (405, b"Method Not Allowed"),
}


# --------------------------------------------------------------------------- upstream side


class _UpstreamConnection(asyncio.Protocol):
    """One connection to the upstream; serves one exchange at a time, then may be pooled."""

    __slots__ = ("closed", "exchange", "idle_since", "pool", "transport")

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=_WRITE_HIGH)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:
            # Bytes nobody asked for: the connection is no longer in a known state.
            self.abort()
            return
        exchange.upstream_data(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.upstream_lost()
        else:
            self.pool.forget(self)

    def pause_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.client.pause_reading("upstream")

    def resume_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.client.resume_reading("upstream")

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class _Pool:
    """Idle keep-alive connections to the upstream, newest first."""

    def __init__(self, target: _Target, settings: UpstreamSettings) -> None:
        self._target = target
        self._settings = settings
        self._idle: list[_UpstreamConnection] = []

    def take(self, now: float) -> _UpstreamConnection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < _POOL_IDLE_S:
                return conn
            conn.abort()
        return None

    def give(self, conn: _UpstreamConnection, now: float) -> None:
        conn.exchange = None
        if conn.closed or len(self._idle) >= _POOL_MAX_IDLE:
            conn.abort()
            return
        conn.idle_since = now
        self._idle.append(conn)

    def forget(self, conn: _UpstreamConnection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    async def connect(self) -> _UpstreamConnection:
        loop = asyncio.get_running_loop()
        conn = _UpstreamConnection(self)
        target = self._target
        if target.unix_path is not None:
            coro = loop.create_unix_connection(lambda: conn, target.unix_path)
        else:
            coro = loop.create_connection(
                lambda: conn,
                target.host,
                target.port,
                ssl=target.ssl,
                server_hostname=target.host if target.ssl else None,
            )
        await asyncio.wait_for(coro, self._settings.connect_timeout_s)
        return conn

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()


# --------------------------------------------------------------------------- one exchange


class _Request:
    """A request head, as parsed; its body streams through the exchange."""

    __slots__ = (
        "body_copy",
        "body_size",
        "chunked",
        "complete",
        "expect_continue",
        "headers",
        "http10",
        "keep_alive",
        "method",
        "pending",
        "start_ns",
        "terminated",
        "trailers",
        "url",
    )

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.trailers: list[tuple[bytes, bytes]] | None = None  # set once the head is done
        self.method = b""
        self.http10 = False
        self.keep_alive = True
        self.chunked = False
        self.expect_continue = False  # sent Expect: 100-continue; the relay answers it
        self.complete = False
        self.terminated = False  # the last chunk went upstream
        self.pending: list[bytes] = []  # body bytes framed for the upstream, not yet written
        self.body_copy: list[bytes] | None = []  # None once past max_request_bytes
        self.body_size = 0


class _Exchange:
    """One request and its response: the upstream's bytes go to the client as they come."""

    def __init__(self, client: _ClientConnection, request: _Request) -> None:
        self.client = client
        self.relay = client.relay
        self.request = request
        self.upstream: _UpstreamConnection | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.stream: StreamTap | None = None
        self.outcome = Outcome(end_ns=0)
        self.head_buf = b""  # the upstream's bytes until its final response head is parsed
        self.head_pos = 0
        self.reason = b""
        self.resp_headers: list[tuple[bytes, bytes]] = []
        self.head_done = False  # the final (non-1xx) response head went to the client
        self.passthrough = True  # False: de-chunk for an HTTP/1.0 client
        # An HTTP/1.0 client gets its answer on a connection that closes after it.
        self.close_client = not request.keep_alive or request.http10
        self.upstream_reusable = True
        self.upstream_framing = "none"  # none | length | chunked | close, then done
        self.length_left = 0  # of a Content-Length body, the bytes not yet parsed
        self.tail = b""  # the bytes parsed last (3 or more), for a CRLF CRLF over two reads
        self.finished = False
        self.pieces: list[bytes] = []
        # The parser waits for a chunk's size line and has read none of it: a read of whole
        # chunks would leave it so. Kept by its chunk callbacks and the read's last bytes.
        self.between_chunks = False
        self.last_read_ns = 0  # the read timer compares with this; one clock read per chunk
        self.read_timer: asyncio.TimerHandle | None = None
        self.total_timer: asyncio.TimerHandle | None = None
        self.retry_log: list[bytes] | None = []  # what was written upstream, for one retry
        self.retry_size = 0
        self.reused = False  # the connection came from the pool: it may have gone stale
        self.connecting: asyncio.Task[None] | None = None
        # What this exchange writes upstream, gathered until the read of the client that made
        # it is parsed (_ClientConnection.data_received) or attach() is done: one write.
        self.corked: list[bytes] = []

    # -- starting

    def start(self) -> None:
        relay = self.relay
        if relay.closing:
            self.fail("not_ready")
            return
        limit = relay.listen_settings.max_upstream_requests
        if limit and relay.active > limit:  # this exchange is counted in active already
            self.fail("upstream_concurrency_limit", rejected=True)
            return
        request = self.request
        if request.expect_continue and not request.http10 and not request.complete:
            # Answered here, as nginx and Envoy do, and not forwarded: an upstream that never
            # sends 100 would leave the client waiting out its expect timeout. The body is
            # relayed whatever its size (an oversized one is forwarded, only not analysed).
            # It is this exchange's turn: a pipelined request's 100 waits for the answers
            # before it, and the reading of its body with it.
            self.client.write(_CONTINUE)
        conn = relay.pool.take(relay.loop.time())
        if conn is not None:
            self.reused = True
            self.attach(conn)
        else:
            self.client.pause_reading("connect")
            self.connecting = relay.loop.create_task(self._connect())
        total = relay.upstream_settings.total_timeout_s
        if total is not None:
            self.total_timer = relay.loop.call_later(total, self._total_timeout)

    async def _connect(self) -> None:
        try:
            conn = await self.relay.pool.connect()
        except TimeoutError:
            self.connecting = None
            self.fail("upstream_timeout")
            return
        except (OSError, ssl.SSLError) as exc:
            self.connecting = None
            log.warning("upstream connection failed: %s", type(exc).__name__)
            self.fail("upstream_unreachable")
            return
        except asyncio.CancelledError:
            return
        self.connecting = None
        if self.finished:
            conn.abort()
            return
        self.client.resume_reading("connect")
        self.attach(conn)

    def attach(self, conn: _UpstreamConnection) -> None:
        self.upstream = conn
        conn.exchange = self
        if conn.transport is not None:
            # A pooled connection may have been paused for its last client; this client may
            # still be behind on an earlier answer. Read exactly when this client can take it.
            if self.client.write_paused:
                conn.transport.pause_reading()
            else:
                conn.transport.resume_reading()
        self.parser = httptools.HttpResponseParser(_ResponseCallbacks(self))
        request = self.request
        self.write_upstream(self._request_head())
        if request.pending:
            pending, request.pending = request.pending, []
            for data in pending:
                self.write_upstream(data)
        if request.complete and request.chunked and not request.terminated:
            request.terminated = True
            self.write_upstream(_LAST_CHUNK)
        if not self.client.reading:  # a pooled connection's go with the rest of the read
            self.send_corked()
        self.last_read_ns = time.monotonic_ns()
        self._arm_read_timer(self.relay.upstream_settings.read_timeout_s)

    def _request_head(self) -> bytes:
        request = self.request
        url = httptools.parse_url(request.url) if request.url != b"*" else None
        path = (url.path or b"/") if url is not None else b"/"
        target = self.relay.target.base + path
        if url is not None and url.query:
            target += b"?" + url.query
        named = _connection_tokens(request.headers)
        lines = [request.method, b" ", target, b" HTTP/1.1\r\nHost: ", self.relay.target.authority]
        lines.append(b"\r\n")
        for name, value in request.headers:
            lower = name.lower()
            if lower in _REQUEST_DROP or lower in named or _expects_continue(name, value):
                continue
            lines += (name, b": ", value, b"\r\n")
        if request.chunked:
            lines.append(b"Transfer-Encoding: chunked\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def write_upstream(self, data: bytes) -> None:
        if self.retry_log is not None:
            self.retry_size += len(data)
            if self.retry_size > _RETRY_KEEP_BYTES:
                self.retry_log = None
            else:
                self.retry_log.append(data)
        assert self.upstream is not None
        self.corked.append(data)

    def send_corked(self) -> None:
        """One write upstream of what ``write_upstream`` gathered: at the end of a read of the
        client, or of ``attach``. A request's head and the body that came with it went in
        two writes, each a system call and a wake-up of the upstream."""
        corked = self.corked
        if not corked:
            return
        self.corked = []
        if self.upstream is not None and not self.finished:
            self.upstream.write(corked[0] if len(corked) == 1 else b"".join(corked))

    # -- the request body, from the client

    def request_body(self, piece: bytes) -> None:
        request = self.request
        data = b"%x\r\n%s\r\n" % (len(piece), piece) if request.chunked else piece
        if self.upstream is None:
            request.pending.append(data)
        elif not self.finished:
            self.write_upstream(data)

    def request_complete(self) -> None:
        request = self.request
        request.complete = True
        if request.chunked and self.upstream is not None and not self.finished:
            request.terminated = True
            self.write_upstream(_LAST_CHUNK)

    # -- the response, from the upstream

    def upstream_data(self, data: bytes) -> None:
        t = self.last_read_ns = time.monotonic_ns()
        self.retry_log = None  # the upstream answered: never resend
        parser = self.parser
        assert parser is not None
        if self.between_chunks:
            body = _whole_chunks(data)
            if body is not None:
                self.tail = data
                self.client.write(data)
                if self.stream is not None:
                    self.stream.offer(body, t)
                return
        if not self.head_done:
            self.head_buf += data
        size = fed = len(data)
        invalid = False
        try:
            fed = self._feed(data)
        except httptools.HttpParserError:  # HttpParserUpgrade too: a 101 was never asked for
            invalid = True
        if self.between_chunks and not data.endswith(b"\r\n"):
            self.between_chunks = False  # a chunk-size line begun: no callback says so
        if self.finished:
            return
        if fed < size:
            # Bytes after the response's end, in the read that ended it (a body after a HEAD,
            # 204 or 304 head, a second response): nobody asked for them. The response ends
            # at its framing, as nginx and Envoy end it, and the connection is in no state
            # to reuse.
            self.upstream_reusable = False
        if self.head_done:
            if self.head_buf:
                # The read that carried the head: the bytes after it are the body's.
                data = self.head_buf[self.head_pos : len(self.head_buf) - size + fed]
                self.head_buf = b""
            else:
                data = data[:fed]  # the same object when it is all of it: no copy
            if self.passthrough:
                if data:
                    self.client.write(data)
            elif self.pieces:
                self.client.write(b"".join(self.pieces))
            pieces, self.pieces = self.pieces, []
            if pieces and self.stream is not None:
                self.stream.offer(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)
        elif len(self.head_buf) > _MAX_HEAD_BYTES:
            invalid = True
        if invalid:
            # The bytes before the fault went to the client, as they would have going direct.
            self._upstream_failed("upstream_invalid_response")
        elif self.upstream_framing == "done":
            self.finish()

    def _feed(self, data: bytes) -> int:
        """Parse ``data`` up to the response's end; return how many of its bytes that is.

        Nothing after the end is parsed. A Content-Length body ends at its length; a head
        and a chunked body can only end where a CRLF CRLF ends (llhttp takes no bare LF),
        so ``data`` goes to the parser in pieces cut there, and the end is between two (a
        body that ends with the connection is cut there too, which changes nothing).
        """
        parser = self.parser
        assert parser is not None
        fed, size = 0, len(data)
        if (
            self.upstream_framing == "chunked"
            and data[:1] not in (b"\r", b"\n")
            and b"\r\n\r\n" not in data
        ):
            # A read of a streamed body (one event, most often) with no end in it, none
            # begun in the read before: parsed whole. The cut on every read cost forwarding
            # a sixth more CPU at 50 streams; with this check, no more than the runs' noise.
            parser.feed_data(data)
            self.tail = data[-3:] if size >= 3 else (self.tail + data)[-3:]
            return size
        while fed < size and self.upstream_framing != "done":
            if self.upstream_framing == "length":
                end = min(size, fed + self.length_left)
                self.length_left -= end - fed
            else:
                end = self._past_crlfcrlf(data, fed)
            parser.feed_data(data[fed:end])  # all of data is data itself: no copy
            fed = end
        # Kept for a CRLF CRLF the next read may end: a reference, copied only when short.
        self.tail = data if size >= 3 else (self.tail + data)[-3:]
        return fed

    def _past_crlfcrlf(self, data: bytes, start: int) -> int:
        """Where the first CRLF CRLF at or after ``start`` ends in ``data`` (its length if
        none does), one that began in the read before included."""
        if start == 0 and data[0] in b"\r\n":
            before = self.tail[-3:]
            found = (before + data[:3]).find(b"\r\n\r\n")
            if found >= 0:
                return found + 4 - len(before)
        found = data.find(b"\r\n\r\n", start)
        return len(data) if found < 0 else found + 4

    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:
            self.resp_headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None
        status = parser.get_status_code()
        end = self.head_buf.find(b"\r\n\r\n", self.head_pos)
        self.head_pos = end + 4
        headers, self.resp_headers = self.resp_headers, []
        # llhttp reports no reason phrase when a status line has none: never the last head's.
        reason, self.reason = self.reason, b""
        if status < 200:
            if status != 101 and not self.request.http10:
                self.client.write(_head(status, reason, headers, ()))
            return
        self._response_head(status, reason, headers)

    def _response_head(
        self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]
    ) -> None:
        parser = self.parser
        assert parser is not None
        request = self.request
        self.head_done = True
        self._arm_read_timer(self.relay.upstream_settings.read_timeout_s)
        chunked = content_length = False
        for name, value in headers:
            lower = name.lower()
            if lower == b"transfer-encoding":
                chunked = chunked or value.rstrip().lower().endswith(b"chunked")
            elif lower == b"content-length":
                content_length = True
                self.length_left = int(value)  # llhttp let it through: digits, one value
        if not parser.should_keep_alive():
            self.upstream_reusable = False
        if request.method == b"HEAD" or status in (204, 304):
            # Nothing follows the head: the parser may not wait for a body.
            self.upstream_framing = "done"
        elif chunked:
            self.upstream_framing = "chunked"
            if request.http10:
                self.passthrough = False
                self.close_client = True
            else:
                self.between_chunks = True
        elif content_length:
            self.upstream_framing = "length"
        else:
            self.upstream_framing = "close"
            self.close_client = True
            self.upstream_reusable = False
        if not request.complete:
            # Answered before the client finished sending: the rest of its body has nowhere
            # to go, and the next request cannot be found after it.
            self.close_client = True
        drop = _HOP_BY_HOP | _connection_tokens(headers)
        if not self.passthrough:
            drop = drop | {b"transfer-encoding", b"trailer"}
        extra = (b"Connection: close\r\n",) if self.close_client else ()
        self.client.write(_head(status, reason, headers, extra, drop))
        self._open_stream(status, headers)

    def _open_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        request = self.request
        self.stream = self.relay.open_stream(
            request,
            status=status,
            response_ns=time.monotonic_ns(),
            content_type=_header(headers, b"content-type"),
            content_encoding=_header(headers, b"content-encoding"),
            ratelimit_source=_header(headers, b"x-ratelimit-source"),
        )

    def on_body(self, body: bytes) -> None:
        if self.head_done:
            self.pieces.append(body)

    def on_chunk_header(self) -> None:
        self.between_chunks = False

    def on_chunk_complete(self) -> None:
        self.between_chunks = self.passthrough

    def on_message_complete(self) -> None:
        if self.head_done:  # else a 1xx interim response: the final one follows
            self.upstream_framing = "done"

    def upstream_lost(self) -> None:
        """The upstream closed or reset the connection."""
        if self.finished:
            return
        self.upstream_reusable = False
        if not self.head_done:
            if self.reused and self.retry():
                return
            self.fail("upstream_unreachable")
        elif self.upstream_framing == "close":
            self.finish()  # a close-delimited body ends this way
        else:
            self._upstream_failed("upstream_aborted")

    def retry(self) -> bool:
        """A pooled connection the upstream had already closed: resend on a new one, once.

        Only a request that may be sent twice (an idempotent method, or one carrying an
        idempotency key): a server that died mid-request would otherwise see an LLM call
        twice. The rest get a 502, as nginx answers them.
        """
        if self.retry_log is None or not _replayable(self.request):
            return False
        self.reused = False
        sent, self.retry_log, self.retry_size = self.retry_log, [], 0
        self.upstream = None
        self.request.pending = sent[1:] + self.request.pending  # attach() rebuilds the head
        self.client.pause_reading("connect")
        self.connecting = self.relay.loop.create_task(self._connect())
        return True

    def _upstream_failed(self, kind: str) -> None:
        """Before the head, the relay answers with its own error; mid-body, what came
        before went to the client, and its connection ends so it knows the body is
        incomplete instead of waiting for bytes that will never come."""
        self.upstream_reusable = False
        if not self.head_done:
            self.fail(kind)
            return
        self.outcome.upstream_aborted = True
        self.outcome.error_type = kind
        self.finish()

    # -- timers

    def _arm_read_timer(self, delay: float) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
        self.read_timer = self.relay.loop.call_later(delay, self._check_read)

    def _check_read(self) -> None:
        self.read_timer = None
        if self.finished:
            return
        read_s = self.relay.upstream_settings.read_timeout_s
        idle = (time.monotonic_ns() - self.last_read_ns) / 1e9
        if idle < read_s:
            self._arm_read_timer(read_s - idle)
            return
        self._upstream_failed("upstream_timeout")

    def _total_timeout(self) -> None:
        self.total_timer = None
        if not self.finished:
            self._upstream_failed("upstream_timeout")

    # -- ending

    def fail(self, kind: str, *, rejected: bool = False) -> None:
        """No response head reached the client: answer with the relay's own error. A
        ``rejected`` request never went upstream: counted as rejected, not analysed."""
        if self.finished:
            return
        status, reason, message = _ERRORS[kind]
        self.upstream_reusable = False
        self.close_client = self.close_client or not self.request.complete
        self.client.write(_error_response(status, reason, kind, message, self.close_client))
        if rejected:
            self.relay.stats.reject(kind)
        else:
            self.relay.stats.error(kind)
            self.stream = self.relay.open_stream(self.request, status=status)
        self.outcome.error_type = kind
        self.finish()

    def respond_locally(self, answer: bytes) -> None:
        """An answer the relay gives itself (the admin front's health checks)."""
        self.close_client = self.close_client or not self.request.complete
        self.client.write(answer)
        self.finished = True
        self.client.exchange_done(self)

    def client_lost(self) -> None:
        if self.finished:
            return
        self.outcome.client_aborted = True
        self.upstream_reusable = False
        if self.stream is None:
            # Gone before any response: nginx's 499, "client closed request".
            self.stream = self.relay.open_stream(self.request, status=499)
        self.finish()

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.outcome.end_ns = time.monotonic_ns()
        for timer in (self.read_timer, self.total_timer):
            if timer is not None:
                timer.cancel()
        if self.connecting is not None:
            self.connecting.cancel()
            self.connecting = None
        conn, self.upstream = self.upstream, None
        if conn is not None:
            if self.upstream_reusable and self.request.complete and not self.outcome.error_type:
                self.relay.pool.give(conn, self.relay.loop.time())
            else:
                conn.exchange = None
                conn.abort()
        if self.stream is not None:
            self.stream.close(self.outcome)
        # The parser's callbacks hold this exchange: let go of it, so the exchange is freed
        # when the client connection lets go of it, not by a later cyclic collection (21
        # objects an exchange, each a collection's work and memory held until then).
        self.parser = None
        # A failed connect leaves the client paused for it; the next request must be read.
        self.client.resume_reading("connect")
        self.client.exchange_done(self)


class _ResponseCallbacks:
    """llhttp's callbacks for the upstream's response, bound to one exchange."""

    __slots__ = (
        "on_body",
        "on_chunk_complete",
        "on_chunk_header",
        "on_header",
        "on_headers_complete",
        "on_message_complete",
        "on_status",
    )

    def __init__(self, exchange: _Exchange) -> None:
        self.on_status = exchange.on_status
        self.on_header = exchange.on_header
        self.on_headers_complete = exchange.on_headers_complete
        self.on_body = exchange.on_body
        self.on_chunk_header = exchange.on_chunk_header
        self.on_chunk_complete = exchange.on_chunk_complete
        self.on_message_complete = exchange.on_message_complete


# --------------------------------------------------------------------------- client side


class _ClientConnection(asyncio.Protocol):
    """One client connection: parses its requests and runs their exchanges in order."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.parsing: _Request | None = None  # the request whose bytes are being parsed
        self.queue: list[_Request] = []  # complete requests waiting their turn (pipelining)
        self.exchange: _Exchange | None = None
        self.paused: set[str] = set()
        self.head_bytes = 0
        self.timer: asyncio.TimerHandle | None = None
        self.closing = False
        self.close_after = False  # close once the exchange in progress is done
        self.write_paused = False
        self.reading = False  # parsing a read: its exchange's upstream writes wait for its end
        self.used = False  # a request began on it (an idle timeout then is no rejection)

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        relay = self.relay
        relay.stats.connections += 1
        limit = relay.listen_settings.max_client_connections
        if limit and len(relay.clients) >= limit:
            self._refuse()
            return
        relay.clients.add(self)
        self._arm(relay.listen_settings.keepalive_timeout_s, "idle")

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if self.closing or parser is None:
            return
        self.reading = True
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The upgrade is not relayed (Upgrade is hop-by-hop); the request was, and
            # what follows it on this connection is not HTTP/1.1.
            self.close_after = True
            self.pause_reading("upgrade")
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # httptools chains the callback's exception this way
            self.reject(cause.reason if isinstance(cause, _Rejected) else "malformed")
        finally:
            self.reading = False
            if self.exchange is not None:
                self.exchange.send_corked()

    def eof_received(self) -> bool:
        exchange = self.exchange
        if exchange is None and self.parsing is None and not self.queue:
            return False  # closes the transport
        self.close_after = True
        if exchange is not None and not exchange.head_done and _left(exchange.request):
            exchange.client_lost()  # a 499; the upstream request ends with it
            return False
        return True  # half-close: keep sending the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.parser = None  # it holds this connection (its callbacks): no cycle to collect
        self.relay.clients.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        if self.exchange is not None:
            self.exchange.client_lost()  # exchange_done() lets go of it

    def pause_writing(self) -> None:
        self.write_paused = True
        exchange = self.exchange
        if exchange is not None and exchange.upstream is not None:
            transport = exchange.upstream.transport
            if transport is not None:
                transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        exchange = self.exchange
        if exchange is not None and exchange.upstream is not None:
            transport = exchange.upstream.transport
            if transport is not None and not transport.is_closing():
                transport.resume_reading()

    # -- llhttp callbacks

    def on_message_begin(self) -> None:
        self.parsing = _Request(time.monotonic_ns())
        self.head_bytes = 0
        if self.exchange is None:
            self._arm(self.relay.listen_settings.header_timeout_s, "header")

    def on_url(self, url: bytes) -> None:
        request = self.parsing
        assert request is not None
        self._count_head(len(url))
        request.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.parsing
        assert request is not None
        self._count_head(len(name) + len(value) + 4)
        if request.trailers is None:
            request.headers.append((name, value))
        else:
            request.trailers.append((name, value))

    def on_headers_complete(self) -> None:
        request = self.parsing
        parser = self.parser
        assert request is not None and parser is not None  # called from feed_data
        request.trailers = []
        request.method = parser.get_method()
        request.http10 = parser.get_http_version() == "1.0"
        request.keep_alive = parser.should_keep_alive()
        request.chunked = any(
            name.lower() == b"transfer-encoding" and value.rstrip().lower().endswith(b"chunked")
            for name, value in request.headers
        )
        request.expect_continue = any(
            _expects_continue(name, value) for name, value in request.headers
        )
        if request.method == b"CONNECT" or not (
            request.url.startswith(b"/") or request.url == b"*" or b"://" in request.url[:16]
        ):
            raise _Rejected("method_not_allowed")
        if self.exchange is None and not self.queue:
            self._cancel_timer()
            self._begin(request)
        else:
            self.pause_reading("pipelined")
            self.queue.append(request)

    def on_body(self, body: bytes) -> None:
        request = self.parsing
        assert request is not None
        self._copy(request, body)
        exchange = self.exchange
        if exchange is not None and exchange.request is request:
            exchange.request_body(body)
        else:
            request.pending.append(b"%x\r\n%s\r\n" % (len(body), body) if request.chunked else body)

    def on_message_complete(self) -> None:
        request = self.parsing
        assert request is not None
        self.parsing = None
        exchange = self.exchange
        if exchange is not None and exchange.request is request:
            exchange.request_complete()
        else:
            request.complete = True

    # -- the exchange

    def _begin(self, request: _Request) -> None:
        relay = self.relay
        relay.stats.requests += 1
        self.used = True
        exchange = self.exchange = _Exchange(self, request)
        relay.exchange_began()
        answer = relay.local(request.method, request.url) if relay.local is not None else None
        if answer is not None:
            exchange.respond_locally(answer)
        else:
            exchange.start()

    def exchange_done(self, exchange: _Exchange) -> None:
        if self.exchange is exchange:
            self.exchange = None
            self.relay.exchange_ended()
        if self.closing:
            return
        if (
            exchange.close_client
            or exchange.outcome.upstream_aborted
            or self.close_after
            or self.relay.closing
        ):
            self.close()
            return
        self.resume_reading("pipelined")
        if self.queue:
            self._begin(self.queue.pop(0))
        elif self.parsing is None:
            self._arm(self.relay.listen_settings.keepalive_timeout_s, "idle")

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not self.closing:
            transport.write(data)

    # -- flow control

    def pause_reading(self, reason: str) -> None:
        if not self.paused and self.transport is not None:
            self.transport.pause_reading()
        self.paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason not in self.paused:
            return
        self.paused.discard(reason)
        if not self.paused and self.transport is not None and not self.closing:
            self.transport.resume_reading()

    # -- errors and limits

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > _MAX_HEAD_BYTES:
            raise _Rejected("head_too_large")

    def _copy(self, request: _Request, body: bytes) -> None:
        request.body_size += len(body)  # past the limit too: the prompt class is its size's
        copy = request.body_copy
        if copy is None:
            return
        if request.body_size > self.relay.upstream_settings.max_request_bytes:
            request.body_copy = None
        else:
            copy.append(body)

    def reject(self, reason: str) -> None:
        """A request that cannot be relayed: answer plainly and close. No byte of it is logged
        or echoed: it may hold prompt text."""
        self.relay.stats.reject(reason)
        if self.exchange is None:
            status, phrase = _REJECTS.get(reason, _REJECTS["malformed"])
            self.write(_error_response(status, phrase, reason, phrase.decode().lower(), True))
            self.close()
        else:
            # Mid-exchange (a broken body or a bad pipelined request): end the connection.
            self.closing = True
            if self.transport is not None:
                self.transport.close()

    def _arm(self, delay: float, why: str) -> None:
        self._cancel_timer()
        self.timer = self.relay.loop.call_later(delay, self._expired, why)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self, why: str) -> None:
        self.timer = None
        if why == "linger":
            if self.transport is not None:
                self.transport.abort()
            return
        if self.exchange is not None or self.closing:
            return
        if why == "header" and self.parsing is not None:
            self.reject("header_timeout")
            return
        if not self.used:
            # Opened and never used: what a slow-loris or a port scan leaves behind. A kept-
            # alive connection closing after its requests is ordinary HTTP, not counted.
            self.relay.stats.reject("idle_timeout")
        self.close()

    def _refuse(self) -> None:
        """Past max_client_connections: a marked 503, then linger (see _TOO_MANY)."""
        self.relay.stats.reject("too_many_connections")
        self.closing = True
        transport = self.transport
        assert transport is not None
        transport.write(_TOO_MANY)
        if transport.can_write_eof():
            transport.write_eof()
            self.timer = self.relay.loop.call_later(_LINGER_S, self._expired, "linger")
        else:
            transport.close()

    def close(self) -> None:
        self.closing = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()


class _Rejected(Exception):
    """Raised from a parser callback to reject the request: llhttp stops parsing and
    ``feed_data`` raises a callback error caused by this."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------- helpers


def _left(request: _Request) -> bool:
    """Whether a client's FIN before the response head means it left, not that it half-closed.

    TCP cannot tell the two apart before the head: close() and shutdown(SHUT_WR) send the
    same FIN, the socket is in CLOSE_WAIT either way, a MSG_PEEK read returns b"" and
    EPOLLRDHUP fires for both. Only a write shows the difference (a closed peer answers it
    with a reset), and the relay has nothing of the upstream's to write yet: inventing bytes
    (an unasked 1xx) would change what the client receives. So it goes by the request:
    - its body is incomplete: it can never be answered; the client left.
    - it asked to keep the connection alive (HTTP/1.1 without ``Connection: close``): a
      client that means to send more requests does not shut its sending side, and the
      clients that close after a request (SDK timeouts, cancelled calls) look exactly like
      this. nginx (``proxy_ignore_client_abort off``) ends the upstream request on any FIN.
    - it said ``Connection: close`` (or is HTTP/1.0): the one request is all it sends, so a
      FIN is the half-close that ``printf … | nc -N`` style clients do; the answer goes out.
      If such a client had left after all, writing the head shows it (a reset, then
      ``client_lost``), as it did before.
    """
    return not request.complete or request.keep_alive


def _replayable(request: _Request) -> bool:
    return request.method in _IDEMPOTENT or any(
        name.lower() in _IDEMPOTENCY_KEYS for name, _ in request.headers
    )


_HEX_DIGITS = b"0123456789abcdefABCDEF"


def _whole_chunks(data: bytes) -> bytes | None:
    """The body ``data`` carries if it is whole chunks (RFC 9112 §7.1) in their strictest
    form: a size of one to eight hex digits, not zero, no extension, the data, CRLF. Else
    None, and llhttp judges ``data``: whatever it would refuse is refused here by not being
    taken."""
    bodies = []
    pos, end = 0, len(data)
    while pos < end:
        line = data.find(b"\r\n", pos, pos + 10)
        if line <= pos:
            return None
        size = data[pos:line]
        if size.strip(_HEX_DIGITS):
            return None
        start = line + 2
        stop = start + int(size, 16)
        if stop == start or data[stop : stop + 2] != b"\r\n":
            return None
        bodies.append(data[start:stop])
        pos = stop + 2
    return bodies[0] if len(bodies) == 1 else b"".join(bodies)


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Header names the Connection header lists: hop-by-hop too."""
    return frozenset(
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
        if token.strip()
    )


def _head(
    status: int,
    reason: bytes,
    headers: list[tuple[bytes, bytes]],
    extra: tuple[bytes, ...],
    drop: frozenset[bytes] = _HOP_BY_HOP,
) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
    for name, value in headers:
        if name.lower() not in drop:
            lines += (name, b": ", value, b"\r\n")
    lines += extra
    lines.append(b"\r\n")
    return b"".join(lines)


def _expects_continue(name: bytes, value: bytes) -> bool:
    return name.lower() == b"expect" and value.strip().lower() == b"100-continue"


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# Request trailers are parsed and dropped, never forwarded (RFC 9110 §6.5.1 allows it):
# servers that mishandle them, aiohttp's among them, put them into the next request's headers.
_LAST_CHUNK = b"0\r\n\r\n"


def _header(headers: list[tuple[bytes, bytes]], lower: bytes) -> str | None:
    for name, value in headers:
        if name.lower() == lower:
            return value.decode("latin-1")
    return None


# --------------------------------------------------------------------------- the server


class Relay:
    """The proxy listener: ``start`` binds, ``shutdown`` drains within a deadline."""

    loop: asyncio.AbstractEventLoop  # set by start(); nothing runs before it

    def __init__(
        self,
        upstream: UpstreamSettings,
        tap: TapSink | None,
        *,
        listen: ListenSettings | None = None,
        local: Callable[[bytes, bytes], bytes | None] | None = None,
        stats: RelayStats | None = None,
        on_quiet: Callable[[], object] | None = None,
        quiet_after_s: float = QUIET_S,
    ) -> None:
        self.upstream_settings = upstream
        self.listen_settings = listen or ListenSettings()
        self.target = _Target(upstream)
        self.pool = _Pool(self.target, upstream)
        self.tap = tap
        # (method, request target) -> a whole response, or None to relay: the admin front
        # answers its health checks itself.
        self.local = local
        self.stats = stats or RelayStats()
        drop = upstream.tap_headers_drop
        self._tap_headers_drop = (
            None if drop is None else drop | _REQUEST_DROP | {b"content-length", b"expect"}
        )
        self.clients: set[_ClientConnection] = set()
        self.active = 0  # exchanges in progress
        # Called once ``quiet_after_s`` passed with nothing in flight after traffic (the
        # forwarder gives back its heap then). One timer a quiet spell, cancelled when an
        # exchange begins before it fires: steady traffic never wakes the loop for it.
        self._on_quiet = on_quiet
        self._quiet_after_s = quiet_after_s
        self._quiet_timer: asyncio.TimerHandle | None = None
        self.closing = False
        self._drained: asyncio.Event | None = None  # set when the last exchange ends
        self._servers: list[asyncio.Server] = []

    @property
    def active_streams(self) -> int:
        return self.active

    def exchange_began(self) -> None:
        self.active += 1
        self._cancel_quiet()
        self.stats.changed()

    def exchange_ended(self) -> None:
        self.active -= 1
        if self.active:
            return
        if self._drained is not None:
            self._drained.set()
        if self._on_quiet is not None and self._quiet_timer is None:
            self._quiet_timer = self.loop.call_later(self._quiet_after_s, self._quiet)

    def _quiet(self) -> None:
        self._quiet_timer = None
        if self._on_quiet is not None:
            self._on_quiet()

    def _cancel_quiet(self) -> None:
        if self._quiet_timer is not None:
            self._quiet_timer.cancel()
            self._quiet_timer = None

    def open_stream(
        self,
        request: _Request,
        *,
        status: int,
        response_ns: int | None = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        ratelimit_source: str | None = None,
    ) -> StreamTap | None:
        tap = self.tap
        if tap is None:
            return None
        oversized = request.body_copy is None
        if oversized:
            tap.unanalysed("oversized")
        url = httptools.parse_url(request.url) if request.url != b"*" else None
        path = (url.path if url is not None and url.path else b"/").decode("latin-1")
        exchange = Exchange(
            method=request.method.decode("latin-1"),
            path=path,
            start_ns=request.start_ns,
            status=status,
            content_type=content_type,
            content_encoding=content_encoding,
            response_ns=response_ns,
            request_body=None if request.body_copy is None else b"".join(request.body_copy),
            request_skip="oversized" if oversized else None,
            request_bytes=request.body_size if oversized else 0,
            ratelimit_source=ratelimit_source,
            # Copied, not parsed: analysis judges it. Once per exchange, never per chunk.
            traceparent=_header(request.headers, b"traceparent"),
            request_headers=self._tap_headers(request.headers),
        )
        return tap.open_stream(exchange)

    def _tap_headers(self, headers: list[tuple[bytes, bytes]]) -> _Headers | None:
        """The request headers analysis may have; once per exchange, only when asked for."""
        drop = self._tap_headers_drop
        if drop is None:
            return None
        drop = drop | _connection_tokens(headers)
        return tuple(
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in headers
            if name.lower() not in drop
        )

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, sock: socket.socket | None = None
    ) -> tuple[str, int]:
        """Listen on ``host:port`` (or on ``sock``); returns the bound address."""
        self.loop = asyncio.get_running_loop()
        if sock is not None:
            server = await self.loop.create_server(lambda: _ClientConnection(self), sock=sock)
        else:
            server = await self.loop.create_server(
                lambda: _ClientConnection(self),
                host,
                port,
                reuse_address=True,
                reuse_port=reuse_port or None,
                backlog=1024,
            )
        self._servers.append(server)
        bound = server.sockets[0].getsockname()
        return bound[0], bound[1]

    async def shutdown(self, timeout_s: float) -> None:
        """Stop accepting, let exchanges in flight finish within ``timeout_s``, then cut them."""
        self.closing = True
        for server in self._servers:
            server.close()
        for client in list(self.clients):
            if client.exchange is None:
                client.close()
        if self.active:
            self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout_s)
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.abort()
        self.pool.close()
        self._cancel_quiet()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
