"""OpenAI Chat Completions (and legacy Completions) wire format.

Streaming: SSE ``data:`` chunks (``object: chat.completion.chunk``) and a final
``data: [DONE]``; with ``stream_options.include_usage`` one last chunk has empty
``choices`` and the ``usage``. Non-streamed: one ``chat.completion`` body.
Many servers speak this format (vLLM, TGI's Messages API, Ollama's ``/v1``,
llama.cpp, LiteLLM), so parsing tolerates their small variations.

Decisions:
- Only choice ``index`` 0 feeds the content stream. ``n > 1`` is rare in
  production, and mixing several choices would make one text no choice ever was
  and break the timing of the stream; usage still counts all choices.
- A ``refusal`` is content: it is what the user reads, it arrives at token pace
  (continuity), and a refusal where JSON was required is an invalid output.
- ``reasoning_content`` (vLLM, DeepSeek; ``reasoning`` on newer vLLM) is not content, like
  Anthropic thinking: it is timed (``ReasoningDelta``).
- A non-streamed body is complete by construction, so it ends with ``Done``.
"""

from __future__ import annotations

import dataclasses
import re
from abc import abstractmethod
from typing import Any

import orjson

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
    function_tools,
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
    ReasoningDelta,
    StreamError,
    ToolCallDelta,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StructureRequest

_FINISH = {"function_call": "tool_calls"}  # the deprecated functions API


def is_done_marker(data: str | bytes) -> bool:
    return data.strip() in ("[DONE]", b"[DONE]")


def stream_error(chunk: JsonObject) -> StreamError | None:
    """The error an OpenAI-style chunk or body carries, if any.

    OpenAI nests it (``{"error": {...}}``); older vLLM puts it at the top level
    (``{"object": "error", "type": ..., "code": 400}``).
    """
    error = chunk.get("error")
    if error is not None:
        return StreamError(error_type(error))
    if chunk.get("object") == "error":
        return StreamError(error_type(chunk))
    return None


def content_text(value: object) -> str:
    """Message content: a string, or (some compatible servers) a list of typed parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(
            opt_str(part, "text") or ""
            for part in objects(value)
            if opt_str(part, "type") == "text"
        )
    raise FrameError(SHAPE)


def finish_reason(choice: JsonObject) -> list[AdapterEvent]:
    reason = opt_str(choice, "finish_reason")
    if not reason:
        return []
    return [Finish(_FINISH.get(reason, reason))]


def token_text(chunk: JsonObject, model: str | None) -> str | None:
    """The text of a chunk that is one content token and nothing else, as nearly every chunk
    of a chat stream is; None for any other chunk, which the general walk reads.

    The answer is the one the walk gives (``[ContentDelta(text)]``): a chat chunk with no
    error, no usage and the model already reported, one choice (index 0, not finished)
    whose delta holds non-empty text content and no refusal, tool call or reasoning
    (``tests/collectors/adapters/test_openai_token.py`` holds the two together). Read in
    the running analysis process at 50 streams, the walk cost about 3 µs a chunk; this,
    about 1.
    """
    if chunk.get("object") != "chat.completion.chunk" or "error" in chunk:
        return None
    if chunk.get("usage") is not None:
        return None
    reported = chunk.get("model")
    if not (reported is None or reported == model):
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("finish_reason") is not None:
        return None
    index = choice.get("index")
    if not (index is None or (index == 0 and type(index) is int)) or "message" in choice:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict:
        return None
    text = delta.get("content")
    if type(text) is not str or not text:
        return None
    if len(delta) > 1 and (  # a delta of content alone, as most are, has nothing else to check
        delta.get("refusal") is not None
        or "tool_calls" in delta
        or "function_call" in delta
        or delta.get("reasoning_content")
        or delta.get("reasoning")
    ):
        return None
    return text


class _OpenAIAdapter(FrameAdapter):
    """What chat and legacy completions share: ``[DONE]``, errors, model, choice 0, usage."""

    # This runs once per token: each step below is skipped when its key is absent, which is
    # most chunks (measured: about 0.8 µs of the ~10 µs a chunk costs end to end).
    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        data = frame.data
        if data[:1] not in ("{", b"{") and is_done_marker(data):
            return [Done()]
        return self._events(load_object(data), frame.t)

    def _events(self, chunk: JsonObject, t: int) -> list[AdapterEvent]:
        """The events of one parsed chunk or body."""
        if "error" in chunk or chunk.get("object") == "error":
            error = stream_error(chunk)
            if error is not None:
                return [error]
        out: list[AdapterEvent] = []
        self._note_model(opt_str(chunk, "model"), out)
        raw_choices = opt_list(chunk, "choices")
        if raw_choices is None:
            raise FrameError(SHAPE)  # even the usage-only chunk has ``choices: []``
        choices = list(objects(raw_choices))
        for position, choice in enumerate(choices):
            index = opt_int(choice, "index")
            if (position if index is None else index) == 0:
                self._choice(choice, t, out)
        usage = opt_object(chunk, "usage") if chunk.get("usage") is not None else None
        if usage is not None:
            details = opt_object(usage, "completion_tokens_details") or {}
            out += usage_report(
                opt_int(usage, "prompt_tokens"),
                opt_int(usage, "completion_tokens"),
                opt_int(details, "reasoning_tokens"),
            )
        if self._is_body(chunk, choices):
            out.append(Done())
        return out

    @abstractmethod
    def _choice(self, choice: JsonObject, t: int, out: list[AdapterEvent]) -> None:
        """Append the events of choice 0."""

    @abstractmethod
    def _is_body(self, chunk: JsonObject, choices: list[JsonObject]) -> bool:
        """Whether this frame is a whole non-streamed response."""


class OpenAIChatAdapter(_OpenAIAdapter):
    """``/v1/chat/completions``, streamed or not."""

    def token(self, data: bytes) -> str | None:
        if data[:1] != b"{":  # so what parses is an object
            return None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None  # feed counts it
        return token_text(chunk, self._model)

    def _events(self, chunk: JsonObject, t: int) -> list[AdapterEvent]:
        text = token_text(chunk, self._model)
        if text is not None:
            return [ContentDelta(text, t)]
        return super()._events(chunk, t)

    def _choice(self, choice: JsonObject, t: int, out: list[AdapterEvent]) -> None:
        message = opt_object(choice, "delta")
        if message is None:
            message = opt_object(choice, "message")
        if message is not None:
            for key in ("content", "refusal"):
                value = message.get(key)
                text = content_text(value) if value is not None else ""
                if text:
                    out.append(ContentDelta(text, t))
            if "tool_calls" in message or "function_call" in message:
                out += _tool_calls(message, t)
            if message.get("reasoning_content") or message.get("reasoning"):
                out.append(ReasoningDelta(t))
        if choice.get("finish_reason") is not None:
            out += finish_reason(choice)

    def _is_body(self, chunk: JsonObject, choices: list[JsonObject]) -> bool:
        if chunk.get("object") == "chat.completion":
            return True
        return bool(choices) and any("message" in c for c in choices)


class OpenAICompletionsAdapter(_OpenAIAdapter):
    """Legacy ``/v1/completions`` (``choices[].text``), still served by vLLM and llama.cpp."""

    def _choice(self, choice: JsonObject, t: int, out: list[AdapterEvent]) -> None:
        text = opt_str(choice, "text")
        if text:
            out.append(ContentDelta(text, t))
        out += finish_reason(choice)

    def _is_body(self, chunk: JsonObject, choices: list[JsonObject]) -> bool:
        # Stream chunks and the body share ``object: text_completion``. Only a body has
        # both usage and a finished choice (bar vLLM's per-chunk usage, whose last chunk
        # then counts as the end a moment before its ``[DONE]``).
        return (
            isinstance(chunk.get("usage"), dict)
            and bool(choices)
            and all(c.get("finish_reason") for c in choices)
        )


def _tool_calls(message: JsonObject, t: int) -> list[AdapterEvent]:
    out: list[AdapterEvent] = []
    for position, call in enumerate(objects(opt_list(message, "tool_calls") or [])):
        index = opt_int(call, "index")
        # Streamed calls carry their index; a whole message lists them in order.
        delta = _tool_delta(position if index is None else index, call, t)
        if delta is not None:
            out.append(delta)
    function_call = opt_object(message, "function_call")
    if function_call is not None:
        delta = _tool_delta(0, {"function": function_call}, t)
        if delta is not None:
            out.append(delta)
    return out


def _tool_delta(index: int, call: JsonObject, t: int) -> ToolCallDelta | None:
    function = opt_object(call, "function") or {}
    call_id = opt_str(call, "id")
    name = opt_str(function, "name")
    arguments = _arguments(function.get("arguments"))
    if not (call_id or name or arguments):
        return None
    return ToolCallDelta(index=index, t=t, id=call_id, name=name, arguments=arguments)


def _arguments(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise FrameError(SHAPE)


# --- the request ----------------------------------------------------------------------------------


def read_chat_request(doc: dict[str, Any]) -> Reading:
    return chat_conversation(doc), _chat_structure(doc)


def read_completions_request(doc: dict[str, Any]) -> Reading:
    return _completions_conversation(doc), ()


def chat_conversation(doc: dict[str, Any]) -> Conversation:
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return UNUSABLE
    system: list[str] = []
    turns: list[Turn] = []
    for message in dicts(messages):
        role = message.get("role")
        text = text_of(message.get("content"))
        if role in ("system", "developer"):
            system.extend(opt(text))
        elif role in ("tool", "function"):
            turns.append(Turn(role="tool", text=None, extras=opt(text)))
        elif isinstance(role, str):
            turns.append(Turn(role=role, text=text))
    return split_turns(system, turns)


def _chat_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    response_format = doc.get("response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_object":
            found.append(StructureRequest("json_object"))
        elif kind == "json_schema":
            spec = dict_or_empty(response_format.get("json_schema"))
            found.append(schema_request("json_schema", spec.get("schema"), spec.get("name")))
    found.extend(function_tools(doc.get("tools")))
    # The deprecated ``functions`` parameter still reaches servers from older clients.
    for function in dicts(doc.get("functions")):
        found.append(schema_request("tool_input", function.get("parameters"), function.get("name")))
    return tuple(found)


def _completions_conversation(doc: dict[str, Any]) -> Conversation:
    # Legacy completions: the prompt is the query; a batch of prompts is scored by its last one.
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompt = prompt[-1]
    if not isinstance(prompt, str):
        return UNUSABLE
    return split_turns((), [Turn(role="user", text=prompt)])


# --- the provider ---------------------------------------------------------------------------------

# Azure OpenAI serves OpenAI's formats under its deployments (``/openai/deployments/{d}/...``)
# and always asks for an ``api-version``; its newer ``/openai/v1/`` paths without one are
# Groq's too, so a route names ``azure_openai_chat`` for them.
AZURE = re.compile(r"/openai/deployments/[^/]+/|[?&]api-version=")

_CHAT = Provider(
    name="openai_chat",
    adapter=OpenAIChatAdapter,
    read_request=read_chat_request,
    gen_ai_name="openai",
    suffixes=("/chat/completions",),
)
_COMPLETIONS = Provider(
    name="openai_completions",
    adapter=OpenAICompletionsAdapter,
    read_request=read_completions_request,
    gen_ai_name="openai",
    operation="text_completion",
    suffixes=("/completions",),
)


def on_azure(provider: Provider) -> Provider:
    """OpenAI's ``provider`` as Azure OpenAI serves it: the same format, Azure's paths."""
    return dataclasses.replace(
        provider, name=f"azure_{provider.name}", gen_ai_name="azure.ai.openai", platform=AZURE
    )


PROVIDERS = (_CHAT, _COMPLETIONS, on_azure(_CHAT), on_azure(_COMPLETIONS))
