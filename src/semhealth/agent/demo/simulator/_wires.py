"""Which wire format answers a path: the suffix table and its streaming rules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from semhealth.agent.demo.simulator._anthropic import (
    anthropic_body,
    anthropic_error,
    anthropic_stream,
)
from semhealth.agent.demo.simulator._bedrock import (
    EVENTSTREAM_TYPE,
    bedrock_error,
    converse_body,
    converse_stream,
    invoke_stream,
)
from semhealth.agent.demo.simulator._cohere import cohere_body, cohere_error, cohere_stream
from semhealth.agent.demo.simulator._google import (
    gemini_body,
    gemini_error,
    gemini_stream,
    gemini_stream_type,
)
from semhealth.agent.demo.simulator._local import (
    ollama_chat_body,
    ollama_chat_stream,
    ollama_generate_body,
    ollama_generate_stream,
    plain_error,
    tgi_body,
    tgi_error,
    tgi_stream,
)
from semhealth.agent.demo.simulator._openai import (
    chat_body,
    chat_stream,
    openai_error,
    responses_body,
    responses_stream,
)
from semhealth.agent.demo.simulator._plan import Plan, Step
from semhealth.agent.demo.simulator._script import ScriptRequest


@dataclass(frozen=True, slots=True)
class Wire:
    """How one path suffix renders a plan."""

    suffix: str
    stream: Callable[[Plan], list[Step]]
    body: Callable[[Plan], dict[str, Any]]
    error: Callable[[int, str], dict[str, Any]]
    content_type: str
    streaming: Literal["flag", "unless_false", "always", "never"]
    request_id_header: str | None = None
    # The stream's Content-Type where the request chooses it (Gemini's alt=sse).
    stream_type: Callable[[ScriptRequest], str] | None = None

    def stream_content_type(self, request: ScriptRequest) -> str:
        return self.stream_type(request) if self.stream_type else self.content_type

    def wants_stream(self, request: ScriptRequest) -> bool:
        flag = request.json.get("stream") if isinstance(request.json, dict) else None
        match self.streaming:
            case "flag":
                return flag is True
            case "unless_false":
                return flag is not False
            case "always":
                return True
            case "never":
                return False


_SSE = "text/event-stream; charset=utf-8"
_NDJSON = "application/x-ndjson"

# Ordered so that a longer suffix wins over one it ends with (/api/generate before /generate).
WIRES = (
    Wire("/chat/completions", chat_stream, chat_body, openai_error, _SSE, "flag", "x-request-id"),
    Wire(
        "/responses",
        responses_stream,
        responses_body,
        openai_error,
        _SSE,
        "flag",
        "x-request-id",
    ),
    Wire(
        "/messages",
        anthropic_stream,
        anthropic_body,
        anthropic_error,
        _SSE,
        "flag",
        "request-id",
    ),
    Wire("/api/chat", ollama_chat_stream, ollama_chat_body, plain_error, _NDJSON, "unless_false"),
    Wire(
        "/api/generate",
        ollama_generate_stream,
        ollama_generate_body,
        plain_error,
        _NDJSON,
        "unless_false",
    ),
    Wire("/generate_stream", tgi_stream, tgi_body, tgi_error, _SSE, "always"),
    Wire("/generate", tgi_stream, tgi_body, tgi_error, _SSE, "never"),
    Wire(
        ":streamGenerateContent",
        gemini_stream,
        gemini_body,
        gemini_error,
        _SSE,
        "always",
        stream_type=gemini_stream_type,
    ),
    Wire(":generateContent", gemini_stream, gemini_body, gemini_error, _SSE, "never"),
    Wire(
        "/converse-stream",
        converse_stream,
        converse_body,
        bedrock_error,
        EVENTSTREAM_TYPE,
        "always",
        "x-amzn-RequestId",
    ),
    Wire("/converse", converse_stream, converse_body, bedrock_error, _SSE, "never"),
    Wire(
        "/invoke-with-response-stream",
        invoke_stream,
        anthropic_body,
        bedrock_error,
        EVENTSTREAM_TYPE,
        "always",
        "x-amzn-RequestId",
    ),
    Wire("/v2/chat", cohere_stream, cohere_body, cohere_error, _SSE, "flag"),
)


def wire_for(path: str) -> Wire | None:
    stripped = path.rstrip("/")
    return next((w for w in WIRES if stripped.endswith(w.suffix)), None)
