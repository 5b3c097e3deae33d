"""The OTLP receiver on loopback, driven by real clients: the OpenTelemetry SDK's own OTLP
exporters (gRPC and HTTP/protobuf, plain and gzip), raw gRPC calls and raw HTTP posts.

What it shows: every request reaches forwarding as the exporter's own bytes and analysis as
the same spans; limits are answered (413, RESOURCE_EXHAUSTED, partial success) and counted,
and the receiver keeps answering after each; bad bodies get a 400 that says what was wrong
without quoting the body; OTLP JSON (hex ids, lowerCamelCase) is read as OTLP says.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc  # type: ignore[import-untyped]
import pytest
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.rpc import code_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
    OTLPLogExporter as GrpcLogExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import (
    OTLPLogExporter as HttpLogExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.logs.v1.logs_pb2 import ResourceLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from semhealth.agent.otlp.codec import Signal
from semhealth.agent.otlp.receiver import Receiver, ReceiverSettings
from tests.servers import free_port

SECRET = "the user's private question about their bank account"
TRACE_SERVICE = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# -- what the receiver feeds ------------------------------------------------------------------


@dataclass
class Analysis:
    """A downstream that keeps what it is handed (the GenAI mapping's interface)."""

    spans: list[ResourceSpans] = field(default_factory=list)
    logs: list[ResourceLogs] = field(default_factory=list)
    flushes: int = 0
    closed: bool = False
    reject: int = 0  # spans to report as shed per call
    fail: bool = False

    def add_spans(self, resource_spans: Sequence[ResourceSpans]) -> int:
        if self.fail:
            raise RuntimeError("mapping bug")
        self.spans += list(resource_spans)
        return self.reject

    def add_logs(self, resource_logs: Sequence[ResourceLogs]) -> int:
        self.logs += list(resource_logs)
        return 0

    def flush(self) -> int:
        self.flushes += 1
        return 0

    def close(self) -> int:
        self.closed = True
        return 0

    def span_names(self) -> list[str]:
        return [s.name for rs in self.spans for ss in rs.scope_spans for s in ss.spans]


@dataclass
class Running:
    receiver: Receiver
    analysis: Analysis
    forwarded: list[tuple[str, bytes]]

    @property
    def grpc(self) -> str:
        assert self.receiver.grpc_address is not None
        return f"127.0.0.1:{self.receiver.grpc_address[1]}"

    @property
    def http(self) -> str:
        assert self.receiver.http_address is not None
        return f"http://127.0.0.1:{self.receiver.http_address[1]}"

    async def analysed(self, n: int) -> list[str]:
        for _ in range(500):
            if len(self.analysis.span_names()) >= n:
                break
            await asyncio.sleep(0.01)
        return self.analysis.span_names()


@asynccontextmanager
async def receiving(**settings: Any) -> AsyncIterator[Running]:
    analysis = Analysis()
    forwarded: list[tuple[str, bytes]] = []

    def forward(signal: Signal, body: bytes) -> None:
        forwarded.append((signal.name, body))

    defaults: dict[str, Any] = {
        "grpc_listen": ("127.0.0.1", 0),
        "http_listen": ("127.0.0.1", 0),
        "flush_interval_s": 0.05,
    }
    receiver = Receiver(
        ReceiverSettings(**{**defaults, **settings}), analysis=analysis, forward=forward
    )
    await receiver.start()
    try:
        yield Running(receiver, analysis, forwarded)
    finally:
        await receiver.shutdown()


# -- real telemetry -----------------------------------------------------------------------------


def make_spans(n: int, *, content: str = "hello") -> list[ReadableSpan]:
    """``n`` finished GenAI-looking spans from the SDK, in one trace."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "rag-app"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("invoke_agent"):
        for i in range(n):
            attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": content}]}]
                ),
            }
            with tracer.start_as_current_span(f"chat {i}", attributes=attributes):
                pass
    provider.shutdown()
    return [span for span in memory.get_finished_spans() if span.name != "invoke_agent"]


def make_logs(n: int) -> list[ReadableLogRecord]:
    memory = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]
    provider = LoggerProvider(resource=Resource.create({"service.name": "rag-app"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("test")
    for i in range(n):
        logger.emit(body=f"event {i}", attributes={"event.name": "gen_ai.choice"})
    provider.shutdown()
    return list(memory.get_finished_logs())


def spans_bytes(spans: Sequence[ReadableSpan]) -> bytes:
    """What an SDK exporter sends for ``spans``: its own encoder's bytes."""
    return bytes(encode_spans(spans).SerializeToString())


async def export_spans(exporter: Any, spans: Sequence[Any]) -> Any:
    # The SDK's export is a blocking call; the receiver answers on this loop meanwhile.
    try:
        return await asyncio.to_thread(exporter.export, spans)
    finally:
        await asyncio.to_thread(exporter.shutdown)


def raw_grpc(target: str) -> Any:
    return grpc.aio.insecure_channel(target)


async def grpc_call(target: str, body: bytes) -> ExportTraceServiceResponse:
    async with raw_grpc(target) as channel:
        call = channel.unary_unary(TRACE_SERVICE)
        response: ExportTraceServiceResponse = ExportTraceServiceResponse.FromString(
            await call(body, timeout=10)
        )
        return response


async def post(
    url: str, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes, str]:
    async with aiohttp.ClientSession(auto_decompress=False) as client:
        async with client.post(
            url, data=body, headers={"Content-Type": content_type, **(headers or {})}
        ) as response:
            return response.status, await response.read(), response.content_type


def otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """``spans`` in OTLP JSON as a collector's file exporter writes it: hex ids."""
    document: dict[str, Any] = json_format.MessageToDict(encode_spans(spans))
    for rs in document["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _b64_to_hex(span[key])
    return document


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


# -- the SDK's exporters ------------------------------------------------------------------------


async def test_sdk_grpc_exporter_spans_are_forwarded_as_sent_and_analysed() -> None:
    spans = make_spans(5)
    async with receiving() as running:
        exporter = GrpcSpanExporter(endpoint=running.grpc, insecure=True)
        assert await export_spans(exporter, spans) is SpanExportResult.SUCCESS
        assert running.forwarded == [("traces", spans_bytes(spans))]
        assert await running.analysed(5) == [f"chat {i}" for i in range(5)]
        assert running.receiver.stats.received == {"traces": 5}
        assert running.receiver.stats.requests == {"traces": 1}


async def test_sdk_grpc_exporter_with_gzip_is_forwarded_decompressed() -> None:
    spans = make_spans(3)
    async with receiving() as running:
        exporter = GrpcSpanExporter(
            endpoint=running.grpc, insecure=True, compression=grpc.Compression.Gzip
        )
        assert await export_spans(exporter, spans) is SpanExportResult.SUCCESS
        assert running.forwarded == [("traces", spans_bytes(spans))]


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
async def test_sdk_http_exporter_spans_are_forwarded_as_sent_and_analysed(
    compression: Compression,
) -> None:
    spans = make_spans(4)
    async with receiving() as running:
        exporter = HttpSpanExporter(endpoint=running.http + "/v1/traces", compression=compression)
        assert await export_spans(exporter, spans) is SpanExportResult.SUCCESS
        assert running.forwarded == [("traces", spans_bytes(spans))]
        assert await running.analysed(4) == [f"chat {i}" for i in range(4)]


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_sdk_log_exporters_reach_forwarding_and_analysis(transport: str) -> None:
    logs = make_logs(3)
    async with receiving() as running:
        exporter: Any = (
            GrpcLogExporter(endpoint=running.grpc, insecure=True)
            if transport == "grpc"
            else HttpLogExporter(endpoint=running.http + "/v1/logs")
        )
        await export_spans(exporter, logs)
        assert running.forwarded == [("logs", bytes(encode_logs(logs).SerializeToString()))]
        for _ in range(500):
            if running.analysis.logs:
                break
            await asyncio.sleep(0.01)
        (resource,) = running.analysis.logs
        bodies = [r.body.string_value for s in resource.scope_logs for r in s.log_records]
        assert bodies == ["event 0", "event 1", "event 2"]
        assert running.receiver.stats.received == {"logs": 3}


async def test_metrics_are_forwarded_but_not_analysed() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("test").create_counter("requests")
    counter.add(3, {"route": "chat"})
    counter.add(1, {"route": "rag"})
    data = reader.get_metrics_data()
    assert data is not None
    async with receiving() as running:
        exporter = HttpMetricExporter(endpoint=running.http + "/v1/metrics")
        await asyncio.to_thread(exporter.export, data)
        await asyncio.to_thread(exporter.shutdown)
        assert [signal for signal, _ in running.forwarded] == ["metrics"]
        assert running.receiver.stats.received == {"metrics": 2}  # data points
        await asyncio.sleep(0.1)
        assert running.analysis.spans == [] and running.analysis.logs == []
    provider.shutdown()


# -- OTLP JSON ----------------------------------------------------------------------------------


async def test_otlp_json_is_read_with_hex_ids_and_forwarded_as_protobuf() -> None:
    spans = make_spans(2)
    document = otlp_json(spans)
    async with receiving() as running:
        status, body, content_type = await post(
            running.http + "/v1/traces", json.dumps(document).encode(), "application/json"
        )
        assert (status, content_type) == (200, "application/json")
        assert json.loads(body) == {}  # a full success, in JSON as the request was
        ((signal, forwarded),) = running.forwarded
        assert signal == "traces"
        request = ExportTraceServiceRequest.FromString(forwarded)
        assert request == encode_spans(spans)  # the ids are the spans' own, not base64 of hex
        got = request.resource_spans[0].scope_spans[0].spans[0]
        assert got.trace_id.hex() == f"{spans[0].context.trace_id:032x}"
        assert await running.analysed(2) == ["chat 0", "chat 1"]


async def test_gzipped_otlp_json_is_read() -> None:
    spans = make_spans(1)
    body = gzip.compress(json.dumps(otlp_json(spans)).encode())
    async with receiving() as running:
        status, _, _ = await post(
            running.http + "/v1/traces", body, "application/json", {"Content-Encoding": "gzip"}
        )
        assert status == 200
        assert ExportTraceServiceRequest.FromString(running.forwarded[0][1]) == encode_spans(spans)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"resourceSpans": [', "the body is not valid JSON (at byte "),
        (b"[1, 2]", "the body must be a JSON object"),
        (
            json.dumps(
                {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": SECRET}]}]}]}
            ).encode(),
            "resourceSpans[0].scopeSpans[0].spans[0].traceId is not a hex string",
        ),
        (
            json.dumps(
                {"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": SECRET}]}]}]}
            ).encode(),
            "the body is not OTLP JSON for traces: resourceSpans.scopeSpans.spans"
            ".startTimeUnixNano has a value of the wrong type or form",
        ),
    ],
)
async def test_bad_json_is_a_400_that_names_the_problem_without_quoting_it(
    body: bytes, expected: str
) -> None:
    async with receiving() as running:
        status, answer, content_type = await post(
            running.http + "/v1/traces", body, "application/json"
        )
        assert (status, content_type) == (400, "application/json")
        assert json.loads(answer)["code"] == code_pb2.INVALID_ARGUMENT
        message = json.loads(answer)["message"]
        assert message.startswith(expected)
        assert SECRET not in message and "bank" not in message
        assert running.receiver.stats.rejected == {("traces", "malformed"): 1}
        assert running.forwarded == []
        # ... and the receiver keeps answering.
        ok, _, _ = await post(running.http + "/v1/traces", spans_bytes(make_spans(1)), PROTOBUF)
        assert ok == 200


# -- bad protobuf -------------------------------------------------------------------------------

PROTOBUF = "application/x-protobuf"
NOT_PROTOBUF = b"\x0a\xff\xff\xff\xff\x0f" + SECRET.encode()


async def test_bad_protobuf_over_http_is_a_400_with_a_plain_message() -> None:
    async with receiving() as running:
        status, body, content_type = await post(running.http + "/v1/traces", NOT_PROTOBUF, PROTOBUF)
        assert (status, content_type) == (400, PROTOBUF)
        refusal = status_pb2.Status.FromString(body)
        assert refusal.code == code_pb2.INVALID_ARGUMENT
        message = refusal.message
        assert message == (
            "the body is not a valid OTLP traces protobuf (ExportTraceServiceRequest,"
            f" {len(NOT_PROTOBUF)} bytes)"
        )
        assert running.receiver.stats.rejected == {("traces", "malformed"): 1}


async def test_bad_protobuf_over_grpc_is_invalid_argument() -> None:
    async with receiving() as running:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await grpc_call(running.grpc, NOT_PROTOBUF)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid OTLP traces protobuf" in refused.value.details()
        assert SECRET not in refused.value.details()
        assert running.receiver.stats.rejected == {("traces", "malformed"): 1}
        response = await grpc_call(running.grpc, spans_bytes(make_spans(1)))
        assert not response.HasField("partial_success")


async def test_an_unsupported_content_type_is_a_plain_415_counted_as_unsupported() -> None:
    # The Collector's receiver answers this in text/plain too: a client that sent another
    # media type could not read a Status in either of OTLP's encodings.
    async with receiving() as running:
        status, body, content_type = await post(
            running.http + "/v1/traces", b"\x00\x01binary", "text/plain"
        )
        assert (status, content_type) == (415, "text/plain")
        assert body.decode().startswith("Content-Type must be application/x-protobuf")
        assert running.receiver.stats.rejected == {("traces", "unsupported"): 1}


@pytest.mark.parametrize(
    ("encoding", "status", "code", "reason", "text"),
    [
        # gRPC answers a compression it does not know with UNIMPLEMENTED.
        ("br", 415, code_pb2.UNIMPLEMENTED, "unsupported", "'br' is not supported"),
        ("gzip", 400, code_pb2.INVALID_ARGUMENT, "malformed", "not valid gzip data"),
    ],
)
async def test_unsupported_or_corrupt_encodings_are_refused_with_their_reason_and_code(
    encoding: str, status: int, code: int, reason: str, text: str
) -> None:
    async with receiving() as running:
        answered, body, content_type = await post(
            running.http + "/v1/traces",
            b"\x00\x01binary",
            PROTOBUF,
            {"Content-Encoding": encoding},
        )
        assert (answered, content_type) == (status, PROTOBUF)
        refusal = status_pb2.Status.FromString(body)
        assert refusal.code == code
        assert text in refusal.message
        assert running.receiver.stats.rejected == {("traces", reason): 1}


# -- limits ------------------------------------------------------------------------------------


async def test_oversized_http_body_is_a_413_and_counted() -> None:
    big = spans_bytes(make_spans(3, content="x" * 5000))
    async with receiving(max_message_bytes=4096) as running:
        status, body, _ = await post(running.http + "/v1/traces", big, PROTOBUF)
        assert status == 413
        refusal = status_pb2.Status.FromString(body)
        # What gRPC answers a message past its limit, and not retryable without RetryInfo.
        assert refusal.code == code_pb2.RESOURCE_EXHAUSTED
        assert refusal.message == "the body is larger than max_message_bytes (4096 bytes)"
        # A small body compressing a large one is measured after decompression.
        status, body, _ = await post(
            running.http + "/v1/traces",
            gzip.compress(big),
            PROTOBUF,
            {"Content-Encoding": "gzip"},
        )
        assert len(gzip.compress(big)) < 4096 and status == 413
        refusal = status_pb2.Status.FromString(body)
        assert refusal.code == code_pb2.RESOURCE_EXHAUSTED
        assert "inflates past max_message_bytes" in refusal.message
        assert running.receiver.stats.rejected == {("traces", "too_large"): 2}
        assert running.forwarded == []
        ok, _, _ = await post(running.http + "/v1/traces", spans_bytes(make_spans(1)), PROTOBUF)
        assert ok == 200


async def test_oversized_grpc_message_is_resource_exhausted_and_counted() -> None:
    big = spans_bytes(make_spans(3, content="x" * 5000))
    async with receiving(max_message_bytes=4096) as running:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await grpc_call(running.grpc, big)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert running.receiver.stats.rejected == {("traces", "too_large"): 1}
        # The SDK's exporter gets the same answer; its channel retries it a few times, each
        # attempt refused and counted.
        exporter = GrpcSpanExporter(endpoint=running.grpc, insecure=True, retryable_error_codes=())
        result = await export_spans(exporter, make_spans(3, content="x" * 5000))
        assert result is SpanExportResult.FAILURE
        assert running.receiver.stats.rejected[("traces", "too_large")] >= 2
        assert running.forwarded == []


async def test_too_many_spans_is_a_partial_success_naming_the_limit() -> None:
    spans = make_spans(6)
    async with receiving(max_items_per_request=5) as running:
        response = await grpc_call(running.grpc, spans_bytes(spans))
        assert response.partial_success.rejected_spans == 6
        assert response.partial_success.error_message == (
            "the request holds 6 spans, more than max_spans_per_request (5); send smaller batches"
        )
        status, body, _ = await post(
            running.http + "/v1/traces", json.dumps(otlp_json(spans)).encode(), "application/json"
        )
        assert status == 200
        assert json.loads(body)["partialSuccess"]["rejectedSpans"] in ("6", 6)
        assert running.receiver.stats.rejected == {("traces", "too_many_items"): 2}
        assert running.forwarded == [] and running.receiver.stats.received == {}
        # Five is within the limit.
        response = await grpc_call(running.grpc, spans_bytes(spans[:5]))
        assert not response.HasField("partial_success")
        assert await running.analysed(5) == [f"chat {i}" for i in range(5)]


async def test_too_many_log_records_is_a_partial_success() -> None:
    logs = make_logs(4)
    request = encode_logs(logs)
    async with receiving(max_items_per_request=3) as running:
        status, body, _ = await post(
            running.http + "/v1/logs", request.SerializeToString(), PROTOBUF
        )
        assert status == 200
        partial = ExportLogsServiceResponse.FromString(body).partial_success
        assert partial.rejected_log_records == 4
        assert "4 log records" in partial.error_message
        assert running.receiver.stats.rejected == {("logs", "too_many_items"): 1}
        assert running.forwarded == [] and running.receiver.stats.received == {}


async def test_a_full_analysis_queue_sheds_analysis_but_still_forwards_and_answers() -> None:
    # OTLP's partial success is for items the server rejected. These are accepted and
    # forwarded; only semhealth's own analysis of them is shed, so the answer is a full success.
    spans = make_spans(3)
    async with receiving(max_queue_bytes=16) as running:  # smaller than any request
        response = await grpc_call(running.grpc, spans_bytes(spans))
        assert not response.HasField("partial_success")
        status, body, _ = await post(running.http + "/v1/traces", spans_bytes(spans), PROTOBUF)
        assert status == 200
        assert not ExportTraceServiceResponse.FromString(body).HasField("partial_success")
        assert running.forwarded == [("traces", spans_bytes(spans))] * 2
        assert running.receiver.stats.shed == {("traces", "queue_full"): 6}
        assert running.receiver.stats.rejected == {}
        await asyncio.sleep(0.1)
        assert running.analysis.spans == []


async def test_spans_the_mapping_sheds_or_fails_on_are_counted_and_it_keeps_going() -> None:
    async with receiving() as running:
        running.analysis.reject = 2
        await grpc_call(running.grpc, spans_bytes(make_spans(2)))
        await running.analysed(2)
        running.analysis.fail = True
        await grpc_call(running.grpc, spans_bytes(make_spans(3)))
        for _ in range(500):
            if ("traces", "error") in running.receiver.stats.shed:
                break
            await asyncio.sleep(0.01)
        running.analysis.fail = False
        await grpc_call(running.grpc, spans_bytes(make_spans(1)))
        assert len(await running.analysed(3)) == 3
        assert running.receiver.stats.shed == {
            ("traces", "pending_full"): 4,
            ("traces", "error"): 3,
        }
        assert running.receiver.stats.received == {"traces": 6}


# -- lifecycle ---------------------------------------------------------------------------------


async def test_shutdown_analyses_what_is_queued_then_closes_the_analysis() -> None:
    analysis = Analysis()
    receiver = Receiver(
        ReceiverSettings(grpc_listen=("127.0.0.1", 0), flush_interval_s=0.05), analysis=analysis
    )
    await receiver.start()
    assert receiver.grpc_address is not None
    await grpc_call(f"127.0.0.1:{receiver.grpc_address[1]}", spans_bytes(make_spans(2)))
    await receiver.shutdown()
    assert analysis.span_names() == ["chat 0", "chat 1"]
    assert analysis.closed
    assert receiver.stats.queue_bytes == 0


async def test_the_analysis_is_flushed_every_interval_until_shutdown() -> None:
    analysis = Analysis()
    receiver = Receiver(
        ReceiverSettings(grpc_listen=("127.0.0.1", 0), flush_interval_s=0.01), analysis=analysis
    )
    await receiver.start()
    for _ in range(500):
        if analysis.flushes >= 3:
            break
        await asyncio.sleep(0.01)
    assert analysis.flushes >= 3  # traces waiting for their last span are checked again
    await receiver.shutdown()
    flushed = analysis.flushes
    await asyncio.sleep(0.1)  # ten intervals: a flush task left running would have run
    assert analysis.flushes == flushed


async def test_lifecycle_shutdown_without_start_twice_and_a_fresh_instance() -> None:
    settings = ReceiverSettings(grpc_listen=("127.0.0.1", free_port()), http_listen=None)
    never = Receiver(settings, analysis=Analysis())
    await never.shutdown()
    await never.shutdown()
    first = Receiver(settings, analysis=Analysis())
    await first.start()
    await first.shutdown()
    await first.shutdown()
    second = Receiver(settings, analysis=Analysis())  # the same port, free again
    await second.start()
    assert second.grpc_address == settings.grpc_listen
    await second.shutdown()


async def test_a_port_in_use_fails_start_and_closes_what_started() -> None:
    async with receiving() as running:
        assert running.receiver.http_address is not None
        taken = running.receiver.http_address[1]
        grpc_port = free_port()
        clash = Receiver(
            ReceiverSettings(grpc_listen=("127.0.0.1", grpc_port), http_listen=("127.0.0.1", taken))
        )
        with pytest.raises(OSError, match=f"cannot listen for OTLP/HTTP on 127.0.0.1:{taken}"):
            await clash.start()
        # Its gRPC listener was closed again: the port can be taken.
        again = Receiver(ReceiverSettings(grpc_listen=("127.0.0.1", grpc_port)))
        await again.start()
        await again.shutdown()
        gtaken = int(running.grpc.rsplit(":", 1)[1])
        with pytest.raises(OSError, match="cannot listen for OTLP/gRPC"):
            await Receiver(ReceiverSettings(grpc_listen=("127.0.0.1", gtaken))).start()
