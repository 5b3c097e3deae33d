"""OpenAI Responses API adapter."""

from __future__ import annotations

import json

import pytest

from semhealth.collectors.adapters.openai_responses import OpenAIResponsesAdapter
from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    Malformed,
    ModelReport,
    ProviderToolCall,
    ReasoningDelta,
    StreamError,
    ToolCallDelta,
    UsageReport,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StreamState

MODEL = "gpt-4.1-2025-04-14"

_RESPONSE_HEAD = (
    '"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response",'
    '"created_at":1741290958,"error":null,"instructions":"You are a helpful assistant.",'
    '"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","parallel_tool_calls":true,'
    '"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,'
    '"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],'
    '"top_p":1.0,"truncation":"disabled","user":null,"metadata":{}'
)

TEXT_STREAM = [
    (
        "response.created",
        '{"type":"response.created","sequence_number":0,"response":{' + _RESPONSE_HEAD + ","
        '"status":"in_progress","incomplete_details":null,"output":[],"usage":null}}',
    ),
    (
        "response.in_progress",
        '{"type":"response.in_progress","sequence_number":1,"response":{' + _RESPONSE_HEAD + ","
        '"status":"in_progress","incomplete_details":null,"output":[],"usage":null}}',
    ),
    (
        "response.output_item.added",
        '{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":'
        '{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message",'
        '"status":"in_progress","role":"assistant","content":[]}}',
    ),
    (
        "response.content_part.added",
        '{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_67c9",'
        '"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}',
    ),
    (
        "response.output_text.delta",
        '{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9",'
        '"output_index":0,"content_index":0,"delta":"Hi"}',
    ),
    (
        "response.output_text.delta",
        '{"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_67c9",'
        '"output_index":0,"content_index":0,"delta":" there!"}',
    ),
    (
        "response.output_text.done",
        '{"type":"response.output_text.done","sequence_number":6,"item_id":"msg_67c9",'
        '"output_index":0,"content_index":0,"text":"Hi there!"}',
    ),
    (
        "response.completed",
        '{"type":"response.completed","sequence_number":7,"response":{' + _RESPONSE_HEAD + ","
        '"status":"completed","incomplete_details":null,"output":[{"id":"msg_67c9",'
        '"type":"message","status":"completed","role":"assistant","content":[{'
        '"type":"output_text","text":"Hi there!","annotations":[]}]}],'
        '"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":0},'
        '"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48}}}',
    ),
]

TOOL_STREAM = [
    (
        "response.created",
        '{"type":"response.created","sequence_number":0,"response":{"id":"resp_1",'
        '"object":"response","model":"gpt-4o","status":"in_progress","output":[],"usage":null}}',
    ),
    (
        "response.output_item.added",
        '{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":'
        '{"id":"rs_1","type":"reasoning","summary":[]}}',
    ),
    (
        "response.output_item.added",
        '{"type":"response.output_item.added","sequence_number":2,"output_index":1,"item":'
        '{"id":"fc_12345xyz","call_id":"call_12345xyz","type":"function_call","name":"get_weather",'
        '"arguments":"","status":"in_progress"}}',
    ),
    (
        "response.function_call_arguments.delta",
        '{"type":"response.function_call_arguments.delta","sequence_number":3,"item_id":"fc_12345xyz",'
        '"output_index":1,"delta":"{\\"location\\":"}',
    ),
    (
        "response.function_call_arguments.delta",
        '{"type":"response.function_call_arguments.delta","sequence_number":4,"item_id":"fc_12345xyz",'
        '"output_index":1,"delta":"\\"Paris, France\\"}"}',
    ),
    (
        "response.function_call_arguments.done",
        '{"type":"response.function_call_arguments.done","sequence_number":5,"item_id":"fc_12345xyz",'
        '"output_index":1,"arguments":"{\\"location\\":\\"Paris, France\\"}"}',
    ),
    (
        "response.completed",
        '{"type":"response.completed","sequence_number":6,"response":{"id":"resp_1",'
        '"object":"response","model":"gpt-4o","status":"completed","output":[],'
        '"usage":{"input_tokens":80,"output_tokens":20,"total_tokens":100}}}',
    ),
]

BODY = (
    b'{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response",'
    b'"created_at":1741476542,"status":"completed","error":null,"incomplete_details":null,'
    b'"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf17f0",'
    b'"status":"completed","role":"assistant","content":[{"type":"output_text",'
    b'"text":"In a peaceful grove beneath a silver moon...","annotations":[]}]}],'
    b'"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,'
    b'"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}}'
)


def feed_all(events_data: list[tuple[str, str]]) -> list[AdapterEvent]:
    adapter = OpenAIResponsesAdapter()
    events: list[AdapterEvent] = []
    for t, (name, data) in enumerate(events_data, start=100):
        events += adapter.feed(Frame(data=data, t=t, event=name))
    return events


def fold(events: list[AdapterEvent]) -> StreamState:
    state = StreamState()
    for event in events:
        state.apply(event)
    return state


def terminal(kind: str, response: str) -> list[AdapterEvent]:
    return OpenAIResponsesAdapter().feed(
        Frame(data=f'{{"type":"{kind}","response":{response}}}', t=1, event=kind)
    )


def test_text_stream_emits_exact_events() -> None:
    assert feed_all(TEXT_STREAM) == [
        ModelReport(MODEL),
        ContentDelta("Hi", 104),
        ContentDelta(" there!", 105),
        Finish("stop"),
        UsageReport(input_tokens=37, output_tokens=11, reasoning_tokens=0),
        Done(),
    ]


def test_text_stream_folds_into_record_facts() -> None:
    state = fold(feed_all(TEXT_STREAM))
    assert state.output_text == "Hi there!"
    assert (state.usage_in, state.usage_out, state.finish_reason, state.done) == (
        37,
        11,
        "stop",
        True,
    )


def test_function_call_stream_emits_exact_events() -> None:
    assert feed_all(TOOL_STREAM) == [
        ModelReport("gpt-4o"),
        ToolCallDelta(index=0, t=102, id="call_12345xyz", name="get_weather"),
        ToolCallDelta(index=0, t=103, arguments='{"location":'),
        ToolCallDelta(index=0, t=104, arguments='"Paris, France"}'),
        Finish("tool_calls"),
        UsageReport(input_tokens=80, output_tokens=20),
        Done(),
    ]


def test_function_call_arguments_fold_joined() -> None:
    (call,) = fold(feed_all(TOOL_STREAM)).tool_calls()
    assert (call.index, call.id, call.name, call.arguments) == (
        0,
        "call_12345xyz",
        "get_weather",
        '{"location":"Paris, France"}',
    )


def test_arguments_without_item_added_still_get_a_tool_index() -> None:
    events = feed_all(TOOL_STREAM[3:5])
    assert events == [
        ToolCallDelta(index=0, t=100, arguments='{"location":'),
        ToolCallDelta(index=0, t=101, arguments='"Paris, France"}'),
    ]


def test_event_type_is_read_from_data_when_event_name_is_missing() -> None:
    data = '{"type":"response.output_text.delta","output_index":0,"delta":"x"}'
    assert OpenAIResponsesAdapter().feed(Frame(data=data, t=3)) == [ContentDelta("x", 3)]


def test_refusal_delta_counts_as_content() -> None:
    data = '{"type":"response.refusal.delta","output_index":0,"delta":"I can\'t"}'
    assert OpenAIResponsesAdapter().feed(Frame(data=data, t=3)) == [ContentDelta("I can't", 3)]


def test_incomplete_for_max_output_tokens_finishes_as_length() -> None:
    response = (
        '{"model":"gpt-4o","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},'
        '"usage":{"input_tokens":5,"output_tokens":16}}'
    )
    assert terminal("response.incomplete", response) == [
        ModelReport("gpt-4o"),
        Finish("length"),
        UsageReport(input_tokens=5, output_tokens=16),
        Done(),
    ]


def test_incomplete_for_content_filter_finishes_as_content_filter() -> None:
    response = '{"status":"incomplete","incomplete_details":{"reason":"content_filter"}}'
    assert terminal("response.incomplete", response) == [Finish("content_filter"), Done()]


def test_failed_response_is_stream_error_by_code_and_done() -> None:
    response = (
        '{"status":"failed","error":{"code":"server_error","message":"private"},"usage":null}'
    )
    assert terminal("response.failed", response) == [StreamError("server_error"), Done()]


def test_error_event_uses_its_code() -> None:
    data = '{"type":"error","code":"ERR_SOMETHING","message":"Something went wrong","param":null}'
    events = OpenAIResponsesAdapter().feed(Frame(data=data, t=1, event="error"))
    assert events == [StreamError("ERR_SOMETHING")]


def test_error_event_with_nested_error_uses_its_type() -> None:
    data = '{"type":"error","error":{"type":"invalid_request_error","code":null,"message":"m"}}'
    events = OpenAIResponsesAdapter().feed(Frame(data=data, t=1, event="error"))
    assert events == [StreamError("invalid_request_error")]


def test_body_emits_content_as_one_delta_and_done() -> None:
    assert OpenAIResponsesAdapter().feed(Frame(data=BODY, t=5)) == [
        ModelReport(MODEL),
        ContentDelta("In a peaceful grove beneath a silver moon...", 5),
        Finish("stop"),
        UsageReport(input_tokens=36, output_tokens=87, reasoning_tokens=0),
        Done(),
    ]


def test_body_function_calls_finish_as_tool_calls() -> None:
    body = (
        b'{"id":"resp_2","object":"response","status":"completed","model":"gpt-4o","output":['
        b'{"type":"reasoning","id":"rs_1","summary":[]},'
        b'{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather",'
        b'"arguments":"{\\"location\\":\\"Paris\\"}","status":"completed"}],'
        b'"usage":{"input_tokens":10,"output_tokens":5}}'
    )
    assert OpenAIResponsesAdapter().feed(Frame(data=body, t=5)) == [
        ModelReport("gpt-4o"),
        ToolCallDelta(
            index=0, t=5, id="call_1", name="get_weather", arguments='{"location":"Paris"}'
        ),
        Finish("tool_calls"),
        UsageReport(input_tokens=10, output_tokens=5),
        Done(),
    ]


def test_queued_background_body_is_not_done() -> None:
    body = (
        b'{"id":"resp_3","object":"response","status":"queued","model":"o3","output":[],'
        b'"usage":null}'
    )
    assert OpenAIResponsesAdapter().feed(Frame(data=body, t=5)) == [ModelReport("o3")]


def test_unknown_event_type_is_ignored() -> None:
    data = '{"type":"response.future_event.delta","output_index":0,"delta":"x"}'
    assert OpenAIResponsesAdapter().feed(Frame(data=data, t=1)) == []


def test_a_reasoning_summary_is_timed_and_is_not_content() -> None:
    data = '{"type":"response.reasoning_summary_text.delta","output_index":0,"delta":"thinking"}'
    assert OpenAIResponsesAdapter().feed(Frame(data=data, t=1)) == [ReasoningDelta(1)]


def test_event_without_type_is_malformed_shape() -> None:
    assert OpenAIResponsesAdapter().feed(Frame(data='{"delta":"x"}', t=1)) == [Malformed("shape")]


def test_argument_delta_without_output_index_is_malformed_shape() -> None:
    data = '{"type":"response.function_call_arguments.delta","delta":"{}"}'
    assert OpenAIResponsesAdapter().feed(Frame(data=data, t=1)) == [Malformed("shape")]


def test_terminal_event_without_response_is_malformed_shape() -> None:
    assert terminal("response.completed", "null") == [Malformed("shape")]


def test_bad_json_is_malformed_json() -> None:
    frame = Frame(
        data='{"type":"response.output_text.delta",', t=1, event="response.output_text.delta"
    )
    assert OpenAIResponsesAdapter().feed(frame) == [Malformed("json")]


@pytest.mark.parametrize(
    ("item_type", "kind"),
    [
        ("web_search_call", "web_search"),
        ("file_search_call", "file_search"),
        ("code_interpreter_call", "code_execution"),
        ("image_generation_call", "image_generation"),
        ("mcp_call", "mcp"),
    ],
)
def test_each_built_in_tool_openai_runs_is_counted_by_its_kind(item_type: str, kind: str) -> None:
    added = {
        "type": "response.output_item.added",
        "output_index": 0,
        "item": {"type": item_type, "id": "x", "status": "in_progress"},
    }
    events = OpenAIResponsesAdapter().feed(Frame(data=json.dumps(added), t=1))
    assert events == [ProviderToolCall(kind)]


def test_a_built_in_tool_is_not_a_tool_call_and_does_not_shift_the_tool_index() -> None:
    frames = [
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"type": "web_search_call", "id": "ws", "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"type": "function_call", "call_id": "c", "name": "f", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{}"},
    ]  # fmt: skip
    adapter, state = OpenAIResponsesAdapter(), StreamState()
    for t, frame in enumerate(frames):
        for event in adapter.feed(Frame(data=json.dumps(frame), t=t)):
            state.apply(event)
    assert state.provider_tools == ["web_search"]
    assert [(c.index, c.name, c.arguments) for c in state.tool_calls()] == [(0, "f", "{}")]


def test_a_whole_response_counts_its_built_in_tools() -> None:
    body = {
        "object": "response",
        "status": "completed",
        "model": "gpt",
        "output": [
            {"type": "code_interpreter_call", "id": "ci", "status": "completed"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "42"}]},
        ],
    }  # fmt: skip
    state = StreamState()
    for event in OpenAIResponsesAdapter().feed(Frame(data=json.dumps(body), t=1)):
        state.apply(event)
    assert state.provider_tools == ["code_execution"] and state.output_text == "42"
