"""Provider adapters: one wire format's frames -> provider-neutral events."""

from semhealth.collectors.adapters.anthropic_messages import AnthropicMessagesAdapter
from semhealth.collectors.adapters.base import Adapter
from semhealth.collectors.adapters.ollama import OllamaAdapter
from semhealth.collectors.adapters.openai_chat import OpenAIChatAdapter, OpenAICompletionsAdapter
from semhealth.collectors.adapters.openai_responses import OpenAIResponsesAdapter
from semhealth.collectors.adapters.registry import (
    ADAPTER_NAMES,
    SniffingAdapter,
    detect_provider,
    make_adapter,
)
from semhealth.collectors.adapters.tgi import TGIAdapter

__all__ = [
    "ADAPTER_NAMES",
    "Adapter",
    "AnthropicMessagesAdapter",
    "OllamaAdapter",
    "OpenAIChatAdapter",
    "OpenAICompletionsAdapter",
    "OpenAIResponsesAdapter",
    "SniffingAdapter",
    "TGIAdapter",
    "detect_provider",
    "make_adapter",
]
