"""Forwarding to the next hop: every export request received, unchanged, to the user's
collector over OTLP/gRPC or OTLP/HTTP (protobuf).

``NextHop.submit`` never waits: it appends the request's protobuf bytes to a queue bounded
in bytes, dropping (and counting) the oldest requests to make room. A few sender tasks send
them in order of arrival. An answer that OTLP calls retryable (gRPC ``UNAVAILABLE`` and
the like, HTTP 429/502/503/504, a refused connection or a timeout) puts the request back at
the head and pauses every sender, with exponential backoff or as long as the next hop's
``Retry-After`` / ``RetryInfo`` asks; any other refusal (HTTP 400, gRPC ``INVALID_ARGUMENT``)
is permanent: the request is dropped and counted. A request older than ``max_age_s`` is
dropped and counted instead of sent. So while the next hop is down, telemetry waits up to
those two limits and arrives when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import grpc  # type: ignore[import-untyped]
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from semhealth.agent.otlp.codec import PROTOBUF, SIGNALS, Signal
from semhealth.agent.tasks import failure_reporter

log = logging.getLogger(__name__)

# Outcomes, the values of the ``outcome`` label.
FORWARDED = "forwarded"  # the next hop accepted it
RETRIED = "retried"  # an attempt failed in a way worth retrying (counted per attempt)
REJECTED = "rejected"  # the next hop refused it for good (HTTP 400, INVALID_ARGUMENT ...)
DROPPED_FULL = "dropped_full"  # pushed out of a full queue, oldest first
DROPPED_EXPIRED = "dropped_expired"  # waited longer than max_age_s
DROPPED_SHUTDOWN = "dropped_shutdown"  # still queued when the agent stopped
OUTCOMES = (FORWARDED, RETRIED, REJECTED, DROPPED_FULL, DROPPED_EXPIRED, DROPPED_SHUTDOWN)

# OTLP's retryable answers (specification, "Failures" of OTLP/gRPC and OTLP/HTTP).
_RETRYABLE_GRPC = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
_RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
_STATUS_DETAILS = "grpc-status-details-bin"


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardSettings:
    endpoint: str  # grpc: http(s)://HOST:PORT; http/protobuf: the base URL (+ /v1/traces ...)
    protocol: str = "grpc"  # grpc | http/protobuf
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 10.0  # one attempt
    insecure: bool | None = None  # gRPC only; None: the endpoint's scheme decides
    max_queue_bytes: int = 64 * 1024 * 1024
    max_age_s: float = 300.0
    senders: int = 4  # requests in flight at once
    backoff_s: tuple[float, float] = (0.5, 30.0)  # first and longest pause after a failure


@dataclass(slots=True)
class ForwardStats:
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)  # (signal, outcome)
    queue_bytes: int = 0  # queued or in flight
    queue_requests: int = 0


@dataclass(slots=True)
class _Item:
    signal: Signal
    body: bytes
    since: float  # when it was queued (the clock's time)
    number: int  # arrival order


@dataclass(frozen=True, slots=True)
class _Result:
    """One attempt's verdict: ``retry`` with an optional pause the next hop asked for."""

    ok: bool = False
    retry: bool = False
    after_s: float | None = None
    reason: str = ""


class _Transport(Protocol):
    async def open(self) -> None: ...

    async def send(self, signal: Signal, body: bytes) -> _Result: ...

    async def close(self) -> None: ...


class NextHop:
    """The bounded retry queue in front of the user's collector."""

    def __init__(
        self,
        settings: ForwardSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_task_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._on_task_failure = on_task_failure
        self._transport: _Transport = (
            _GrpcTransport(settings) if settings.protocol == "grpc" else _HttpTransport(settings)
        )
        self.stats = ForwardStats()
        self._queue: deque[_Item] = deque()
        self._work = asyncio.Event()
        self._drained = asyncio.Event()  # nothing queued or in flight
        self._drained.set()
        self._resume_at = 0.0
        self._failures = 0  # consecutive failed attempts: the backoff's exponent
        self._in_flight = 0
        self._arrivals = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._accepting = False
        self._failing = False  # logged once per outage

    # -- intake -----------------------------------------------------------------------------

    def submit(self, signal: Signal, body: bytes) -> None:
        """Queue ``body`` for the next hop; returns at once, dropping the oldest when full."""
        if not self._accepting:
            self._count(signal, DROPPED_SHUTDOWN)
            return
        self._expire()
        limit = self._settings.max_queue_bytes
        if len(body) > limit:
            self._count(signal, DROPPED_FULL)
            return
        while self._queue and self.stats.queue_bytes + len(body) > limit:
            self._drop(self._queue.popleft(), DROPPED_FULL)
        self._arrivals += 1
        self._queue.append(_Item(signal, body, self._clock(), self._arrivals))
        self.stats.queue_bytes += len(body)
        self.stats.queue_requests += 1
        self._work.set()
        self._drained.clear()

    def _count(self, signal: Signal, outcome: str) -> None:
        key = (signal.name, outcome)
        self.stats.outcomes[key] = self.stats.outcomes.get(key, 0) + 1

    def _drop(self, item: _Item, outcome: str) -> None:
        self._done(item)
        self._count(item.signal, outcome)

    def _done(self, item: _Item) -> None:
        self.stats.queue_bytes -= len(item.body)
        self.stats.queue_requests -= 1
        if self.stats.queue_requests == 0:
            self._drained.set()

    def _expire(self) -> None:
        """Drop queued requests past ``max_age_s``, oldest first (the head is the oldest)."""
        oldest = self._clock() - self._settings.max_age_s
        while self._queue and self._queue[0].since < oldest:
            self._drop(self._queue.popleft(), DROPPED_EXPIRED)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self._transport.open()
        self._accepting = True
        self._tasks = [
            asyncio.create_task(self._send_loop(), name=f"otlp-forward-{n}")
            for n in range(self._settings.senders)
        ]
        for task in self._tasks:
            task.add_done_callback(failure_reporter(self._on_task_failure, log, "OTLP forwarding"))

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Send what is queued within ``timeout_s`` (the next hop permitting), then stop;
        what is left is counted as ``dropped_shutdown``. Safe without ``start``, and twice."""
        self._accepting = False
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout_s)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while self._queue:
            self._drop(self._queue.popleft(), DROPPED_SHUTDOWN)
        await self._transport.close()

    # -- sending ----------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        while True:
            pause = self._resume_at - self._clock()
            if pause > 0:
                await asyncio.sleep(pause)
                continue
            self._expire()
            if not self._queue:
                self._work.clear()
                await self._work.wait()
                continue
            item = self._queue.popleft()
            self._in_flight += 1
            try:
                result = await self._transport.send(item.signal, item.body)
            finally:
                self._in_flight -= 1
            self._settle(item, result)

    def _settle(self, item: _Item, result: _Result) -> None:
        if result.ok:
            self._done(item)
            self._count(item.signal, FORWARDED)
            self._failures = 0
            if self._failing:
                log.info("OTLP forwarding to the next hop recovered")
                self._failing = False
            return
        if not result.retry:
            self._drop(item, REJECTED)
            log.warning(
                "the next hop refused an OTLP %s request for good (%s): dropped",
                item.signal.name,
                result.reason,
            )
            return
        self._count(item.signal, RETRIED)
        self._requeue(item)
        self._failures += 1
        pause = result.after_s if result.after_s is not None else self._backoff()
        self._resume_at = max(self._resume_at, self._clock() + min(pause, self._settings.max_age_s))
        if not self._failing:
            log.warning(
                "OTLP forwarding to the next hop failed (%s): retrying, queued up to %d bytes"
                " and %g s",
                result.reason,
                self._settings.max_queue_bytes,
                self._settings.max_age_s,
            )
            self._failing = True

    def _requeue(self, item: _Item) -> None:
        """Back in arrival order: it is among the oldest, so near the head, where it is
        sent first when the hop is back and dropped first when room is needed."""
        index = 0
        while index < len(self._queue) and self._queue[index].number < item.number:
            index += 1
        self._queue.insert(index, item)

    def _backoff(self) -> float:
        first, longest = self._settings.backoff_s
        pause = min(first * 2.0 ** min(self._failures - 1, 30), longest)
        return pause * random.uniform(0.8, 1.2)  # jitter: senders of a fleet spread out


# -- transports -----------------------------------------------------------------------------


class _GrpcTransport:
    """``Export`` on the OTLP services, the request's bytes sent as they are."""

    def __init__(self, settings: ForwardSettings) -> None:
        self._settings = settings
        self._channel: Any = None
        self._calls: dict[str, Any] = {}
        self._metadata = tuple(settings.headers)

    async def open(self) -> None:
        settings = self._settings
        parts = urlsplit(settings.endpoint)
        target = parts.netloc
        # https always means TLS; http means plain text unless insecure is false.
        secure = parts.scheme == "https" or settings.insecure is False
        first, longest = settings.backoff_s
        # The channel's own reconnect backoff (1 s growing to 120 s by default) would keep a
        # recovered hop waiting longer than this queue's; it follows the same bounds instead.
        options = [
            ("grpc.initial_reconnect_backoff_ms", int(first * 1000)),
            ("grpc.min_reconnect_backoff_ms", int(first * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(longest * 1000)),
            ("grpc.max_send_message_length", -1),
        ]
        if secure:
            credentials = grpc.ssl_channel_credentials()
            self._channel = grpc.aio.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        # No serializers: the bytes received are the bytes sent.
        self._calls = {
            signal.name: self._channel.unary_unary(signal.grpc_method) for signal in SIGNALS
        }

    async def send(self, signal: Signal, body: bytes) -> _Result:
        try:
            await self._calls[signal.name](
                body, timeout=self._settings.timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            return _grpc_result(exc)
        return _Result(ok=True)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


def _grpc_result(exc: Any) -> _Result:
    code = exc.code()
    reason = f"gRPC {code.name}"
    delay = _retry_info(exc.trailing_metadata() or ())
    if code in _RETRYABLE_GRPC:
        return _Result(retry=True, after_s=delay, reason=reason)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None:
        # OTLP: retryable only when the server says when (RetryInfo).
        return _Result(retry=True, after_s=delay, reason=reason)
    return _Result(reason=reason)


def _retry_info(metadata: Any) -> float | None:
    """The pause a ``google.rpc.RetryInfo`` in the status details asks for, if any."""
    for key, value in metadata:
        if key != _STATUS_DETAILS or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except Exception:  # undecodable details: no advice, not a failure of ours
            return None
        for detail in status.details:
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                delay = info.retry_delay
                return int(delay.seconds) + int(delay.nanos) / 1e9
    return None


class _HttpTransport:
    """``POST {endpoint}/v1/{signal}`` with the protobuf body as it is."""

    def __init__(self, settings: ForwardSettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None
        base = settings.endpoint.rstrip("/")
        self._urls = {signal.name: base + signal.path for signal in SIGNALS}
        self._headers = {**dict(settings.headers), "Content-Type": PROTOBUF}

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._settings.timeout_s),
            auto_decompress=True,
        )

    async def send(self, signal: Signal, body: bytes) -> _Result:
        assert self._session is not None, "transport not opened"
        try:
            async with self._session.post(
                self._urls[signal.name], data=body, headers=self._headers
            ) as response:
                await response.read()
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return _Result(retry=True, reason=type(exc).__name__)
        if 200 <= status < 300:
            return _Result(ok=True)
        reason = f"HTTP {status}"
        if status in _RETRYABLE_HTTP:
            return _Result(retry=True, after_s=_retry_after(retry_after), reason=reason)
        return _Result(reason=reason)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)
