"""The providers' one table, and choosing one: by configured name, by request path, or by the
stream itself.

``detect_provider`` serves routes configured with ``provider: auto``. A path it
does not know gives ``unknown`` rather than a guess: ``make_adapter("unknown")``
returns a ``SniffingAdapter``, which picks the provider from the first frames'
shape (event names, ``object``/``type`` fields) and then delegates. Guessing
``openai_chat`` would turn every frame of an Anthropic or TGI stream behind an
unusual path into ``Malformed``; emitting nothing would lose the stream. The
sniffer names what it chose in ``provider``, so the record can carry it.
"""

from __future__ import annotations

from typing import Any

import orjson

from semhealth.collectors.adapters import (
    anthropic_messages,
    bedrock,
    cohere,
    gemini,
    ollama,
    openai_chat,
    openai_responses,
    tgi,
)
from semhealth.collectors.adapters.base import Adapter
from semhealth.collectors.adapters.conversation import UNUSABLE, Reading
from semhealth.collectors.adapters.provider import Provider
from semhealth.collectors.events import AdapterEvent
from semhealth.collectors.frames import Frame

UNKNOWN = "unknown"

PROVIDER_TABLE: tuple[Provider, ...] = (
    *openai_chat.PROVIDERS,
    *openai_responses.PROVIDERS,
    *gemini.PROVIDERS,  # before Claude on Vertex AI: a gcp.vertex_ai span is Gemini's first
    *anthropic_messages.PROVIDERS,
    *ollama.PROVIDERS,
    *tgi.PROVIDERS,
    *bedrock.PROVIDERS,
    *cohere.PROVIDERS,
)
"""Every provider semhealth understands, each declared in its own module. Where two give the
same GenAI provider and operation, the first is what an OTLP span of that name reads as."""

_BY_NAME = {provider.name: provider for provider in PROVIDER_TABLE}

ADAPTER_NAMES = (*_BY_NAME, UNKNOWN)
"""Every name ``make_adapter`` accepts."""

GEN_AI_PROVIDERS = {provider.name: provider.gen_ai_name for provider in PROVIDER_TABLE}
"""``gen_ai.provider.name`` of each wire format, the GenAI conventions' well-known values
(ollama and tgi, which have none, are named as they are)."""

# A platform's rules first (it serves another's format at the same suffixes), then the longest
# suffix first where one ends another (``/chat/completions`` before ``/completions``).
_PATH_RULES = sorted(
    ((provider, suffix) for provider in PROVIDER_TABLE for suffix in provider.suffixes),
    key=lambda rule: (rule[0].platform is None, -len(rule[1])),
)


def gen_ai_provider(provider: str) -> str:
    """The ``gen_ai.provider.name`` of a record's provider."""
    return GEN_AI_PROVIDERS.get(provider, provider)


def operation_name(provider: str) -> str:
    """The ``gen_ai.operation.name`` of a record's provider."""
    known = _BY_NAME.get(provider)
    return known.operation if known is not None else "chat"


def wire_format(gen_ai_name: str, operation: str | None) -> str:
    """The wire format (a record's provider) that a GenAI span's provider name speaks, or
    the name itself when it is none of ours."""
    speaking = [p for p in PROVIDER_TABLE if p.gen_ai_name == gen_ai_name]
    if not speaking:
        return gen_ai_name
    wanted = operation or "chat"
    return next((p for p in speaking if p.operation == wanted), speaking[0]).name


def read_request(provider: str, doc: dict[str, Any]) -> Reading:
    """What ``provider``'s convention finds in a request body; unusable for a name not ours."""
    known = _BY_NAME.get(provider)
    return (UNUSABLE, ()) if known is None else known.read_request(doc)


_ANTHROPIC_TYPES = frozenset(
    {
        "message",
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    }
)
_COHERE_TYPES = frozenset(
    {"message-start", "content-start", "content-delta", "tool-plan-delta", "tool-call-start"}
)
_CONVERSE_EVENTS = frozenset(
    {"messageStart", "contentBlockStart", "contentBlockDelta", "messageStop", "metadata"}
)
_OPENAI_OBJECTS = {
    "chat.completion": "openai_chat",
    "chat.completion.chunk": "openai_chat",
    "text_completion": "openai_completions",
    "response": "openai_responses",
}

# Past this many frames without a recognisable one the stream is not one we know.
_SNIFF_FRAMES = 16


def make_adapter(provider: str) -> Adapter:
    """A fresh adapter for one response. ``provider`` is one of ``ADAPTER_NAMES``."""
    if provider == UNKNOWN:
        return SniffingAdapter()
    known = _BY_NAME.get(provider)
    if known is None:
        raise ValueError(f"no adapter for provider {provider!r}; known: {', '.join(ADAPTER_NAMES)}")
    return known.adapter()


def detect_provider(path: str, content_type: str | None) -> str:
    """The provider a request path implies, or ``unknown`` (sniff the stream).

    ``content_type`` (the response's) only breaks ties on unknown paths:
    ``application/x-ndjson`` is Ollama's streaming type.
    """
    clean = path.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    for provider, suffix in _PATH_RULES:
        if (provider.platform is None or provider.platform.search(path)) and clean.endswith(suffix):
            return provider.name
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/x-ndjson":
        return "ollama"
    return UNKNOWN


def sniff_provider(frame: Frame) -> str | None:
    """The provider whose wire format this frame is in, or None when it does not say."""
    if frame.event.startswith("response."):
        return "openai_responses"
    if frame.event in _ANTHROPIC_TYPES:
        return "anthropic_messages"
    if frame.event in _COHERE_TYPES:
        return "cohere_chat"
    if frame.event in _CONVERSE_EVENTS:
        return "bedrock_converse"
    if frame.event == "chunk":
        return "bedrock_invoke"
    try:
        value = orjson.loads(frame.data)
    except orjson.JSONDecodeError:
        return None
    if isinstance(value, list) and value and isinstance(value[0], dict):
        value = value[0]  # TGI's list body
    if not isinstance(value, dict):
        return None
    return _sniff_object(value)


def _sniff_object(obj: dict[str, object]) -> str | None:
    kind = obj.get("object")
    if isinstance(kind, str) and kind in _OPENAI_OBJECTS:
        return _OPENAI_OBJECTS[kind]
    kind = obj.get("type")
    if isinstance(kind, str):
        if kind.startswith("response."):
            return "openai_responses"
        if kind in _ANTHROPIC_TYPES:
            return "anthropic_messages"
        if kind in _COHERE_TYPES:
            return "cohere_chat"
    if "candidates" in obj or "usageMetadata" in obj:
        return "gemini"
    if "token" in obj or "generated_text" in obj:
        return "tgi"
    if "done" in obj and ("message" in obj or "response" in obj):
        return "ollama"
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        if "delta" in first or "message" in first:
            return "openai_chat"
        if "text" in first:
            return "openai_completions"
    return None


class SniffingAdapter:
    """Adapter for an unknown path: finds the provider from the stream, then delegates.

    Frames before the first recognisable one yield nothing (a lone ``[DONE]`` or an
    error object does not say whose it is). After ``_SNIFF_FRAMES`` such frames it
    stops looking, so an unknown stream costs one JSON parse per frame at most that long.
    """

    def __init__(self) -> None:
        self.provider: str | None = None  # set once recognised
        self._inner: Adapter | None = None
        self._unrecognised = 0

    def feed(self, frame: Frame) -> list[AdapterEvent]:
        if self._inner is None:
            if self._unrecognised >= _SNIFF_FRAMES:
                return []
            provider = sniff_provider(frame)
            if provider is None:
                self._unrecognised += 1
                return []
            self.provider = provider
            self._inner = make_adapter(provider)
        return self._inner.feed(frame)

    def token(self, data: bytes) -> str | None:
        return self._inner.token(data) if self._inner is not None else None
