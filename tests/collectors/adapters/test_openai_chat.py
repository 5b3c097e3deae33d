"""OpenAI Chat Completions and legacy Completions adapters."""

from __future__ import annotations

from semhealth.collectors.adapters.openai_chat import OpenAIChatAdapter, OpenAICompletionsAdapter
from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    Malformed,
    ModelReport,
    ReasoningDelta,
    StreamError,
    ToolCallDelta,
    UsageReport,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StreamState

MODEL = "gpt-4o-mini-2024-07-18"

TEXT_STREAM = [
    '{"id":"chatcmpl-AZ1","object":"chat.completion.chunk","created":1733000000,'
    '"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1",'
    '"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
    '"logprobs":null,"finish_reason":null}],"usage":null}',
    '{"id":"chatcmpl-AZ1","object":"chat.completion.chunk","created":1733000000,'
    '"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1",'
    '"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],'
    '"usage":null}',
    '{"id":"chatcmpl-AZ1","object":"chat.completion.chunk","created":1733000000,'
    '"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1",'
    '"choices":[{"index":0,"delta":{"content":" there!"},"logprobs":null,"finish_reason":null}],'
    '"usage":null}',
    '{"id":"chatcmpl-AZ1","object":"chat.completion.chunk","created":1733000000,'
    '"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1",'
    '"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}',
    '{"id":"chatcmpl-AZ1","object":"chat.completion.chunk","created":1733000000,'
    '"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[],'
    '"usage":{"prompt_tokens":19,"completion_tokens":3,"total_tokens":22,'
    '"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}',
    "[DONE]",
]

TOOL_STREAM = [
    '{"id":"chatcmpl-T1","object":"chat.completion.chunk","created":1733000001,"model":"gpt-4o",'
    '"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,'
    '"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather",'
    '"arguments":""}}]},"finish_reason":null}]}',
    '{"id":"chatcmpl-T1","object":"chat.completion.chunk","created":1733000001,"model":"gpt-4o",'
    '"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"loc"}}]},'
    '"finish_reason":null}]}',
    '{"id":"chatcmpl-T1","object":"chat.completion.chunk","created":1733000001,"model":"gpt-4o",'
    '"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":'
    '"ation\\": \\"Paris\\"}"}}]},"finish_reason":null}]}',
    '{"id":"chatcmpl-T1","object":"chat.completion.chunk","created":1733000001,"model":"gpt-4o",'
    '"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function",'
    '"function":{"name":"get_time","arguments":"{}"}}]},"finish_reason":null}]}',
    '{"id":"chatcmpl-T1","object":"chat.completion.chunk","created":1733000001,"model":"gpt-4o",'
    '"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
    "[DONE]",
]

BODY = (
    b'{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion",'
    b'"created":1741569952,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"Hello! How can I assist you today?","refusal":null,'
    b'"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,'
    b'"completion_tokens":10,"total_tokens":29},"service_tier":"default"}'
)

TOOL_BODY = (
    b'{"id":"chatcmpl-abc123","object":"chat.completion","created":1699896916,"model":"gpt-4o",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":['
    b'{"id":"call_abc123","type":"function","function":{"name":"get_current_weather",'
    b'"arguments":"{\\n\\"location\\": \\"Boston, MA\\"\\n}"}}]},"logprobs":null,'
    b'"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":82,"completion_tokens":17,'
    b'"total_tokens":99}}'
)


def feed_all(
    adapter: OpenAIChatAdapter | OpenAICompletionsAdapter, datas: list[str]
) -> list[AdapterEvent]:
    events: list[AdapterEvent] = []
    for t, data in enumerate(datas, start=100):
        events += adapter.feed(Frame(data=data, t=t))
    return events


def fold(events: list[AdapterEvent]) -> StreamState:
    state = StreamState()
    for event in events:
        state.apply(event)
    return state


def chunk(delta: str, *, index: int = 0, finish: str = "null") -> str:
    return (
        '{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{'
        f'"index":{index},"delta":{delta},"finish_reason":{finish}}}]}}'
    )


def test_text_stream_emits_exact_events() -> None:
    assert feed_all(OpenAIChatAdapter(), TEXT_STREAM) == [
        ModelReport(MODEL),
        ContentDelta("Hello", 101),
        ContentDelta(" there!", 102),
        Finish("stop"),
        UsageReport(input_tokens=19, output_tokens=3, reasoning_tokens=0),
        Done(),
    ]


def test_text_stream_folds_into_record_facts() -> None:
    state = fold(feed_all(OpenAIChatAdapter(), TEXT_STREAM))
    assert state.output_text == "Hello there!"
    assert (state.usage_in, state.usage_out) == (19, 3)
    assert state.finish_reason == "stop"
    assert state.done
    assert state.model == MODEL
    assert state.delta_ns == [101, 102]


def test_tool_call_stream_emits_exact_events() -> None:
    assert feed_all(OpenAIChatAdapter(), TOOL_STREAM) == [
        ModelReport("gpt-4o"),
        ToolCallDelta(index=0, t=100, id="call_DdmO9pD3xa9XTPNJ32zg2hcA", name="get_weather"),
        ToolCallDelta(index=0, t=101, arguments='{"loc'),
        ToolCallDelta(index=0, t=102, arguments='ation": "Paris"}'),
        ToolCallDelta(index=1, t=103, id="call_2", name="get_time", arguments="{}"),
        Finish("tool_calls"),
        Done(),
    ]


def test_tool_call_stream_folds_into_joined_arguments() -> None:
    state = fold(feed_all(OpenAIChatAdapter(), TOOL_STREAM))
    calls = state.tool_calls()
    assert [(c.index, c.id, c.name, c.arguments) for c in calls] == [
        (0, "call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather", '{"location": "Paris"}'),
        (1, "call_2", "get_time", "{}"),
    ]
    assert state.output_text == ""
    assert state.finish_reason == "tool_calls"


def test_body_emits_content_as_one_delta_and_done() -> None:
    assert OpenAIChatAdapter().feed(Frame(data=BODY, t=7)) == [
        ModelReport("gpt-4.1-2025-04-14"),
        ContentDelta("Hello! How can I assist you today?", 7),
        Finish("stop"),
        UsageReport(input_tokens=19, output_tokens=10),
        Done(),
    ]


def test_body_tool_calls_take_their_list_position_as_index() -> None:
    state = fold(OpenAIChatAdapter().feed(Frame(data=TOOL_BODY, t=7)))
    (call,) = state.tool_calls()
    assert (call.index, call.id, call.name) == (0, "call_abc123", "get_current_weather")
    assert call.arguments == '{\n"location": "Boston, MA"\n}'
    assert state.finish_reason == "tool_calls"
    assert (state.usage_in, state.usage_out, state.done) == (82, 17, True)


def test_refusal_delta_counts_as_content() -> None:
    events = OpenAIChatAdapter().feed(Frame(data=chunk('{"refusal":"I can\'t help"}'), t=5))
    assert ContentDelta("I can't help", 5) in events


def test_only_choice_zero_feeds_content() -> None:
    adapter = OpenAIChatAdapter()
    events = adapter.feed(Frame(data=chunk('{"content":"B"}', index=1, finish='"stop"'), t=1))
    events += adapter.feed(Frame(data=chunk('{"content":"A"}'), t=2))
    assert events == [ModelReport("m"), ContentDelta("A", 2)]


def test_model_is_reported_once_while_unchanged() -> None:
    adapter = OpenAIChatAdapter()
    events = feed_all(adapter, [chunk('{"content":"a"}'), chunk('{"content":"b"}')])
    assert events.count(ModelReport("m")) == 1


def test_done_marker_alone_is_done() -> None:
    assert OpenAIChatAdapter().feed(Frame(data="[DONE]", t=1)) == [Done()]


def test_nested_error_object_becomes_stream_error_by_type() -> None:
    data = (
        '{"error":{"message":"secret prompt text","type":"server_error","param":null,"code":null}}'
    )
    assert OpenAIChatAdapter().feed(Frame(data=data, t=1)) == [StreamError("server_error")]


def test_error_without_type_falls_back_to_code() -> None:
    data = '{"error":{"message":"x","type":null,"code":"rate_limit_exceeded"}}'
    assert OpenAIChatAdapter().feed(Frame(data=data, t=1)) == [StreamError("rate_limit_exceeded")]


def test_vllm_top_level_error_object_becomes_stream_error() -> None:
    data = '{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}'
    assert OpenAIChatAdapter().feed(Frame(data=data, t=1)) == [StreamError("BadRequestError")]


def test_legacy_function_call_delta_becomes_tool_zero() -> None:
    adapter = OpenAIChatAdapter()
    events = adapter.feed(
        Frame(
            data=chunk('{"function_call":{"name":"f","arguments":"{}"}}', finish='"function_call"'),
            t=3,
        )
    )
    assert events[1:] == [
        ToolCallDelta(index=0, t=3, name="f", arguments="{}"),
        Finish("tool_calls"),
    ]


def test_content_parts_list_is_joined_text() -> None:
    delta = '{"content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"ok"}]}'
    assert ContentDelta("ok", 4) in OpenAIChatAdapter().feed(Frame(data=chunk(delta), t=4))


def test_reasoning_content_is_timed_and_is_not_content() -> None:
    events = OpenAIChatAdapter().feed(Frame(data=chunk('{"reasoning_content":"think"}'), t=4))
    assert events == [ModelReport("m"), ReasoningDelta(4)]


def test_bad_json_is_malformed_json() -> None:
    assert OpenAIChatAdapter().feed(Frame(data='{"choices": [', t=1)) == [Malformed("json")]


def test_chunk_without_choices_is_malformed_shape() -> None:
    assert OpenAIChatAdapter().feed(Frame(data='{"id":"x","model":"m"}', t=1)) == [
        Malformed("shape")
    ]


def test_non_object_json_is_malformed_shape() -> None:
    assert OpenAIChatAdapter().feed(Frame(data="[1, 2]", t=1)) == [Malformed("shape")]


def test_wrongly_typed_content_is_malformed_shape() -> None:
    assert OpenAIChatAdapter().feed(Frame(data=chunk('{"content":42}'), t=1)) == [
        Malformed("shape")
    ]


def test_negative_token_count_is_malformed_shape() -> None:
    data = '{"choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":2}}'
    assert OpenAIChatAdapter().feed(Frame(data=data, t=1)) == [Malformed("shape")]


def test_blank_frame_yields_nothing() -> None:
    assert OpenAIChatAdapter().feed(Frame(data="  \n", t=1)) == []


COMPLETIONS_STREAM = [
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct",'
    '"choices":[{"text":"Once","index":0,"logprobs":null,"finish_reason":null}]}',
    '{"id":"cmpl-1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct",'
    '"choices":[{"text":" upon","index":0,"logprobs":null,"finish_reason":"length"}]}',
    "[DONE]",
]


def test_completions_stream_emits_exact_events() -> None:
    assert feed_all(OpenAICompletionsAdapter(), COMPLETIONS_STREAM) == [
        ModelReport("gpt-3.5-turbo-instruct"),
        ContentDelta("Once", 100),
        ContentDelta(" upon", 101),
        Finish("length"),
        Done(),
    ]


def test_completions_body_ends_with_done() -> None:
    body = (
        b'{"id":"cmpl-2","object":"text_completion","created":1,"model":"davinci-002",'
        b'"choices":[{"text":"\\n\\nThis is a test.","index":0,"logprobs":null,'
        b'"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}'
    )
    assert OpenAICompletionsAdapter().feed(Frame(data=body, t=9)) == [
        ModelReport("davinci-002"),
        ContentDelta("\n\nThis is a test.", 9),
        Finish("stop"),
        UsageReport(input_tokens=5, output_tokens=7),
        Done(),
    ]
