"""The conversation a GenAI span recorded, read from whichever form the instrumentation used.

Forms, in the order they are preferred when a span carries several:

1. current conventions: ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON strings
   on spans, structured values on the ``gen_ai.client.inference.operation.details`` event) of
   ``{"role", "parts": [{"type": "text", "content"}, {"type": "tool_call", ...},
   {"type": "tool_call_response", "response"}], "finish_reason"}``, and
   ``gen_ai.system_instructions`` (a list of parts);
2. OpenLLMetry's indexed attributes: ``gen_ai.prompt.N.role`` / ``.content`` /
   ``.tool_calls.M.{id,name,arguments}`` and ``gen_ai.completion.N.*`` with ``.finish_reason``;
3. OpenLIT's flattened strings: ``gen_ai.prompt`` ("role: content" lines) and
   ``gen_ai.completion`` (the answer's text), as attributes or on the ``gen_ai.content.prompt``
   / ``gen_ai.content.completion`` span events;
4. the older events: ``gen_ai.{system,user,assistant,tool}.message`` with ``{"content"}`` and
   ``gen_ai.choice`` with ``{"index", "finish_reason", "message": {"content", "tool_calls"}}``.

Input and output are read separately, so a span may give its output in one form and its input
in another. Nothing here raises on a bad value: what cannot be read is counted in ``Problems``
and left out. Text read here is never logged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from semhealth.agent.otlp import conventions as c
from semhealth.agent.otlp.conventions import OVERSIZED, Problems
from semhealth.collectors import ToolCall


@dataclass(slots=True)
class Turn:
    """One input message: ``text`` may be the query; ``extras`` (tool results) are context."""

    role: str
    text: str | None
    extras: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Choice:
    """One output message (choice) of the model."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(slots=True)
class SpanEvent:
    """A GenAI event tied to the span: a span event or a log record with its span context."""

    name: str
    time_ns: int
    attributes: dict[str, Any]
    body: Any = None


@dataclass(slots=True)
class Conversation:
    """``turns`` None: no input was recorded; ``choices`` None: no output was recorded."""

    system: list[str] = field(default_factory=list)
    turns: list[Turn] | None = None
    choices: list[Choice] | None = None
    input_oversized: bool = False  # an input message value was too large to read
    output_oversized: bool = False  # an output message value was too large to read


_OUTPUT_KEYS = frozenset({c.OUTPUT_MESSAGES, c.OPENLIT_COMPLETION})


def _is_output_key(key: str) -> bool:
    return key in _OUTPUT_KEYS or key.startswith(c.COMPLETION_PREFIX)


def read_conversation(
    attrs: Mapping[str, Any], events: Iterable[SpanEvent], problems: Problems
) -> Conversation:
    """The conversation of one span, from its attributes (already merged with the
    operation-details event's) and its other GenAI events."""
    events = list(events)
    found = Conversation()
    oversized = [k for k, v in attrs.items() if v is OVERSIZED]
    found.output_oversized = any(_is_output_key(k) for k in oversized)
    found.input_oversized = any(not _is_output_key(k) for k in oversized)
    found.system = _texts_of_parts(_decoded(attrs.get(c.SYSTEM_INSTRUCTIONS), problems))
    found.turns = (
        _current_input(attrs, problems)
        or _openllmetry_input(attrs, problems)
        or _openlit_input(attrs, events)
        or _event_input(events, problems)
    )
    found.choices = (
        _current_output(attrs, problems)
        or _openllmetry_output(attrs, problems)
        or _openlit_output(attrs, events)
        or _event_output(events, problems)
    )
    return found


# --- 1. current conventions -------------------------------------------------------------------


def _current_input(attrs: Mapping[str, Any], problems: Problems) -> list[Turn] | None:
    messages = _decoded(attrs.get(c.INPUT_MESSAGES), problems)
    if messages is None:
        return None
    if not isinstance(messages, list):
        problems.add("wrong_type")
        return None
    turns: list[Turn] = []
    for message in _dicts(messages, problems):
        role = _str(message.get("role")) or "user"
        parts = message.get("parts")
        if not isinstance(parts, list):  # some emitters keep a plain "content"
            turns.append(Turn(role, _content_text(message.get("content"))))
            continue
        texts = _texts_of_parts(parts)
        extras = [
            _as_text(part.get("response"))
            for part in _dicts(parts, problems)
            if part.get("type") == "tool_call_response"
        ]
        turns.append(Turn(role, "\n".join(texts) if texts else None, [e for e in extras if e]))
    return turns


def _current_output(attrs: Mapping[str, Any], problems: Problems) -> list[Choice] | None:
    messages = _decoded(attrs.get(c.OUTPUT_MESSAGES), problems)
    if messages is None:
        return None
    if not isinstance(messages, list):
        problems.add("wrong_type")
        return None
    choices: list[Choice] = []
    for message in _dicts(messages, problems):
        parts = message.get("parts")
        parts = parts if isinstance(parts, list) else []
        requests = [p for p in _dicts(parts, problems) if p.get("type") == "tool_call"]
        calls = [
            _tool_call(i, part.get("id"), part.get("name"), part.get("arguments"))
            for i, part in enumerate(requests)
        ]
        choices.append(
            Choice(
                text="".join(_texts_of_parts(parts)),
                tool_calls=calls,
                finish_reason=_str(message.get("finish_reason")),
            )
        )
    return choices


# --- 2. OpenLLMetry's indexed attributes --------------------------------------------------


def _indexed(attrs: Mapping[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """``prefix``N.rest attributes as {N: {rest: value}}, for N a decimal index."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix) :].partition(".")
        if index.isdecimal() and rest:
            found.setdefault(int(index), {})[rest] = value
    return found


def _openllmetry_input(attrs: Mapping[str, Any], problems: Problems) -> list[Turn] | None:
    prompts = _indexed(attrs, c.PROMPT_PREFIX)
    if not prompts:
        return None
    turns: list[Turn] = []
    for _, fields in sorted(prompts.items()):
        role = _str(fields.get("role")) or "user"
        text = _legacy_content(fields.get("content"), problems)
        if role == "tool":
            turns.append(Turn(role, None, [text] if text else []))
        else:
            turns.append(Turn(role, text))
    return turns


def _openllmetry_output(attrs: Mapping[str, Any], problems: Problems) -> list[Choice] | None:
    completions = _indexed(attrs, c.COMPLETION_PREFIX)
    if not completions:
        return None
    choices: list[Choice] = []
    for _, fields in sorted(completions.items()):
        calls = _indexed(fields, "tool_calls.")
        tool_calls = [
            _tool_call(i, call.get("id"), call.get("name"), call.get("arguments"))
            for i, (_, call) in enumerate(sorted(calls.items()))
        ]
        if not tool_calls and "function_call.name" in fields:
            tool_calls.append(
                _tool_call(
                    0, None, fields.get("function_call.name"), fields.get("function_call.arguments")
                )
            )
        choices.append(
            Choice(
                text=_legacy_content(fields.get("content"), problems) or "",
                tool_calls=tool_calls,
                finish_reason=_str(fields.get("finish_reason")),
            )
        )
    return choices


def _legacy_content(value: Any, problems: Problems) -> str | None:
    """A content attribute: text, or a JSON list of content parts that OpenLLMetry dumped."""
    if not isinstance(value, str):
        if value is not None and value is not OVERSIZED:
            problems.add("wrong_type")
        return None
    if value.startswith("[{"):
        try:
            parts = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        texts = _texts_of_parts(parts) if isinstance(parts, list) else []
        return "\n".join(texts) if texts else None
    return value


# --- 3. OpenLIT's flattened strings -------------------------------------------------------

_ROLE_LINE = re.compile(r"^(system|developer|user|assistant|tool|function): ", re.MULTILINE)


def _openlit_input(attrs: Mapping[str, Any], events: list[SpanEvent]) -> list[Turn] | None:
    prompt = _openlit_value(attrs, events, c.OPENLIT_PROMPT, c.OPENLIT_PROMPT_EVENT)
    if prompt is None:
        return None
    # "role: content" per message, joined by newlines; a line that does not open with a role
    # continues the message before it. Text without any role line is one user message.
    starts = list(_ROLE_LINE.finditer(prompt))
    if not starts:
        return [Turn("user", prompt)]
    turns: list[Turn] = []
    for match, after in zip(starts, [*starts[1:], None], strict=True):
        end = after.start() - 1 if after is not None else len(prompt)
        text = prompt[match.end() : max(end, match.end())]
        role = match.group(1)
        tool = role in ("tool", "function")
        turns.append(Turn("tool", None, [text]) if tool else Turn(role, text))
    return turns


def _openlit_output(attrs: Mapping[str, Any], events: list[SpanEvent]) -> list[Choice] | None:
    completion = _openlit_value(attrs, events, c.OPENLIT_COMPLETION, c.OPENLIT_COMPLETION_EVENT)
    return None if completion is None else [Choice(text=completion)]


def _openlit_value(
    attrs: Mapping[str, Any], events: list[SpanEvent], key: str, event_name: str
) -> str | None:
    value = attrs.get(key)
    if isinstance(value, str):
        return value
    for event in events:
        if event.name == event_name and isinstance(event.attributes.get(key), str):
            return str(event.attributes[key])
    return None


# --- 4. the older events ----------------------------------------------------------------------


def _event_input(events: list[SpanEvent], problems: Problems) -> list[Turn] | None:
    turns: list[Turn] = []
    for event in sorted(events, key=lambda e: e.time_ns):
        role = c.MESSAGE_EVENTS.get(event.name)
        if role is None:
            continue
        body = event.body if isinstance(event.body, dict) else {}
        if event.body is not None and not isinstance(event.body, dict):
            problems.add("wrong_type")
        text = _content_text(body.get("content"))
        extras = [text] if text else []
        turns.append(Turn(role, None, extras) if role == "tool" else Turn(role, text))
    return turns or None


def _event_output(events: list[SpanEvent], problems: Problems) -> list[Choice] | None:
    bodies = [e.body for e in events if e.name == c.CHOICE_EVENT]
    if not bodies:
        return None
    choices: dict[int, Choice] = {}
    for body in bodies:
        if not isinstance(body, dict):
            if body is not None:  # None: the body was not recorded
                problems.add("wrong_type")
            continue
        index = body.get("index")
        message = body.get("message")
        message = message if isinstance(message, dict) else {}
        calls = []
        for i, call in enumerate(_dicts(message.get("tool_calls"), problems)):
            function = _dict(call.get("function"))
            calls.append(
                _tool_call(i, call.get("id"), function.get("name"), function.get("arguments"))
            )
        choices[index if isinstance(index, int) else len(choices)] = Choice(
            text=_content_text(message.get("content")) or "",
            tool_calls=calls,
            finish_reason=_str(body.get("finish_reason")),
        )
    return [choice for _, choice in sorted(choices.items())] or None


# --- tools and structure ------------------------------------------------------------------


def tool_definitions(attrs: Mapping[str, Any], problems: Problems) -> list[dict[str, Any]]:
    """Declared tools as OpenAI chat ``tools[]`` entries, from the current attribute or
    OpenLLMetry's ``llm.request.functions.N.*``."""
    declared = _decoded(attrs.get(c.TOOL_DEFINITIONS), problems)
    tools: list[dict[str, Any]] = []
    if isinstance(declared, list):
        for tool in _dicts(declared, problems):
            function = _dict(tool.get("function")) or tool
            tools.append(_function_tool(function.get("name"), function.get("parameters")))
    elif declared is not None:
        problems.add("wrong_type")
    for _, fields in sorted(_indexed(attrs, c.FUNCTIONS_PREFIX).items()):
        parameters = _decoded(fields.get("parameters"), problems)
        tools.append(_function_tool(fields.get("name"), parameters))
    return tools


def _function_tool(name: Any, parameters: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name if isinstance(name, str) else None}
    if isinstance(parameters, dict):
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def response_format(attrs: Mapping[str, Any], problems: Problems) -> dict[str, Any] | None:
    """The structure the output had to have, as an OpenAI chat ``response_format``."""
    schema = _decoded(attrs.get(c.STRUCTURED_OUTPUT_SCHEMA), problems)
    if isinstance(schema, dict):
        # OpenLLMetry writes a schema, or for a plain response_format the object itself.
        kind = schema.get("type")
        if kind == "json_object":
            return {"type": "json_object"}
        if kind == "json_schema":
            inner = _dict(schema.get("json_schema"))
            if not inner:
                return {"type": "json_object"}
            return {"type": "json_schema", "json_schema": inner}
        if kind != "text":
            return {"type": "json_schema", "json_schema": {"schema": schema}}
    if attrs.get(c.OUTPUT_TYPE) == "json":
        return {"type": "json_object"}
    if attrs.get(c.OPENAI_RESPONSE_FORMAT) in ("json_object", "json_schema"):
        return {"type": "json_object"}  # the schema itself was not recorded
    return None


# --- small readers ----------------------------------------------------------------------------


def _decoded(value: Any, problems: Problems) -> Any:
    """A structured value as is; a JSON string decoded; None for absent or oversized."""
    if value is None or value is OVERSIZED:
        return None
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            problems.add("bad_json")
            return None
    if isinstance(value, list | dict):
        return value
    problems.add("wrong_type")
    return None


def _texts_of_parts(parts: Any) -> list[str]:
    """Text of the ``text`` parts of a parts list (or a bare string)."""
    if isinstance(parts, str):
        return [parts]
    if not isinstance(parts, list):
        return []
    texts = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") == "text":
            text = part.get("content", part.get("text"))
            if isinstance(text, str):
                texts.append(text)
        elif isinstance(part, str):
            texts.append(part)
    return texts


def _content_text(content: Any) -> str | None:
    """A message ``content``: a string, or a list of OpenAI-style content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            p.get("text") or p.get("content")
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        ]
        strings = [t for t in texts if isinstance(t, str)]
        return "\n".join(strings) if strings else None
    return None


def _tool_call(index: int, call_id: Any, name: Any, arguments: Any) -> ToolCall:
    return ToolCall(index=index, id=_str(call_id), name=_str(name), arguments=_as_text(arguments))


def _as_text(value: Any) -> str:
    """Text as is; a structured value (parsed arguments, a tool's JSON result) as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, default=lambda _: None).decode()  # bytes read as null


def _dicts(items: Any, problems: Problems) -> list[dict[str, Any]]:
    if not isinstance(items, list):
        return []
    found = [item for item in items if isinstance(item, dict)]
    if len(found) != len(items):
        problems.add("wrong_type")
    return found


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
