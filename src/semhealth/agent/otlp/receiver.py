"""The OTLP receiver: OTLP/gRPC and OTLP/HTTP (protobuf and JSON) for traces, logs and metrics.

Each export request is checked (size, items per request, decoding), counted, handed to
forwarding as it came (``forward``: the protobuf bytes, or JSON converted once) and queued
for the GenAI mapping (``analysis``, traces and logs only), then answered at once: neither
forwarding nor analysis is ever awaited by a caller. Over a limit the request is refused
and counted (413 / ``RESOURCE_EXHAUSTED`` for size, OTLP partial success for too many
items); when the analysis queue is full the request is still forwarded and answered, and
its items are shed from analysis and counted.

gRPC serves ``Export`` as a client-streaming method on the OTLP services' names. A unary
client cannot tell the difference, and it lets the handler see the calls that gRPC itself
refuses for size (their stream is empty), so those are counted too; the raw request bytes
also reach forwarding untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc  # type: ignore[import-untyped]
from aiohttp import web
from google.protobuf.message import Message  # type: ignore[import-untyped]
from opentelemetry.proto.logs.v1.logs_pb2 import ResourceLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from semhealth.agent.otlp import codec
from semhealth.agent.otlp.codec import JSON, METRICS, PROTOBUF, SIGNALS, TRACES, Signal
from semhealth.agent.tasks import failure_reporter

log = logging.getLogger(__name__)

Forward = Callable[[Signal, bytes], None]
_READ_CHUNK = 64 * 1024
# gRPC status codes as google.rpc.Code numbers, for OTLP/HTTP's Status bodies.
_INVALID_ARGUMENT = 3
_RESOURCE_EXHAUSTED = 8
_UNIMPLEMENTED = 12


class Analysis(Protocol):
    """What the receiver feeds: the GenAI mapping (``genai.GenAITraces``)."""

    def add_spans(self, resource_spans: Sequence[ResourceSpans]) -> int: ...

    def add_logs(self, resource_logs: Sequence[ResourceLogs]) -> int: ...

    def flush(self) -> int: ...

    def close(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiverSettings:
    grpc_listen: tuple[str, int] | None = None  # None: no OTLP/gRPC
    http_listen: tuple[str, int] | None = None  # None: no OTLP/HTTP
    max_message_bytes: int = 4 * 1024 * 1024  # one request, after decompression
    max_items_per_request: int = 10_000  # spans or log records; past it the request is refused
    max_queue_bytes: int = 64 * 1024 * 1024  # requests waiting for the GenAI mapping
    flush_interval_s: float = 0.5  # how often traces waiting for their last span are checked


@dataclass(slots=True)
class ReceiverStats:
    """Counters; every key is a signal name (``traces``, ``logs``, ``metrics``)."""

    received: dict[str, int] = field(default_factory=dict)  # items accepted
    requests: dict[str, int] = field(default_factory=dict)  # requests accepted
    # requests refused, by (signal, reason): too_large, too_many_items, malformed, unsupported
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)
    # items accepted (and forwarded) but not analysed, by (signal, reason): queue_full, pending_full
    # (the GenAI mapping's own limit), error (the mapping failed on them: a bug)
    shed: dict[tuple[str, str], int] = field(default_factory=dict)
    queue_bytes: int = 0  # waiting for the GenAI mapping now


def _add(counts: dict[Any, int], key: Any, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


@dataclass(frozen=True, slots=True)
class _Queued:
    signal: Signal
    message: Any
    size: int
    items: int


class Receiver:
    """Listens for OTLP exports and hands each request to ``forward`` and ``analysis``.

    ``start`` binds the configured listeners (gRPC, then HTTP; the first is closed again
    if the second fails); ``shutdown`` stops them, analyses what is queued and closes the
    analysis so that traces still waiting for spans become records. Both are safe to call
    again, and ``shutdown`` without ``start``.
    """

    def __init__(
        self,
        settings: ReceiverSettings,
        *,
        analysis: Analysis | None = None,
        forward: Forward | None = None,
        on_task_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._settings = settings
        self._analysis = analysis
        self._forward = forward
        self._on_task_failure = on_task_failure
        self.stats = ReceiverStats()
        self._queue: deque[_Queued] = deque()
        self._wakeup = asyncio.Event()
        self._grpc: Any = None
        self._http: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.grpc_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        settings = self._settings
        try:
            if settings.grpc_listen is not None:
                self.grpc_address = await self._start_grpc(*settings.grpc_listen)
            if settings.http_listen is not None:
                self.http_address = await self._start_http(*settings.http_listen)
        except BaseException:
            await self.shutdown()
            raise
        if self._analysis is not None:
            self._tasks = [
                asyncio.create_task(self._analyse(), name="otlp-analysis"),
                asyncio.create_task(self._flush_periodically(), name="otlp-flush"),
            ]
            for task in self._tasks:
                task.add_done_callback(
                    failure_reporter(self._on_task_failure, log, "OTLP receiver")
                )

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop listening (calls in flight get part of ``timeout_s``), analyse what is
        queued, close the analysis and stop the tasks."""
        server, self._grpc = self._grpc, None
        if server is not None:
            await server.stop(grace=timeout_s / 2)
        runner, self._http = self._http, None
        if runner is not None:
            await runner.cleanup()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if tasks and self._analysis is not None:
            while self._queue:
                self._analyse_one(self._queue.popleft())
            self._guarded(lambda analysis: analysis.close(), None)

    # -- intake, shared by both transports --------------------------------------------------

    def _accept(self, signal: Signal, message: Message, raw: bytes | None) -> Message:
        """Count, forward and queue one decoded request; the response to send."""
        stats = self.stats
        items = signal.items(message)
        limit = self._settings.max_items_per_request
        if signal is not METRICS and items > limit:
            _add(stats.rejected, (signal.name, "too_many_items"))
            noun = "spans" if signal is TRACES else "log records"
            return codec.answer(
                signal,
                items,
                f"the request holds {items} {noun}, more than max_spans_per_request ({limit});"
                " send smaller batches",
            )
        _add(stats.requests, signal.name)
        _add(stats.received, signal.name, items)
        if self._forward is not None:
            self._forward(signal, raw if raw is not None else message.SerializeToString())
        if signal is not METRICS and self._tasks:
            size = len(raw) if raw is not None else message.ByteSize()
            self._enqueue(signal, message, items, size)
        return codec.answer(signal)

    def _enqueue(self, signal: Signal, message: Message, items: int, size: int) -> None:
        if self.stats.queue_bytes + size > self._settings.max_queue_bytes:
            _add(self.stats.shed, (signal.name, "queue_full"), items)
            return
        self.stats.queue_bytes += size
        self._queue.append(_Queued(signal, message, size, items))
        self._wakeup.set()

    def _refuse(self, signal: Signal, reason: str) -> None:
        _add(self.stats.rejected, (signal.name, reason))

    # -- analysis ---------------------------------------------------------------------------

    async def _analyse(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                self._analyse_one(self._queue.popleft())
                await asyncio.sleep(0)  # one request at a time: handlers keep answering

    def _analyse_one(self, queued: _Queued) -> None:
        self.stats.queue_bytes -= queued.size
        message = queued.message
        if queued.signal is TRACES:
            rejected = self._guarded(lambda a: a.add_spans(message.resource_spans), queued)
        else:
            rejected = self._guarded(lambda a: a.add_logs(message.resource_logs), queued)
        if rejected:
            _add(self.stats.shed, (queued.signal.name, "pending_full"), rejected)

    def _guarded(self, call: Callable[[Analysis], int], queued: _Queued | None) -> int:
        """The analysis' answer; a failure is logged by type and counted, never raised,
        so one odd request cannot stop the analysis of the next."""
        assert self._analysis is not None
        try:
            return call(self._analysis)
        except Exception as exc:
            log.error("GenAI mapping failed with %s (a bug: please report)", type(exc).__name__)
            if queued is not None:
                _add(self.stats.shed, (queued.signal.name, "error"), queued.items)
            return 0

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._settings.flush_interval_s)
            self._guarded(lambda analysis: analysis.flush(), None)

    # -- OTLP/gRPC --------------------------------------------------------------------------

    async def _start_grpc(self, host: str, port: int) -> tuple[str, int]:
        limit = self._settings.max_message_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                # gRPC shares a port with another listener by default; one in use must fail.
                ("grpc.so_reuseport", 0),
            ]
        )
        for signal in SIGNALS:
            handler = grpc.stream_unary_rpc_method_handler(self._grpc_export(signal))
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(signal.service, {"Export": handler}),)
            )
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(target)
        except RuntimeError as exc:
            raise OSError(f"cannot listen for OTLP/gRPC on {target}: {exc}") from None
        if not bound:
            raise OSError(f"cannot listen for OTLP/gRPC on {target} (is the port in use?)")
        await server.start()
        self._grpc = server
        return host, int(bound)

    def _grpc_export(self, signal: Signal) -> Callable[[AsyncIterator[bytes], Any], Any]:
        async def export(requests: AsyncIterator[bytes], context: Any) -> bytes:
            raw = None
            async for message in requests:
                raw = message
                break
            if raw is None:
                # gRPC refused the message (past max_receive_message_length) and has
                # already answered RESOURCE_EXHAUSTED; a cancelled call is not counted.
                if not context.cancelled():
                    self._refuse(signal, "too_large")
                return b""
            try:
                decoded = codec.decode(signal, raw, PROTOBUF)
            except codec.BadRequest as exc:
                self._refuse(signal, "malformed")
                context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
                context.set_details(str(exc))
                return b""
            response: bytes = self._accept(signal, decoded, raw).SerializeToString()
            return response

        return export

    # -- OTLP/HTTP --------------------------------------------------------------------------

    async def _start_http(self, host: str, port: int) -> tuple[str, int]:
        app = web.Application(client_max_size=self._settings.max_message_bytes)
        for signal in SIGNALS:
            app.router.add_post(signal.path, self._http_export(signal))
        # Content-Encoding is decoded here, under the size limit, not by aiohttp.
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, auto_decompress=False, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, reuse_address=True).start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(f"cannot listen for OTLP/HTTP on {host}:{port}: {exc.strerror}") from None
        self._http = runner
        bound = runner.addresses[-1]
        return bound[0], int(bound[1])

    def _http_export(self, signal: Signal) -> Callable[[web.Request], Any]:
        async def export(request: web.Request) -> web.Response:
            content_type = request.content_type
            if content_type not in (PROTOBUF, JSON):
                self._refuse(signal, "unsupported")
                return web.Response(
                    status=415,
                    text=f"Content-Type must be {PROTOBUF} or {JSON}, not {content_type!r}\n",
                )
            try:
                body = await self._read_body(request)
                decoded = codec.decode(signal, body, content_type)
            except codec.TooLarge as exc:
                return self._http_error(signal, 413, "too_large", exc, content_type)
            except codec.UnsupportedEncoding as exc:
                return self._http_error(signal, 415, "unsupported", exc, content_type)
            except codec.BadRequest as exc:
                return self._http_error(signal, 400, "malformed", exc, content_type)
            raw = body if content_type == PROTOBUF else None
            response = self._accept(signal, decoded, raw)
            return web.Response(
                body=codec.encode(response, content_type), content_type=content_type
            )

        return export

    async def _read_body(self, request: web.Request) -> bytes:
        """The decoded body, never more than ``max_message_bytes`` read or inflated."""
        limit = self._settings.max_message_bytes
        too_large = codec.TooLarge(f"the body is larger than max_message_bytes ({limit} bytes)")
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(_READ_CHUNK):
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        encoding = request.headers.get("Content-Encoding", "")
        return codec.inflate(b"".join(chunks), encoding, limit)

    def _http_error(
        self, signal: Signal, status: int, reason: str, exc: Exception, content_type: str
    ) -> web.Response:
        self._refuse(signal, reason)
        code = {400: _INVALID_ARGUMENT, 413: _RESOURCE_EXHAUSTED}.get(status, _UNIMPLEMENTED)
        return web.Response(
            status=status,
            body=codec.status(code, str(exc), content_type),
            content_type=content_type,
        )
