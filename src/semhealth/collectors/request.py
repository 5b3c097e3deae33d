"""Request extraction: what a request body asks of the model, read once per request.

``extract_request`` turns a provider request body into ``RequestFacts`` (model,
stream flag, the user's query, the context the model was given, the output
structure it must follow) and the request's prompt class. It is sans-IO and never
raises on bad input: a body it cannot use becomes ``analysed=False`` with a
``skip_reason`` (``empty``, ``not_json``, ``shape``), filled as far as it could be.

Query and context are read by each provider's own reader, by the convention in
``semhealth.collectors.adapters.conversation``; route overrides (``Extract``) replace
either part with JSONPath.

Context texts are split into chunks for embedding; see ``chunk_text``.
Prompt and response text held here is never logged: errors name sizes only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from urllib.parse import unquote

import orjson

from semhealth.collectors.adapters.conversation import (
    UNUSABLE,
    Conversation,
    has_text,
    nonempty_str,
)
from semhealth.collectors.adapters.registry import read_request
from semhealth.collectors.config import Extract
from semhealth.collectors.jsonpath import jsonpath_values
from semhealth.collectors.record import RequestFacts, StructureRequest
from semhealth.common.text import CHARS_PER_TOKEN, estimate_tokens

CHUNK_CHARS = 1000
"""Default upper bound on the length of one context chunk, in characters."""


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
        found = _apply_overrides(doc, extract, UNUSABLE)
        return _facts(found, chunk_chars=chunk_chars, long_context_tokens=long_context_tokens)
    found, structure = read_request(provider, doc)
    found = _apply_overrides(doc, extract, found)
    return _facts(
        found,
        model=nonempty_str(doc.get("model")) or model_from_path(path),
        stream=_stream_flag(provider, doc.get("stream"), path),
        structure=structure,
        chunk_chars=chunk_chars,
        long_context_tokens=long_context_tokens,
    )


def unanalysed(
    reason: str | None, *, body_bytes: int = 0, long_context_tokens: int | None = None
) -> tuple[RequestFacts, str]:
    """Facts for a body that was not read (``oversized`` is decided by the caller; None
    when the caller had no body and no reason, as a recording without one).

    Without the text, the token estimate falls back to ``body_bytes / 4`` (rounded
    up), the same ratio ``estimate_tokens`` uses for non-CJK text, so an oversized
    body still lands in ``long_context``. Without ``long_context_tokens`` the class
    is ``short``.
    """
    estimate = math.ceil(max(body_bytes, 0) / CHARS_PER_TOKEN)
    facts = RequestFacts(analysed=False, skip_reason=reason, input_tokens_estimate=estimate)
    return facts, _prompt_class(estimate, long_context_tokens)


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
    found: Conversation,
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


# --- OpenAI chat completions ------------------------------------------------------------------


# --- OpenAI responses -------------------------------------------------------------------------


# --- Anthropic messages -----------------------------------------------------------------------


# --- Google Gemini and Vertex AI --------------------------------------------------------------


# --- Amazon Bedrock -----------------------------------------------------------------------------


# --- Cohere -------------------------------------------------------------------------------------


# --- Ollama and TGI ---------------------------------------------------------------------------


# --- route overrides (JSONPath) ---------------------------------------------------------------


def _apply_overrides(doc: object, extract: Extract, found: Conversation) -> Conversation:
    """Replace the query and/or the context with the route's JSONPath matches."""
    query, context, usable = found.query, found.context, found.usable
    if extract.query is not None:
        matches = jsonpath_values(extract.query, doc)
        query = _joined_strings(matches[0]) if matches else None
    if extract.context:
        context = tuple(
            text
            for expr in extract.context
            for value in jsonpath_values(expr, doc)
            for text in _flat_strings(value)
            if has_text(text)
        )
    # With both parts overridden the provider's carrier is not needed; a non-object
    # body stays unusable because model, stream and structure could not be read.
    if extract.query is not None and extract.context and isinstance(doc, dict):
        usable = True
    return Conversation(query=query, context=context, usable=usable)


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


# How each provider of ``config.PROVIDERS`` (but ``auto``) carries query, context and the
# structured-output request; a test pins the keys to that list.
