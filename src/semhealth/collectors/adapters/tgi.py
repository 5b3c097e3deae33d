"""Hugging Face text-generation-inference native wire format.

Streaming (``/generate_stream``): SSE ``data:`` events, one per token,
``{"token": {"id", "text", "special"}, "generated_text": null, "details": null}``;
the last carries the whole ``generated_text`` and ``details`` (finish reason,
token counts). Non-streamed (``/generate``): ``{"generated_text", "details"}``,
or a list of those from the ``/`` route. Errors:
``{"error": "<message>", "error_type": "validation" | "generation" | ...}``.
(TGI's ``/v1/chat/completions`` speaks OpenAI and uses that adapter.)

Decisions:
- Special tokens (``</s>``, ``<|eot_id|>``) are not content: the user never sees them.
- TGI has no end marker of its own; the token event that carries ``details``
  (or ``generated_text``) is the last one, so it counts as ``Done``.
- A list body feeds only its first item, as only choice 0 does for OpenAI.
- ``eos_token`` and ``stop_sequence`` finish as ``stop``. TGI does not name the
  model in its responses, so there is no ``ModelReport``.
"""

from __future__ import annotations

from typing import Any

from semhealth.collectors.adapters.base import (
    SHAPE,
    FrameAdapter,
    FrameError,
    JsonObject,
    as_object,
    error_type,
    load_json,
    opt_bool,
    opt_int,
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
    schema_request,
    split_turns,
)
from semhealth.collectors.adapters.provider import Provider
from semhealth.collectors.events import AdapterEvent, ContentDelta, Done, Finish, StreamError
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StructureRequest

_FINISH = {"eos_token": "stop", "stop_sequence": "stop"}


class TGIAdapter(FrameAdapter):
    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        value: Any = load_json(frame.data)
        if isinstance(value, list):
            if not value:
                return [Done()]  # a batch of nothing is still a complete body
            value = value[0]
        obj = as_object(value)
        if obj.get("error") is not None:
            # The message may quote the prompt; error_type is TGI's class for it.
            return [StreamError(error_type({"type": obj.get("error_type")}))]
        if "token" in obj:
            return _token_event(obj, frame.t)
        if "generated_text" in obj:
            return _body(obj, frame.t)
        raise FrameError(SHAPE)


def _token_event(obj: JsonObject, t: int) -> list[AdapterEvent]:
    out: list[AdapterEvent] = []
    token = opt_object(obj, "token") or {}
    text = opt_str(token, "text")
    if text and not opt_bool(token, "special"):
        out.append(ContentDelta(text, t))
    details = opt_object(obj, "details")
    if details is not None:
        out += _details(details)
    if details is not None or opt_str(obj, "generated_text") is not None:
        out.append(Done())
    return out


def _body(obj: JsonObject, t: int) -> list[AdapterEvent]:
    out: list[AdapterEvent] = []
    text = opt_str(obj, "generated_text")
    if text:
        out.append(ContentDelta(text, t))
    out += _details(opt_object(obj, "details") or {})
    out.append(Done())
    return out


def _details(details: JsonObject) -> list[AdapterEvent]:
    out: list[AdapterEvent] = []
    reason = opt_str(details, "finish_reason")
    if reason:
        out.append(Finish(_FINISH.get(reason, reason)))
    # Newer TGI streams send ``input_length``; some builds and proxies say ``prompt_tokens``.
    prompt = opt_int(details, "prompt_tokens")
    if prompt is None:
        prompt = opt_int(details, "input_length")
    out += usage_report(prompt, opt_int(details, "generated_tokens"))
    return out


# --- the request ----------------------------------------------------------------------------------


def read_request(doc: dict[str, Any]) -> Reading:
    return _conversation(doc), _structure(doc)


def _conversation(doc: dict[str, Any]) -> Conversation:
    inputs = doc.get("inputs")
    if not isinstance(inputs, str):
        return UNUSABLE
    return split_turns((), [Turn(role="user", text=inputs)])


def _structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    # TGI guidance: parameters.grammar = {"type": "json", "value": <JSON Schema>}.
    grammar = dict_or_empty(dict_or_empty(doc.get("parameters")).get("grammar"))
    if grammar.get("type") == "json":
        return (schema_request("json_schema", grammar.get("value"), None),)
    return ()


# --- the provider ---------------------------------------------------------------------------------

PROVIDERS = (
    Provider(
        name="tgi",
        adapter=TGIAdapter,
        read_request=read_request,
        gen_ai_name="tgi",  # not among the conventions' values: named as it is
        operation="text_completion",
        suffixes=("/generate_stream", "/generate"),
    ),
)
