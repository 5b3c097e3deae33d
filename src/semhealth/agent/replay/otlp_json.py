"""One line of an OTLP JSON file (the Collector's file exporter: one export request per line)
-> the protobuf ``resource_spans`` or ``resource_logs`` the GenAI mapping reads.

The decoding is the OTLP receiver's own (``semhealth.agent.otlp.codec``: hex ids, unknown
fields ignored, errors that name fields but never quote values); this module only tells
which signal a line holds and refuses the ones replay cannot use (metrics, profiles).
"""

from __future__ import annotations

from typing import Any

import orjson

from semhealth.agent.otlp.codec import JSON, LOGS, TRACES, BadRequest, decode

# The signals replay cannot use, by their top-level key (OTLP JSON's, then protobuf's name).
_OTHER_SIGNALS = {
    "resourceMetrics": "metrics",
    "resource_metrics": "metrics",
    "resourceProfiles": "profiles",
    "resource_profiles": "profiles",
}


class OTLPJSONError(ValueError):
    """A line that is not an OTLP JSON traces or logs request; the message says why."""


def otlp_request(line: bytes) -> tuple[str, tuple[Any, ...]]:
    """("traces", resource_spans) or ("logs", resource_logs) of one OTLP JSON line."""
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise OTLPJSONError(f"not JSON (at character {exc.pos}): truncated?") from None
    if not isinstance(data, dict):
        raise OTLPJSONError("not a JSON object")
    for key, signal in _OTHER_SIGNALS.items():
        if key in data:
            raise OTLPJSONError(f"OTLP {signal} ({key}): replay reads traces and logs only")
    try:
        if "resourceSpans" in data or "resource_spans" in data:
            return "traces", tuple(decode(TRACES, line, JSON).resource_spans)
        if "resourceLogs" in data or "resource_logs" in data:
            return "logs", tuple(decode(LOGS, line, JSON).resource_logs)
    except BadRequest as exc:
        raise OTLPJSONError(str(exc)) from None
    raise OTLPJSONError("not an OTLP request (no resourceSpans or resourceLogs)")
