"""Anthropic Messages adapter."""

from __future__ import annotations

import json

import pytest

from semhealth.collectors.adapters.anthropic_messages import AnthropicMessagesAdapter
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

MODEL = "claude-sonnet-4-5-20250929"

TEXT_STREAM = [
    (
        "message_start",
        '{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",'
        '"type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929",'
        '"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,'
        '"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}',
    ),
    (
        "content_block_start",
        '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
    ),
    ("ping", '{"type": "ping"}'),
    (
        "content_block_delta",
        '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}',
    ),
    (
        "content_block_delta",
        '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}',
    ),
    ("content_block_stop", '{"type":"content_block_stop","index":0}'),
    (
        "message_delta",
        '{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
        '"usage":{"output_tokens":15}}',
    ),
    ("message_stop", '{"type":"message_stop"}'),
]

TOOL_STREAM = [
    (
        "message_start",
        '{"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message",'
        '"role":"assistant","model":"claude-sonnet-4-5-20250929","stop_sequence":null,'
        '"usage":{"input_tokens":472,"output_tokens":2},"content":[],"stop_reason":null}}',
    ),
    (
        "content_block_start",
        '{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}',
    ),
    (
        "content_block_delta",
        '{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Weather..."}}',
    ),
    (
        "content_block_delta",
        '{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}',
    ),
    ("content_block_stop", '{"type":"content_block_stop","index":0}'),
    (
        "content_block_start",
        '{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}',
    ),
    (
        "content_block_delta",
        '{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Checking."}}',
    ),
    ("content_block_stop", '{"type":"content_block_stop","index":1}'),
    (
        "content_block_start",
        '{"type":"content_block_start","index":2,"content_block":{"type":"tool_use",'
        '"id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}',
    ),
    (
        "content_block_delta",
        '{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}',
    ),
    (
        "content_block_delta",
        '{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta",'
        '"partial_json":"{\\"location\\": \\"San Fra"}}',
    ),
    (
        "content_block_delta",
        '{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta",'
        '"partial_json":"ncisco, CA\\"}"}}',
    ),
    ("content_block_stop", '{"type":"content_block_stop","index":2}'),
    (
        "message_delta",
        '{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},'
        '"usage":{"output_tokens":89}}',
    ),
    ("message_stop", '{"type":"message_stop"}'),
]

BODY = (
    b'{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant",'
    b'"model":"claude-sonnet-4-5-20250929",'
    b'"content":[{"type":"text","text":"Hi! My name is Claude."}],'
    b'"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,'
    b'"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":503}}'
)


def feed_all(events_data: list[tuple[str, str]]) -> list[AdapterEvent]:
    adapter = AnthropicMessagesAdapter()
    events: list[AdapterEvent] = []
    for t, (name, data) in enumerate(events_data, start=100):
        events += adapter.feed(Frame(data=data, t=t, event=name))
    return events


def fold(events: list[AdapterEvent]) -> StreamState:
    state = StreamState()
    for event in events:
        state.apply(event)
    return state


def one(data: str, event: str = "") -> list[AdapterEvent]:
    return AnthropicMessagesAdapter().feed(Frame(data=data, t=1, event=event))


def test_text_stream_emits_exact_events() -> None:
    assert feed_all(TEXT_STREAM) == [
        ModelReport(MODEL),
        UsageReport(input_tokens=25, output_tokens=1),
        ContentDelta("Hello", 103),
        ContentDelta("!", 104),
        Finish("stop"),
        UsageReport(input_tokens=None, output_tokens=15),
        Done(),
    ]


def test_text_stream_folds_into_record_facts() -> None:
    state = fold(feed_all(TEXT_STREAM))
    assert state.output_text == "Hello!"
    # message_delta's usage is output-only: input from message_start survives it.
    assert (state.usage_in, state.usage_out, state.finish_reason, state.done) == (
        25,
        15,
        "stop",
        True,
    )


def test_tool_stream_emits_exact_events() -> None:
    assert feed_all(TOOL_STREAM) == [
        ModelReport(MODEL),
        UsageReport(input_tokens=472, output_tokens=2),
        ReasoningDelta(102),  # thinking is timed, never content
        ContentDelta("Checking.", 106),
        ToolCallDelta(index=0, t=108, id="toolu_01T1x1fJ34qAmk2tNTrN7Up6", name="get_weather"),
        ToolCallDelta(index=0, t=110, arguments='{"location": "San Fra'),
        ToolCallDelta(index=0, t=111, arguments='ncisco, CA"}'),
        Finish("tool_calls"),
        UsageReport(input_tokens=None, output_tokens=89),
        Done(),
    ]


def test_tool_stream_folds_thinking_out_and_arguments_joined() -> None:
    state = fold(feed_all(TOOL_STREAM))
    assert state.output_text == "Checking."
    (call,) = state.tool_calls()
    assert (call.index, call.name, call.arguments) == (
        0,
        "get_weather",
        '{"location": "San Francisco, CA"}',
    )


def test_tool_index_counts_tool_blocks_only() -> None:
    adapter = AnthropicMessagesAdapter()
    starts = [
        '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
        '{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"a","name":"f","input":{}}}',
        '{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"b","name":"g","input":{}}}',
    ]
    events = [e for s in starts for e in adapter.feed(Frame(data=s, t=1))]
    assert [(e.index, e.id) for e in events if isinstance(e, ToolCallDelta)] == [(0, "a"), (1, "b")]


def test_server_tool_input_is_not_a_tool_call() -> None:
    adapter = AnthropicMessagesAdapter()
    start = (
        '{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use",'
        '"id":"srvtoolu_1","name":"web_search","input":{}}}'
    )
    delta = (
        '{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta",'
        '"partial_json":"{\\"query\\": \\"x\\"}"}}'
    )
    events = adapter.feed(Frame(data=start, t=1)) + adapter.feed(Frame(data=delta, t=2))
    assert events == [ProviderToolCall("web_search")]


@pytest.mark.parametrize(
    ("block", "kind"),
    [
        ('{"type":"server_tool_use","id":"s","name":"web_search","input":{}}', "web_search"),
        ('{"type":"server_tool_use","id":"s","name":"web_fetch","input":{}}', "web_fetch"),
        (
            '{"type":"server_tool_use","id":"s","name":"code_execution","input":{}}',
            "code_execution",
        ),
        (
            '{"type":"server_tool_use","id":"s","name":"bash_code_execution","input":{}}',
            "code_execution",
        ),
        ('{"type":"server_tool_use","id":"s","name":"tool_search_tool_regex","input":{}}', "other"),
        ('{"type":"mcp_tool_use","id":"m","name":"echo","server_name":"x","input":{}}', "mcp"),
    ],
)
def test_each_tool_anthropic_runs_is_counted_by_its_kind(block: str, kind: str) -> None:
    start = f'{{"type":"content_block_start","index":0,"content_block":{block}}}'
    assert AnthropicMessagesAdapter().feed(Frame(data=start, t=1)) == [ProviderToolCall(kind)]


def test_a_whole_message_counts_its_server_tools_and_keeps_its_tool_calls_apart() -> None:
    body = {
        "type": "message",
        "model": "claude",
        "stop_reason": "tool_use",
        "content": [
            {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {"query": "x"}},
            {"type": "web_search_tool_result", "tool_use_id": "s", "content": []},
            {"type": "text", "text": "Found it."},
            {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
        ],
    }
    state = StreamState()
    for event in AnthropicMessagesAdapter().feed(Frame(data=json.dumps(body), t=1)):
        state.apply(event)
    assert state.provider_tools == ["web_search"]
    assert [(c.name, c.arguments) for c in state.tool_calls()] == [("f", '{"a":1}')]


def test_input_json_for_unstarted_block_gets_a_tool_index() -> None:
    delta = (
        '{"type":"content_block_delta","index":3,'
        '"delta":{"type":"input_json_delta","partial_json":"{}"}}'
    )
    assert one(delta) == [ToolCallDelta(index=0, t=1, arguments="{}")]


def test_cached_input_tokens_count_as_input() -> None:
    start = (
        '{"type":"message_start","message":{"model":"m","usage":{"input_tokens":3,'
        '"cache_creation_input_tokens":10,"cache_read_input_tokens":200,"output_tokens":1}}}'
    )
    assert UsageReport(input_tokens=213, output_tokens=1) in one(start)


def test_max_tokens_finishes_as_length() -> None:
    data = (
        '{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":9}}'
    )
    assert one(data)[0] == Finish("length")


def test_stop_sequence_finishes_as_stop() -> None:
    assert one('{"type":"message_delta","delta":{"stop_reason":"stop_sequence"}}') == [
        Finish("stop")
    ]


def test_refusal_finishes_as_content_filter() -> None:
    assert one('{"type":"message_delta","delta":{"stop_reason":"refusal"}}') == [
        Finish("content_filter")
    ]


def test_unknown_stop_reason_passes_through() -> None:
    assert one('{"type":"message_delta","delta":{"stop_reason":"pause_turn"}}') == [
        Finish("pause_turn")
    ]


def test_error_event_becomes_stream_error_by_type() -> None:
    data = '{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'
    assert one(data, event="error") == [StreamError("overloaded_error")]


def test_ping_is_ignored() -> None:
    assert one('{"type": "ping"}', event="ping") == []


def test_unknown_event_is_ignored() -> None:
    assert one('{"type":"content_block_future","index":0}') == []


def test_body_emits_content_as_one_delta_and_done() -> None:
    assert AnthropicMessagesAdapter().feed(Frame(data=BODY, t=4)) == [
        ModelReport(MODEL),
        ContentDelta("Hi! My name is Claude.", 4),
        Finish("stop"),
        UsageReport(input_tokens=3195, output_tokens=503),
        Done(),
    ]


def test_body_tool_use_input_becomes_json_arguments() -> None:
    body = (
        b'{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-4-1",'
        b'"content":[{"type":"text","text":"Let me check."},{"type":"tool_use","id":"toolu_1",'
        b'"name":"get_weather","input":{"location":"Paris"}}],"stop_reason":"tool_use",'
        b'"usage":{"input_tokens":10,"output_tokens":20}}'
    )
    state = fold(AnthropicMessagesAdapter().feed(Frame(data=body, t=4)))
    (call,) = state.tool_calls()
    assert (call.id, call.name, call.arguments) == (
        "toolu_1",
        "get_weather",
        '{"location":"Paris"}',
    )
    assert (state.output_text, state.finish_reason, state.done) == (
        "Let me check.",
        "tool_calls",
        True,
    )


def test_error_body_becomes_stream_error() -> None:
    body = (
        b'{"type":"error","error":{"type":"invalid_request_error",'
        b'"message":"max_tokens: field required"}}'
    )
    assert AnthropicMessagesAdapter().feed(Frame(data=body, t=1)) == [
        StreamError("invalid_request_error")
    ]


def test_bad_json_is_malformed_json() -> None:
    assert one('{"type":"content_block_delta"', event="content_block_delta") == [Malformed("json")]


def test_wrongly_typed_text_is_malformed_shape() -> None:
    data = '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":["x"]}}'
    assert one(data) == [Malformed("shape")]


def test_event_without_type_is_malformed_shape() -> None:
    assert one('{"index":0}') == [Malformed("shape")]
