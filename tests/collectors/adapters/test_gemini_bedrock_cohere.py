"""The Gemini, Bedrock and Cohere adapters and request readers, frame by frame."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson

from semhealth.collectors.adapters.bedrock import BedrockConverseAdapter, BedrockInvokeAdapter
from semhealth.collectors.adapters.cohere import CohereChatAdapter
from semhealth.collectors.adapters.gemini import GeminiAdapter, openapi_schema
from semhealth.collectors.config import Extract
from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    Malformed,
    ProviderToolCall,
    ReasoningDelta,
    StreamError,
    UsageReport,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StreamState
from semhealth.collectors.request import extract_request


def _gemini(*chunks: dict[str, Any]) -> list[AdapterEvent]:
    adapter = GeminiAdapter()
    return [e for t, c in enumerate(chunks) for e in adapter.feed(Frame(orjson.dumps(c), t))]


def _parts(*parts: dict[str, Any], **candidate: Any) -> dict[str, Any]:
    return {"candidates": [{"content": {"role": "model", "parts": list(parts)}, **candidate}]}


def _tools(events: list[AdapterEvent]) -> list[tuple[str | None, str]]:
    state = StreamState()
    for event in events:
        state.apply(event)
    return [(call.name, call.arguments) for call in state.tool_calls()]


# --------------------------------------------------------------------------- Gemini


def test_gemini_thought_parts_are_reasoning_and_text_parts_content() -> None:
    events = _gemini(_parts({"text": "hmm", "thought": True}), _parts({"text": "Paris"}))
    assert events == [ReasoningDelta(0), ContentDelta("Paris", 1)]


def test_gemini_code_execution_is_a_provider_tool_and_never_a_tool_call() -> None:
    events = _gemini(
        _parts({"executableCode": {"language": "PYTHON", "code": "print(6*7)"}}),
        _parts({"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "42"}}),
        _parts({"text": "42"}),
    )
    assert events == [ProviderToolCall("code_execution"), ContentDelta("42", 2)]
    assert _tools(events) == []


def test_gemini_search_grounding_counts_each_query_once_though_its_metadata_repeats() -> None:
    grounding = {"webSearchQueries": ["capital of France", "Paris"], "groundingChunks": []}
    urls = {"urlMetadata": [{"retrievedUrl": "https://example.com"}]}
    events = _gemini(
        _parts({"text": "Paris"}, groundingMetadata=grounding, urlContextMetadata=urls),
        _parts({"text": "."}, groundingMetadata=grounding, urlContextMetadata=urls),
    )
    tools = [e.kind for e in events if isinstance(e, ProviderToolCall)]
    assert tools == ["web_search", "web_search", "web_fetch"]


def test_gemini_usage_counts_thoughts_as_output_and_apart_as_reasoning() -> None:
    usage = {
        "promptTokenCount": 10,
        "candidatesTokenCount": 5,
        "thoughtsTokenCount": 20,
        "cachedContentTokenCount": 4,
    }
    events = _gemini({**_parts({"text": "x"}, finishReason="STOP"), "usageMetadata": usage})
    assert events == [
        ContentDelta("x", 0),
        Finish("stop"),
        UsageReport(input_tokens=10, output_tokens=25, reasoning_tokens=20),
        Done(),
    ]


def test_gemini_finish_reasons_other_than_stop_and_length_pass_through_lowercased() -> None:
    events = _gemini(_parts(finishReason="SAFETY"))
    assert Finish("safety") in events and events[-1] == Done()
    assert Finish("length") in _gemini(_parts({"text": "a"}, finishReason="MAX_TOKENS"))


def test_a_gemini_error_object_is_counted_by_its_status() -> None:
    error = {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}
    assert _gemini(error) == [StreamError("RESOURCE_EXHAUSTED")]


def test_a_whole_gemini_function_call_is_one_tool_call() -> None:
    call = {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}
    assert _tools(_gemini(_parts(call))) == [("get_weather", '{"city":"Paris"}')]


def test_gemini_streamed_partial_args_are_assembled_into_one_object() -> None:
    chunks = [
        _parts({"functionCall": {"name": "book", "willContinue": True}}),
        _parts(
            {
                "functionCall": {
                    "partialArgs": [
                        {"jsonPath": "$.city", "stringValue": "Par", "willContinue": True}
                    ],
                    "willContinue": True,
                }
            }
        ),
        _parts(
            {
                "functionCall": {
                    "partialArgs": [
                        {"jsonPath": "$.city", "stringValue": "is"},
                        {"jsonPath": "$.nights", "numberValue": 2},
                        {"jsonPath": "$.rooms[0].beds", "numberValue": 1},
                        {"jsonPath": "$.breakfast", "boolValue": True},
                    ],
                    "willContinue": True,
                }
            }
        ),
        _parts({"functionCall": {}}, finishReason="STOP"),
    ]
    ((name, arguments),) = _tools(_gemini(*chunks))
    assert name == "book"
    assert json.loads(arguments) == {
        "city": "Paris",
        "nights": 2,
        "rooms": [{"beds": 1}],
        "breakfast": True,
    }


def test_a_gemini_partial_arg_with_a_path_that_is_not_json_path_is_malformed() -> None:
    chunks = [
        _parts({"functionCall": {"name": "f", "willContinue": True}}),
        _parts({"functionCall": {"partialArgs": [{"jsonPath": "city", "stringValue": "x"}]}}),
    ]
    assert Malformed("shape") in _gemini(*chunks)


def test_gemini_request_reads_system_turns_and_function_responses() -> None:
    body = {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "w", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "w", "response": {"t": 21}}}]},
            {"role": "user", "parts": [{"text": "And tomorrow?"}]},
        ],
        "generationConfig": {
            "responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT", "properties": {"t": {"type": "NUMBER"}}},
        },
    }
    facts, _ = extract_request(
        orjson.dumps(body),
        "gemini",
        Extract(),
        long_context_tokens=4000,
        path="/v1beta/models/gemini-2.5-flash:streamGenerateContent",
    )
    assert facts.query == "And tomorrow?"
    assert facts.context == ("Be brief.", "Weather in Paris?", '{"t":21}')
    assert facts.model == "gemini-2.5-flash" and facts.stream
    (structure,) = facts.structure
    assert structure.kind == "json_schema"
    assert structure.schema == {"type": "object", "properties": {"t": {"type": "number"}}}


def test_openapi_schemas_become_json_schema_with_nullable_as_a_null_type() -> None:
    schema = {
        "type": "ARRAY",
        "items": {"type": "STRING", "nullable": True, "example": "x"},
        "propertyOrdering": [],
    }
    assert openapi_schema(schema) == {"type": "array", "items": {"type": ["string", "null"]}}


# --------------------------------------------------------------------------- Bedrock


def _frames(adapter: Any, *events: tuple[str, dict[str, Any]]) -> list[AdapterEvent]:
    return [
        e for t, (n, p) in enumerate(events) for e in adapter.feed(Frame(orjson.dumps(p), t, n))
    ]


def test_converse_stream_events_give_text_tool_input_reasoning_and_usage() -> None:
    events = _frames(
        BedrockConverseAdapter(),
        ("messageStart", {"role": "assistant"}),
        (
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "h"}}},
        ),
        ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "Hi"}}),
        (
            "contentBlockStart",
            {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "t1", "name": "f"}}},
        ),
        ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '{"a":'}}}),
        ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": "1}"}}}),
        ("messageStop", {"stopReason": "tool_use"}),
        ("metadata", {"usage": {"inputTokens": 3, "outputTokens": 4, "cacheReadInputTokens": 2}}),
    )
    assert events[:2] == [ReasoningDelta(1), ContentDelta("Hi", 2)]
    assert _tools(events) == [("f", '{"a":1}')]
    assert events[-3:] == [Finish("tool_calls"), Done(), UsageReport(5, 4)]


def test_an_event_stream_exception_is_an_error_of_its_type() -> None:
    adapter = BedrockConverseAdapter()
    assert adapter.feed(Frame(b'{"message":"x"}', 1, "exception:throttlingException")) == [
        StreamError("throttlingException")
    ]


def _chunk(inner: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "chunk", {"bytes": base64.b64encode(orjson.dumps(inner)).decode()}


def test_invoke_stream_of_nova_reads_converse_events_by_name() -> None:
    events = _frames(
        BedrockInvokeAdapter(),
        _chunk({"messageStart": {"role": "assistant"}}),
        _chunk({"contentBlockDelta": {"delta": {"text": "Hi"}, "contentBlockIndex": 0}}),
        _chunk({"messageStop": {"stopReason": "end_turn"}}),
        _chunk({"metadata": {"usage": {"inputTokens": 3, "outputTokens": 1}}}),
    )
    assert events == [ContentDelta("Hi", 1), Finish("stop"), Done(), UsageReport(3, 1)]


def test_invoke_stream_of_llama_reads_generations_and_counts() -> None:
    events = _frames(
        BedrockInvokeAdapter(),
        _chunk({"generation": "Hi", "prompt_token_count": 7, "generation_token_count": 1}),
        _chunk({"generation": "!", "generation_token_count": 2, "stop_reason": "stop"}),
    )
    assert [e for e in events if isinstance(e, ContentDelta)] == [
        ContentDelta("Hi", 0),
        ContentDelta("!", 1),
    ]
    assert events[-3:] == [UsageReport(7, 2), Finish("stop"), Done()]


def test_invoke_chunk_bytes_that_are_not_base64_are_malformed() -> None:
    adapter = BedrockInvokeAdapter()
    assert adapter.feed(Frame(b'{"bytes":"%%%"}', 1, "chunk")) == [Malformed("json")]


def test_converse_request_reads_system_tool_results_and_input_schemas() -> None:
    body = {
        "system": [{"text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"text": "Weather?"}]},
            {
                "role": "user",
                "content": [{"toolResult": {"toolUseId": "t", "content": [{"json": {"t": 21}}]}}],
            },
            {"role": "user", "content": [{"text": "Tomorrow?"}]},
        ],
        "toolConfig": {"tools": [{"toolSpec": {"name": "w", "inputSchema": {"json": {}}}}]},
    }
    facts, _ = extract_request(
        orjson.dumps(body),
        "bedrock_converse",
        Extract(),
        long_context_tokens=4000,
        path="/model/amazon.nova-lite-v1%3A0/converse-stream",
    )
    assert facts.query == "Tomorrow?"
    assert facts.context == ("Be brief.", "Weather?", '{"t":21}')
    assert facts.model == "amazon.nova-lite-v1:0" and facts.stream
    assert [(s.kind, s.name) for s in facts.structure] == [("tool_input", "w")]


# --------------------------------------------------------------------------- Cohere


def _cohere(*events: dict[str, Any]) -> list[AdapterEvent]:
    adapter = CohereChatAdapter()
    return [e for t, obj in enumerate(events) for e in adapter.feed(Frame(orjson.dumps(obj), t))]


def test_cohere_message_end_gives_finish_usage_from_tokens_and_done() -> None:
    end = {
        "type": "message-end",
        "delta": {
            "finish_reason": "MAX_TOKENS",
            "usage": {
                "billed_units": {"input_tokens": 1.0, "output_tokens": 2.0},
                "tokens": {"input_tokens": 10.0, "output_tokens": 20.0},
            },
        },
    }
    assert _cohere(end) == [Finish("length"), UsageReport(10, 20), Done()]


def test_cohere_tool_plan_and_thinking_are_reasoning() -> None:
    plan = {"type": "tool-plan-delta", "delta": {"message": {"tool_plan": "I will"}}}
    thinking = {
        "type": "content-delta",
        "index": 0,
        "delta": {"message": {"content": {"thinking": "hmm"}}},
    }
    assert _cohere(plan, thinking) == [ReasoningDelta(0), ReasoningDelta(1)]


def test_cohere_error_finish_is_an_error() -> None:
    end = {"type": "message-end", "delta": {"finish_reason": "ERROR"}}
    assert _cohere(end) == [StreamError("error"), Done()]


def test_cohere_request_documents_are_context() -> None:
    body = {
        "model": "command-a",
        "messages": [{"role": "user", "content": "Who won?"}],
        "documents": ["Doc one.", {"id": "2", "data": {"title": "T", "snippet": "Doc two."}}],
        "response_format": {"type": "json_object"},
    }
    facts, _ = extract_request(
        orjson.dumps(body), "cohere_chat", Extract(), long_context_tokens=4000
    )
    assert facts.query == "Who won?"
    assert facts.context == ("Doc one.", "T\nDoc two.")
    assert [s.kind for s in facts.structure] == ["json_object"]
