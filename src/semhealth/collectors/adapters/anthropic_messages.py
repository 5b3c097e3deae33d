"""Anthropic Messages wire format (``/v1/messages``).

Streaming: SSE events ``message_start``, ``content_block_start/delta/stop``,
``message_delta``, ``message_stop``, plus ``ping`` and ``error``. The data's
``type`` is read first, the ``event:`` name second. Non-streamed: one
``type: message`` body.

Decisions:
- Tool index = order of ``tool_use`` blocks; content-block indices (which also
  count text and thinking blocks) map to it. ``server_tool_use`` blocks (web
  search, code execution run by Anthropic) and ``mcp_tool_use`` blocks are not the
  caller's tool calls: each is one provider tool call, of the kind its name says.
- Thinking is not content: the user does not read it as the answer. It is timed
  (``ReasoningDelta``).
- Input tokens = ``input_tokens`` + cache creation + cache reads, because
  Anthropic counts cached prompt tokens apart while OpenAI's ``prompt_tokens``
  (and the OTel GenAI convention) include them.
- ``stop_reason``: ``end_turn``/``stop_sequence`` -> ``stop``, ``max_tokens`` ->
  ``length``, ``tool_use`` -> ``tool_calls``, ``refusal`` (the streaming safety
  classifier) -> ``content_filter``; others pass through.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from semhealth.collectors.adapters.base import (
    SHAPE,
    FrameAdapter,
    FrameError,
    JsonObject,
    add_counts,
    dump_json,
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
    dicts,
    opt,
    schema_request,
    split_turns,
    text_of,
)
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
    provider_tool_kind,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StructureRequest

_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_INPUT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


class AnthropicMessagesAdapter(FrameAdapter):
    def __init__(self) -> None:
        super().__init__()
        # content-block index -> tool index, None for a block that is not a tool call
        self._blocks: dict[int, int | None] = {}
        self._tools = 0

    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        return self.event(load_object(frame.data), frame.event, frame.t)

    def event(self, obj: JsonObject, name: str, t: int) -> list[AdapterEvent]:
        """One parsed event (``name``: its SSE event name, if any). Bedrock's invoke stream
        hands over events it has already parsed; raises ``FrameError`` like ``_parse``."""
        kind = opt_str(obj, "type") or name
        if not kind:
            raise FrameError(SHAPE)  # every event names its type
        if kind == "content_block_delta":
            return self._block_delta(obj, t)
        if kind == "content_block_start":
            return self._block_start(obj, t)
        if kind == "message_start":
            return self._message_start(obj)
        if kind == "message_delta":
            return _message_delta(obj)
        if kind == "message_stop":
            return [Done()]
        if kind == "error":
            return [StreamError(error_type(obj.get("error")))]
        if kind == "message":
            return self._body(obj, t)
        return []  # ping, content_block_stop, and whatever Anthropic adds next

    def _message_start(self, obj: JsonObject) -> list[AdapterEvent]:
        message = opt_object(obj, "message") or {}
        out: list[AdapterEvent] = []
        self._note_model(opt_str(message, "model"), out)
        out += _usage(message)
        return out

    def _block_start(self, obj: JsonObject, t: int) -> list[AdapterEvent]:
        index = _block_index(obj)
        block = opt_object(obj, "content_block") or {}
        kind = opt_str(block, "type")
        if kind == "tool_use":
            tool = self._new_tool(index)
            return [
                ToolCallDelta(index=tool, t=t, id=opt_str(block, "id"), name=opt_str(block, "name"))
            ]
        self._blocks[index] = None
        if kind in _PROVIDER_TOOL_BLOCKS:
            return [_provider_tool(block)]
        text = opt_str(block, "text") if kind == "text" else None
        return [ContentDelta(text, t)] if text else []

    def _block_delta(self, obj: JsonObject, t: int) -> list[AdapterEvent]:
        index = _block_index(obj)
        delta = opt_object(obj, "delta") or {}
        kind = opt_str(delta, "type")
        if kind == "text_delta":
            text = opt_str(delta, "text")
            return [ContentDelta(text, t)] if text else []
        if kind == "input_json_delta":
            fragment = opt_str(delta, "partial_json")
            # A block whose start was shed is taken for a tool: only tool blocks send JSON
            # to the caller (server tools' blocks are known from their start).
            tool = self._blocks[index] if index in self._blocks else self._new_tool(index)
            if tool is None or not fragment:
                return []
            return [ToolCallDelta(index=tool, t=t, arguments=fragment)]
        if kind == "thinking_delta":
            return [ReasoningDelta(t)]
        return []  # signature_delta, citations_delta

    def _new_tool(self, block: int) -> int:
        tool = self._tools
        self._tools += 1
        self._blocks[block] = tool
        return tool

    def _body(self, message: JsonObject, t: int) -> list[AdapterEvent]:
        out: list[AdapterEvent] = []
        self._note_model(opt_str(message, "model"), out)
        texts: list[str] = []
        tools: list[AdapterEvent] = []
        for block in objects(opt_list(message, "content") or []):
            kind = opt_str(block, "type")
            if kind == "text":
                texts.append(opt_str(block, "text") or "")
            elif kind == "tool_use":
                tools.append(_whole_tool_call(len(tools), block, t))
            elif kind in _PROVIDER_TOOL_BLOCKS:
                out.append(_provider_tool(block))
        text = "".join(texts)
        if text:
            out.append(ContentDelta(text, t))
        out += tools
        out += _finish(opt_str(message, "stop_reason"))
        out += _usage(message)
        out.append(Done())
        return out


# Tools Anthropic runs: its server tools (web search and fetch, code execution, ...) and the
# MCP connector's remote servers.
_PROVIDER_TOOL_BLOCKS = frozenset({"server_tool_use", "mcp_tool_use"})


def _provider_tool(block: JsonObject) -> ProviderToolCall:
    if opt_str(block, "type") == "mcp_tool_use":
        return ProviderToolCall("mcp")
    return ProviderToolCall(provider_tool_kind(opt_str(block, "name")))


def _block_index(obj: JsonObject) -> int:
    index = opt_int(obj, "index")
    return 0 if index is None else index


def _message_delta(obj: JsonObject) -> list[AdapterEvent]:
    delta = opt_object(obj, "delta") or {}
    return _finish(opt_str(delta, "stop_reason")) + _usage(obj)


def _finish(stop_reason: str | None) -> list[AdapterEvent]:
    if not stop_reason:
        return []
    return [Finish(_STOP.get(stop_reason, stop_reason))]


def _usage(holder: JsonObject) -> list[AdapterEvent]:
    usage = opt_object(holder, "usage")
    if usage is None:
        return []
    # message_delta usually reports output only; absent input fields must not reset input.
    input_tokens = add_counts(*(opt_int(usage, key) for key in _INPUT_FIELDS))
    return usage_report(input_tokens, opt_int(usage, "output_tokens"))


def _whole_tool_call(index: int, block: JsonObject, t: int) -> ToolCallDelta:
    tool_input = block.get("input")
    return ToolCallDelta(
        index=index,
        t=t,
        id=opt_str(block, "id"),
        name=opt_str(block, "name"),
        arguments="" if tool_input is None else dump_json(tool_input),
    )


# --- the request ----------------------------------------------------------------------------------


def read_request(doc: dict[str, Any]) -> Reading:
    return _conversation(doc), _structure(doc)


def _conversation(doc: dict[str, Any]) -> Conversation:
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return UNUSABLE
    system = opt(text_of(doc.get("system")))
    return split_turns(system, (_turn(m) for m in dicts(messages)))


def _turn(message: dict[str, Any]) -> Turn:
    role = message.get("role")
    role = role if isinstance(role, str) else ""
    content = message.get("content")
    if not isinstance(content, list):
        return Turn(role=role, text=text_of(content))
    extras: list[str] = []
    for block in dicts(content):
        kind = block.get("type")
        if kind == "tool_result":
            extras.extend(opt(text_of(block.get("content"))))
        elif kind == "document":
            extras.extend(opt(_document_text(block.get("source"))))
    return Turn(role=role, text=text_of(content), extras=tuple(extras))


def _document_text(source: object) -> str | None:
    """Plain-text documents only: ``source.type`` ``text`` (``data``) or ``content`` (blocks)."""
    if not isinstance(source, dict):
        return None
    if source.get("type") == "text":
        data = source.get("data")
        return data if isinstance(data, str) else None
    if source.get("type") == "content":
        return text_of(source.get("content"))
    return None


def _structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    # Server tools (web search, code execution, ...) carry no input_schema: the model
    # does not write their input as JSON for the client, so there is nothing to check.
    return tuple(
        schema_request("tool_input", tool.get("input_schema"), tool.get("name"))
        for tool in dicts(doc.get("tools"))
        if isinstance(tool.get("input_schema"), dict)
    )


# --- the provider ---------------------------------------------------------------------------------

_MESSAGES = Provider(
    name="anthropic_messages",
    adapter=AnthropicMessagesAdapter,
    read_request=read_request,
    gen_ai_name="anthropic",
    suffixes=("/messages",),
)

PROVIDERS = (
    _MESSAGES,
    # Claude on Vertex AI: the Messages API behind Vertex's own methods.
    dataclasses.replace(
        _MESSAGES,
        name="vertex_ai_anthropic",
        gen_ai_name="gcp.vertex_ai",
        suffixes=(":streamRawPredict", ":rawPredict"),
    ),
)
