"""Real OTLP metric and log receivers for tests: gRPC (``grpc.aio``) and HTTP/protobuf
(aiohttp).

Both decode what arrives with ``opentelemetry-proto``'s own messages, as a collector would, and
keep every ``ExportMetricsServiceRequest`` with the headers (gRPC metadata) it came with.
``flatten`` turns what was received into ``{(metric name, attributes): value}`` to compare
with ``/metrics``. Log exports (``ExportLogsServiceRequest``: events such as
``gen_ai.evaluation.result``) are kept apart, in ``logs``, with the exact bytes that arrived.

Each receiver runs its server on an event loop of its own, in a thread: a collector is another
process, and the SDK's exports are synchronous calls (the periodic reader's thread,
``MeterProvider.force_flush``, and the final export of ``MeterProvider.shutdown``, which
``Agent.shutdown`` makes on the agent's loop). A receiver on the agent's loop could not answer
while that loop waits for it.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import zlib
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc  # type: ignore[import-untyped]
from aiohttp import web
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import (
    LogsServiceServicer,
    add_LogsServiceServicer_to_server,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    MetricsServiceServicer,
    add_MetricsServiceServicer_to_server,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_DELTA,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
)

PROTOBUF = "application/x-protobuf"
METRICS_PATH = "/v1/metrics"
LOGS_PATH = "/v1/logs"

AttributeValue = str | bool | int | float | tuple[Any, ...]
Attributes = frozenset[tuple[str, AttributeValue]]
SeriesKey = tuple[str, Attributes]


@dataclass(frozen=True, slots=True)
class HistogramValue:
    """One explicit-bucket histogram series: ``bucket_counts`` per bucket (not cumulative),
    ``len(explicit_bounds) + 1`` of them, the last one above every bound."""

    count: int
    sum: float
    bucket_counts: tuple[int, ...]
    explicit_bounds: tuple[float, ...]


Value = int | float | HistogramValue


@dataclass(frozen=True, slots=True)
class Received:
    """One export as the receiver got it. Header names are lower-case."""

    request: ExportMetricsServiceRequest
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class ReceivedLogs:
    """One log export as the receiver got it: ``raw`` is the body as it arrived (decompressed
    over HTTP; over gRPC the message as serialized on the wire). Header names are lower-case."""

    request: ExportLogsServiceRequest
    headers: dict[str, str]
    raw: bytes


# --------------------------------------------------------------------------- decoding


def any_value(value: AnyValue) -> AttributeValue:
    """The Python value of an OTLP ``AnyValue`` (arrays as tuples)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "array_value":
        return tuple(any_value(item) for item in value.array_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return ""


def attributes(pairs: Iterable[KeyValue]) -> Attributes:
    return frozenset((pair.key, any_value(pair.value)) for pair in pairs)


def _number(point: NumberDataPoint) -> int | float:
    return point.as_int if point.WhichOneof("value") == "as_int" else point.as_double


def _histogram(point: HistogramDataPoint) -> HistogramValue:
    return HistogramValue(
        count=point.count,
        sum=point.sum,
        bucket_counts=tuple(point.bucket_counts),
        explicit_bounds=tuple(point.explicit_bounds),
    )


def _add(old: Value | None, new: Value) -> Value:
    """Delta points add up; a histogram's buckets add element-wise."""
    if old is None:
        return new
    if isinstance(old, HistogramValue) and isinstance(new, HistogramValue):
        counts = tuple(a + b for a, b in zip(old.bucket_counts, new.bucket_counts, strict=True))
        return replace(
            new, count=old.count + new.count, sum=old.sum + new.sum, bucket_counts=counts
        )
    if isinstance(old, HistogramValue) or isinstance(new, HistogramValue):
        raise TypeError("a metric changed between histogram and number data points")
    return old + new


class _Series:
    """Values by series: delta points add up, every other point replaces an older one."""

    def __init__(self) -> None:
        self.values: dict[SeriesKey, Value] = {}
        self._stamps: dict[SeriesKey, int] = {}

    def put(self, key: SeriesKey, value: Value, time_unix_nano: int, delta: bool) -> None:
        if delta:
            self.values[key] = _add(self.values.get(key), value)
        elif time_unix_nano >= self._stamps.get(key, -1):
            # By collection time, not arrival: two readers' exports can overtake each other.
            self.values[key] = value
            self._stamps[key] = time_unix_nano

    def merge(self, metric: Metric) -> None:
        kind = metric.WhichOneof("data")
        if kind == "sum":
            delta = metric.sum.aggregation_temporality == AGGREGATION_TEMPORALITY_DELTA
            for point in metric.sum.data_points:
                key = (metric.name, attributes(point.attributes))
                self.put(key, _number(point), point.time_unix_nano, delta)
        elif kind == "gauge":
            for point in metric.gauge.data_points:
                key = (metric.name, attributes(point.attributes))
                self.put(key, _number(point), point.time_unix_nano, delta=False)
        elif kind == "histogram":
            delta = metric.histogram.aggregation_temporality == AGGREGATION_TEMPORALITY_DELTA
            for hpoint in metric.histogram.data_points:
                key = (metric.name, attributes(hpoint.attributes))
                self.put(key, _histogram(hpoint), hpoint.time_unix_nano, delta)
        else:
            raise ValueError(f"metric {metric.name!r} has unsupported data {kind!r}")


def _metrics(requests: Iterable[ExportMetricsServiceRequest]) -> Iterable[Metric]:
    for request in requests:
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                yield from scope_metrics.metrics


def flatten(requests: Iterable[ExportMetricsServiceRequest]) -> dict[SeriesKey, Value]:
    """``{(metric name, attributes): value}`` over everything in ``requests``.

    Cumulative sums and histograms keep their newest point (each one is the running total),
    delta ones add up; a gauge keeps its newest value.
    """
    series = _Series()
    for metric in _metrics(requests):
        series.merge(metric)
    return series.values


def latest_metrics(requests: Iterable[ExportMetricsServiceRequest]) -> dict[str, Metric]:
    """The last ``Metric`` message received under each name: its unit, kind, temporality."""
    return {metric.name: metric for metric in _metrics(requests)}


def resource_attributes(requests: Sequence[ExportMetricsServiceRequest]) -> dict[str, Any]:
    """The resource attributes of the latest export (empty before any)."""
    out: dict[str, Any] = {}
    if requests:
        for resource_metrics in requests[-1].resource_metrics:
            out.update(attributes(resource_metrics.resource.attributes))
    return out


# --------------------------------------------------------------------------- lifecycle


class _Receiver(ABC):
    """The shared half: a server on an event loop in its own thread, and what it received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._logs: list[ReceivedLogs] = []
        self._attempts = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def requests(self) -> list[ExportMetricsServiceRequest]:
        """Every export accepted so far, in arrival order."""
        with self._lock:
            return [item.request for item in self._received]

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    @property
    def attempts(self) -> int:
        """Exports that reached the receiver, refused ones included."""
        with self._lock:
            return self._attempts

    def values(self) -> dict[SeriesKey, Value]:
        return flatten(self.requests)

    @property
    def logs(self) -> list[ReceivedLogs]:
        """Every log export accepted so far, in arrival order (metrics' counters exclude them)."""
        with self._lock:
            return list(self._logs)

    def log_records(self) -> list[LogRecord]:
        """Every log record received, in arrival order."""
        return [
            record
            for received in self.logs
            for resource_logs in received.request.resource_logs
            for scope_logs in resource_logs.scope_logs
            for record in scope_logs.log_records
        ]

    def _keep_logs(
        self, request: ExportLogsServiceRequest, headers: dict[str, str], raw: bytes
    ) -> None:
        with self._lock:
            self._logs.append(ReceivedLogs(request, headers, raw))

    async def wait_log_records(self, n: int, timeout_s: float = 10.0) -> list[LogRecord]:
        """Wait until at least ``n`` log records were accepted."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(records := self.log_records()) < n:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"expected {n} OTLP log records, got {len(records)}")
            await asyncio.sleep(0.01)
        return records

    def _count_attempt(self) -> None:
        with self._lock:
            self._attempts += 1

    def _keep(self, request: ExportMetricsServiceRequest, headers: dict[str, str]) -> None:
        with self._lock:
            self._received.append(Received(request, headers))

    async def wait_requests(
        self, n: int, timeout_s: float = 5.0
    ) -> list[ExportMetricsServiceRequest]:
        """Wait until at least ``n`` exports were accepted."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(requests := self.requests) < n:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"expected {n} OTLP exports, got {len(requests)}")
            await asyncio.sleep(0.01)
        return requests

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("receiver already started")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=type(self).__name__, daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            await self._on_own_loop(self._serve())
        except BaseException:
            await self.shutdown()
            raise

    async def shutdown(self) -> None:
        """Stop the server and its loop; safe without ``start`` and safe twice."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._stop(), loop))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join, 5.0)
            if not thread.is_alive():
                loop.close()

    async def _on_own_loop(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    @abstractmethod
    async def _serve(self) -> None:
        """Start listening; runs on the receiver's own loop."""

    @abstractmethod
    async def _stop(self) -> None:
        """Stop listening; runs on the receiver's own loop."""


# --------------------------------------------------------------------------- gRPC


class _MetricsService(MetricsServiceServicer):
    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    async def Export(  # the generated servicer's method name
        self, request: ExportMetricsServiceRequest, context: Any
    ) -> ExportMetricsServiceResponse:
        receiver = self._receiver
        receiver._count_attempt()
        if receiver.fail_with is not None:
            await context.abort(receiver.fail_with, "test collector refuses exports")
        metadata = context.invocation_metadata() or ()
        receiver._keep(request, {str(key).lower(): _text(value) for key, value in metadata})
        return ExportMetricsServiceResponse()


class _LogsService(LogsServiceServicer):
    """Log exports; refused like metric exports while ``fail_with`` is set."""

    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    async def Export(  # the generated servicer's method name
        self, request: ExportLogsServiceRequest, context: Any
    ) -> ExportLogsServiceResponse:
        receiver = self._receiver
        if receiver.fail_with is not None:
            await context.abort(receiver.fail_with, "test collector refuses exports")
        metadata = context.invocation_metadata() or ()
        headers = {str(key).lower(): _text(value) for key, value in metadata}
        receiver._keep_logs(request, headers, request.SerializeToString())
        return ExportLogsServiceResponse()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class GrpcReceiver(_Receiver):
    """``MetricsService/Export`` and ``LogsService/Export`` on 127.0.0.1, an ephemeral port;
    ``endpoint`` once started.

    ``fail_with`` (a ``grpc.StatusCode``, e.g. ``UNAVAILABLE``) refuses every export with that
    status; it may be changed while running.
    """

    def __init__(self, *, fail_with: Any = None) -> None:
        super().__init__()
        self.fail_with: Any = fail_with
        self._server: Any = None
        self._port: int | None = None

    @property
    def endpoint(self) -> str:
        """What ``OTLPSettings.endpoint`` takes: ``http://`` means a plaintext channel."""
        assert self._port is not None, "receiver not started"
        return f"http://127.0.0.1:{self._port}"

    async def _serve(self) -> None:
        server = grpc.aio.server()
        add_MetricsServiceServicer_to_server(_MetricsService(self), server)  # type: ignore[no-untyped-call]
        add_LogsServiceServicer_to_server(_LogsService(self), server)  # type: ignore[no-untyped-call]
        self._port = int(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        self._server = server

    async def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)


# --------------------------------------------------------------------------- HTTP


_DECODERS = {
    "": lambda body: body,
    "identity": lambda body: body,
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
}


class HttpReceiver(_Receiver):
    """``POST /v1/metrics`` and ``POST /v1/logs`` (``application/x-protobuf``, identity, gzip
    or deflate body) on 127.0.0.1, an ephemeral port. ``endpoint`` is the full metrics URL the
    exporter takes, ``logs_endpoint`` the logs one.

    ``fail_with`` (an HTTP status, e.g. 503) refuses every export with that status; it may be
    changed while running.
    """

    def __init__(self, *, fail_with: int | None = None) -> None:
        super().__init__()
        self.fail_with = fail_with
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def url(self) -> str:
        assert self._port is not None, "receiver not started"
        return f"http://127.0.0.1:{self._port}"

    @property
    def endpoint(self) -> str:
        return self.url + METRICS_PATH

    @property
    def logs_endpoint(self) -> str:
        return self.url + LOGS_PATH

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post(METRICS_PATH, self._export)
        app.router.add_post(LOGS_PATH, self._export_logs)
        # Decoding Content-Encoding here, not in aiohttp, is what shows gzip bodies are handled.
        runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await runner.setup()
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", 0))
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self._port = int(sock.getsockname()[1])
        self._runner = runner

    async def _stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _export(self, request: web.Request) -> web.Response:
        self._count_attempt()
        if self.fail_with is not None:
            return web.Response(status=self.fail_with, text="test collector refuses exports")
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"expected {PROTOBUF}")
        decode = _DECODERS.get(request.headers.get("Content-Encoding", "").strip().lower())
        if decode is None:
            return web.Response(status=415, text="unsupported Content-Encoding")
        try:
            message = ExportMetricsServiceRequest.FromString(decode(await request.read()))
        except (OSError, EOFError, zlib.error, DecodeError) as exc:
            return web.Response(status=400, text=f"undecodable body: {type(exc).__name__}")
        self._keep(message, {key.lower(): value for key, value in request.headers.items()})
        return web.Response(
            body=ExportMetricsServiceResponse().SerializeToString(), content_type=PROTOBUF
        )

    async def _export_logs(self, request: web.Request) -> web.Response:
        if self.fail_with is not None:
            return web.Response(status=self.fail_with, text="test collector refuses exports")
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"expected {PROTOBUF}")
        decode = _DECODERS.get(request.headers.get("Content-Encoding", "").strip().lower())
        if decode is None:
            return web.Response(status=415, text="unsupported Content-Encoding")
        try:
            raw = decode(await request.read())
            message = ExportLogsServiceRequest.FromString(raw)
        except (OSError, EOFError, zlib.error, DecodeError) as exc:
            return web.Response(status=400, text=f"undecodable body: {type(exc).__name__}")
        self._keep_logs(
            message, {key.lower(): value for key, value in request.headers.items()}, raw
        )
        return web.Response(
            body=ExportLogsServiceResponse().SerializeToString(), content_type=PROTOBUF
        )
