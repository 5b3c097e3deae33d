"""Cohere v2 chat wire format (``/v2/chat``).

Streaming: SSE events named by ``type`` (also the ``event:`` field): ``message-start``,
``content-start``, ``content-delta``, ``content-end``, ``tool-plan-delta``,
``tool-call-start``, ``tool-call-delta``, ``tool-call-end``, ``citation-start``/``-end``
and ``message-end`` with the finish reason and usage. Non-streamed: one body with
``message`` and ``usage``.

Decisions:
- ``content-delta`` text is content; its ``thinking`` (reasoning models) and the
  ``tool-plan-delta`` (the model's plan before calling tools) are reasoning: timed, not
  content.
- Tool index = the event's ``index`` among tool calls, as Cohere numbers them.
- Usage: ``usage.tokens`` (what the model read and wrote) when present, else
  ``billed_units``.
- ``finish_reason``: ``COMPLETE``/``STOP_SEQUENCE`` -> ``stop``, ``MAX_TOKENS`` ->
  ``length``, ``TOOL_CALL`` -> ``tool_calls``; ``ERROR``/``TIMEOUT`` are errors of that
  kind. ``message-end`` is the end marker.
"""

from __future__ import annotations

from typing import Any

from semhealth.collectors.adapters.base import (
    SHAPE,
    FrameAdapter,
    FrameError,
    JsonObject,
    load_object,
    objects,
    opt_int,
    opt_list,
    opt_object,
    opt_str,
    usage_report,
)
from semhealth.collectors.adapters.conversation import (
    Conversation,
    Reading,
    dict_or_empty,
    function_tools,
    has_text,
    list_or_empty,
    schema_request,
)
from semhealth.collectors.adapters.openai_chat import chat_conversation
from semhealth.collectors.adapters.provider import Provider
from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    ReasoningDelta,
    StreamError,
    ToolCallDelta,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StructureRequest

_FINISH = {
    "COMPLETE": "stop",
    "STOP_SEQUENCE": "stop",
    "MAX_TOKENS": "length",
    "TOOL_CALL": "tool_calls",
}
_ERRORS = {"ERROR": "error", "TIMEOUT": "timeout", "ERROR_TOXIC": "content_filter"}


class CohereChatAdapter(FrameAdapter):
    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        obj = load_object(frame.data)
        kind = opt_str(obj, "type") or frame.event
        if kind == "content-delta":
            return _content_delta(obj, frame.t)
        if kind == "tool-call-delta" or kind == "tool-call-start":
            return _tool_call(obj, frame.t)
        if kind == "tool-plan-delta":
            return [ReasoningDelta(frame.t)]
        if kind == "message-end":
            delta = opt_object(obj, "delta") or {}
            return [*_finish(opt_str(delta, "finish_reason")), *_usage(delta), Done()]
        if kind == "message-start":
            return []
        if "finish_reason" in obj and isinstance(obj.get("message"), dict):
            return _body(obj, frame.t)
        if not kind:
            if isinstance(obj.get("message"), str):
                return []  # an error body, {"id", "message"}: its HTTP status is the error
            raise FrameError(SHAPE)
        return []  # content-start/-end, tool-call-end, citations, debug


def _content_delta(obj: JsonObject, t: int) -> list[AdapterEvent]:
    content = opt_object(opt_object(opt_object(obj, "delta") or {}, "message") or {}, "content")
    if content is None:
        return []
    if opt_str(content, "thinking"):
        return [ReasoningDelta(t)]
    text = opt_str(content, "text")
    return [ContentDelta(text, t)] if text else []


def _tool_call(obj: JsonObject, t: int) -> list[AdapterEvent]:
    index = opt_int(obj, "index") or 0
    message = opt_object(opt_object(obj, "delta") or {}, "message") or {}
    call = opt_object(message, "tool_calls") or {}
    function = opt_object(call, "function") or {}
    call_id, name = opt_str(call, "id"), opt_str(function, "name")
    arguments = opt_str(function, "arguments") or ""
    if not (call_id or name or arguments):
        return []
    return [ToolCallDelta(index=index, t=t, id=call_id, name=name, arguments=arguments)]


def _body(obj: JsonObject, t: int) -> list[AdapterEvent]:
    message = opt_object(obj, "message") or {}
    out: list[AdapterEvent] = []
    texts: list[str] = []
    for part in objects(opt_list(message, "content") or []):
        kind = opt_str(part, "type")
        if kind == "text":
            texts.append(opt_str(part, "text") or "")
        elif kind == "thinking":
            out.append(ReasoningDelta(t))
    if "".join(texts):
        out.append(ContentDelta("".join(texts), t))
    for index, call in enumerate(objects(opt_list(message, "tool_calls") or [])):
        function = opt_object(call, "function") or {}
        out.append(
            ToolCallDelta(
                index=index,
                t=t,
                id=opt_str(call, "id"),
                name=opt_str(function, "name"),
                arguments=opt_str(function, "arguments") or "",
            )
        )
    return [*out, *_finish(opt_str(obj, "finish_reason")), *_usage(obj), Done()]


def _finish(reason: str | None) -> list[AdapterEvent]:
    if not reason:
        return []
    if reason in _ERRORS:
        return [StreamError(_ERRORS[reason])]
    return [Finish(_FINISH.get(reason, reason.lower()))]


def _usage(holder: JsonObject) -> list[AdapterEvent]:
    usage = opt_object(holder, "usage")
    if usage is None:
        return []
    counts = opt_object(usage, "tokens") or opt_object(usage, "billed_units") or {}
    return usage_report(_count(counts, "input_tokens"), _count(counts, "output_tokens"))


def _count(counts: JsonObject, key: str) -> int | None:
    # Cohere writes counts as JSON numbers that may carry a fraction part (``12.0``).
    value = counts.get(key)
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return opt_int(counts, key)


# --- the request ----------------------------------------------------------------------------------


def read_request(doc: dict[str, Any]) -> Reading:
    return _conversation(doc), _structure(doc)


def _conversation(doc: dict[str, Any]) -> Conversation:
    found = chat_conversation(doc)
    if not found.usable:
        return found
    documents = (_document(d) for d in list_or_empty(doc.get("documents")))
    context = tuple(text for text in documents if text is not None and has_text(text))
    return Conversation(query=found.query, context=found.context + context, usable=True)


def _document(document: object) -> str | None:
    """A document is a string, or ``{"data": {...}}`` / ``{"id", "data"}``: its string
    fields, in order."""
    if isinstance(document, str):
        return document
    data = dict_or_empty(document).get("data", document)
    if isinstance(data, str):
        return data
    texts = [value for value in dict_or_empty(data).values() if isinstance(value, str)]
    return "\n".join(texts) if texts else None


def _structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    response_format = dict_or_empty(doc.get("response_format"))
    if response_format.get("type") == "json_object":
        schema = response_format.get("json_schema")
        if isinstance(schema, dict):
            found.append(schema_request("json_schema", schema, None))
        else:
            found.append(StructureRequest("json_object"))
    found.extend(function_tools(doc.get("tools")))
    return tuple(found)


# --- the provider ---------------------------------------------------------------------------------

PROVIDERS = (
    Provider(
        name="cohere_chat",
        adapter=CohereChatAdapter,
        read_request=read_request,
        gen_ai_name="cohere",
        suffixes=("/v2/chat",),
    ),
)
