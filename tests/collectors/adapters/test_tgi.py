"""Text-generation-inference native adapter."""

from __future__ import annotations

from semhealth.collectors.adapters.tgi import TGIAdapter
from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    Malformed,
    StreamError,
    UsageReport,
)
from semhealth.collectors.frames import Frame
from semhealth.collectors.record import StreamState

STREAM = [
    '{"index":1,"token":{"id":1939,"text":"Deep","logprob":-0.42,"special":false},'
    '"generated_text":null,"details":null}',
    '{"index":2,"token":{"id":6509,"text":" learning","logprob":-0.03,"special":false},'
    '"generated_text":null,"details":null}',
    '{"index":3,"token":{"id":2,"text":"</s>","logprob":-0.1,"special":true},'
    '"generated_text":"Deep learning","details":{"finish_reason":"eos_token","generated_tokens":3,'
    '"seed":null,"input_length":7}}',
]


def feed_all(datas: list[str]) -> list[AdapterEvent]:
    adapter = TGIAdapter()
    events: list[AdapterEvent] = []
    for t, data in enumerate(datas, start=100):
        events += adapter.feed(Frame(data=data, t=t))
    return events


def fold(events: list[AdapterEvent]) -> StreamState:
    state = StreamState()
    for event in events:
        state.apply(event)
    return state


def one(data: str | bytes) -> list[AdapterEvent]:
    return TGIAdapter().feed(Frame(data=data, t=1))


def test_stream_emits_exact_events_skipping_special_tokens() -> None:
    assert feed_all(STREAM) == [
        ContentDelta("Deep", 100),
        ContentDelta(" learning", 101),
        Finish("stop"),
        UsageReport(input_tokens=7, output_tokens=3),
        Done(),
    ]


def test_stream_folds_into_record_facts() -> None:
    state = fold(feed_all(STREAM))
    assert state.output_text == "Deep learning"
    assert (state.usage_in, state.usage_out, state.finish_reason, state.done) == (
        7,
        3,
        "stop",
        True,
    )


def test_length_finish_with_prompt_tokens_field() -> None:
    data = (
        '{"token":{"id":5,"text":".","special":false},"generated_text":"a.",'
        '"details":{"finish_reason":"length","generated_tokens":20,"prompt_tokens":11}}'
    )
    assert one(data) == [
        ContentDelta(".", 1),
        Finish("length"),
        UsageReport(input_tokens=11, output_tokens=20),
        Done(),
    ]


def test_stop_sequence_finishes_as_stop() -> None:
    data = (
        '{"token":{"id":1,"text":"x","special":false},"details":{"finish_reason":"stop_sequence"}}'
    )
    assert Finish("stop") in one(data)


def test_body_emits_content_as_one_delta_and_done() -> None:
    body = (
        b'{"generated_text":"Deep learning is a subset of machine learning.","details":'
        b'{"finish_reason":"length","generated_tokens":10,"seed":null,"prefill":[],"tokens":[]}}'
    )
    assert one(body) == [
        ContentDelta("Deep learning is a subset of machine learning.", 1),
        Finish("length"),
        UsageReport(input_tokens=None, output_tokens=10),
        Done(),
    ]


def test_body_without_details_is_content_and_done() -> None:
    assert one(b'{"generated_text":"Hi"}') == [ContentDelta("Hi", 1), Done()]


def test_list_body_feeds_its_first_item_only() -> None:
    assert one(b'[{"generated_text":"A"},{"generated_text":"B"}]') == [ContentDelta("A", 1), Done()]


def test_error_becomes_stream_error_by_error_type() -> None:
    data = (
        '{"error":"Input validation error: `inputs` must have less than 4096 tokens",'
        '"error_type":"validation"}'
    )
    assert one(data) == [StreamError("validation")]


def test_error_without_type_is_generic_stream_error() -> None:
    assert one('{"error":"Request failed during generation"}') == [StreamError("error")]


def test_unrelated_object_is_malformed_shape() -> None:
    assert one('{"text":"x"}') == [Malformed("shape")]


def test_wrongly_typed_special_flag_is_malformed_shape() -> None:
    assert one('{"token":{"id":1,"text":"x","special":"no"}}') == [Malformed("shape")]


def test_bad_json_is_malformed_json() -> None:
    assert one('{"token":') == [Malformed("json")]
