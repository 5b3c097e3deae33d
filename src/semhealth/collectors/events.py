"""What provider adapters emit: the provider-neutral facts of one response.

An adapter turns frames (SSE events, NDJSON lines, ...) of one provider's
wire format into these events; ``StreamState`` folds them into a record.
All ``t`` are the tap's monotonic-ns arrival time of the chunk that carried
the fact.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Output text the user sees (assistant content)."""

    text: str
    t: int


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning arrived (thinking, thought parts, reasoning content): timed, never kept.

    It is not the answer: not scored for relevance, not validated, not in the continuity
    index. Only its arrival time is used (time to first reasoning token)."""

    t: int


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of one tool call: its identity when first seen, then argument fragments."""

    index: int
    t: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


PROVIDER_TOOL_KINDS = (
    "web_search",
    "web_fetch",
    "code_execution",
    "file_search",
    "image_generation",
    "mcp",
    "other",
)
"""What a provider-executed tool did, in one vocabulary over every provider: a bounded set,
so it can be a label."""


@dataclass(frozen=True, slots=True)
class ProviderToolCall:
    """A tool the provider ran itself (Anthropic ``server_tool_use``, OpenAI's built-in tools,
    Gemini's code execution and search grounding): not the caller's tool call, so never
    validated against the request's ``tools``; counted by ``kind`` (one of
    ``PROVIDER_TOOL_KINDS``)."""

    kind: str


def provider_tool_kind(name: str | None) -> str:
    """The kind of a provider's own tool name (``web_search_20250305``, ``bash_code_execution``,
    ``code_interpreter_call``, ...), ``other`` for one not known."""
    if not name:
        return "other"
    for kind, words in _TOOL_WORDS:
        if any(word in name for word in words):
            return kind
    return "other"


# Substrings of the providers' tool names (their versions come as suffixes), most specific first.
_TOOL_WORDS = (
    ("web_fetch", ("web_fetch", "url_context")),
    ("web_search", ("web_search", "google_search", "grounding")),
    ("code_execution", ("code_execution", "code_interpreter", "executable_code")),
    ("file_search", ("file_search", "retrieval")),
    ("image_generation", ("image_generation",)),
    ("mcp", ("mcp",)),
)


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Token usage the stream reported. Later reports fill in or replace earlier fields."""

    input_tokens: int | None = None
    output_tokens: int | None = None  # reasoning included, as every provider but Gemini counts
    reasoning_tokens: int | None = None  # the part of output_tokens spent reasoning


@dataclass(frozen=True, slots=True)
class ModelReport:
    """The model name the response says produced it."""

    model: str


@dataclass(frozen=True, slots=True)
class Finish:
    """The provider's finish/stop reason, normalised to OpenAI's vocabulary where one exists
    (``stop``, ``length``, ``tool_calls``, ``content_filter``); others pass through."""

    reason: str


@dataclass(frozen=True, slots=True)
class StreamError:
    """An error object inside the stream: the provider's error type or code, never its message."""

    type: str


@dataclass(frozen=True, slots=True)
class Done:
    """The stream's explicit end marker.

    ``[DONE]``, ``message_stop``, ``response.completed``, ``done: true``.
    """


@dataclass(frozen=True, slots=True)
class Malformed:
    """A frame the adapter could not understand (bad JSON, wrong shape)."""

    reason: str


AdapterEvent = (
    ContentDelta
    | ReasoningDelta
    | ToolCallDelta
    | ProviderToolCall
    | UsageReport
    | ModelReport
    | Finish
    | StreamError
    | Done
    | Malformed
)
