"""One GenAI span, its events and its trace's retrieved documents -> one checked ``StreamRecord``.

The record is built as the proxy builds its own, so the same signals come out:

- the request's facts (query, context, structure, prompt class) come from the proxy's own
  ``extract_request``, given the recorded conversation as an OpenAI chat request body: the
  query is the last user message with text; the context is the system instructions, the
  system and tool messages, the earlier turns, then the retrieved documents of the trace;
  ``gen_ai.output.type`` ``json`` (or OpenLLMetry's structured-output schema) asks for JSON,
  and declared tools (``gen_ai.tool.definitions``) give the tool-input schemas;
- continuity and validity are filled by ``check_record``, exactly as for proxied streams.

Clock: ``start_ns`` and ``end_ns`` are the span's own start and end (Unix epoch ns, the
application's clock). ``first_byte_ns`` is ``start_ns`` plus the recorded time to the first
chunk (util-genai's ``gen_ai.response.time_to_first_chunk``, OpenLIT's
``gen_ai.server.time_to_first_token``; both time the first chunk, whatever it held), or the
first of OpenLLMetry's per-chunk events. Only OpenLLMetry records per-chunk times: its
``gen_ai.content.completion.chunk`` span events, one per chunk the SDK yielded, carry no
content, so the chat-completions stream's own non-content chunks are left out by position:
the first (the role opener), and at the end the finish chunk (when a finish reason was
recorded) and the usage chunk (when usage was recorded). The rest are ``delta_ns``. Nothing
else is invented: without chunk events, ``delta_ns`` is empty and ``first_delta_ns`` None.

Status: ``http.response.status_code`` when recorded, else 500 for a span with error status,
else 200. ``error_type`` is ``error.type``, else the status for an error status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from semhealth.agent.otlp import conventions as c
from semhealth.agent.otlp.conventions import Problems
from semhealth.agent.otlp.messages import (
    Choice,
    Conversation,
    SpanEvent,
    Turn,
    read_conversation,
    response_format,
    tool_definitions,
)
from semhealth.collectors import (
    Config,
    Extract,
    RequestFacts,
    SchemaCache,
    StreamRecord,
    TraceRef,
    Usage,
    check_record,
    extract_request,
    wire_format,
)

OTHER_ROUTE = "other"
OK_STATUS = 200
ERROR_STATUS = 500


@dataclass(slots=True)
class GenAISpan:
    """A GenAI span as received, with its attributes read; events arrive until it is built."""

    trace_id: bytes
    span_id: bytes
    route: str
    start_ns: int
    end_ns: int
    error: bool  # span status ERROR
    attributes: dict[str, Any]
    events: list[SpanEvent]


def build_record(
    span: GenAISpan,
    documents: Sequence[str],
    config: Config,
    schemas: SchemaCache,
    problems: Problems,
) -> StreamRecord:
    """The checked record of ``span``; ``documents`` are its trace's retrieved texts."""
    attrs = _merged_attributes(span)
    conversation = read_conversation(attrs, span.events, problems)
    facts, prompt_class = _request_facts(attrs, conversation, documents, config, problems)
    choice = (conversation.choices or [Choice()])[0]
    status = _status(attrs, span.error)
    finish = _finish_reason(attrs, choice)
    usage = Usage(
        _int(attrs, (c.INPUT_TOKENS, c.PROMPT_TOKENS), problems),
        _int(attrs, (c.OUTPUT_TOKENS, c.COMPLETION_TOKENS), problems),
        _int(attrs, (c.REASONING_TOKENS,), problems),
    )
    chunks = sorted(e.time_ns for e in span.events if e.name == c.COMPLETION_CHUNK_EVENT)
    delta_ns = _content_chunks(chunks, finish is not None, usage.output_tokens is not None)
    record = StreamRecord(
        route=span.route,
        provider=_provider(attrs),
        model=_str(attrs, c.RESPONSE_MODEL) or facts.model or "unknown",
        prompt_class=prompt_class,
        request=facts,
        status=status,
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        first_byte_ns=chunks[0] if chunks else _first_chunk_ns(attrs, span.start_ns, problems),
        first_delta_ns=delta_ns[0] if delta_ns else None,
        delta_ns=delta_ns,
        output_text=choice.text,
        tool_calls=tuple(choice.tool_calls),
        usage=usage,
        finish_reason=finish,
        # The instrumentation saw the response end when it recorded why it finished
        # (openai-v2 writes "error" for a stream that ended without a finish reason).
        done=finish is not None and finish != "error" and status < 400,
        streamed=facts.stream or bool(chunks),
        error_type=_error_type(attrs, status, span.error),
        truncated=conversation.output_oversized,
        source="otlp",
        trace=TraceRef(span.trace_id.hex(), span.span_id.hex()),
        response_id=_str(attrs, c.RESPONSE_ID),
    )
    route = next((r for r in config.routes if r.name == span.route), None)
    return check_record(
        record,
        stall_threshold_s=config.analysis.stall_threshold_s,
        contract=route.contract_schema if route is not None else None,
        schemas=schemas,
    )


def _merged_attributes(span: GenAISpan) -> dict[str, Any]:
    """Span attributes, filled in from the operation-details event where the span lacks them."""
    attrs = dict(span.attributes)
    for event in span.events:
        if event.name == c.OPERATION_DETAILS_EVENT:
            for key, value in event.attributes.items():
                attrs.setdefault(key, value)
    return attrs


def _request_facts(
    attrs: Mapping[str, Any],
    conversation: Conversation,
    documents: Sequence[str],
    config: Config,
    problems: Problems,
) -> tuple[RequestFacts, str]:
    """The proxy's request extraction over the recorded conversation, as a chat request."""
    long_context = config.analysis.long_context_tokens
    if conversation.input_oversized:
        facts, prompt_class = RequestFacts(analysed=False, skip_reason="oversized"), "short"
        return dataclasses.replace(facts, model=_str(attrs, c.REQUEST_MODEL)), prompt_class
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": text} for text in conversation.system if text
    ]
    messages += [m for turn in conversation.turns or [] for m in _chat_messages(turn)]
    messages += [{"role": "tool", "content": doc} for doc in documents if doc]
    body: dict[str, Any] = {"messages": messages, "stream": _stream_flag(attrs)}
    model = _str(attrs, c.REQUEST_MODEL)
    if model is not None:
        body["model"] = model
    output_format = response_format(attrs, problems)
    if output_format is not None and conversation.choices is not None:
        body["response_format"] = output_format  # without output there is nothing to check
    tools = tool_definitions(attrs, problems)
    if tools:
        body["tools"] = tools
    facts, prompt_class = extract_request(
        orjson.dumps(body, default=_no_json),
        "openai_chat",
        Extract(),
        long_context_tokens=long_context,
    )
    if conversation.turns is None and not conversation.system:
        # Content was not captured: the request is known only by its attributes.
        facts = dataclasses.replace(facts, analysed=False, skip_reason="not_recorded")
    return facts, prompt_class


def _no_json(_value: Any) -> None:
    """JSON has no form for bytes (an OTLP value type): such a value reads as null."""
    return None


def _chat_messages(turn: Turn) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if turn.text is not None:
        role = turn.role if turn.role in ("system", "developer", "user", "assistant") else "user"
        found.append({"role": role, "content": turn.text})
    found += [{"role": "tool", "content": extra} for extra in turn.extras]
    return found


def _stream_flag(attrs: Mapping[str, Any]) -> bool:
    for key in (c.REQUEST_STREAM, c.OPENLIT_IS_STREAM, *c.IS_STREAMING):
        if isinstance(attrs.get(key), bool):
            return bool(attrs[key])
    return False


def _content_chunks(chunks: list[int], finished: bool, has_usage: bool) -> tuple[int, ...]:
    """OpenLLMetry's chunk times less the stream's non-content chunks (see the docstring)."""
    end = len(chunks) - (1 if finished else 0) - (1 if has_usage else 0)
    return tuple(chunks[1:end]) if end > 1 else ()


def _first_chunk_ns(attrs: Mapping[str, Any], start_ns: int, problems: Problems) -> int | None:
    for key in (c.TIME_TO_FIRST_CHUNK, c.OPENLIT_TIME_TO_FIRST_TOKEN):
        value = attrs.get(key)
        if value is None:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e6:
            return start_ns + round(value * 1e9)
        problems.add("wrong_type")
    return None


def _finish_reason(attrs: Mapping[str, Any], choice: Choice) -> str | None:
    reasons = attrs.get(c.FINISH_REASONS)
    if isinstance(reasons, list) and reasons and isinstance(reasons[0], str) and reasons[0]:
        return reasons[0]
    if isinstance(reasons, str) and reasons:
        return reasons
    return choice.finish_reason


def _status(attrs: Mapping[str, Any], error: bool) -> int:
    code = attrs.get(c.HTTP_STATUS)
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
        return code
    return ERROR_STATUS if error else OK_STATUS


def _error_type(attrs: Mapping[str, Any], status: int, error: bool) -> str | None:
    etype = attrs.get(c.ERROR_TYPE)
    if isinstance(etype, str) and etype:
        return etype
    return str(status) if error or status >= 400 else None


def _provider(attrs: Mapping[str, Any]) -> str:
    name = _str(attrs, c.PROVIDER) or _str(attrs, c.SYSTEM)
    if name is None:
        return "unknown"
    return wire_format(name, _str(attrs, c.OPERATION))


def _int(attrs: Mapping[str, Any], keys: Sequence[str], problems: Problems) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        problems.add("wrong_type")
    return None


def _str(attrs: Mapping[str, Any], key: str) -> str | None:
    value = attrs.get(key)
    return value if isinstance(value, str) and value else None
