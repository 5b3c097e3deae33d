"""Bytes -> frames -> events -> one ``StreamRecord`` per exchange. Sans-IO: no asyncio here."""

from semhealth.collectors.adapters.registry import gen_ai_provider, operation_name, wire_format
from semhealth.collectors.collector import Exchange, StreamCollector, check_record, match_route
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
from semhealth.collectors.continuity import intervals_s, measure_continuity, quantile
from semhealth.collectors.eventstream import EventStreamDecoder, event_message, exception_message
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
from semhealth.collectors.request import extract_request, model_from_path, validate_jsonpath
from semhealth.collectors.sse import SSEDecoder
from semhealth.collectors.validity import SchemaCache, check_output, validate_record

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
