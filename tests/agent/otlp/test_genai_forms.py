"""Each form GenAI telemetry takes becomes the record it describes: the current conventions,
the older events, OpenLLMetry's indexed attributes and OpenLIT's strings.

The shapes are those the instrumentations write (read from their sources: openai-v2's
``message_to_event`` / ``choice_to_event``, OpenLLMetry's ``gen_ai.prompt.N.*`` before 0.50,
OpenLIT's ``gen_ai.content.*`` events); the real packages are exercised in
``test_genai_instrumented.py``. The builders here are shared with ``test_genai_traces.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from semhealth.agent.otlp.genai import GenAISettings, GenAITraces
from semhealth.collectors import Config, Route, StreamRecord, ValidityResult

TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SPAN = bytes.fromhex("b7ad6b7169203331")
START = 1_700_000_000_000_000_000
END = START + 2_000_000_000
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


# --- builders -----------------------------------------------------------------------------------


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, Mapping):
        return AnyValue(kvlist_value=KeyValueList(values=attributes(value)))
    if isinstance(value, Sequence):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    return AnyValue()


def attributes(values: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in values.items()]


def span(
    attrs: Mapping[str, Any],
    *,
    trace_id: bytes = TRACE,
    span_id: bytes = SPAN,
    name: str = "chat gpt-test",
    events: Sequence[tuple[str, int, Mapping[str, Any]]] = (),
    error: bool = False,
    start: int = START,
    end: int = END,
) -> Span:
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=attributes(attrs),
        events=[
            Span.Event(name=n, time_unix_nano=t, attributes=attributes(a)) for n, t, a in events
        ],
        status=Status(code=Status.STATUS_CODE_ERROR if error else Status.STATUS_CODE_UNSET),
    )


def resource_spans(*spans: Span, resource: Mapping[str, Any] | None = None) -> ResourceSpans:
    return ResourceSpans(
        resource=Resource(
            attributes=attributes({"service.name": "shop"} if resource is None else resource)
        ),
        scope_spans=[ScopeSpans(spans=list(spans))],
    )


def log_event(
    name: str,
    body: Any = None,
    *,
    attrs: Mapping[str, Any] | None = None,
    trace_id: bytes = TRACE,
    span_id: bytes = SPAN,
    time_ns: int = START,
) -> LogRecord:
    record = LogRecord(
        event_name=name,
        trace_id=trace_id,
        span_id=span_id,
        time_unix_nano=time_ns,
        attributes=attributes(attrs or {}),
    )
    if body is not None:
        record.body.CopyFrom(any_value(body))
    return record


def resource_logs(*records: LogRecord) -> ResourceLogs:
    return ResourceLogs(scope_logs=[ScopeLogs(log_records=list(records))])


def records_of(
    spans: Sequence[Span] = (),
    logs: Sequence[LogRecord] = (),
    *,
    settings: GenAISettings | None = None,
    collectors: Config | None = None,
    resource: Mapping[str, Any] | None = None,
) -> tuple[list[StreamRecord], GenAITraces]:
    records: list[StreamRecord] = []
    traces = GenAITraces(settings or GenAISettings(), records.append, collectors=collectors)
    if logs:
        traces.add_logs([resource_logs(*logs)])
    if spans:
        traces.add_spans([resource_spans(*spans, resource=resource)])
    traces.close()
    return records, traces


def messages(*items: tuple[str, str]) -> str:
    return json.dumps([{"role": r, "parts": [{"type": "text", "content": t}]} for r, t in items])


# --- the current conventions ----------------------------------------------------------------


def test_current_attributes_with_tools_and_system_instructions() -> None:
    output = [
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_1",
                    "name": "weather",
                    "arguments": {"city": "Oslo"},
                }
            ],
            "finish_reason": "tool_call",
        }
    ]
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-x",
        "gen_ai.response.model": "claude-x-2",
        "gen_ai.response.id": "msg_1",
        "gen_ai.response.finish_reasons": ["tool_use"],
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 12,
        "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be brief."}]),
        "gen_ai.input.messages": json.dumps(
            [
                {"role": "user", "parts": [{"type": "text", "content": "Weather in Oslo?"}]},
                {
                    "role": "tool",
                    "parts": [{"type": "tool_call_response", "id": "c0", "response": {"t": 3}}],
                },
            ]
        ),
        "gen_ai.output.messages": json.dumps(output),
        "gen_ai.tool.definitions": json.dumps(
            [{"type": "function", "name": "weather", "parameters": WEATHER_SCHEMA}]
        ),
        "gen_ai.response.time_to_first_chunk": 0.25,
        "gen_ai.request.stream": True,
    }
    (record,), traces = records_of([span(attrs)])
    assert record.source == "otlp"
    assert record.trace is not None and record.trace.trace_id == TRACE.hex()
    assert record.trace.span_id == SPAN.hex()
    assert record.route == "shop"
    assert record.provider == "anthropic_messages"
    assert record.model == "claude-x-2"
    assert record.request.model == "claude-x"
    assert record.response_id == "msg_1"
    assert record.request.query == "Weather in Oslo?"
    assert record.request.context == ("Be brief.", '{"t":3}')
    assert record.request.stream and record.streamed
    assert (record.usage.input_tokens, record.usage.output_tokens) == (30, 12)
    assert record.finish_reason == "tool_use"  # the span attribute wins over the message's
    assert record.output_text == ""
    (call,) = record.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == (
        "call_1",
        "weather",
        {"city": "Oslo"},
    )
    assert record.validity == (ValidityResult("valid", "tool:weather"),)
    assert (record.start_ns, record.end_ns) == (START, END)
    assert record.first_byte_ns == START + 250_000_000
    assert record.first_delta_ns is None and record.delta_ns == ()  # never invented
    assert traces.stats.malformed == {}


def test_tool_arguments_against_the_declared_schema() -> None:
    output = [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c", "name": "weather", "arguments": {"town": 1}}
            ],
            "finish_reason": "tool_calls",
        }
    ]
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": messages(("user", "Weather?")),
        "gen_ai.output.messages": json.dumps(output),
        "gen_ai.tool.definitions": json.dumps(
            [{"type": "function", "name": "weather", "parameters": WEATHER_SCHEMA}]
        ),
    }
    (record,), _ = records_of([span(attrs)])
    (verdict,) = record.validity
    assert (verdict.result, verdict.target, verdict.reasons) == (
        "schema",
        "tool:weather",
        ("required",),
    )


def test_json_output_type_is_checked_like_json_mode() -> None:
    def record_for(text: str, finish: str) -> StreamRecord:
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.output.type": "json",
            "gen_ai.input.messages": messages(("user", "Give JSON")),
            "gen_ai.output.messages": json.dumps(
                [
                    {
                        "role": "assistant",
                        "parts": [{"type": "text", "content": text}],
                        "finish_reason": finish,
                    }
                ]
            ),
        }
        (record,), _ = records_of([span(attrs)])
        return record

    assert record_for('{"a": 1}', "stop").validity == (ValidityResult("valid"),)
    assert record_for('{"a": 1', "length").validity[0].result == "truncated"
    assert record_for("not json", "stop").validity[0].result == "syntax"


def test_a_route_contract_applies_to_the_span_s_route() -> None:
    contract = {"type": "object", "required": ["answer"]}
    config = Config(routes=(Route(name="shop", match="/never", contract_schema=contract),))
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": messages(("user", "Q")),
        "gen_ai.output.messages": messages(("assistant", '{"other": 1}')),
        "gen_ai.response.finish_reasons": ["stop"],
    }
    (record,), _ = records_of([span(attrs)], collectors=config)
    assert record.validity[0].result == "contract"


def test_error_status_and_error_type() -> None:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.output.type": "json",
        "error.type": "openai.RateLimitError",
        "gen_ai.input.messages": messages(("user", "Q")),
    }
    (record,), _ = records_of([span(attrs, error=True)])
    assert (record.status, record.error_type) == (500, "openai.RateLimitError")
    assert record.validity == ()  # an error's output is never judged
    (with_code,), _ = records_of([span({**attrs, "http.response.status_code": 429}, error=True)])
    assert with_code.status == 429
    (plain_error,), _ = records_of([span({"gen_ai.operation.name": "chat"}, error=True)])
    assert (plain_error.status, plain_error.error_type) == (500, "500")


def test_no_content_recorded_means_nothing_to_judge() -> None:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.output.type": "json",
        "gen_ai.provider.name": "openai",
    }
    (record,), _ = records_of([span(attrs)])
    assert not record.request.analysed and record.request.skip_reason == "not_recorded"
    assert record.output_text == "" and record.validity == ()
    assert record.provider == "openai_chat"


def test_operation_details_event_carries_structured_messages() -> None:
    event_attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "Hi?"}]}],
        "gen_ai.output.messages": [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": "Hello"}],
                "finish_reason": "stop",
            }
        ],
        "gen_ai.usage.output_tokens": 1,
    }
    logs = [log_event("gen_ai.client.inference.operation.details", attrs=event_attrs)]
    (record,), _ = records_of([span({"gen_ai.operation.name": "chat"})], logs)
    assert (record.request.query, record.output_text, record.finish_reason) == (
        "Hi?",
        "Hello",
        "stop",
    )
    assert record.usage.output_tokens == 1


# --- the older events -------------------------------------------------------------------------


def test_older_events_as_log_records() -> None:
    choice = {
        "index": 0,
        "finish_reason": "tool_calls",
        "message": {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                }
            ],
        },
    }
    logs = [
        log_event("gen_ai.system.message", {"content": "Docs: X is Y."}, time_ns=START + 1),
        log_event("gen_ai.user.message", {"content": "What is X?"}, time_ns=START + 2),
        log_event("gen_ai.assistant.message", {"content": "Let me check."}, time_ns=START + 3),
        log_event(
            "gen_ai.tool.message", {"content": "X is Y indeed.", "id": "c0"}, time_ns=START + 4
        ),
        log_event("gen_ai.choice", choice, time_ns=START + 5),
    ]
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "m",
    }
    (record,), traces = records_of([span(attrs)], logs)
    assert record.request.query == "What is X?"
    assert record.request.context == ("Docs: X is Y.", "Let me check.", "X is Y indeed.")
    assert record.finish_reason == "tool_calls"
    (call,) = record.tool_calls
    assert (call.id, call.name, call.arguments) == ("c1", "lookup", '{"q": "x"}')
    assert record.provider == "openai_chat"
    assert traces.stats.genai_events == 5


def test_older_events_as_span_events_have_no_body_to_read() -> None:
    events: list[tuple[str, int, dict[str, Any]]] = [
        ("gen_ai.user.message", START, {}),
        ("gen_ai.choice", START + 1, {}),
    ]
    # Span events carry no body, and the older conventions put the content only in the
    # body: what was not recorded stays absent.
    (record,), traces = records_of([span({"gen_ai.operation.name": "chat"}, events=events)])
    assert record.request.query is None and record.output_text == ""
    assert record.finish_reason is None and not record.done
    assert traces.stats.malformed == {}


# --- OpenLLMetry's indexed attributes -------------------------------------------------------------


def test_openllmetry_indexed_prompts_and_completions() -> None:
    attrs = {
        "llm.request.type": "chat",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024",
        "llm.is_streaming": True,
        "gen_ai.prompt.0.role": "system",
        "gen_ai.prompt.0.content": "Answer from the docs.",
        "gen_ai.prompt.1.role": "user",
        "gen_ai.prompt.1.content": json.dumps([{"type": "text", "text": "Where is Oslo?"}]),
        "gen_ai.prompt.2.role": "tool",
        "gen_ai.prompt.2.content": "Oslo is in Norway.",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "In Norway.",
        "gen_ai.completion.0.finish_reason": "stop",
        "gen_ai.usage.prompt_tokens": 40,
        "gen_ai.usage.completion_tokens": 3,
        "llm.request.functions.0.name": "weather",
        "llm.request.functions.0.parameters": json.dumps(WEATHER_SCHEMA),
    }
    (record,), traces = records_of([span(attrs, name="openai.chat")])
    assert record.request.query == "Where is Oslo?"
    assert record.request.context == ("Answer from the docs.", "Oslo is in Norway.")
    assert record.output_text == "In Norway."
    assert (record.usage.input_tokens, record.usage.output_tokens) == (40, 3)
    assert record.finish_reason == "stop"
    assert record.model == "gpt-4o-2024"
    assert record.streamed
    assert [s.name for s in record.request.structure] == ["weather"]
    assert traces.stats.malformed == {}


def test_openllmetry_tool_calls_and_structured_output_schema() -> None:
    attrs = {
        "llm.request.type": "chat",
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": "Weather in Oslo as JSON",
        "gen_ai.request.structured_output_schema": json.dumps(WEATHER_SCHEMA),
        "gen_ai.completion.0.content": '{"city": 5}',
        "gen_ai.completion.0.finish_reason": "stop",
    }
    (record,), _ = records_of([span(attrs)])
    assert record.validity == (ValidityResult("schema", reasons=("type",)),)
    calls = {
        "llm.request.type": "chat",
        "gen_ai.prompt.0.content": "Weather?",
        "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.tool_calls.0.id": "c9",
        "gen_ai.completion.0.tool_calls.0.name": "weather",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Oslo"}',
    }
    (record,), _ = records_of([span(calls)])
    (call,) = record.tool_calls
    assert (call.id, call.name, call.arguments) == ("c9", "weather", '{"city": "Oslo"}')
    assert record.validity == (ValidityResult("schema", "tool", ("unknown_tool",)),)


def test_openllmetry_embeddings_are_not_records() -> None:
    records, traces = records_of(
        [span({"llm.request.type": "embedding", "gen_ai.request.model": "e"})]
    )
    assert records == [] and traces.stats.genai_spans == 0


# --- OpenLIT ------------------------------------------------------------------------------------


def test_openlit_prompt_and_completion_events() -> None:
    prompt = "system: Use the context.\nContext line two.\nuser: Is it sunny?\nassistant: Maybe.\nuser: In Oslo?"
    events = [
        ("gen_ai.content.prompt", START + 1, {"gen_ai.prompt": prompt}),
        ("gen_ai.content.completion", END - 1, {"gen_ai.completion": "Yes, sunny."}),
    ]
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.request.is_stream": True,
        "gen_ai.server.time_to_first_token": 0.5,
        "gen_ai.usage.input_tokens": 20,
        "gen_ai.usage.output_tokens": 4,
        "gen_ai.response.finish_reasons": ["stop"],
    }
    (record,), _ = records_of([span(attrs, events=events)])
    assert record.request.query == "In Oslo?"
    assert record.request.context == (
        "Use the context.\nContext line two.",
        "Is it sunny?",
        "Maybe.",
    )
    assert record.output_text == "Yes, sunny."
    assert record.first_byte_ns == START + 500_000_000
    assert record.first_delta_ns is None and record.delta_ns == ()
    assert record.streamed


def test_openlit_prompt_attributes_without_roles() -> None:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.prompt": "Just a question?",
        "gen_ai.completion": "Just an answer.",
    }
    (record,), _ = records_of([span(attrs)])
    assert (record.request.query, record.output_text) == ("Just a question?", "Just an answer.")


# --- routes, providers, non-GenAI spans -------------------------------------------------------


def test_route_from_resource_then_span_then_other() -> None:
    attrs = {"gen_ai.operation.name": "chat", "app.route": "search"}
    settings = GenAISettings(route_attribute="app.route")
    (from_span,), _ = records_of([span(attrs)], settings=settings)
    assert from_span.route == "search"
    (from_resource,), _ = records_of(
        [span(attrs)], settings=settings, resource={"app.route": "checkout"}
    )
    assert from_resource.route == "checkout"
    (other,), _ = records_of([span({"gen_ai.operation.name": "chat"})], resource={})
    assert other.route == "other"


def test_provider_names() -> None:
    def provider(attrs: Mapping[str, Any]) -> str:
        (record,), _ = records_of([span({"gen_ai.operation.name": "chat", **attrs})])
        return record.provider

    assert provider({"gen_ai.provider.name": "openai"}) == "openai_chat"
    assert provider({"gen_ai.system": "anthropic"}) == "anthropic_messages"
    # A span's provider is named by the wire format the proxy would read it in.
    assert provider({"gen_ai.provider.name": "aws.bedrock"}) == "bedrock_converse"
    assert provider({"gen_ai.provider.name": "gcp.gemini"}) == "gemini"
    assert provider({"gen_ai.provider.name": "azure.ai.openai"}) == "azure_openai_chat"
    assert provider({"gen_ai.provider.name": "gcp.vertex_ai"}) == "vertex_ai"
    assert provider({"gen_ai.provider.name": "ibm.watsonx.ai"}) == "ibm.watsonx.ai"
    assert provider({}) == "unknown"
    (completion,), _ = records_of(
        [span({"gen_ai.operation.name": "text_completion", "gen_ai.provider.name": "openai"})]
    )
    assert completion.provider == "openai_completions"


def test_other_spans_are_ignored() -> None:
    spans = [
        span({"http.request.method": "GET"}, span_id=b"\x01" * 8),
        span({"gen_ai.operation.name": "embeddings"}, span_id=b"\x02" * 8),
        span({"gen_ai.operation.name": "execute_tool"}, span_id=b"\x03" * 8),
    ]
    records, traces = records_of(spans)
    assert records == []
    assert (traces.stats.spans_seen, traces.stats.genai_spans) == (3, 0)
