"""GenAITraces waits for what belongs with a GenAI span, within limits, and never raises.

Retriever spans and events may come before or after their GenAI span (batching exporters
send spans when they end, in any order); within ``trace_wait_s`` they all count. Memory is
bounded by ``max_pending_spans``, message values by ``max_message_bytes``, and anything
malformed is counted by reason.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semhealth.agent.otlp import genai
from semhealth.agent.otlp.genai import GenAISettings, GenAITraces
from semhealth.collectors import StreamRecord
from tests.agent.otlp.test_genai_forms import (
    END,
    START,
    TRACE,
    log_event,
    messages,
    resource_logs,
    resource_spans,
    span,
)

CHAT = {
    "gen_ai.operation.name": "chat",
    "gen_ai.input.messages": messages(("system", "Answer from the context."), ("user", "Q?")),
    "gen_ai.output.messages": messages(("assistant", "A.")),
}
RETRIEVER_ID = bytes.fromhex("00000000000000aa")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def traces_with_clock(
    **settings_: Any,
) -> tuple[GenAITraces, list[StreamRecord], Clock]:
    records: list[StreamRecord] = []
    clock = Clock()
    traces = GenAITraces(GenAISettings(**settings_), records.append, clock=clock)
    return traces, records, clock


def semconv_retriever(*docs: str) -> Any:
    documents = [{"id": f"d{i}", "score": 0.9, "content": d} for i, d in enumerate(docs)]
    return span(
        {"gen_ai.operation.name": "retrieval", "gen_ai.retrieval.documents": json.dumps(documents)},
        span_id=RETRIEVER_ID,
        name="retrieval",
    )


def test_a_span_waits_for_its_trace_then_is_built_once() -> None:
    traces, records, clock = traces_with_clock(trace_wait_s=2.0)
    traces.add_spans([resource_spans(span(CHAT))])
    assert traces.flush() == 0
    clock.now += 1.9
    assert traces.flush() == 0
    clock.now += 0.2
    assert traces.flush() == 1
    assert traces.flush() == 0
    assert len(records) == 1 and traces.stats.records == 1
    assert traces.pending == 0


def test_retriever_spans_before_and_after_the_genai_span() -> None:
    traces, records, clock = traces_with_clock(trace_wait_s=2.0)
    traces.add_spans([resource_spans(semconv_retriever("Doc one.", "Doc two."))])
    clock.now += 1.5
    traces.add_spans([resource_spans(span(CHAT))])
    clock.now += 1.0
    openinference = span(
        {
            "openinference.span.kind": "RETRIEVER",
            "retrieval.documents.0.document.content": "Doc three.",
            "retrieval.documents.0.document.id": "x",
        },
        span_id=bytes.fromhex("00000000000000bb"),
        name="retrieve",
    )
    vector_db = span(
        {"db.system": "chroma", "db.operation": "query"},
        span_id=bytes.fromhex("00000000000000cc"),
        name="chroma.query",
        events=[("db.query.result", START, {"db.query.result.document": "Doc four."})],
    )
    langchain = span(
        {
            "traceloop.span.kind": "task",
            "traceloop.entity.output": json.dumps(
                {"outputs": [{"page_content": "Doc five.", "metadata": {}}]}
            ),
        },
        span_id=bytes.fromhex("00000000000000dd"),
        name="VectorStoreRetriever.retriever",
    )
    traces.add_spans([resource_spans(openinference, vector_db, langchain)])
    clock.now += 1.1
    assert traces.flush() == 1
    (record,) = records
    assert record.request.query == "Q?"
    assert record.request.context == (
        "Answer from the context.",
        "Doc one.",
        "Doc two.",
        "Doc three.",
        "Doc four.",
        "Doc five.",
    )
    assert traces.stats.retriever_spans == 4
    assert traces.stats.malformed == {}


def test_retriever_after_the_wait_is_counted_late_not_attached() -> None:
    traces, records, clock = traces_with_clock(trace_wait_s=2.0)
    traces.add_spans([resource_spans(span(CHAT))])
    clock.now += 2.0
    assert traces.flush() == 1
    traces.add_spans([resource_spans(semconv_retriever("Too late."))])
    clock.now += 3.0
    traces.flush()
    assert records[0].request.context == ("Answer from the context.",)
    assert traces.stats.late_documents == 1
    assert traces.pending == 0  # the trace was forgotten once quiet


def test_events_before_and_after_their_span_and_orphans() -> None:
    traces, records, clock = traces_with_clock(trace_wait_s=2.0)
    bare = {"gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": ["stop"]}
    traces.add_logs([resource_logs(log_event("gen_ai.user.message", {"content": "Early?"}))])
    clock.now += 1.0
    traces.add_spans([resource_spans(span(bare))])
    choice = {"index": 0, "finish_reason": "stop", "message": {"content": "Late answer."}}
    traces.add_logs([resource_logs(log_event("gen_ai.choice", choice))])
    orphan = log_event("gen_ai.user.message", {"content": "?"}, span_id=b"\x09" * 8)
    not_genai = log_event("app.log", {"content": "ignored"})
    traces.add_logs([resource_logs(orphan, not_genai)])
    clock.now += 5.0
    assert traces.flush() == 1
    (record,) = records
    assert (record.request.query, record.output_text) == ("Early?", "Late answer.")
    assert traces.stats.orphan_events == 1
    assert (traces.stats.log_records_seen, traces.stats.genai_events) == (4, 3)
    assert traces.pending == 0


def test_max_pending_spans_sheds_and_counts() -> None:
    traces, records, clock = traces_with_clock(trace_wait_s=1.0, max_pending_spans=2)
    spans = [span(CHAT, span_id=bytes([0, 0, 0, 0, 0, 0, 0, i + 1])) for i in range(3)]
    assert traces.add_spans([resource_spans(*spans)]) == 1
    assert traces.add_logs([resource_logs(log_event("gen_ai.user.message", {"content": "x"}))]) == 1
    assert (traces.stats.shed, traces.stats.shed_events, traces.pending) == (1, 1, 2)
    clock.now += 1.0
    assert traces.flush() == 2
    assert traces.add_spans([resource_spans(spans[2])]) == 0  # room again
    assert traces.close() == 1
    assert len(records) == 3


def test_oversized_messages_are_not_read() -> None:
    big = "x" * 2000
    traces, records, _ = traces_with_clock(max_message_bytes=1000)
    oversized_input = {**CHAT, "gen_ai.input.messages": messages(("user", big))}
    oversized_output = {
        **CHAT,
        "gen_ai.output.type": "json",
        "gen_ai.output.messages": messages(("assistant", big)),
    }
    traces.add_spans(
        [
            resource_spans(
                span(oversized_input, span_id=b"\x01" * 8),
                span(oversized_output, span_id=b"\x02" * 8),
            )
        ]
    )
    body = {"content": big}
    traces.add_logs([resource_logs(log_event("gen_ai.user.message", body, span_id=b"\x01" * 8))])
    traces.close()
    by_span = {r.trace.span_id if r.trace else "": r for r in records}
    request = by_span[("01" * 8)].request
    assert (request.analysed, request.skip_reason, request.query) == (False, "oversized", None)
    output = by_span["02" * 8]
    assert output.truncated and output.output_text == "" and output.validity == ()
    assert output.request.query == "Q?"
    assert traces.stats.oversized == 3


def test_malformed_values_are_counted_by_reason() -> None:
    traces, records, _ = traces_with_clock()
    bad = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": "[{not json",
        "gen_ai.output.messages": 42,
        "gen_ai.usage.input_tokens": "many",
        "gen_ai.tool.definitions": json.dumps([1, {"name": "t"}]),
    }
    bad_ids = span(CHAT, trace_id=b"\x01\x02", span_id=b"\x03")
    traces.add_spans([resource_spans(span(bad), bad_ids)])
    no_context = log_event("gen_ai.choice", {"index": 0}, trace_id=b"", span_id=b"")
    traces.add_logs([resource_logs(no_context)])
    traces.close()
    (record,) = records
    assert record.request.query is None and record.usage.input_tokens is None
    assert traces.stats.malformed == {
        "bad_json": 1,
        "wrong_type": 3,
        "bad_ids": 1,
        "no_span_context": 1,
    }


def test_spans_of_many_traces_come_out_in_arrival_order() -> None:
    traces, records, clock = traces_with_clock(trace_wait_s=1.0)
    for i in range(5):
        trace_id = bytes(15) + bytes([i + 1])
        traces.add_spans([resource_spans(span(CHAT, trace_id=trace_id, start=START + i, end=END))])
        clock.now += 0.3
    assert traces.flush() == 2  # arrived at 0.0 and 0.3: their second has passed
    clock.now += 1.0
    assert traces.flush() == 3
    assert [r.start_ns - START for r in records] == [0, 1, 2, 3, 4]


# --- never raises -------------------------------------------------------------------------------

_KEYS = [
    "gen_ai.operation.name",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
    "gen_ai.response.finish_reasons",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.output.type",
    "gen_ai.request.structured_output_schema",
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.server.time_to_first_token",
    "gen_ai.prompt.0.content",
    "gen_ai.prompt.0.role",
    "gen_ai.completion.0.content",
    "gen_ai.completion.0.tool_calls.0.arguments",
    "llm.request.functions.0.parameters",
    "llm.request.type",
    "gen_ai.prompt",
    "gen_ai.completion",
    "gen_ai.retrieval.documents",
    "retrieval.documents.0.document.content",
    "traceloop.entity.output",
    "http.response.status_code",
    "error.type",
    "service.name",
]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.binary(max_size=10),
    st.sampled_from(["chat", "retrieval", "json", "[]", "{}", "[{", '[{"role": 1}]', "null"]),
)
_json_texts = st.sampled_from(
    [
        '[{"role": "user", "parts": [{"type": "text", "content": "q"}]}]',
        '[{"role": "assistant", "parts": [{"type": "tool_call", "arguments": [1]}]}]',
        '[{"parts": "x"}, 3, {"role": null, "parts": [null, {"type": "text"}]}]',
        '[{"type": "function", "name": 1, "parameters": {"type": "nope"}}]',
        '{"type": "json_schema", "json_schema": 5}',
        '{"type": "object", "required": 7}',
        '{"outputs": [{"page_content": 1}, {"text": "t"}]}',
        '[{"id": 1, "content": {"x": 1}}]',
    ]
)
_keys = st.sampled_from(["role", "parts", "type", "content", "message", "index", "tool_calls"])
_values = st.one_of(
    _scalars,
    _json_texts,
    st.lists(st.one_of(_scalars, _json_texts), max_size=3),
    st.dictionaries(_keys, st.one_of(_scalars, st.lists(_scalars, max_size=2)), max_size=3),
)
_attributes = st.dictionaries(st.sampled_from(_KEYS), _values, max_size=6)
_event_names = st.sampled_from(
    [
        "gen_ai.choice",
        "gen_ai.user.message",
        "gen_ai.tool.message",
        "gen_ai.client.inference.operation.details",
        "gen_ai.content.prompt",
        "gen_ai.content.completion.chunk",
        "db.query.result",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spans=st.lists(
        st.tuples(
            _attributes,
            st.lists(st.tuples(_event_names, _attributes), max_size=3),
            st.booleans(),
            st.integers(min_value=0, max_value=2**64 - 1),
        ),
        max_size=4,
    ),
    logs=st.lists(st.tuples(_event_names, _values, _attributes), max_size=4),
)
def test_random_attribute_values_never_raise(
    spans: list[tuple[dict[str, Any], list[tuple[str, dict[str, Any]]], bool, int]],
    logs: list[tuple[str, Any, dict[str, Any]]],
) -> None:
    records: list[StreamRecord] = []
    traces = GenAITraces(GenAISettings(max_message_bytes=200), records.append)
    built = [
        span(
            {"gen_ai.operation.name": "chat", **attrs},
            span_id=bytes(7) + bytes([i + 1]),
            events=[(name, START, event_attrs) for name, event_attrs in events],
            error=error,
            start=START,
            end=end,
        )
        for i, (attrs, events, error, end) in enumerate(spans)
    ]
    log_records = [log_event(name, body, attrs=attrs) for name, body, attrs in logs]
    traces.add_logs([resource_logs(*log_records)])
    traces.add_spans([resource_spans(*built)])
    traces.flush()
    traces.close()
    assert traces.stats.records == len(records) == traces.stats.genai_spans
    assert "unreadable" not in traces.stats.malformed
    for record in records:
        assert record.source == "otlp" and record.trace is not None
        assert record.trace.trace_id == TRACE.hex()


def test_deep_nesting_is_cut_and_counted() -> None:
    deep: Any = "bottom"
    for _ in range(20):  # protobuf itself refuses to decode past about 30 levels of kvlists
        deep = {"content": deep}
    traces, records, _ = traces_with_clock()
    traces.add_spans([resource_spans(span(CHAT))])
    traces.add_logs([resource_logs(log_event("gen_ai.user.message", deep))])
    traces.close()
    assert len(records) == 1
    assert traces.stats.malformed == {"too_deep": 1}


def test_a_stream_that_ended_without_finish_reason_is_truncated_json() -> None:
    cut = [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": '{"a": '}],
            "finish_reason": "error",
        }
    ]
    attrs = {**CHAT, "gen_ai.output.type": "json", "gen_ai.output.messages": json.dumps(cut)}
    traces, records, _ = traces_with_clock()
    traces.add_spans([resource_spans(span(attrs))])
    traces.close()
    (record,) = records
    assert not record.done
    assert [(v.result, v.reasons) for v in record.validity] == [("truncated", ("ended_early",))]


def test_a_failure_is_logged_without_content(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(*_args: Any) -> StreamRecord:
        raise ValueError("secret prompt text")

    monkeypatch.setattr(genai, "build_record", explode)
    traces, records, _ = traces_with_clock()
    traces.add_spans([resource_spans(span(CHAT))])
    with caplog.at_level(logging.ERROR):
        assert traces.close() == 0
    assert records == [] and traces.stats.malformed == {"unreadable": 1}
    assert "ValueError" in caplog.text and "secret" not in caplog.text
