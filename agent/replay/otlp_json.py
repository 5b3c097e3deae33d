"""OTLP JSON (the Collector's file exporter, OTLP/HTTP's JSON encoding) -> protobuf.

OTLP JSON is the protobuf JSON mapping with two differences the generic parser does not
know: trace and span ids are hex strings (not base64), and enum fields may be integers
(which it accepts). So ids are rewritten to base64 first, then ``json_format`` parses the
object into an ``ExportTraceServiceRequest`` or ``ExportLogsServiceRequest``; unknown fields
are ignored, as OTLP receivers must.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
_OTHER_SIGNALS = {"resourceMetrics": "metrics", "resourceProfiles": "profiles"}


class OTLPJSONError(ValueError):
    """A line that is not an OTLP JSON traces or logs request; the message says why."""


def otlp_request(line: bytes) -> tuple[str, tuple[Any, ...]]:
    """("traces", resource_spans) or ("logs", resource_logs) of one OTLP JSON line."""
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise OTLPJSONError(f"not JSON ({exc}): truncated?") from None
    if not isinstance(data, dict):
        raise OTLPJSONError("not a JSON object")
    for key, signal in _OTHER_SIGNALS.items():
        if key in data:
            raise OTLPJSONError(f"OTLP {signal} ({key}): replay reads traces and logs only")
    if "resourceSpans" in data or "resource_spans" in data:
        traces = ExportTraceServiceRequest()
        _parse(data, traces)
        return "traces", tuple(traces.resource_spans)
    if "resourceLogs" in data or "resource_logs" in data:
        logs = ExportLogsServiceRequest()
        _parse(data, logs)
        return "logs", tuple(logs.resource_logs)
    raise OTLPJSONError("not an OTLP request (no resourceSpans or resourceLogs)")


def _parse(data: dict[str, Any], message: Any) -> None:
    try:
        json_format.ParseDict(_ids_to_base64(data), message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError) as exc:
        raise OTLPJSONError(f"not valid OTLP JSON: {exc}") from None


def _ids_to_base64(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: _id(item) if key in _ID_KEYS and isinstance(item, str) else _ids_to_base64(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_ids_to_base64(item) for item in value]
    return value


def _id(text: str) -> str:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise OTLPJSONError(f"id {text[:40]!r} is not hex") from None
    return base64.b64encode(raw).decode("ascii")
