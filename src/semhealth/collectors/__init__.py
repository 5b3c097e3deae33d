"""Bytes -> frames -> events -> one ``StreamRecord`` per exchange. Sans-IO: no asyncio here.

Importing this package is cheap: only the configuration's types, ``Exchange`` and the
JSONPath check load with it, which is what the forwarding process needs (it reads the
configuration and hands exchanges to the tap); every other name is imported on first use
(PEP 562), so framing, the provider adapters, validity and jsonschema's validators load in
the analysis process only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from semhealth.collectors.config import (
    FRAMINGS,
    PROVIDERS,
    Analysis,
    Config,
    Extract,
    Limits,
    Route,
    default_config,
)
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.jsonpath import validate_jsonpath
from semhealth.common.lazy import on_first_use

if TYPE_CHECKING:
    from semhealth.collectors.adapters.registry import gen_ai_provider, operation_name, wire_format
    from semhealth.collectors.collector import StreamCollector, check_record, match_route
    from semhealth.collectors.continuity import intervals_s, measure_continuity, quantile
    from semhealth.collectors.eventstream import (
        EventStreamDecoder,
        event_message,
        exception_message,
    )
    from semhealth.collectors.frames import DecodeError, Decoder, Frame
    from semhealth.collectors.framing import detect_framing, make_decoder
    from semhealth.collectors.json_array import JSONArrayDecoder
    from semhealth.collectors.json_body import JSONBodyDecoder
    from semhealth.collectors.json_check import JSONChecker
    from semhealth.collectors.length_prefixed import LengthPrefixedDecoder
    from semhealth.collectors.ndjson import NDJSONDecoder
    from semhealth.collectors.record import (
        Continuity,
        RequestFacts,
        StreamRecord,
        StreamState,
        StructureRequest,
        ToolCall,
        TraceRef,
        Usage,
        ValidityResult,
    )
    from semhealth.collectors.request import extract_request, model_from_path
    from semhealth.collectors.sse import SSEDecoder
    from semhealth.collectors.validity import SchemaCache, check_output, validate_record

# Public names imported on first use, and the module each comes from.
_LAZY = {
    "gen_ai_provider": "adapters.registry",
    "operation_name": "adapters.registry",
    "wire_format": "adapters.registry",
    "StreamCollector": "collector",
    "check_record": "collector",
    "match_route": "collector",
    "intervals_s": "continuity",
    "measure_continuity": "continuity",
    "quantile": "continuity",
    "EventStreamDecoder": "eventstream",
    "event_message": "eventstream",
    "exception_message": "eventstream",
    "DecodeError": "frames",
    "Decoder": "frames",
    "Frame": "frames",
    "detect_framing": "framing",
    "make_decoder": "framing",
    "JSONArrayDecoder": "json_array",
    "JSONBodyDecoder": "json_body",
    "JSONChecker": "json_check",
    "LengthPrefixedDecoder": "length_prefixed",
    "NDJSONDecoder": "ndjson",
    "Continuity": "record",
    "RequestFacts": "record",
    "StreamRecord": "record",
    "StreamState": "record",
    "StructureRequest": "record",
    "ToolCall": "record",
    "TraceRef": "record",
    "Usage": "record",
    "ValidityResult": "record",
    "extract_request": "request",
    "model_from_path": "request",
    "SSEDecoder": "sse",
    "SchemaCache": "validity",
    "check_output": "validity",
    "validate_record": "validity",
}


__getattr__, __dir__ = on_first_use(globals(), _LAZY)


__all__ = [
    "FRAMINGS",
    "PROVIDERS",
    "Analysis",
    "Config",
    "Continuity",
    "DecodeError",
    "Decoder",
    "EventStreamDecoder",
    "Exchange",
    "Extract",
    "Frame",
    "JSONArrayDecoder",
    "JSONBodyDecoder",
    "JSONChecker",
    "LengthPrefixedDecoder",
    "Limits",
    "NDJSONDecoder",
    "RequestFacts",
    "Route",
    "SSEDecoder",
    "SchemaCache",
    "StreamCollector",
    "StreamRecord",
    "StreamState",
    "StructureRequest",
    "ToolCall",
    "TraceRef",
    "Usage",
    "ValidityResult",
    "check_output",
    "check_record",
    "default_config",
    "detect_framing",
    "event_message",
    "exception_message",
    "extract_request",
    "gen_ai_provider",
    "intervals_s",
    "make_decoder",
    "match_route",
    "measure_continuity",
    "model_from_path",
    "operation_name",
    "quantile",
    "validate_jsonpath",
    "validate_record",
    "wire_format",
]
