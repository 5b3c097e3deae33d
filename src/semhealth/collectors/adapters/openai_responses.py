"""OpenAI Responses API wire format (``/v1/responses``).

Streaming: SSE events whose ``event:`` name repeats the data's ``type``
(``response.created``, ``response.output_text.delta``, ...). The data's
``type`` is read first, so a decoder that names unnamed events ``message``
does not matter. Non-streamed: one ``object: response`` body.

Decisions:
- Tool index = order of function-call output items; the stream's
  ``output_index`` (which also counts messages and reasoning items) maps to it.
  Arguments come from the ``.delta`` events; the ``.done`` repeat is ignored.
- Finish: ``completed`` is ``tool_calls`` when the response called a function,
  else ``stop``; ``incomplete`` maps ``max_output_tokens`` to ``length``.
- ``refusal`` deltas are content, as in the Chat Completions adapter.
- Built-in tools OpenAI runs (web and file search, code interpreter, image generation,
  remote MCP) are one provider tool call each, when their output item is added.
- A body still ``queued``/``in_progress`` (background mode) has no ``Done``.
"""

from __future__ import annotations

from typing import Any

from semhealth.collectors.adapters.base import (
    SHAPE,
    FrameAdapter,
    FrameError,
    JsonObject,
    error_type,
    load_object,
    objects,
    opt_int,
    opt_list,
    opt_object,
    opt_str,
    usage_report,
)
from semhealth.collectors.adapters.conversation import (
    UNUSABLE,
    Conversation,
    Reading,
    Turn,
    dict_or_empty,
    dicts,
    opt,
    schema_request,
    split_turns,
    text_of,
)
from semhealth.collectors.adapters.openai_chat import on_azure
from semhealth.collectors.adapters.provider import Provider
from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    ProviderToolCall,
    ReasoningDelta,
    StreamError,
    ToolCallDelta,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StructureRequest

_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.refusal.delta"})
_ARGUMENT_DELTAS = frozenset(
    {"response.function_call_arguments.delta", "response.custom_tool_call_input.delta"}
)
# Reasoning summaries and (open models') raw reasoning text: timed, never content.
_REASONING_DELTAS = frozenset(
    {"response.reasoning_summary_text.delta", "response.reasoning_text.delta"}
)
_TOOL_ITEMS = frozenset({"function_call", "custom_tool_call"})
# Built-in tools OpenAI runs itself. The computer and local-shell calls are the caller's to run
# (and carry no JSON arguments to check): neither kind.
_PROVIDER_TOOL_ITEMS = {
    "web_search_call": "web_search",
    "file_search_call": "file_search",
    "code_interpreter_call": "code_execution",
    "image_generation_call": "image_generation",
    "mcp_call": "mcp",
}
_TERMINAL = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


class OpenAIResponsesAdapter(FrameAdapter):
    def __init__(self) -> None:
        super().__init__()
        self._tool_index: dict[int, int] = {}  # output_index -> tool index

    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        obj = load_object(frame.data)
        if obj.get("object") == "response":
            return self._body(obj, frame.t)  # stream events nest the response, never are one
        kind = opt_str(obj, "type") or frame.event
        if not kind:
            raise FrameError(SHAPE)  # every event names its type
        if kind in _TEXT_DELTAS:
            text = opt_str(obj, "delta")
            return [ContentDelta(text, frame.t)] if text else []
        if kind in _ARGUMENT_DELTAS:
            return self._argument_delta(obj, frame.t)
        if kind in _REASONING_DELTAS:
            return [ReasoningDelta(frame.t)]
        if kind == "response.output_item.added":
            return self._item_added(obj, frame.t)
        if kind in ("response.created", "response.in_progress"):
            out: list[AdapterEvent] = []
            self._note_model(opt_str(_response(obj), "model"), out)
            return out
        if kind in _TERMINAL:
            return self._outcome(_response(obj), _TERMINAL[kind])
        if kind == "error":
            return [_error_event(obj)]
        return []

    def _item_added(self, obj: JsonObject, t: int) -> list[AdapterEvent]:
        item = _item(obj)
        kind = opt_str(item, "type")
        if kind in _PROVIDER_TOOL_ITEMS:
            return [ProviderToolCall(_PROVIDER_TOOL_ITEMS[kind])]
        if kind not in _TOOL_ITEMS:
            return []
        index = self._tool(_output_index(obj))
        arguments = opt_str(item, "arguments") or opt_str(item, "input") or ""
        return [
            ToolCallDelta(
                index=index,
                t=t,
                id=opt_str(item, "call_id"),
                name=opt_str(item, "name"),
                arguments=arguments,
            )
        ]

    def _argument_delta(self, obj: JsonObject, t: int) -> list[AdapterEvent]:
        delta = opt_str(obj, "delta")
        # An unseen output_index (its ``output_item.added`` was shed) still gets its own tool.
        index = self._tool(_output_index(obj))
        return [ToolCallDelta(index=index, t=t, arguments=delta)] if delta else []

    def _tool(self, output_index: int) -> int:
        return self._tool_index.setdefault(output_index, len(self._tool_index))

    def _outcome(self, response: JsonObject, status: str) -> list[AdapterEvent]:
        out: list[AdapterEvent] = []
        self._note_model(opt_str(response, "model"), out)
        called = bool(self._tool_index) or _has_tool_items(response)
        out += _status_events(response, status, called)
        out += _usage(response)
        out.append(Done())
        return out

    def _body(self, response: JsonObject, t: int) -> list[AdapterEvent]:
        out: list[AdapterEvent] = []
        self._note_model(opt_str(response, "model"), out)
        texts: list[str] = []
        tools: list[AdapterEvent] = []
        for item in objects(opt_list(response, "output") or []):
            kind = opt_str(item, "type")
            if kind == "message":
                texts += _message_texts(item)
            elif kind in _TOOL_ITEMS:
                tools.append(_whole_tool_call(len(tools), item, t))
            elif kind in _PROVIDER_TOOL_ITEMS:
                out.append(ProviderToolCall(_PROVIDER_TOOL_ITEMS[kind]))
        text = "".join(texts)
        if text:
            out.append(ContentDelta(text, t))
        out += tools
        status = opt_str(response, "status") or ""
        out += _status_events(response, status, bool(tools))
        out += _usage(response)
        if status in ("completed", "incomplete", "failed", "cancelled"):
            out.append(Done())
        return out


def _item(obj: JsonObject) -> JsonObject:
    item = opt_object(obj, "item")
    if item is None:
        raise FrameError(SHAPE)
    return item


def _error_event(obj: JsonObject) -> StreamError:
    # Nested ``error`` object in newer streams; a top-level ``code`` (its ``type`` is
    # just "error") in the documented one.
    nested = obj.get("error")
    if isinstance(nested, dict):
        return StreamError(error_type(nested))
    return StreamError(error_type({"code": obj.get("code")}))


def _response(obj: JsonObject) -> JsonObject:
    response = opt_object(obj, "response")
    if response is None:
        raise FrameError(SHAPE)
    return response


def _output_index(obj: JsonObject) -> int:
    index = opt_int(obj, "output_index")
    if index is None:
        raise FrameError(SHAPE)
    return index


def _has_tool_items(response: JsonObject) -> bool:
    items = objects(opt_list(response, "output") or [])
    return any(opt_str(item, "type") in _TOOL_ITEMS for item in items)


def _status_events(response: JsonObject, status: str, called: bool) -> list[AdapterEvent]:
    if status == "completed":
        return [Finish("tool_calls" if called else "stop")]
    if status == "incomplete":
        details = opt_object(response, "incomplete_details") or {}
        reason = opt_str(details, "reason") or "incomplete"
        return [Finish(_INCOMPLETE.get(reason, reason))]
    if status == "failed":
        return [StreamError(error_type(response.get("error"), default="failed"))]
    if status == "cancelled":
        return [Finish("cancelled")]
    return []


def _usage(response: JsonObject) -> list[AdapterEvent]:
    usage = opt_object(response, "usage")
    if usage is None:
        return []
    details = opt_object(usage, "output_tokens_details") or {}
    return usage_report(
        opt_int(usage, "input_tokens"),
        opt_int(usage, "output_tokens"),
        opt_int(details, "reasoning_tokens"),
    )


def _message_texts(item: JsonObject) -> list[str]:
    texts: list[str] = []
    for part in objects(opt_list(item, "content") or []):
        kind = opt_str(part, "type")
        if kind == "output_text":
            texts.append(opt_str(part, "text") or "")
        elif kind == "refusal":
            texts.append(opt_str(part, "refusal") or "")
    return texts


def _whole_tool_call(index: int, item: JsonObject, t: int) -> ToolCallDelta:
    return ToolCallDelta(
        index=index,
        t=t,
        id=opt_str(item, "call_id"),
        name=opt_str(item, "name"),
        arguments=opt_str(item, "arguments") or opt_str(item, "input") or "",
    )


# --- the request ----------------------------------------------------------------------------------


def read_request(doc: dict[str, Any]) -> Reading:
    return _conversation(doc), _structure(doc)


_TOOL_OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})


def _conversation(doc: dict[str, Any]) -> Conversation:
    system = list(opt(text_of(doc.get("instructions"))))
    items = doc.get("input")
    if isinstance(items, str):
        return split_turns(system, [Turn(role="user", text=items)])
    if not isinstance(items, list):
        return UNUSABLE
    turns: list[Turn] = []
    for item in dicts(items):
        kind = item.get("type")
        if kind in _TOOL_OUTPUT_ITEMS:
            turns.append(Turn(role="tool", text=None, extras=opt(text_of(item.get("output")))))
        elif kind == "message" or (kind is None and "role" in item):
            role = item.get("role")
            text = text_of(item.get("content"))
            if role in ("system", "developer"):
                system.extend(opt(text))
            elif isinstance(role, str):
                turns.append(Turn(role=role, text=text))
    return split_turns(system, turns)


def _structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    fmt = dict_or_empty(dict_or_empty(doc.get("text")).get("format"))
    if fmt.get("type") == "json_object":
        found.append(StructureRequest("json_object"))
    elif fmt.get("type") == "json_schema":
        found.append(schema_request("json_schema", fmt.get("schema"), fmt.get("name")))
    for tool in dicts(doc.get("tools")):
        if tool.get("type") == "function":
            found.append(schema_request("tool_input", tool.get("parameters"), tool.get("name")))
    return tuple(found)


# --- the provider ---------------------------------------------------------------------------------

_RESPONSES = Provider(
    name="openai_responses",
    adapter=OpenAIResponsesAdapter,
    read_request=read_request,
    gen_ai_name="openai",
    suffixes=("/responses",),
)

PROVIDERS = (_RESPONSES, on_azure(_RESPONSES))
