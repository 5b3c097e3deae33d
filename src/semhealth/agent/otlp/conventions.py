"""GenAI telemetry names, and OTLP attribute values read into plain Python values.

The names are those of the OpenTelemetry GenAI semantic conventions (now kept in
``open-telemetry/semantic-conventions-genai``) and of the instrumentations that predate or
extend them (OpenLLMetry, OpenLIT, OpenInference). ``plain`` turns an OTLP ``AnyValue``
into str/bool/int/float/bytes/list/dict, bounded in depth so that a hostile nesting cannot
exhaust the stack; what it cannot read it reports as a reason, never as an exception.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

# --- current conventions (span attributes; the same on the operation-details event) --------
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"  # the older name of gen_ai.provider.name
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
OUTPUT_TYPE = "gen_ai.output.type"
REQUEST_STREAM = "gen_ai.request.stream"
# util-genai: seconds from the operation's start to the first chunk of a streamed response.
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
ERROR_TYPE = "error.type"
HTTP_STATUS = "http.response.status_code"
RETRIEVAL_DOCUMENTS = "gen_ai.retrieval.documents"

# Operations whose span is one model call: the ones a StreamRecord describes.
INFERENCE_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
RETRIEVAL_OPERATION = "retrieval"

# --- events (log records with event_name, or span events) ----------------------------------
OPERATION_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
CHOICE_EVENT = "gen_ai.choice"

# --- OpenLLMetry (traceloop) ---------------------------------------------------------------
PROMPT_PREFIX = "gen_ai.prompt."  # gen_ai.prompt.N.role / .content / .tool_calls.M.*
COMPLETION_PREFIX = "gen_ai.completion."  # gen_ai.completion.N.role / .content / ...
FUNCTIONS_PREFIX = "llm.request.functions."  # llm.request.functions.N.name / .parameters
LLM_REQUEST_TYPE = "llm.request.type"  # chat | completion | embedding | rerank
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
STRUCTURED_OUTPUT_SCHEMA = "gen_ai.request.structured_output_schema"
IS_STREAMING = ("gen_ai.is_streaming", "llm.is_streaming")
# One span event per chunk the SDK yielded, with no attributes: its time is the arrival.
COMPLETION_CHUNK_EVENT = "gen_ai.content.completion.chunk"
TRACELOOP_SPAN_KIND = "traceloop.span.kind"
TRACELOOP_ENTITY_OUTPUT = "traceloop.entity.output"
DB_QUERY_RESULT_EVENT = "db.query.result"  # vector DB instrumentations: one event per result
DB_QUERY_RESULT_DOCUMENT = "db.query.result.document"

# --- OpenLIT --------------------------------------------------------------------------------
OPENLIT_PROMPT = "gen_ai.prompt"  # "role: content" lines
OPENLIT_COMPLETION = "gen_ai.completion"  # the answer's text
OPENLIT_PROMPT_EVENT = "gen_ai.content.prompt"
OPENLIT_COMPLETION_EVENT = "gen_ai.content.completion"
OPENLIT_IS_STREAM = "gen_ai.request.is_stream"
# Seconds from the call to the first chunk, whatever the chunk held.
OPENLIT_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"

# --- older OpenAI attributes ------------------------------------------------------------------
OPENAI_RESPONSE_FORMAT = "gen_ai.openai.request.response_format"

# --- OpenInference (Arize Phoenix) retriever spans --------------------------------------------
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
OPENINFERENCE_DOCUMENTS_PREFIX = "retrieval.documents."  # .N.document.content

# Attributes whose value is message text: larger than max_message_bytes, they are not read.
MESSAGE_ATTRIBUTES = frozenset(
    {
        INPUT_MESSAGES,
        OUTPUT_MESSAGES,
        SYSTEM_INSTRUCTIONS,
        OPENLIT_PROMPT,
        OPENLIT_COMPLETION,
        RETRIEVAL_DOCUMENTS,
        TRACELOOP_ENTITY_OUTPUT,
    }
)

MAX_DEPTH = 16  # nesting of kvlists/arrays read; deeper values are "too_deep"


@dataclass(slots=True)
class Problems:
    """What could not be read, by reason; the caller adds them to its stats."""

    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


def plain(value: AnyValue, problems: Problems, depth: int = 0) -> Any:
    """``value`` as a Python value; None when it is empty or too deeply nested."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "kvlist_value":
        if depth >= MAX_DEPTH:
            problems.add("too_deep")
            return None
        return {kv.key: plain(kv.value, problems, depth + 1) for kv in value.kvlist_value.values}
    if kind == "array_value":
        if depth >= MAX_DEPTH:
            problems.add("too_deep")
            return None
        return [plain(v, problems, depth + 1) for v in value.array_value.values]
    return getattr(value, kind)


def attribute_map(
    attributes: Iterable[KeyValue], problems: Problems, *, max_message_bytes: int
) -> dict[str, Any]:
    """Attributes by key. A message attribute over ``max_message_bytes`` maps to ``OVERSIZED``."""
    found: dict[str, Any] = {}
    for kv in attributes:
        if is_message_key(kv.key) and kv.value.ByteSize() > max_message_bytes:
            found[kv.key] = OVERSIZED
            continue
        found[kv.key] = plain(kv.value, problems)
    return found


def is_message_key(key: str) -> bool:
    """Whether ``key`` carries message text (its size is checked before it is read)."""
    return key in MESSAGE_ATTRIBUTES or key.startswith((PROMPT_PREFIX, COMPLETION_PREFIX))


class _Oversized:
    """Marks a value that was too large to read."""

    def __repr__(self) -> str:
        return "OVERSIZED"


OVERSIZED: Any = _Oversized()
