"""Ollama native wire format: NDJSON from ``/api/chat`` and ``/api/generate``.

Every line is ``{"model", "message": {...} | "response": "...", "done": false}``;
the last has ``done: true`` with ``done_reason`` and the token counts
(``prompt_eval_count``, ``eval_count``). A non-streamed response is that last
line alone, content included. Errors are ``{"error": "<message>"}``.

Decisions:
- Ollama sends each tool call whole, its arguments an object; the adapter
  re-serialises them so tool calls read the same as from the other providers.
  Tool index = order of calls in the response.
- ``done_reason: stop`` after tool calls becomes ``tool_calls``, as Ollama's own
  OpenAI-compatible endpoint reports it.
- ``thinking`` is not content.
"""

from __future__ import annotations

from typing import Any

from semhealth.collectors.adapters.base import (
    SHAPE,
    FrameAdapter,
    FrameError,
    JsonObject,
    dump_json,
    load_object,
    objects,
    opt_bool,
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
    function_tools,
    opt,
    split_turns,
    text_of,
)
from semhealth.collectors.adapters.openai_chat import chat_conversation
from semhealth.collectors.adapters.provider import Provider
from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    StreamError,
    ToolCallDelta,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StructureRequest


class OllamaAdapter(FrameAdapter):
    def __init__(self) -> None:
        super().__init__()
        self._tools = 0

    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        line = load_object(frame.data)
        if line.get("error") is not None:
            # Ollama's error is a free-text message: only its presence is reported.
            return [StreamError("error")]
        done = opt_bool(line, "done")
        if done is None:
            raise FrameError(SHAPE)  # every Ollama line says whether it is the last
        out: list[AdapterEvent] = []
        self._note_model(opt_str(line, "model"), out)
        message = opt_object(line, "message")
        text = opt_str(line, "response") or (opt_str(message, "content") if message else None)
        if text:
            out.append(ContentDelta(text, frame.t))
        if message is not None:
            out += self._tool_calls(message, frame.t)
        if done:
            out += self._final(line)
        return out

    def _tool_calls(self, message: JsonObject, t: int) -> list[AdapterEvent]:
        out: list[AdapterEvent] = []
        for call in objects(opt_list(message, "tool_calls") or []):
            function = opt_object(call, "function") or {}
            out.append(
                ToolCallDelta(
                    index=self._tools,
                    t=t,
                    id=opt_str(call, "id"),
                    name=opt_str(function, "name"),
                    arguments=_arguments(function.get("arguments")),
                )
            )
            self._tools += 1
        return out

    def _final(self, line: JsonObject) -> list[AdapterEvent]:
        out: list[AdapterEvent] = []
        reason = opt_str(line, "done_reason")
        if reason:
            out.append(Finish("tool_calls" if reason == "stop" and self._tools else reason))
        out += usage_report(opt_int(line, "prompt_eval_count"), opt_int(line, "eval_count"))
        out.append(Done())
        return out


def _arguments(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return dump_json(value)
    raise FrameError(SHAPE)


# --- the request ----------------------------------------------------------------------------------


def read_request(doc: dict[str, Any]) -> Reading:
    return _conversation(doc), _structure(doc)


def _conversation(doc: dict[str, Any]) -> Conversation:
    messages = doc.get("messages")
    if isinstance(messages, list):  # /api/chat
        return chat_conversation(doc)
    prompt = doc.get("prompt")
    if isinstance(prompt, str):  # /api/generate
        system = opt(text_of(doc.get("system")))
        return split_turns(system, [Turn(role="user", text=prompt)])
    return UNUSABLE


def _structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    fmt = doc.get("format")
    if fmt == "json":
        found.append(StructureRequest("json_object"))
    elif isinstance(fmt, dict):
        found.append(StructureRequest("json_schema", schema=fmt))
    found.extend(function_tools(doc.get("tools")))
    return tuple(found)


# --- the provider ---------------------------------------------------------------------------------

PROVIDERS = (
    Provider(
        name="ollama",
        adapter=OllamaAdapter,
        read_request=read_request,
        gen_ai_name="ollama",  # not among the conventions' values: named as it is
        suffixes=("/api/chat", "/api/generate"),
    ),
)
