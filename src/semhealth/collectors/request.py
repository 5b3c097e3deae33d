"""Request extraction: what a request body asks of the model, read once per request.

``extract_request`` turns a provider request body into ``RequestFacts`` (model,
stream flag, the user's query, the context the model was given, the output
structure it must follow) and the request's prompt class. It is sans-IO and never
raises on bad input: a body it cannot use becomes ``analysed=False`` with a
``skip_reason`` (``empty``, ``not_json``, ``shape``), filled as far as it could be.

Query and context, by provider convention:

- the query is the text of the last user message that has text; a user message
  holding only tool results (or only images) is passed over;
- the context is everything else the model was given, in request order: system
  and developer text first, then earlier and later turns, tool results and
  documents. Route overrides (``Extract``) replace either part with JSONPath.

Context texts are split into chunks for embedding; see ``chunk_text``.
Prompt and response text held here is never logged: errors name sizes only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

import orjson
from jsonpath_ng.ext import parse as _jsonpath_parse  # type: ignore[import-untyped]

from semhealth.collectors.config import Extract
from semhealth.collectors.record import RequestFacts, StructureRequest
from semhealth.common.text import CHARS_PER_TOKEN, estimate_tokens

CHUNK_CHARS = 1000
"""Default upper bound on the length of one context chunk, in characters."""

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_TOOL_OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})
_GEMINI_ROLES = {"user": "user", "model": "assistant", "function": "tool"}
_OPENAPI_DROPPED = frozenset({"nullable", "propertyOrdering", "example"})

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_PATH_MODEL = re.compile(
    r"/models/([^/:]+):[A-Za-z]+$"
    r"|/model/([^/]+)/(?:converse-stream|converse|invoke-with-response-stream|invoke)$"
)
_STREAMING_METHOD = re.compile(
    r":(?:streamGenerateContent|streamRawPredict)(?:\?|$)"
    r"|/(?:converse-stream|invoke-with-response-stream)(?:\?|$)"
)
# Split *after* a sentence end so each piece keeps its terminator.
_SENTENCE_END = re.compile("(?<=[.!?] )|(?<=[\u3002\uff01\uff1f\n])")


@dataclass(frozen=True, slots=True)
class _Turn:
    """One message, normalised: ``text`` may be the query; ``extras`` are always context."""

    role: str
    text: str | None
    extras: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Conversation:
    """What a provider's convention found; ``usable`` is False when its carrier was missing."""

    query: str | None
    context: tuple[str, ...]
    usable: bool


_UNUSABLE = _Conversation(query=None, context=(), usable=False)


# --- public entry points ----------------------------------------------------------------------


def extract_request(
    body: bytes,
    provider: str,
    extract: Extract,
    *,
    long_context_tokens: int,
    chunk_chars: int = CHUNK_CHARS,
    path: str = "",
) -> tuple[RequestFacts, str]:
    """Read one request body; return its facts and its prompt class.

    ``provider`` is one of ``config.PROVIDERS`` other than ``auto``; any other value
    gives ``skip_reason="shape"`` with only the route overrides applied. The prompt
    class is ``long_context`` when ``input_tokens_estimate >= long_context_tokens``,
    else ``short``.

    ``analysed`` is True exactly when ``skip_reason`` is None. ``shape`` means the
    body is JSON but not an object, or lacks what the provider's convention reads
    the conversation from (``messages``, ``input``, ``prompt``, ``inputs``); the
    other fields are still filled where the body allows. A route override for both
    query and context makes the provider's carrier unnecessary.
    """
    if not body.strip():
        return unanalysed("empty", long_context_tokens=long_context_tokens)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return unanalysed("not_json", body_bytes=len(body), long_context_tokens=long_context_tokens)
    if not isinstance(doc, dict):
        found = _apply_overrides(doc, extract, _UNUSABLE)
        return _facts(found, chunk_chars=chunk_chars, long_context_tokens=long_context_tokens)
    found, structure = _read_provider(provider, doc)
    found = _apply_overrides(doc, extract, found)
    return _facts(
        found,
        model=_nonempty_str(doc.get("model")) or model_from_path(path),
        stream=_stream_flag(provider, doc.get("stream"), path),
        structure=structure,
        chunk_chars=chunk_chars,
        long_context_tokens=long_context_tokens,
    )


def unanalysed(
    reason: str, *, body_bytes: int = 0, long_context_tokens: int | None = None
) -> tuple[RequestFacts, str]:
    """Facts for a body that was not read (``oversized`` is decided by the caller).

    Without the text, the token estimate falls back to ``body_bytes / 4`` (rounded
    up), the same ratio ``estimate_tokens`` uses for non-CJK text, so an oversized
    body still lands in ``long_context``. Without ``long_context_tokens`` the class
    is ``short``.
    """
    estimate = math.ceil(max(body_bytes, 0) / CHARS_PER_TOKEN)
    facts = RequestFacts(analysed=False, skip_reason=reason, input_tokens_estimate=estimate)
    return facts, _prompt_class(estimate, long_context_tokens)


def validate_jsonpath(expr: str) -> str | None:
    """Return why ``expr`` is not a valid JSONPath expression, or None when it is.

    For the config validator: the message names only the expression and the
    parser's position, never request content.
    """
    try:
        _jsonpath_parse(expr)
    except Exception as exc:  # jsonpath-ng raises several unrelated types for bad syntax
        return f"invalid JSONPath expression {expr!r}: {exc}"
    return None


def chunk_text(text: str, *, max_chars: int = CHUNK_CHARS) -> list[str]:
    """Split ``text`` into chunks of at most ``max_chars`` characters, for embedding.

    Paragraph boundaries (blank lines) come first. A paragraph longer than the
    limit is cut after sentence ends (``. ``, ``! ``, ``? ``, their CJK forms
    U+3002, U+FF01, U+FF1F, and newlines), and a sentence still longer than the
    limit is cut hard every ``max_chars`` characters. The pieces are then packed
    greedily, in order, into chunks up to the limit (paragraphs rejoined with a
    blank line). Chunks are stripped and never empty; their concatenation keeps
    every non-whitespace character of ``text`` in order.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, got {max_chars}")
    chunks: list[str] = []
    parts: list[str] = []  # the chunk being packed; joined once it is full
    size = 0
    for separator, piece in _pieces(text, max_chars):
        if parts and size + len(separator) + len(piece) <= max_chars:
            parts += (separator, piece)
            size += len(separator) + len(piece)
            continue
        if parts:
            chunks.append("".join(parts))
        parts, size = [piece], len(piece)
    if parts:
        chunks.append("".join(parts))
    return [chunk.strip() for chunk in chunks if chunk.strip()]


# --- assembling facts -------------------------------------------------------------------------


def _facts(
    found: _Conversation,
    *,
    model: str | None = None,
    stream: bool = False,
    structure: tuple[StructureRequest, ...] = (),
    chunk_chars: int,
    long_context_tokens: int,
) -> tuple[RequestFacts, str]:
    texts = [found.query] if found.query is not None else []
    texts.extend(found.context)
    estimate = estimate_tokens(texts)
    chunks = tuple(c for text in found.context for c in chunk_text(text, max_chars=chunk_chars))
    facts = RequestFacts(
        model=model,
        query=found.query,
        context=chunks,
        structure=structure,
        stream=stream,
        input_tokens_estimate=estimate,
        analysed=found.usable,
        skip_reason=None if found.usable else "shape",
    )
    return facts, _prompt_class(estimate, long_context_tokens)


def _prompt_class(estimate: int, long_context_tokens: int | None) -> str:
    if long_context_tokens is not None and estimate >= long_context_tokens:
        return "long_context"
    return "short"


def _stream_flag(provider: str, value: object, path: str) -> bool:
    if isinstance(value, bool):
        return value
    # Gemini and Bedrock say it in the method (the path), not in the body.
    if _STREAMING_METHOD.search(path):
        return True
    # Ollama streams unless told not to; every other API answers in one body by default.
    return provider == "ollama"


def model_from_path(path: str) -> str | None:
    """The model a path names, where the API puts it there and not in the body: Gemini's
    ``models/{model}:method``, Vertex AI's ``publishers/{p}/models/{model}:method`` and
    Bedrock's ``/model/{modelId}/converse`` (percent-decoded: ids hold ``:``)."""
    match = _PATH_MODEL.search(path.split("?", 1)[0])
    if match is None:
        return None
    return unquote(match.group(1) or match.group(2)) or None


def _read_provider(
    provider: str, doc: dict[str, Any]
) -> tuple[_Conversation, tuple[StructureRequest, ...]]:
    reader = _READERS.get(provider)
    return (_UNUSABLE, ()) if reader is None else reader(doc)


def _split_turns(system: Iterable[str], turns: Iterable[_Turn]) -> _Conversation:
    """Pick the last user turn with real text as the query; everything else is context."""
    turns = list(turns)
    query_at = next(
        (
            i
            for i in range(len(turns) - 1, -1, -1)
            if turns[i].role == "user" and _has_text(turns[i].text)
        ),
        None,
    )
    context = [text for text in system if _has_text(text)]
    for i, turn in enumerate(turns):
        context.extend(extra for extra in turn.extras if _has_text(extra))
        if i != query_at and turn.text is not None and _has_text(turn.text):
            context.append(turn.text)
    query = turns[query_at].text if query_at is not None else None
    return _Conversation(query=query, context=tuple(context), usable=True)


# --- OpenAI chat completions ------------------------------------------------------------------


def _openai_chat(doc: dict[str, Any]) -> _Conversation:
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return _UNUSABLE
    system: list[str] = []
    turns: list[_Turn] = []
    for message in _dicts(messages):
        role = message.get("role")
        text = _text_of(message.get("content"))
        if role in ("system", "developer"):
            system.extend(_opt(text))
        elif role in ("tool", "function"):
            turns.append(_Turn(role="tool", text=None, extras=_opt(text)))
        elif isinstance(role, str):
            turns.append(_Turn(role=role, text=text))
    return _split_turns(system, turns)


def _openai_chat_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    response_format = doc.get("response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_object":
            found.append(StructureRequest("json_object"))
        elif kind == "json_schema":
            spec = _dict_or_empty(response_format.get("json_schema"))
            found.append(_schema_request("json_schema", spec.get("schema"), spec.get("name")))
    found.extend(_function_tools(doc.get("tools")))
    # The deprecated ``functions`` parameter still reaches servers from older clients.
    for function in _dicts(doc.get("functions")):
        found.append(
            _schema_request("tool_input", function.get("parameters"), function.get("name"))
        )
    return tuple(found)


def _function_tools(tools: object) -> Iterator[StructureRequest]:
    """OpenAI-style ``tools[]`` (also Ollama's): ``{"type": "function", "function": {...}}``."""
    for tool in _dicts(tools):
        function = tool.get("function")
        if isinstance(function, dict):
            yield _schema_request("tool_input", function.get("parameters"), function.get("name"))


# --- OpenAI responses -------------------------------------------------------------------------


def _openai_responses(doc: dict[str, Any]) -> _Conversation:
    system = list(_opt(_text_of(doc.get("instructions"))))
    items = doc.get("input")
    if isinstance(items, str):
        return _split_turns(system, [_Turn(role="user", text=items)])
    if not isinstance(items, list):
        return _UNUSABLE
    turns: list[_Turn] = []
    for item in _dicts(items):
        kind = item.get("type")
        if kind in _TOOL_OUTPUT_ITEMS:
            turns.append(_Turn(role="tool", text=None, extras=_opt(_text_of(item.get("output")))))
        elif kind == "message" or (kind is None and "role" in item):
            role = item.get("role")
            text = _text_of(item.get("content"))
            if role in ("system", "developer"):
                system.extend(_opt(text))
            elif isinstance(role, str):
                turns.append(_Turn(role=role, text=text))
    return _split_turns(system, turns)


def _responses_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    fmt = _dict_or_empty(_dict_or_empty(doc.get("text")).get("format"))
    if fmt.get("type") == "json_object":
        found.append(StructureRequest("json_object"))
    elif fmt.get("type") == "json_schema":
        found.append(_schema_request("json_schema", fmt.get("schema"), fmt.get("name")))
    for tool in _dicts(doc.get("tools")):
        if tool.get("type") == "function":
            found.append(_schema_request("tool_input", tool.get("parameters"), tool.get("name")))
    return tuple(found)


# --- Anthropic messages -----------------------------------------------------------------------


def _anthropic(doc: dict[str, Any]) -> _Conversation:
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return _UNUSABLE
    system = _opt(_text_of(doc.get("system")))
    return _split_turns(system, (_anthropic_turn(m) for m in _dicts(messages)))


def _anthropic_turn(message: dict[str, Any]) -> _Turn:
    role = message.get("role")
    role = role if isinstance(role, str) else ""
    content = message.get("content")
    if not isinstance(content, list):
        return _Turn(role=role, text=_text_of(content))
    extras: list[str] = []
    for block in _dicts(content):
        kind = block.get("type")
        if kind == "tool_result":
            extras.extend(_opt(_text_of(block.get("content"))))
        elif kind == "document":
            extras.extend(_opt(_document_text(block.get("source"))))
    return _Turn(role=role, text=_text_of(content), extras=tuple(extras))


def _document_text(source: object) -> str | None:
    """Plain-text documents only: ``source.type`` ``text`` (``data``) or ``content`` (blocks)."""
    if not isinstance(source, dict):
        return None
    if source.get("type") == "text":
        data = source.get("data")
        return data if isinstance(data, str) else None
    if source.get("type") == "content":
        return _text_of(source.get("content"))
    return None


def _anthropic_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    # Server tools (web search, code execution, ...) carry no input_schema: the model
    # does not write their input as JSON for the client, so there is nothing to check.
    return tuple(
        _schema_request("tool_input", tool.get("input_schema"), tool.get("name"))
        for tool in _dicts(doc.get("tools"))
        if isinstance(tool.get("input_schema"), dict)
    )


# --- Google Gemini and Vertex AI --------------------------------------------------------------


def _gemini(doc: dict[str, Any]) -> _Conversation:
    contents = doc.get("contents")
    if not isinstance(contents, list):
        return _UNUSABLE
    system = _opt(_gemini_text(_dict_or_empty(doc.get("systemInstruction")).get("parts")))
    turns: list[_Turn] = []
    for content in _dicts(contents):
        role = content.get("role")
        parts = content.get("parts")
        extras = tuple(
            orjson.dumps(response).decode()
            for part in _dicts(parts)
            if (response := _dict_or_empty(part.get("functionResponse")).get("response"))
            is not None
        )
        # A content with no role is the user's (the API's own default).
        turns.append(
            _Turn(
                role=_GEMINI_ROLES.get(role if isinstance(role, str) else "user", "user"),
                text=_gemini_text(parts),
                extras=extras,
            )
        )
    return _split_turns(system, turns)


def _gemini_text(parts: object) -> str | None:
    """The text parts of a Gemini ``parts`` list joined by newlines; thoughts are not text."""
    texts = [
        part["text"]
        for part in _dicts(parts)
        if isinstance(part.get("text"), str) and not part.get("thought")
    ]
    return "\n".join(texts) if texts else None


def _gemini_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    config = _dict_or_empty(doc.get("generationConfig"))
    if config.get("responseMimeType") == "application/json":
        if isinstance(config.get("responseJsonSchema"), dict):
            found.append(_schema_request("json_schema", config["responseJsonSchema"], None))
        elif isinstance(config.get("responseSchema"), dict):
            converted = openapi_schema(config["responseSchema"])
            found.append(_schema_request("json_schema", converted, None))
        else:
            found.append(StructureRequest("json_object"))
    for tool in _dicts(doc.get("tools")):
        for function in _dicts(tool.get("functionDeclarations")):
            schema = function.get("parametersJsonSchema")
            if not isinstance(schema, dict) and isinstance(function.get("parameters"), dict):
                schema = openapi_schema(function["parameters"])
            found.append(_schema_request("tool_input", schema, function.get("name")))
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


# --- Amazon Bedrock -----------------------------------------------------------------------------


def _bedrock_converse(doc: dict[str, Any]) -> _Conversation:
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return _UNUSABLE
    system = _opt(_converse_text(doc.get("system")))
    turns: list[_Turn] = []
    for message in _dicts(messages):
        role = message.get("role")
        content = message.get("content")
        extras: list[str] = []
        for block in _dicts(content):
            result = block.get("toolResult")
            if isinstance(result, dict):
                extras.extend(_opt(_converse_text(result.get("content"))))
            document = _dict_or_empty(block.get("document"))
            source = _dict_or_empty(document.get("source"))
            extras.extend(_opt(_converse_text(source.get("content"))))
            extras.extend(_opt(_nonempty_str(source.get("text"))))
        turns.append(
            _Turn(
                role=role if isinstance(role, str) else "",
                text=_converse_text(content),
                extras=tuple(extras),
            )
        )
    return _split_turns(system, turns)


def _converse_text(blocks: object) -> str | None:
    """The ``text`` blocks of a Converse content list (``json`` blocks as their JSON)."""
    if isinstance(blocks, str):
        return blocks
    texts: list[str] = []
    for block in _dicts(blocks):
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif "json" in block:
            texts.append(orjson.dumps(block["json"]).decode())
    return "\n".join(texts) if texts else None


def _bedrock_converse_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    tools = _dict_or_empty(doc.get("toolConfig")).get("tools")
    found: list[StructureRequest] = []
    for tool in _dicts(tools):
        spec = tool.get("toolSpec")
        if isinstance(spec, dict):
            schema = _dict_or_empty(spec.get("inputSchema")).get("json")
            found.append(_schema_request("tool_input", schema, spec.get("name")))
    return tuple(found)


def _bedrock_invoke(doc: dict[str, Any]) -> tuple[_Conversation, tuple[StructureRequest, ...]]:
    """InvokeModel bodies are the model family's own: Anthropic Messages
    (``anthropic_version``), Nova (Converse's shape under ``messages``, ``system``) or a
    plain ``prompt`` (Llama, Mistral) / ``inputText`` (Titan)."""
    if "anthropic_version" in doc:
        return _anthropic(doc), _anthropic_structure(doc)
    if isinstance(doc.get("messages"), list):
        return _bedrock_converse(doc), _bedrock_converse_structure(doc)
    for key in ("prompt", "inputText"):
        if isinstance(doc.get(key), str):
            return _split_turns((), [_Turn(role="user", text=doc[key])]), ()
    return _UNUSABLE, ()


# --- Cohere -------------------------------------------------------------------------------------


def _cohere(doc: dict[str, Any]) -> _Conversation:
    found = _openai_chat(doc)
    if not found.usable:
        return found
    documents = (_cohere_document(d) for d in _list_or_empty(doc.get("documents")))
    context = tuple(text for text in documents if text is not None and _has_text(text))
    return _Conversation(query=found.query, context=found.context + context, usable=True)


def _cohere_document(document: object) -> str | None:
    """A document is a string, or ``{"data": {...}}`` / ``{"id", "data"}``: its string
    fields, in order."""
    if isinstance(document, str):
        return document
    data = _dict_or_empty(document).get("data", document)
    if isinstance(data, str):
        return data
    texts = [value for value in _dict_or_empty(data).values() if isinstance(value, str)]
    return "\n".join(texts) if texts else None


def _cohere_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    response_format = _dict_or_empty(doc.get("response_format"))
    if response_format.get("type") == "json_object":
        schema = response_format.get("json_schema")
        if isinstance(schema, dict):
            found.append(_schema_request("json_schema", schema, None))
        else:
            found.append(StructureRequest("json_object"))
    found.extend(_function_tools(doc.get("tools")))
    return tuple(found)


# --- Ollama and TGI ---------------------------------------------------------------------------


def _ollama(doc: dict[str, Any]) -> _Conversation:
    messages = doc.get("messages")
    if isinstance(messages, list):  # /api/chat
        return _openai_chat(doc)
    prompt = doc.get("prompt")
    if isinstance(prompt, str):  # /api/generate
        system = _opt(_text_of(doc.get("system")))
        return _split_turns(system, [_Turn(role="user", text=prompt)])
    return _UNUSABLE


def _ollama_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    found: list[StructureRequest] = []
    fmt = doc.get("format")
    if fmt == "json":
        found.append(StructureRequest("json_object"))
    elif isinstance(fmt, dict):
        found.append(StructureRequest("json_schema", schema=fmt))
    found.extend(_function_tools(doc.get("tools")))
    return tuple(found)


def _tgi(doc: dict[str, Any]) -> _Conversation:
    inputs = doc.get("inputs")
    if not isinstance(inputs, str):
        return _UNUSABLE
    return _split_turns((), [_Turn(role="user", text=inputs)])


def _openai_completions(doc: dict[str, Any]) -> _Conversation:
    # Legacy completions: the prompt is the query; a batch of prompts is scored by its last one.
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompt = prompt[-1]
    if not isinstance(prompt, str):
        return _UNUSABLE
    return _split_turns((), [_Turn(role="user", text=prompt)])


def _tgi_structure(doc: dict[str, Any]) -> tuple[StructureRequest, ...]:
    # TGI guidance: parameters.grammar = {"type": "json", "value": <JSON Schema>}.
    grammar = _dict_or_empty(_dict_or_empty(doc.get("parameters")).get("grammar"))
    if grammar.get("type") == "json":
        return (_schema_request("json_schema", grammar.get("value"), None),)
    return ()


# --- route overrides (JSONPath) ---------------------------------------------------------------


def _apply_overrides(doc: object, extract: Extract, found: _Conversation) -> _Conversation:
    """Replace the query and/or the context with the route's JSONPath matches."""
    query, context, usable = found.query, found.context, found.usable
    if extract.query is not None:
        matches = _jsonpath_values(extract.query, doc)
        query = _joined_strings(matches[0]) if matches else None
    if extract.context:
        context = tuple(
            text
            for expr in extract.context
            for value in _jsonpath_values(expr, doc)
            for text in _flat_strings(value)
            if _has_text(text)
        )
    # With both parts overridden the provider's carrier is not needed; a non-object
    # body stays unusable because model, stream and structure could not be read.
    if extract.query is not None and extract.context and isinstance(doc, dict):
        usable = True
    return _Conversation(query=query, context=context, usable=usable)


@lru_cache(maxsize=256)
def _compiled(expr: str) -> Any:
    """Parse once per expression (parsing costs ~30 ms); None when it does not parse."""
    try:
        return _jsonpath_parse(expr)
    except Exception:  # validated at config load; a bad one here just matches nothing
        return None


def _jsonpath_values(expr: str, doc: object) -> list[Any]:
    path = _compiled(expr)
    if path is None:
        return []
    try:
        return [match.value for match in path.find(doc)]
    except Exception:
        # Filters can meet values of any type (TypeError on comparisons) and deep
        # nesting exceeds the recursion limit; a request body must never raise here.
        return []


def _joined_strings(value: object) -> str | None:
    strings = _flat_strings(value)
    return "\n".join(strings) if strings else None


def _flat_strings(value: object) -> list[str]:
    """Strings in ``value``, itself or in (nested) lists, in order; iterative for deep bodies."""
    found: list[str] = []
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return found


# --- small readers ----------------------------------------------------------------------------


def _text_of(content: object) -> str | None:
    """A string, or the text parts of a content-part list joined by newlines; None if no text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [
        part["text"]
        for part in _dicts(content)
        if part.get("type") in _TEXT_PART_TYPES and isinstance(part.get("text"), str)
    ]
    return "\n".join(texts) if texts else None


def _pieces(text: str, max_chars: int) -> Iterator[tuple[str, str]]:
    """(separator, piece) pairs, each piece at most ``max_chars`` long."""
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        separator = "\n\n"
        for sentence in _sentences(paragraph, max_chars):
            yield separator, sentence
            separator = ""


def _sentences(paragraph: str, max_chars: int) -> Iterator[str]:
    if len(paragraph) <= max_chars:
        yield paragraph
        return
    for sentence in _SENTENCE_END.split(paragraph):
        for start in range(0, len(sentence), max_chars):
            yield sentence[start : start + max_chars]


def _schema_request(kind: str, schema: object, name: object) -> StructureRequest:
    return StructureRequest(
        kind,
        schema=schema if isinstance(schema, dict) else None,
        name=_nonempty_str(name),
    )


def _dicts(items: object) -> Iterator[dict[str, Any]]:
    """The objects in a JSON list, skipping anything else; nothing when it is not a list."""
    if isinstance(items, list):
        yield from (item for item in items if isinstance(item, dict))


def _list_or_empty(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict_or_empty(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _nonempty_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _opt(text: str | None) -> tuple[str, ...]:
    return (text,) if text is not None else ()


def _has_text(text: str | None) -> bool:
    return text is not None and text != "" and not text.isspace()


_Reader = Callable[[dict[str, Any]], tuple[_Conversation, tuple[StructureRequest, ...]]]

# How each provider of ``config.PROVIDERS`` (but ``auto``) carries query, context and the
# structured-output request; a test pins the keys to that list.
_READERS: dict[str, _Reader] = {
    "openai_chat": lambda doc: (_openai_chat(doc), _openai_chat_structure(doc)),
    "openai_completions": lambda doc: (_openai_completions(doc), ()),
    "openai_responses": lambda doc: (_openai_responses(doc), _responses_structure(doc)),
    "anthropic_messages": lambda doc: (_anthropic(doc), _anthropic_structure(doc)),
    "ollama": lambda doc: (_ollama(doc), _ollama_structure(doc)),
    "tgi": lambda doc: (_tgi(doc), _tgi_structure(doc)),
    "gemini": lambda doc: (_gemini(doc), _gemini_structure(doc)),
    "vertex_ai": lambda doc: (_gemini(doc), _gemini_structure(doc)),
    "bedrock_converse": lambda doc: (_bedrock_converse(doc), _bedrock_converse_structure(doc)),
    "bedrock_invoke": _bedrock_invoke,
    "cohere_chat": lambda doc: (_cohere(doc), _cohere_structure(doc)),
}
