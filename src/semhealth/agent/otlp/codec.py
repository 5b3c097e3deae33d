"""OTLP export requests on the wire: the three signals, their bodies and their answers.

One ``Signal`` per OTLP service (traces, logs, metrics) names its HTTP path, its gRPC
method and its protobuf messages. ``decode`` turns a body (protobuf, or OTLP JSON with its
hex ids and lowerCamelCase names) into the request message; ``BadRequest`` says what was
wrong in words that never quote the body, since a body holds prompts and answers.
``answer`` builds the export response, with OTLP partial success when items were refused.
"""

from __future__ import annotations

import base64
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError, Message  # type: ignore[import-untyped]
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_service
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_service
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_service

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# OTLP JSON writes these bytes fields as hex, where protobuf's JSON mapping expects base64
# (OTLP spec, "JSON Protobuf Encoding"). Both spellings of the names are accepted, as
# protobuf's JSON parser accepts both.
_HEX_IDS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
_FIELD = re.compile(r"Failed to parse (\w+) field")


class BadRequest(ValueError):
    """A body that is not an export request; the message names the problem, never content."""


@dataclass(frozen=True, slots=True)
class Signal:
    """One OTLP service: what it is called, where it listens and what it carries."""

    name: str  # traces | logs | metrics: the label value
    path: str  # OTLP/HTTP path
    service: str  # full gRPC service name
    request: type[Message]
    response: type[Message]
    partial: type[Message]  # the response's partial_success message
    rejected_field: str  # partial_success's count of refused items
    count: Callable[[Any], int]  # items in a request: spans, log records, data points

    @property
    def grpc_method(self) -> str:
        return f"/{self.service}/Export"

    def items(self, request: Message) -> int:
        return self.count(request)


def _spans(request: Any) -> int:
    return sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)


def _log_records(request: Any) -> int:
    return sum(len(scope.log_records) for rl in request.resource_logs for scope in rl.scope_logs)


def _data_points(request: Any) -> int:
    total = 0
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    total += len(getattr(metric, kind).data_points)
    return total


def _service(module: Any, name: str) -> str:
    return str(module.DESCRIPTOR.services_by_name[name].full_name)


TRACES = Signal(
    name="traces",
    path="/v1/traces",
    service=_service(trace_service, "TraceService"),
    request=trace_service.ExportTraceServiceRequest,
    response=trace_service.ExportTraceServiceResponse,
    partial=trace_service.ExportTracePartialSuccess,
    rejected_field="rejected_spans",
    count=_spans,
)
LOGS = Signal(
    name="logs",
    path="/v1/logs",
    service=_service(logs_service, "LogsService"),
    request=logs_service.ExportLogsServiceRequest,
    response=logs_service.ExportLogsServiceResponse,
    partial=logs_service.ExportLogsPartialSuccess,
    rejected_field="rejected_log_records",
    count=_log_records,
)
METRICS = Signal(
    name="metrics",
    path="/v1/metrics",
    service=_service(metrics_service, "MetricsService"),
    request=metrics_service.ExportMetricsServiceRequest,
    response=metrics_service.ExportMetricsServiceResponse,
    partial=metrics_service.ExportMetricsPartialSuccess,
    rejected_field="rejected_data_points",
    count=_data_points,
)
SIGNALS = (TRACES, LOGS, METRICS)


# -- bodies ---------------------------------------------------------------------------------


def decode(signal: Signal, body: bytes, content_type: str) -> Message:
    """The export request in ``body``; raises ``BadRequest``."""
    if content_type == JSON:
        return _from_json(signal, body)
    try:
        return signal.request.FromString(body)
    except DecodeError:
        raise BadRequest(
            f"the body is not a valid OTLP {signal.name} protobuf"
            f" ({signal.request.DESCRIPTOR.name}, {len(body)} bytes)"
        ) from None


def _from_json(signal: Signal, body: bytes) -> Message:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON (at byte {exc.pos})") from None
    if not isinstance(document, dict):
        raise BadRequest(f"the body must be a JSON object, an OTLP {signal.name} export request")
    _hex_to_base64(document, "")
    try:
        # OTLP asks receivers to ignore fields they do not know (newer senders).
        return json_format.ParseDict(document, signal.request(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        # The parser's message may quote the value; only the field names are kept.
        where = ".".join(_FIELD.findall(str(exc))) or "(the top level)"
        raise BadRequest(
            f"the body is not OTLP JSON for {signal.name}: {where} has a value of the wrong"
            " type or form"
        ) from None


def _hex_to_base64(node: Any, path: str) -> None:
    """Rewrite OTLP JSON's hex ids in place as the base64 protobuf's JSON parser reads."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            _hex_to_base64(item, f"{path}[{index}]")
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        where = f"{path}.{key}" if path else key
        if key in _HEX_IDS and isinstance(value, str):
            try:
                node[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            except ValueError:
                raise BadRequest(f"{where} is not a hex string (OTLP JSON ids are hex)") from None
        elif isinstance(value, dict | list):
            _hex_to_base64(value, where)


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded per ``Content-Encoding`` (identity, gzip or deflate), never past
    ``limit`` bytes: ``TooLarge`` past it, ``BadRequest`` for a corrupt or unknown one."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedEncoding(f"Content-Encoding {encoding!r} is not supported")
    # wbits: 16+ reads a gzip header; 32+ detects zlib or gzip, as browsers do for deflate.
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else 32 + zlib.MAX_WBITS)
    try:
        out = decoder.decompress(body, limit + 1)
        if len(out) > limit or decoder.unconsumed_tail:
            raise TooLarge(f"the body inflates past max_message_bytes ({limit} bytes)")
        out += decoder.flush()
    except zlib.error:
        raise BadRequest(f"the body is not valid {encoding} data") from None
    if len(out) > limit:
        raise TooLarge(f"the body inflates past max_message_bytes ({limit} bytes)")
    if not decoder.eof:
        raise BadRequest(f"the {encoding} body is truncated")
    return out


class TooLarge(ValueError):
    """A body past the message size limit."""


class UnsupportedEncoding(ValueError):
    """A Content-Encoding the receiver does not decode."""


# -- answers --------------------------------------------------------------------------------


def answer(signal: Signal, rejected: int = 0, message: str = "") -> Message:
    """The export response; ``rejected`` items refused make it a partial success."""
    response = signal.response()
    if rejected or message:
        partial = signal.partial(**{signal.rejected_field: rejected, "error_message": message})
        response.partial_success.CopyFrom(partial)
    return response


def encode(message: Message, content_type: str) -> bytes:
    """``message`` in the request's own encoding, as OTLP/HTTP answers."""
    if content_type == JSON:
        return str(json_format.MessageToJson(message, indent=None)).encode()
    return bytes(message.SerializeToString())


def status(code: int, message: str, content_type: str) -> bytes:
    """An OTLP/HTTP error body: a ``google.rpc.Status`` whose message says what was wrong."""
    return encode(status_pb2.Status(code=code, message=message), content_type)
