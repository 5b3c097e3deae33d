"""Choosing an adapter: by configured provider name, by request path, or by the stream itself.

``detect_provider`` serves routes configured with ``provider: auto``. A path it
does not know gives ``unknown`` rather than a guess: ``make_adapter("unknown")``
returns a ``SniffingAdapter``, which picks the provider from the first frames'
shape (event names, ``object``/``type`` fields) and then delegates. Guessing
``openai_chat`` would turn every frame of an Anthropic or TGI stream behind an
unusual path into ``Malformed``; emitting nothing would lose the stream. The
sniffer names what it chose in ``provider``, so the record can carry it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import orjson

from semhealth.collectors.adapters.anthropic_messages import AnthropicMessagesAdapter
from semhealth.collectors.adapters.base import Adapter
from semhealth.collectors.adapters.bedrock import BedrockConverseAdapter, BedrockInvokeAdapter
from semhealth.collectors.adapters.cohere import CohereChatAdapter
from semhealth.collectors.adapters.gemini import GeminiAdapter
from semhealth.collectors.adapters.ollama import OllamaAdapter
from semhealth.collectors.adapters.openai_chat import OpenAIChatAdapter, OpenAICompletionsAdapter
from semhealth.collectors.adapters.openai_responses import OpenAIResponsesAdapter
from semhealth.collectors.adapters.tgi import TGIAdapter
from semhealth.collectors.events import AdapterEvent
from semhealth.collectors.frames import Frame

UNKNOWN = "unknown"

_FACTORIES: dict[str, Callable[[], Adapter]] = {
    "openai_chat": OpenAIChatAdapter,
    "openai_completions": OpenAICompletionsAdapter,
    "openai_responses": OpenAIResponsesAdapter,
    "anthropic_messages": AnthropicMessagesAdapter,
    "ollama": OllamaAdapter,
    "tgi": TGIAdapter,
    "gemini": GeminiAdapter,
    "vertex_ai": GeminiAdapter,
    "bedrock_converse": BedrockConverseAdapter,
    "bedrock_invoke": BedrockInvokeAdapter,
    "cohere_chat": CohereChatAdapter,
}

ADAPTER_NAMES = (*_FACTORIES, UNKNOWN)
"""Every name ``make_adapter`` accepts."""

GEN_AI_PROVIDERS = {
    "openai_chat": "openai",
    "openai_completions": "openai",
    "openai_responses": "openai",
    "anthropic_messages": "anthropic",
    "gemini": "gcp.gemini",
    "vertex_ai": "gcp.vertex_ai",
    "bedrock_converse": "aws.bedrock",
    "bedrock_invoke": "aws.bedrock",
    "cohere_chat": "cohere",
}
"""``gen_ai.provider.name`` of each wire format, the GenAI conventions' well-known values
(the others, ollama and tgi, are named as they are)."""

OPERATIONS = {"openai_completions": "text_completion", "tgi": "text_completion"}
"""``gen_ai.operation.name`` where it is not ``chat``."""


def gen_ai_provider(provider: str) -> str:
    """The ``gen_ai.provider.name`` of a record's provider."""
    return GEN_AI_PROVIDERS.get(provider, provider)


def operation_name(provider: str) -> str:
    """The ``gen_ai.operation.name`` of a record's provider."""
    return OPERATIONS.get(provider, "chat")


def wire_format(gen_ai_name: str, operation: str | None) -> str:
    """The wire format (a record's provider) that a GenAI span's provider name speaks, or
    the name itself when it is none of ours. Azure OpenAI speaks OpenAI's."""
    if gen_ai_name == "azure.ai.openai":
        gen_ai_name = "openai"
    speaking = [provider for provider, name in GEN_AI_PROVIDERS.items() if name == gen_ai_name]
    if not speaking:
        return gen_ai_name
    wanted = operation or "chat"
    return next((p for p in speaking if operation_name(p) == wanted), speaking[0])


# Longest suffix first where one ends another (``/chat/completions`` before ``/completions``,
# ``/api/generate`` before ``/generate``).
_PATH_SUFFIXES = (
    (":streamGenerateContent", "gemini"),
    (":generateContent", "gemini"),
    (":streamRawPredict", "anthropic_messages"),  # Claude on Vertex AI
    (":rawPredict", "anthropic_messages"),
    ("/converse-stream", "bedrock_converse"),
    ("/converse", "bedrock_converse"),
    ("/invoke-with-response-stream", "bedrock_invoke"),
    ("/invoke", "bedrock_invoke"),
    ("/v2/chat", "cohere_chat"),
    ("/chat/completions", "openai_chat"),
    ("/completions", "openai_completions"),
    ("/responses", "openai_responses"),
    ("/messages", "anthropic_messages"),
    ("/api/chat", "ollama"),
    ("/api/generate", "ollama"),
    ("/generate_stream", "tgi"),
    ("/generate", "tgi"),
)

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
# Vertex AI's Gemini paths: /v1/projects/{p}/locations/{l}/publishers/google/models/{m}:...
_VERTEX = re.compile(r"/projects/[^/]+/locations/[^/]+/publishers/google/models/")
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
    factory = _FACTORIES.get(provider)
    if factory is None:
        raise ValueError(f"no adapter for provider {provider!r}; known: {', '.join(ADAPTER_NAMES)}")
    return factory()


def detect_provider(path: str, content_type: str | None) -> str:
    """The provider a request path implies, or ``unknown`` (sniff the stream).

    ``content_type`` (the response's) only breaks ties on unknown paths:
    ``application/x-ndjson`` is Ollama's streaming type.
    """
    clean = path.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    for suffix, provider in _PATH_SUFFIXES:
        if clean.endswith(suffix):
            if provider == "gemini" and _VERTEX.search(clean):
                return "vertex_ai"
            return provider
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
