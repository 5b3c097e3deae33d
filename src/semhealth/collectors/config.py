"""Configuration of the collectors: routes, and the analysis limits they enforce.

These are what users write under ``routes:``, ``limits:`` and ``analysis:``
in the agent's YAML; ``semhealth.agent.config`` parses and validates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROVIDERS = (
    "auto",
    "openai_chat",
    "openai_completions",
    "openai_responses",
    "azure_openai_chat",
    "azure_openai_completions",
    "azure_openai_responses",
    "anthropic_messages",
    "vertex_ai_anthropic",
    "ollama",
    "tgi",
    "gemini",
    "vertex_ai",
    "bedrock_converse",
    "bedrock_invoke",
    "cohere_chat",
)
FRAMINGS = ("auto", "sse", "ndjson", "length_prefixed", "json", "aws_eventstream", "json_array")


@dataclass(frozen=True, slots=True, kw_only=True)
class Extract:
    """Where a route's request carries the query and the context, as JSONPath expressions.

    Empty means the provider's convention (last user message is the query;
    system text, earlier turns, tool results and documents are the context).
    """

    query: str | None = None
    context: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """A path pattern and how to read the traffic on it.

    ``match`` is a glob over the request path (``fnmatch``, case-sensitive,
    ``*`` crosses ``/``); the first matching route wins. ``name`` becomes the
    ``route`` label.

    ``contract`` is the path the user wrote; ``contract_schema`` is that file's JSON Schema,
    loaded once at start-up by whoever reads files (the agent: ``attach_contracts``), since
    the collectors never do IO. A route whose contract is not loaded is checked without it.
    """

    name: str
    match: str
    provider: str = "auto"
    framing: str = "auto"
    extract: Extract = field(default_factory=Extract)
    contract: str | None = None  # path of a JSON Schema file every structured answer must meet
    # The loaded contract; left out of comparisons and repr (it follows from ``contract``).
    contract_schema: dict[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    max_request_bytes: int = 1 << 20  # request bodies larger than this are forwarded, not analysed
    max_response_bytes: int = 8 << 20  # analysis of one response stops here (record.truncated)
    max_frame_bytes: int = 1 << 20  # one SSE event / NDJSON line / binary frame
    tap_queue_size: int = 4096  # chunks waiting for analysis, all streams together
    # Their bytes: a chunk is one upstream read, up to 256 KiB, so the count alone let 4096 of
    # them hold a gigabyte. As the forwarder's own copies are bounded (tap_buffer_bytes).
    tap_queue_bytes: int = 8 << 20
    # Streams' ends waiting, each with its exchange: about 1 KiB plus its request body.
    tap_queue_ends: int = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Analysis:
    stall_threshold_s: float = 0.5  # a gap between deltas longer than this is a stall
    long_context_tokens: int = 4000  # prompt_class is long_context at or above this estimate


def default_routes() -> tuple[Route, ...]:
    """Routes for the paths the well-known providers use; anything else is route ``other``."""
    return (
        # OpenAI's formats, served by OpenAI or by Azure OpenAI (provider auto: the path tells).
        Route(name="chat_completions", match="*/chat/completions"),
        Route(name="completions", match="*/completions"),
        Route(name="responses", match="*/responses"),
        # Anthropic's Messages API, served by Anthropic, or by Vertex AI at its own methods.
        Route(name="messages", match="*/messages"),
        Route(name="ollama_chat", match="*/api/chat", provider="ollama"),
        Route(name="ollama_generate", match="*/api/generate", provider="ollama"),
        Route(name="tgi_generate", match="*/generate_stream", provider="tgi"),
        Route(name="tgi_generate", match="*/generate", provider="tgi"),
        # Gemini API and Vertex AI (provider auto: the path tells which).
        Route(name="generate_content", match="*:streamGenerateContent"),
        Route(name="generate_content", match="*:generateContent"),
        Route(name="messages", match="*:streamRawPredict"),
        Route(name="messages", match="*:rawPredict"),
        Route(name="converse", match="*/model/*/converse-stream", provider="bedrock_converse"),
        Route(name="converse", match="*/model/*/converse", provider="bedrock_converse"),
        Route(
            name="invoke_model",
            match="*/model/*/invoke-with-response-stream",
            provider="bedrock_invoke",
        ),
        Route(name="invoke_model", match="*/model/*/invoke", provider="bedrock_invoke"),
        Route(name="chat", match="*/v2/chat", provider="cohere_chat"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    routes: tuple[Route, ...] = field(default_factory=default_routes)
    limits: Limits = field(default_factory=Limits)
    analysis: Analysis = field(default_factory=Analysis)


def default_config() -> Config:
    return Config()
