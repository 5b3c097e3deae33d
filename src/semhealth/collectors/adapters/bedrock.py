"""Amazon Bedrock Runtime: ``ConverseStream``/``Converse`` and
``InvokeModelWithResponseStream``/``InvokeModel``.

Streams arrive in AWS event-stream frames (``aws_eventstream`` framing): a frame's
``event`` is its ``:event-type`` header, ``exception:<type>`` for an exception message
(``throttlingException``, ``modelStreamErrorException``, ...), and its data the JSON payload.

ConverseStream events: ``messageStart``, ``contentBlockStart`` (a ``toolUse`` start carries
the call's id and name), ``contentBlockDelta`` (``text``, ``toolUse.input`` fragments,
``reasoningContent``), ``contentBlockStop``, ``messageStop`` (``stopReason``) and
``metadata`` (usage, latency). ``Converse`` answers one body with ``output.message``.

InvokeModelWithResponseStream: each ``chunk`` event's ``bytes`` (base64) holds one event of
the model family's own stream. Anthropic Messages events (``anthropic.claude-*``) go to the
Anthropic adapter; Amazon Nova's are Converse's events, one per object under its name;
Meta Llama's carry ``generation``; Titan's ``outputText``; Mistral's ``outputs``.

Decisions:
- Tool index = order of ``toolUse`` blocks; content-block indices map to it, as for Anthropic.
- Input tokens = ``inputTokens`` + cache reads + cache writes, as for Anthropic.
- ``stopReason``: ``end_turn``/``stop_sequence`` -> ``stop``, ``max_tokens`` -> ``length``,
  ``tool_use`` -> ``tool_calls``, ``content_filtered``/``guardrail_intervened`` ->
  ``content_filter``; others pass through. ``messageStop`` is the end marker.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from semhealth.collectors.adapters import anthropic_messages
from semhealth.collectors.adapters.anthropic_messages import AnthropicMessagesAdapter
from semhealth.collectors.adapters.base import (
    JSON,
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
    dict_or_empty,
    dicts,
    nonempty_str,
    opt,
    schema_request,
    split_turns,
)
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

_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "stop": "stop",
    "max_tokens": "length",
    "length": "length",
    "tool_use": "tool_calls",
    "content_filtered": "content_filter",
    "guardrail_intervened": "content_filter",
}
_CONVERSE_EVENTS = frozenset(
    {
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    }
)
_EXCEPTION = "exception:"
_ERROR = "error:"


def frame_error(event: str) -> StreamError | None:
    """The error an event-stream exception or error message reports, by its type."""
    for prefix in (_EXCEPTION, _ERROR):
        if event.startswith(prefix):
            return StreamError(error_type({"type": event.removeprefix(prefix)}))
    return None


class _ConverseEvents:
    """Converse's events, by name: shared by ConverseStream and Nova's invoke stream."""

    def __init__(self) -> None:
        self._blocks: dict[int, int | None] = {}  # content-block index -> tool index
        self._tools = 0

    def event(self, name: str, obj: JsonObject, t: int) -> list[AdapterEvent]:
        if name == "contentBlockDelta":
            return self._delta(obj, t)
        if name == "contentBlockStart":
            return self._start(obj, t)
        if name == "messageStop":
            return [*_finish(opt_str(obj, "stopReason")), Done()]
        if name == "metadata":
            return _usage(opt_object(obj, "usage"))
        return []  # messageStart, contentBlockStop

    def _start(self, obj: JsonObject, t: int) -> list[AdapterEvent]:
        index = opt_int(obj, "contentBlockIndex") or 0
        start = opt_object(obj, "start") or {}
        tool = opt_object(start, "toolUse")
        if tool is None:
            self._blocks[index] = None
            return []
        slot = self._new_tool(index)
        return [
            ToolCallDelta(
                index=slot, t=t, id=opt_str(tool, "toolUseId"), name=opt_str(tool, "name")
            )
        ]

    def _delta(self, obj: JsonObject, t: int) -> list[AdapterEvent]:
        index = opt_int(obj, "contentBlockIndex") or 0
        delta = opt_object(obj, "delta") or {}
        text = opt_str(delta, "text")
        if text:
            return [ContentDelta(text, t)]
        tool = opt_object(delta, "toolUse")
        if tool is not None:
            fragment = opt_str(tool, "input")
            slot = self._blocks[index] if index in self._blocks else self._new_tool(index)
            if slot is None or not fragment:
                return []
            return [ToolCallDelta(index=slot, t=t, arguments=fragment)]
        if opt_object(delta, "reasoningContent") is not None:
            return [ReasoningDelta(t)]
        return []

    def _new_tool(self, block: int) -> int:
        slot = self._tools
        self._tools += 1
        self._blocks[block] = slot
        return slot


class BedrockConverseAdapter(FrameAdapter):
    """``ConverseStream`` frames, or the one body of ``Converse``."""

    def __init__(self) -> None:
        super().__init__()
        self._events = _ConverseEvents()

    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        error = frame_error(frame.event)
        if error is not None:
            return [error]
        obj = load_object(frame.data)
        if frame.event:
            return self._events.event(frame.event, obj, frame.t)
        return converse_body(obj, frame.t)


def converse_body(obj: JsonObject, t: int) -> list[AdapterEvent]:
    """The events of a whole ``Converse`` answer (also Nova's ``InvokeModel`` body)."""
    output = opt_object(obj, "output")
    if output is None:
        raise FrameError(SHAPE)  # an error body: the status says what went wrong
    message = opt_object(output, "message") or {}
    texts: list[str] = []
    out: list[AdapterEvent] = []
    tools: list[AdapterEvent] = []
    for block in objects(opt_list(message, "content") or []):
        text = opt_str(block, "text")
        if text is not None:
            texts.append(text)
        tool = opt_object(block, "toolUse")
        if tool is not None:
            arguments = tool.get("input")
            tools.append(
                ToolCallDelta(
                    index=len(tools),
                    t=t,
                    id=opt_str(tool, "toolUseId"),
                    name=opt_str(tool, "name"),
                    arguments="" if arguments is None else dump_json(arguments),
                )
            )
        if opt_object(block, "reasoningContent") is not None:
            out.append(ReasoningDelta(t))
    if texts and "".join(texts):
        out.append(ContentDelta("".join(texts), t))
    out += tools
    out += _finish(opt_str(obj, "stopReason"))
    out += _usage(opt_object(obj, "usage"))
    out.append(Done())
    return out


class BedrockInvokeAdapter(FrameAdapter):
    """``InvokeModelWithResponseStream`` chunks, or an ``InvokeModel`` body: the model
    family's own events, recognised from the first one."""

    def __init__(self) -> None:
        super().__init__()
        self._anthropic: AnthropicMessagesAdapter | None = None
        self._nova: _ConverseEvents | None = None
        self._llama_in: int | None = None

    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        error = frame_error(frame.event)
        if error is not None:
            return [error]
        obj = load_object(frame.data)
        if frame.event:  # an event-stream frame: the model's event is in ``bytes``
            if frame.event != "chunk":
                return []
            obj = load_object(_chunk_bytes(obj))
        out: list[AdapterEvent] = []
        self._model_event(obj, frame, out)
        # Bedrock's own count, in the last chunk: the usage of families that report none
        # themselves (Anthropic and Nova do, and theirs counts cached input too).
        metrics = opt_object(obj, "amazon-bedrock-invocationMetrics")
        if metrics is not None and self._anthropic is None and self._nova is None:
            out += usage_report(
                opt_int(metrics, "inputTokenCount"), opt_int(metrics, "outputTokenCount")
            )
        return out

    def _model_event(self, obj: JsonObject, frame: Frame, out: list[AdapterEvent]) -> None:
        if "type" in obj:  # Anthropic Messages, streamed or whole
            if self._anthropic is None:
                self._anthropic = AnthropicMessagesAdapter()
            out += self._anthropic.event(obj, "", frame.t)
            return
        if "output" in obj and "stopReason" in obj:  # Nova's whole body is Converse's
            out += converse_body(obj, frame.t)
            return
        names = [name for name in obj if name in _CONVERSE_EVENTS]
        if names:  # Nova streamed: one Converse event under its name
            if self._nova is None:
                self._nova = _ConverseEvents()
            for name in names:
                out += self._nova.event(name, opt_object(obj, name) or {}, frame.t)
            return
        if "generation" in obj:
            out += self._llama(obj, frame.t)
            return
        if "outputText" in obj:
            out += _titan(obj, frame.t)
            return
        if "outputs" in obj:
            out += _mistral(obj, frame.t)

    def _llama(self, obj: JsonObject, t: int) -> list[AdapterEvent]:
        out: list[AdapterEvent] = []
        text = opt_str(obj, "generation")
        if text:
            out.append(ContentDelta(text, t))
        prompt = opt_int(obj, "prompt_token_count")
        if prompt is not None:
            self._llama_in = prompt
        generated = opt_int(obj, "generation_token_count")
        if generated is not None or prompt is not None:
            out += usage_report(self._llama_in, generated)
        reason = opt_str(obj, "stop_reason")
        if reason:
            out += [*_finish(reason), Done()]
        return out


def _titan(obj: JsonObject, t: int) -> list[AdapterEvent]:
    out: list[AdapterEvent] = []
    text = opt_str(obj, "outputText")
    if text:
        out.append(ContentDelta(text, t))
    out += usage_report(
        opt_int(obj, "inputTextTokenCount"), opt_int(obj, "totalOutputTextTokenCount")
    )
    reason = opt_str(obj, "completionReason")
    if reason:
        out += [Finish({"FINISH": "stop", "LENGTH": "length"}.get(reason, reason.lower())), Done()]
    return out


def _mistral(obj: JsonObject, t: int) -> list[AdapterEvent]:
    output = next(objects(opt_list(obj, "outputs") or []), None)  # output 0, like choice 0
    if output is None:
        return []
    out: list[AdapterEvent] = []
    text = opt_str(output, "text")
    if text:
        out.append(ContentDelta(text, t))
    reason = opt_str(output, "stop_reason")
    if reason:
        out += [*_finish(reason), Done()]
    return out


def _chunk_bytes(obj: JsonObject) -> bytes:
    encoded = opt_str(obj, "bytes")
    if encoded is None:
        raise FrameError(SHAPE)
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FrameError(JSON) from exc


def _finish(reason: str | None) -> list[AdapterEvent]:
    if not reason:
        return []
    return [Finish(_STOP.get(reason, reason))]


def _usage(usage: JsonObject | None) -> list[AdapterEvent]:
    if usage is None:
        return []
    return usage_report(
        add_counts(
            opt_int(usage, "inputTokens"),
            opt_int(usage, "cacheReadInputTokens"),
            opt_int(usage, "cacheWriteInputTokens"),
        ),
        opt_int(usage, "outputTokens"),
    )


# --- the request ----------------------------------------------------------------------------------


def read_converse_request(doc: dict[str, Any]) -> Reading:
    return _converse_conversation(doc), _converse_structure(doc)


def _converse_conversation(doc: dict[str, Any]) -> Conversation:
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return UNUSABLE
    system = opt(_converse_text(doc.get("system")))
    turns: list[Turn] = []
    for message in dicts(messages):
        role = message.get("role")
        content = message.get("content")
        extras: list[str] = []
        for block in dicts(content):
            result = block.get("toolResult")
            if isinstance(result, dict):
                extras.extend(opt(_converse_text(result.get("content"))))
            document = dict_or_empty(block.get("document"))
            source = dict_or_empty(document.get("source"))
            extras.extend(opt(_converse_text(source.get("content"))))
            extras.extend(opt(nonempty_str(source.get("text"))))
        turns.append(
            Turn(
                role=role if isinstance(role, str) else "",
                text=_converse_text(content),
                extras=tuple(extras),
            )
        )
    return split_turns(system, turns)


def _converse_text(blocks: object) -> str | None:
    """The ``text`` blocks of a Converse content list (``json`` blocks as their JSON)."""
    if isinstance(blocks, str):
        return blocks
    texts: list[str] = []
    for block in dicts(blocks):
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif "json" in block:
            texts.append(orjson.dumps(block["json"]).decode())
    return "\n".join(texts) if texts else None


def _converse_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    tools = dict_or_empty(doc.get("toolConfig")).get("tools")
    found: list[StructureRequest] = []
    for tool in dicts(tools):
        spec = tool.get("toolSpec")
        if isinstance(spec, dict):
            schema = dict_or_empty(spec.get("inputSchema")).get("json")
            found.append(schema_request("tool_input", schema, spec.get("name")))
    return tuple(found)


def read_invoke_request(doc: dict[str, Any]) -> tuple[Conversation, tuple[StructureRequest, ...]]:
    """InvokeModel bodies are the model family's own: Anthropic Messages
    (``anthropic_version``), Nova (Converse's shape under ``messages``, ``system``) or a
    plain ``prompt`` (Llama, Mistral) / ``inputText`` (Titan)."""
    if "anthropic_version" in doc:
        return anthropic_messages.read_request(doc)
    if isinstance(doc.get("messages"), list):
        return _converse_conversation(doc), _converse_structure(doc)
    for key in ("prompt", "inputText"):
        if isinstance(doc.get(key), str):
            return split_turns((), [Turn(role="user", text=doc[key])]), ()
    return UNUSABLE, ()


# --- the provider ---------------------------------------------------------------------------------

PROVIDERS = (
    Provider(
        name="bedrock_converse",
        adapter=BedrockConverseAdapter,
        read_request=read_converse_request,
        gen_ai_name="aws.bedrock",
        suffixes=("/converse-stream", "/converse"),
    ),
    Provider(
        name="bedrock_invoke",
        adapter=BedrockInvokeAdapter,
        read_request=read_invoke_request,
        gen_ai_name="aws.bedrock",
        suffixes=("/invoke-with-response-stream", "/invoke"),
    ),
)
