"""Google Gemini wire format: the Gemini API and Vertex AI (``generateContent``).

Every frame is one ``GenerateContentResponse`` object: SSE ``data:`` events with
``alt=sse``, the elements of a streamed JSON array without it (``json_array`` framing),
or the one body of ``:generateContent``. An error is one ``{"error": {...}}`` object.

Decisions:
- Only candidate 0 feeds the content stream, as with OpenAI's choice 0.
- Parts marked ``thought`` are reasoning: timed, never content.
- ``executableCode`` and ``codeExecutionResult`` parts are run by Google, not by the
  caller: they are not the caller's tool calls and are never validated; each
  ``executableCode`` is one ``code_execution`` provider tool call. Search grounding counts
  one ``web_search`` per ``webSearchQueries`` entry, URL context one ``web_fetch`` per URL.
- A ``functionCall`` part is a tool call. Whole (``args``) it is one delta. Streamed
  (Gemini 3's ``partialArgs``: a JSON path and one typed value each, ``willContinue``
  until the last), the call's name comes first and its arguments are assembled here into
  one object, emitted when the call ends, so validity judges what the caller will run.
- Output tokens = ``candidatesTokenCount`` + ``thoughtsTokenCount``: every other provider
  (and the GenAI convention's output tokens) counts reasoning as output; the thoughts are
  also reported apart as reasoning tokens. Input = ``promptTokenCount`` (cached content
  included) + ``toolUsePromptTokenCount``.
- ``finishReason``: ``STOP`` -> ``stop``, ``MAX_TOKENS`` -> ``length``; the others
  (``SAFETY``, ``RECITATION``, ``MALFORMED_FUNCTION_CALL``, ...) pass through lowercased.
  A frame that carries a finish reason is the last: it is the stream's end marker.
- An error's kind is its ``status`` (``RESOURCE_EXHAUSTED``, ...), else its code.
- A prompt blocked before any candidate (``promptFeedback.blockReason``) finishes as
  ``content_filter``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import orjson

from semhealth.collectors.adapters.base import (
    SHAPE,
    FrameAdapter,
    FrameError,
    JsonObject,
    add_counts,
    as_object,
    dump_json,
    error_type,
    load_json,
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
    dict_or_empty,
    dicts,
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
    ProviderToolCall,
    ReasoningDelta,
    StreamError,
    ToolCallDelta,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StructureRequest

_FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}
# One step of a partialArgs JSON path: ``.name``, ``['name']`` or ``[0]``.
_PATH_STEP = re.compile(r"\.([A-Za-z_$][\w$-]*)|\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]")
_TYPED_VALUES = ("stringValue", "numberValue", "boolValue", "nullValue", "structValue")


class GeminiAdapter(FrameAdapter):
    def __init__(self) -> None:
        super().__init__()
        self._calls = 0  # function calls seen, in order: the tool index
        self._open: _StreamedCall | None = None  # a call whose arguments are still streaming
        self._searched = False
        self._fetched = False

    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        value = load_json(frame.data)
        # A whole streamed array framed as one body (``framing: json``): its elements in order.
        items = value if isinstance(value, list) else [value]
        out: list[AdapterEvent] = []
        for item in items:
            self._response(as_object(item), frame.t, out)
        return out

    def _response(self, obj: JsonObject, t: int, out: list[AdapterEvent]) -> None:
        if "error" in obj:
            # Google's canonical status (RESOURCE_EXHAUSTED), else the HTTP code.
            out.append(StreamError(error_type(obj.get("error"), keys=("status", "code"))))
            return
        self._note_model(opt_str(obj, "modelVersion"), out)
        finished = False
        candidates = opt_list(obj, "candidates") or []
        for position, candidate in enumerate(objects(candidates)):
            index = opt_int(candidate, "index")
            if (position if index is None else index) != 0:
                continue
            content = opt_object(candidate, "content") or {}
            for part in objects(opt_list(content, "parts") or []):
                self._part(part, t, out)
            self._grounding(candidate, out)
            reason = opt_str(candidate, "finishReason")
            if reason and reason != "FINISH_REASON_UNSPECIFIED":
                out.append(Finish(_FINISH.get(reason, reason.lower())))
                finished = True
        feedback = opt_object(obj, "promptFeedback")
        if feedback is not None and opt_str(feedback, "blockReason") and not candidates:
            out.append(Finish("content_filter"))
            finished = True
        usage = opt_object(obj, "usageMetadata")
        if usage is not None:
            thoughts = opt_int(usage, "thoughtsTokenCount")
            out += usage_report(
                add_counts(
                    opt_int(usage, "promptTokenCount"), opt_int(usage, "toolUsePromptTokenCount")
                ),
                add_counts(opt_int(usage, "candidatesTokenCount"), thoughts),
                thoughts,
            )
        if finished:
            out.extend(self._close_call(t))
            out.append(Done())

    def _part(self, part: JsonObject, t: int, out: list[AdapterEvent]) -> None:
        call = opt_object(part, "functionCall")
        if call is not None:
            out.extend(self._function_call(call, t))
            return
        if opt_object(part, "executableCode") is not None:
            out.append(ProviderToolCall("code_execution"))
            return
        text = opt_str(part, "text")
        if not text:
            return
        if opt_bool(part, "thought"):
            out.append(ReasoningDelta(t))
        else:
            out.append(ContentDelta(text, t))

    def _grounding(self, candidate: JsonObject, out: list[AdapterEvent]) -> None:
        """Google Search and URL context, run by Google: one search per query, one fetch per
        URL. Their metadata may repeat on later chunks; the first that carries it counts."""
        if not self._searched:
            grounding = opt_object(candidate, "groundingMetadata") or {}
            queries = opt_list(grounding, "webSearchQueries") or []
            out.extend(ProviderToolCall("web_search") for _ in queries)
            self._searched = bool(queries)
        if not self._fetched:
            context = opt_object(candidate, "urlContextMetadata") or {}
            urls = opt_list(context, "urlMetadata") or []
            out.extend(ProviderToolCall("web_fetch") for _ in urls)
            self._fetched = bool(urls)

    def _function_call(self, call: JsonObject, t: int) -> list[AdapterEvent]:
        name = opt_str(call, "name")
        partial = opt_list(call, "partialArgs")
        continues = bool(opt_bool(call, "willContinue"))
        out: list[AdapterEvent] = []
        if self._open is not None and name is not None:
            out += self._close_call(t)  # a new call's name ends the one before
        if self._open is None and (partial is not None or continues):
            self._open = _StreamedCall(self._calls)
            self._calls += 1
            out.append(
                ToolCallDelta(index=self._open.index, t=t, id=opt_str(call, "id"), name=name)
            )
        if self._open is not None:
            for arg in objects(partial or []):
                self._open.apply(arg)
            if not continues:
                out += self._close_call(t)
            return out
        # A whole call: name and arguments in one part.
        args = call.get("args")
        index = self._calls
        self._calls += 1
        out.append(
            ToolCallDelta(
                index=index,
                t=t,
                id=opt_str(call, "id"),
                name=name,
                arguments=dump_json(args if args is not None else {}),
            )
        )
        return out

    def _close_call(self, t: int) -> list[AdapterEvent]:
        call, self._open = self._open, None
        if call is None:
            return []
        return [ToolCallDelta(index=call.index, t=t, arguments=dump_json(call.args))]


class _StreamedCall:
    """One function call whose arguments arrive as ``partialArgs``."""

    __slots__ = ("args", "continuing", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.args: dict[str, Any] = {}
        self.continuing: str | None = None  # the path whose string value is still streaming

    def apply(self, arg: JsonObject) -> None:
        path = opt_str(arg, "jsonPath")
        if path is None:
            raise FrameError(SHAPE)
        steps = _path_steps(path)
        value = _typed_value(arg)
        if isinstance(value, str) and self.continuing == path:
            value = _get(self.args, steps) + value
        _set(self.args, steps, value)
        self.continuing = path if opt_bool(arg, "willContinue") else None


def _typed_value(arg: JsonObject) -> Any:
    for key in _TYPED_VALUES:
        if key in arg:
            return None if key == "nullValue" else arg[key]
    return None


def _path_steps(path: str) -> list[str | int]:
    """``$.a.b[0]['c']`` -> ``["a", "b", 0, "c"]``; anything else is a malformed frame."""
    if not path.startswith("$"):
        raise FrameError(SHAPE)
    steps: list[str | int] = []
    at = 1
    while at < len(path):
        match = _PATH_STEP.match(path, at)
        if match is None:
            raise FrameError(SHAPE)
        name, quoted, index = match.groups()
        if index is not None:
            steps.append(int(index))
        else:
            steps.append(name if name is not None else re.sub(r"\\(.)", r"\1", quoted))
        at = match.end()
    if not steps:
        raise FrameError(SHAPE)  # the arguments object itself is never a partial value
    return steps


def _set(root: dict[str, Any], steps: list[str | int], value: Any) -> None:
    node: Any = root
    for step, after in zip(steps, [*steps[1:], None], strict=True):
        if after is None:
            _put(node, step, value)
            return
        child = _child(node, step)
        if child is None:
            child = [] if isinstance(after, int) else {}
            _put(node, step, child)
        node = child


def _get(root: dict[str, Any], steps: list[str | int]) -> str:
    node: Any = root
    for step in steps:
        node = _child(node, step)
    return node if isinstance(node, str) else ""


def _child(node: Any, step: str | int) -> Any:
    if isinstance(step, int):
        if not isinstance(node, list):
            raise FrameError(SHAPE)
        return node[step] if step < len(node) else None
    if not isinstance(node, dict):
        raise FrameError(SHAPE)
    return node.get(step)


def _put(node: Any, step: str | int, value: Any) -> None:
    if isinstance(step, int):
        if not isinstance(node, list) or step > len(node):
            raise FrameError(SHAPE)  # arrays fill in order
        if step == len(node):
            node.append(value)
        else:
            node[step] = value
    elif isinstance(node, dict):
        node[step] = value
    else:
        raise FrameError(SHAPE)


# --- the request ----------------------------------------------------------------------------------


def read_request(doc: dict[str, Any]) -> Reading:
    return _conversation(doc), _structure(doc)


_ROLES = {"user": "user", "model": "assistant", "function": "tool"}


_OPENAPI_DROPPED = frozenset({"nullable", "propertyOrdering", "example"})


def _conversation(doc: dict[str, Any]) -> Conversation:
    contents = doc.get("contents")
    if not isinstance(contents, list):
        return UNUSABLE
    system = opt(_text(dict_or_empty(doc.get("systemInstruction")).get("parts")))
    turns: list[Turn] = []
    for content in dicts(contents):
        role = content.get("role")
        parts = content.get("parts")
        extras = tuple(
            orjson.dumps(response).decode()
            for part in dicts(parts)
            if (response := dict_or_empty(part.get("functionResponse")).get("response")) is not None
        )
        # A content with no role is the user's (the API's own default).
        turns.append(
            Turn(
                role=_ROLES.get(role if isinstance(role, str) else "user", "user"),
                text=_text(parts),
                extras=extras,
            )
        )
    return split_turns(system, turns)


def _text(parts: object) -> str | None:
    """The text parts of a Gemini ``parts`` list joined by newlines; thoughts are not text."""
    texts = [
        part["text"]
        for part in dicts(parts)
        if isinstance(part.get("text"), str) and not part.get("thought")
    ]
    return "\n".join(texts) if texts else None


def _structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    config = dict_or_empty(doc.get("generationConfig"))
    if config.get("responseMimeType") == "application/json":
        if isinstance(config.get("responseJsonSchema"), dict):
            found.append(schema_request("json_schema", config["responseJsonSchema"], None))
        elif isinstance(config.get("responseSchema"), dict):
            converted = openapi_schema(config["responseSchema"])
            found.append(schema_request("json_schema", converted, None))
        else:
            found.append(StructureRequest("json_object"))
    for tool in dicts(doc.get("tools")):
        for function in dicts(tool.get("functionDeclarations")):
            schema = function.get("parametersJsonSchema")
            if not isinstance(schema, dict) and isinstance(function.get("parameters"), dict):
                schema = openapi_schema(function["parameters"])
            found.append(schema_request("tool_input", schema, function.get("name")))
    return tuple(found)


def openapi_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Gemini's ``Schema`` (an OpenAPI 3.0 subset with upper-case types) as JSON Schema.

    Types are lower-cased, ``nullable`` becomes a ``null`` type, ``anyOf``, ``properties``
    and ``items`` are converted in turn, and the keys JSON Schema does not know
    (``propertyOrdering``, ``example``) are dropped. Iterative: bodies can nest deeply.
    """
    root: dict[str, Any] = {}
    stack: list[tuple[dict[str, Any], dict[str, Any]]] = [(schema, root)]
    while stack:
        source, target = stack.pop()
        for key, value in source.items():
            if key in _OPENAPI_DROPPED:
                continue
            if key == "type" and isinstance(value, str):
                target["type"] = value.lower()
            elif key == "properties" and isinstance(value, dict):
                target[key] = {name: {} for name in value}
                stack += [
                    (sub, target[key][name]) for name, sub in value.items() if isinstance(sub, dict)
                ]
            elif key in ("items", "not") and isinstance(value, dict):
                target[key] = {}
                stack.append((value, target[key]))
            elif key in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
                target[key] = [{} for _ in value]
                stack += [
                    (sub, slot)
                    for sub, slot in zip(value, target[key], strict=True)
                    if isinstance(sub, dict)
                ]
            else:
                target[key] = value
        if source.get("nullable") is True and isinstance(target.get("type"), str):
            target["type"] = [target["type"], "null"]
    return root


# --- the provider ---------------------------------------------------------------------------------

# Vertex AI's Gemini paths: /v1/projects/{p}/locations/{l}/publishers/google/models/{m}:...
_VERTEX = re.compile(r"/projects/[^/]+/locations/[^/]+/publishers/google/models/")

_GEMINI = Provider(
    name="gemini",
    adapter=GeminiAdapter,
    read_request=read_request,
    gen_ai_name="gcp.gemini",
    suffixes=(":streamGenerateContent", ":generateContent"),
)

PROVIDERS = (
    _GEMINI,
    dataclasses.replace(_GEMINI, name="vertex_ai", gen_ai_name="gcp.vertex_ai", platform=_VERTEX),
)
