"""Adapter choice: by name, by path, and by sniffing the stream."""

from __future__ import annotations

import pytest

from semhealth.collectors.adapters.anthropic_messages import AnthropicMessagesAdapter
from semhealth.collectors.adapters.ollama import OllamaAdapter
from semhealth.collectors.adapters.openai_chat import OpenAIChatAdapter, OpenAICompletionsAdapter
from semhealth.collectors.adapters.openai_responses import OpenAIResponsesAdapter
from semhealth.collectors.adapters.registry import (
    ADAPTER_NAMES,
    SniffingAdapter,
    detect_provider,
    gen_ai_provider,
    make_adapter,
    sniff_provider,
    wire_format,
)
from semhealth.collectors.adapters.tgi import TGIAdapter
from semhealth.collectors.config import PROVIDERS
from semhealth.collectors.events import ContentDelta, Done, ModelReport
from semhealth.collectors.frames import Frame


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("openai_chat", OpenAIChatAdapter),
        ("openai_completions", OpenAICompletionsAdapter),
        ("openai_responses", OpenAIResponsesAdapter),
        ("anthropic_messages", AnthropicMessagesAdapter),
        ("ollama", OllamaAdapter),
        ("tgi", TGIAdapter),
        ("unknown", SniffingAdapter),
    ],
)
def test_make_adapter_builds_the_named_adapter(name: str, cls: type) -> None:
    assert isinstance(make_adapter(name), cls)


def test_every_configurable_provider_has_an_adapter() -> None:
    assert set(PROVIDERS) - {"auto"} <= set(ADAPTER_NAMES)


def test_make_adapter_returns_a_fresh_instance_per_call() -> None:
    assert make_adapter("openai_chat") is not make_adapter("openai_chat")


def test_make_adapter_rejects_auto_and_unknown_names() -> None:
    for name in ("auto", "palm"):
        with pytest.raises(ValueError, match="no adapter for provider"):
            make_adapter(name)


@pytest.mark.parametrize(
    ("path", "provider"),
    [
        ("/v1/chat/completions", "openai_chat"),
        ("/openai/deployments/gpt4/chat/completions?api-version=2024-10-21", "azure_openai_chat"),
        (
            "/openai/deployments/gpt35/completions?api-version=2024-10-21",
            "azure_openai_completions",
        ),
        ("/openai/responses?api-version=2025-04-01-preview", "azure_openai_responses"),
        ("/v1/completions", "openai_completions"),
        ("/v1/responses", "openai_responses"),
        ("/v1/responses/", "openai_responses"),
        ("/v1/messages", "anthropic_messages"),
        ("/api/chat", "ollama"),
        ("/api/generate", "ollama"),
        ("/generate_stream", "tgi"),
        ("/generate", "tgi"),
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", "gemini"),
        ("/v1/models/gemini-2.5-flash:generateContent", "gemini"),
        (
            "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro"
            ":streamGenerateContent",
            "vertex_ai",
        ),
        (
            "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4"
            ":streamRawPredict",
            "vertex_ai_anthropic",
        ),
        ("/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse-stream", "bedrock_converse"),
        ("/model/amazon.nova-lite-v1%3A0/converse", "bedrock_converse"),
        ("/model/anthropic.claude-v2/invoke-with-response-stream", "bedrock_invoke"),
        ("/model/meta.llama3-8b-instruct-v1%3A0/invoke", "bedrock_invoke"),
        ("/v2/chat", "cohere_chat"),
        ("/openai/deployments/d/responses?api-version=preview", "azure_openai_responses"),
        # Groq's base URL ends /openai/v1 too: without a deployment or an api-version, OpenAI's.
        ("/openai/v1/chat/completions", "openai_chat"),
        ("/v1/embeddings", "unknown"),
        ("/", "unknown"),
    ],
)
def test_detect_provider_by_path_suffix(path: str, provider: str) -> None:
    assert detect_provider(path, None) == provider


def test_every_provider_a_path_implies_reads_the_gen_ai_name_of_its_platform() -> None:
    names = {
        p: gen_ai_provider(p)
        for p in ("azure_openai_chat", "azure_openai_responses", "vertex_ai_anthropic", "vertex_ai")
    }
    assert names == {
        "azure_openai_chat": "azure.ai.openai",
        "azure_openai_responses": "azure.ai.openai",
        "vertex_ai_anthropic": "gcp.vertex_ai",
        "vertex_ai": "gcp.vertex_ai",
    }


def test_a_gen_ai_span_of_a_platform_reads_as_the_platform_s_wire_format() -> None:
    assert wire_format("azure.ai.openai", "chat") == "azure_openai_chat"
    assert wire_format("azure.ai.openai", "text_completion") == "azure_openai_completions"
    assert wire_format("openai", None) == "openai_chat"
    assert wire_format("aws.bedrock", "chat") == "bedrock_converse"
    assert wire_format("mistral_ai", "chat") == "mistral_ai"


def test_detect_provider_path_wins_over_content_type() -> None:
    assert detect_provider("/v1/chat/completions", "application/x-ndjson") == "openai_chat"


def test_detect_provider_takes_ndjson_on_unknown_path_for_ollama() -> None:
    assert detect_provider("/custom", "application/x-ndjson; charset=utf-8") == "ollama"


def test_detect_provider_leaves_sse_on_unknown_path_to_sniffing() -> None:
    assert detect_provider("/custom", "text/event-stream") == "unknown"


@pytest.mark.parametrize(
    ("frame", "provider"),
    [
        (Frame(data='{"type":"message_start"}', t=0, event="message_start"), "anthropic_messages"),
        (
            Frame(data='{"type":"response.created"}', t=0, event="response.created"),
            "openai_responses",
        ),
        (Frame(data='{"type":"response.output_text.delta","delta":"x"}', t=0), "openai_responses"),
        (Frame(data=b'{"object":"response","output":[]}', t=0), "openai_responses"),
        (Frame(data='{"object":"chat.completion.chunk","choices":[]}', t=0), "openai_chat"),
        (Frame(data='{"choices":[{"index":0,"delta":{"content":"x"}}]}', t=0), "openai_chat"),
        (Frame(data='{"object":"text_completion","choices":[]}', t=0), "openai_completions"),
        (Frame(data='{"choices":[{"index":0,"text":"x"}]}', t=0), "openai_completions"),
        (Frame(data=b'{"type":"message","content":[]}', t=0), "anthropic_messages"),
        (Frame(data='{"token":{"id":1,"text":"x"}}', t=0), "tgi"),
        (Frame(data=b'[{"generated_text":"x"}]', t=0), "tgi"),
        (Frame(data=b'{"model":"m","response":"x","done":false}', t=0), "ollama"),
    ],
)
def test_sniff_provider_recognises_each_wire_format(frame: Frame, provider: str) -> None:
    assert sniff_provider(frame) == provider


@pytest.mark.parametrize(
    "data", ["[DONE]", '{"error":{"type":"x"}}', "not json", "[]", '{"type":"ping"}']
)
def test_sniff_provider_does_not_guess_from_ambiguous_frames(data: str) -> None:
    assert sniff_provider(Frame(data=data, t=0)) is None


def test_sniffing_adapter_delegates_once_recognised() -> None:
    adapter = SniffingAdapter()
    ping = adapter.feed(Frame(data='{"type":"ping"}', t=1, event="ping"))
    start = adapter.feed(
        Frame(
            data='{"type":"message_start","message":{"model":"claude-x"}}',
            t=2,
            event="message_start",
        )
    )
    delta = adapter.feed(
        Frame(
            data='{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}',
            t=3,
            event="content_block_delta",
        )
    )
    stop = adapter.feed(Frame(data='{"type":"message_stop"}', t=4, event="message_stop"))
    assert (ping, start, delta, stop) == (
        [],
        [ModelReport("claude-x")],
        [ContentDelta("hi", 3)],
        [Done()],
    )
    assert adapter.provider == "anthropic_messages"


def test_sniffing_adapter_gives_up_after_unrecognised_frames() -> None:
    adapter = SniffingAdapter()
    for t in range(16):
        assert adapter.feed(Frame(data='{"hello":1}', t=t)) == []
    late = Frame(data='{"object":"chat.completion.chunk","model":"m","choices":[]}', t=99)
    assert adapter.feed(late) == []
    assert adapter.provider is None
