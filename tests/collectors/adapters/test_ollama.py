"""Ollama native NDJSON adapter."""

from __future__ import annotations

from semhealth.collectors.adapters.ollama import OllamaAdapter
from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    Malformed,
    ModelReport,
    StreamError,
    ToolCallDelta,
    UsageReport,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StreamState

CHAT_STREAM = [
    b'{"model":"llama3.2","created_at":"2024-08-04T08:52:19.385406455-07:00",'
    b'"message":{"role":"assistant","content":"The"},"done":false}',
    b'{"model":"llama3.2","created_at":"2024-08-04T08:52:19.485406455-07:00",'
    b'"message":{"role":"assistant","content":" sky"},"done":false}',
    b'{"model":"llama3.2","created_at":"2024-08-04T08:52:19.585406455-07:00",'
    b'"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",'
    b'"total_duration":4883583458,"load_duration":1334875,"prompt_eval_count":26,'
    b'"prompt_eval_duration":342546000,"eval_count":282,"eval_duration":4535599000}',
]

GENERATE_STREAM = [
    b'{"model":"llama3.2","created_at":"2024-08-04T19:22:45.499127Z",'
    b'"response":"Why","done":false}',
    b'{"model":"llama3.2","created_at":"2024-08-04T19:22:45.599127Z",'
    b'"response":" not","done":false}',
    b'{"model":"llama3.2","created_at":"2024-08-04T19:22:45.699127Z","response":"","done":true,'
    b'"done_reason":"length","context":[1,2,3],"total_duration":10706818083,'
    b'"prompt_eval_count":13,"eval_count":2}',
]

TOOL_BODY = (
    b'{"model":"llama3.2","created_at":"2024-07-22T20:33:28.123648Z","message":{"role":"assistant",'
    b'"content":"","tool_calls":[{"function":{"name":"get_current_weather","arguments":'
    b'{"format":"celsius","location":"Paris, FR"}}}]},"done_reason":"stop","done":true,'
    b'"total_duration":885095291,"prompt_eval_count":122,"eval_count":20}'
)


def feed_all(lines: list[bytes]) -> list[AdapterEvent]:
    adapter = OllamaAdapter()
    events: list[AdapterEvent] = []
    for t, line in enumerate(lines, start=100):
        events += adapter.feed(Frame(data=line, t=t))
    return events


def fold(events: list[AdapterEvent]) -> StreamState:
    state = StreamState()
    for event in events:
        state.apply(event)
    return state


def test_chat_stream_emits_exact_events() -> None:
    assert feed_all(CHAT_STREAM) == [
        ModelReport("llama3.2"),
        ContentDelta("The", 100),
        ContentDelta(" sky", 101),
        Finish("stop"),
        UsageReport(input_tokens=26, output_tokens=282),
        Done(),
    ]


def test_generate_stream_folds_into_record_facts() -> None:
    state = fold(feed_all(GENERATE_STREAM))
    assert state.output_text == "Why not"
    assert (state.usage_in, state.usage_out, state.finish_reason, state.done) == (
        13,
        2,
        "length",
        True,
    )
    assert state.model == "llama3.2"


def test_tool_call_body_emits_exact_events() -> None:
    assert feed_all([TOOL_BODY]) == [
        ModelReport("llama3.2"),
        ToolCallDelta(
            index=0,
            t=100,
            name="get_current_weather",
            arguments='{"format":"celsius","location":"Paris, FR"}',
        ),
        Finish("tool_calls"),
        UsageReport(input_tokens=122, output_tokens=20),
        Done(),
    ]


def test_tool_calls_across_lines_take_increasing_indices() -> None:
    line = (
        b'{"model":"m","message":{"role":"assistant","content":"","tool_calls":'
        b'[{"function":{"name":"f","arguments":{}}}]},"done":false}'
    )
    calls = fold(feed_all([line, line])).tool_calls()
    assert [(c.index, c.name, c.arguments) for c in calls] == [(0, "f", "{}"), (1, "f", "{}")]


def test_non_streamed_chat_body_is_content_and_done() -> None:
    body = (
        b'{"model":"llama3.2","created_at":"2023-12-12T14:13:43.416799Z","message":{"role":"assistant",'
        b'"content":"Hello! How are you today?"},"done":true,"done_reason":"stop",'
        b'"prompt_eval_count":26,"eval_count":298}'
    )
    assert feed_all([body]) == [
        ModelReport("llama3.2"),
        ContentDelta("Hello! How are you today?", 100),
        Finish("stop"),
        UsageReport(input_tokens=26, output_tokens=298),
        Done(),
    ]


def test_thinking_is_not_content() -> None:
    line = (
        b'{"model":"qwen3","message":{"role":"assistant","content":"","thinking":"hmm"},'
        b'"done":false}'
    )
    assert feed_all([line]) == [ModelReport("qwen3")]


def test_error_line_is_stream_error_without_its_message() -> None:
    assert feed_all([b'{"error":"model \'llama9\' not found"}']) == [StreamError("error")]


def test_line_without_done_is_malformed_shape() -> None:
    assert feed_all([b'{"model":"m","response":"x"}']) == [Malformed("shape")]


def test_object_arguments_must_be_object_or_string() -> None:
    line = (
        b'{"model":"m","message":{"tool_calls":[{"function":{"name":"f","arguments":[1]}}]},'
        b'"done":false}'
    )
    assert feed_all([line]) == [Malformed("shape")]


def test_bad_json_is_malformed_json() -> None:
    assert feed_all([b'{"model":"m","done":fal']) == [Malformed("json")]


def test_invalid_utf8_is_malformed_json() -> None:
    assert feed_all([b'{"model":"\xff","done":false}']) == [Malformed("json")]
