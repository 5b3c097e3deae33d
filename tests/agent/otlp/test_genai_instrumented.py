"""Real GenAI instrumentations of the real ``openai`` SDK, calling the scripted upstream, give
the records the scripts imply.

Each instrumentation runs in a fresh interpreter (this file run as a script): instrumenting
patches the ``openai`` module for the whole process, and util-genai reads its content-capture
settings once. The app exports with the SDK's in-memory exporters; the spans and log records
are encoded with the OTLP exporter's own encoders, as they would go over the wire, and the
test feeds those protobuf messages to ``GenAITraces``.

What the instrumentations record (pinned in pyproject.toml):

- opentelemetry-instrumentation-openai-v2 2.4b0 with opentelemetry-util-genai 1.1b0: the
  current conventions, messages on the span (``SPAN_ONLY``/``SPAN_AND_EVENT``) and/or, as
  structured values, on the ``gen_ai.client.inference.operation.details`` log event; no
  time-to-first-chunk and no finish-reasons attribute for streamed chat (the finish reason is
  in ``gen_ai.output.messages``), no per-chunk times;
- OpenLLMetry's opentelemetry-instrumentation-openai 0.62.4: the current message attributes,
  ``gen_ai.request.structured_output_schema`` for JSON mode, and one
  ``gen_ai.content.completion.chunk`` span event per chunk (the only per-chunk times any of
  them records). With ``use_attributes=False`` it emits the older message events instead; for
  a stream, its ``gen_ai.choice`` event is emitted outside the chat span's context (with the
  app's current span, or none), so the answer cannot be tied to the span and the record has
  none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from semhealth.agent.otlp.genai import GenAISettings, GenAITraces
from semhealth.collectors import StreamRecord, ValidityResult

ROOT = Path(__file__).resolve().parents[3]
SYSTEM = "Paris is the capital of France. It lies on the Seine."
DOCUMENT = "France's capital has been Paris since the tenth century."
QUESTION = "What is the capital of France?"
PIECES = ("The", " capital", " is", " Paris", ".")
JSON_PIECES = ('{"city":', ' "Paris"}')
TTFT_S = 0.05
GAP_S = 0.02
SERVICE = "rag-app"

# mode -> environment of the app process
MODES: dict[str, dict[str, str]] = {
    "openai_v2": {
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_AND_EVENT",
        "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
    },
    "openai_v2_event_only": {
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY",
        "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
    },
    "openllmetry": {"TRACELOOP_TRACE_CONTENT": "true"},
    "openllmetry_events": {"TRACELOOP_TRACE_CONTENT": "true"},
}


def _run_app(mode: str, out: Path) -> tuple[ExportTraceServiceRequest, ExportLogsServiceRequest]:
    env = {**os.environ, **MODES[mode], "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-W", "ignore", __file__, mode, str(out)],
        env=env,
        check=True,
        timeout=90,
        cwd=ROOT,
    )
    spans = ExportTraceServiceRequest.FromString((out / "spans.pb").read_bytes())
    logs = ExportLogsServiceRequest.FromString((out / "logs.pb").read_bytes())
    return spans, logs


def _records(
    spans: ExportTraceServiceRequest, logs: ExportLogsServiceRequest
) -> tuple[list[StreamRecord], GenAITraces]:
    records: list[StreamRecord] = []
    traces = GenAITraces(GenAISettings(), records.append, clock=lambda: 0.0)
    assert traces.add_logs(logs.resource_logs) == 0
    assert traces.add_spans(spans.resource_spans) == 0
    assert traces.flush() == 0  # the clock has not moved: every span still waits
    traces.close()
    return sorted(records, key=lambda r: r.start_ns), traces


def _span_ids(spans: ExportTraceServiceRequest) -> list[tuple[str, str]]:
    """(trace id, span id) of the chat spans the app exported, in start order."""
    found = [
        (s.start_time_unix_nano, s.trace_id.hex(), s.span_id.hex())
        for rs in spans.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        if any(
            kv.key == "gen_ai.operation.name" and kv.value.string_value == "chat"
            for kv in s.attributes
        )
    ]
    return [(t, s) for _, t, s in sorted(found)]


def _check_common(record: StreamRecord, ids: tuple[str, str]) -> None:
    assert record.source == "otlp"
    assert (record.trace.trace_id, record.trace.span_id) == ids if record.trace else False
    assert record.route == SERVICE
    assert record.provider == "openai_chat"
    assert record.model == "gpt-test"
    assert record.request.model == "gpt-test"
    assert record.status == 200
    assert record.error_type is None
    assert record.response_id is not None and record.response_id.startswith("chatcmpl-")
    assert record.start_ns < record.end_ns


def _check_full(
    records: list[StreamRecord],
    spans: ExportTraceServiceRequest,
    context: tuple[str, ...] = (SYSTEM,),
) -> None:
    plain, json_mode = records
    ids = _span_ids(spans)
    assert len(ids) == 2
    _check_common(plain, ids[0])
    _check_common(json_mode, ids[1])
    assert plain.request.analysed
    assert plain.request.query == QUESTION
    assert plain.request.context == context
    assert plain.output_text == "".join(PIECES)
    assert plain.finish_reason == "stop"
    assert plain.done
    assert (plain.usage.input_tokens, plain.usage.output_tokens) == (9, len(PIECES))
    assert plain.validity == ()
    assert json_mode.output_text == "".join(JSON_PIECES)
    assert json_mode.validity == (ValidityResult("valid"),)


@pytest.mark.parametrize(
    ("mode", "context"),
    [
        # util-genai's retrieval span, in the same trace, records its documents on the span
        # when content is captured on spans; the system message is context either way.
        ("openai_v2", (SYSTEM, DOCUMENT)),
        ("openai_v2_event_only", (SYSTEM,)),
    ],
)
def test_openai_v2_streamed_chat(mode: str, context: tuple[str, ...], tmp_path: Path) -> None:
    spans, logs = _run_app(mode, tmp_path)
    records, traces = _records(spans, logs)
    assert len(records) == 2
    _check_full(records, spans, context)
    assert traces.stats.retriever_spans == 1
    for record in records:
        # openai-v2 2.4b0 records neither the time to the first chunk nor per-chunk times.
        assert record.first_byte_ns is None
        assert record.first_delta_ns is None
        assert record.delta_ns == ()
        assert record.continuity is not None and record.continuity.ttft_s is None
    assert traces.stats.genai_spans == 2
    assert traces.stats.genai_events == 2  # one operation-details event per call
    assert traces.stats.malformed == {}


def test_openllmetry_streamed_chat_with_chunk_times(tmp_path: Path) -> None:
    spans, logs = _run_app("openllmetry", tmp_path)
    records, traces = _records(spans, logs)
    assert len(records) == 2
    _check_full(records, spans)
    plain, json_mode = records
    assert plain.streamed
    # One delta per scripted piece: the role opener, finish and usage chunks are left out.
    assert len(plain.delta_ns) == len(PIECES)
    assert len(json_mode.delta_ns) == len(JSON_PIECES)
    assert plain.first_byte_ns is not None and plain.first_delta_ns is not None
    assert plain.start_ns <= plain.first_byte_ns < plain.first_delta_ns
    # The upstream cannot send earlier than scripted: lower bounds hold on any machine.
    assert plain.ttft_s is not None and plain.ttft_s >= TTFT_S
    assert (plain.delta_ns[-1] - plain.start_ns) / 1e9 >= TTFT_S + GAP_S * (len(PIECES) - 1)
    assert plain.continuity is not None and plain.continuity.deltas == len(PIECES)
    assert traces.stats.malformed == {}


def test_openllmetry_event_form_ties_what_has_a_span_context(tmp_path: Path) -> None:
    spans, logs = _run_app("openllmetry_events", tmp_path)
    records, traces = _records(spans, logs)
    assert len(records) == 2
    plain, json_mode = records
    ids = _span_ids(spans)
    _check_common(plain, ids[0])
    assert plain.request.query == QUESTION  # from the gen_ai.user.message event
    assert plain.request.context == (SYSTEM,)  # from the gen_ai.system.message event
    # The stream's gen_ai.choice event carries no span context: the answer is not invented.
    assert plain.output_text == ""
    assert json_mode.validity == ()
    assert plain.finish_reason == "stop"  # from gen_ai.response.finish_reasons on the span
    # The event takes whatever span is current when the stream ends: none for the second call
    # (ids zero), the app's own parent span for the first (an orphan: no GenAI span has it).
    assert traces.stats.malformed == {"no_span_context": 1}
    assert traces.stats.orphan_events == 1


# --- the instrumented app (run as a script in its own interpreter) ------------------------------


def _app(mode: str, out: Path) -> None:  # pragma: no cover - runs in the subprocess
    import asyncio

    import openai
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream

    resource = Resource.create({"service.name": SERVICE})
    span_exporter = InMemorySpanExporter()
    log_exporter = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    instrumentor: Any
    if mode.startswith("openai_v2"):
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as V2

        instrumentor = V2()  # type: ignore[no-untyped-call]
    else:
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor as Traceloop

        instrumentor = Traceloop(use_attributes=mode != "openllmetry_events")
    instrumentor.instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    tracer = tracer_provider.get_tracer("app")

    def retrieve() -> None:
        """A RAG step in the chat's trace: util-genai's own retrieval span (openai-v2 modes)."""
        if not mode.startswith("openai_v2"):
            return
        from opentelemetry.util.genai.handler import TelemetryHandler

        handler = TelemetryHandler(tracer_provider=tracer_provider, logger_provider=logger_provider)
        retrieval: Any = handler.retrieval(data_source_id="docs")
        retrieval.documents = [{"id": "d1", "score": 0.93, "content": DOCUMENT}]
        retrieval.stop()

    def script(request: ScriptRequest) -> Script:
        pieces = JSON_PIECES if b"response_format" in request.body else PIECES
        return Script(pieces=pieces, ttft_s=TTFT_S, gaps_s=GAP_S, input_tokens=9)

    async def calls() -> None:
        upstream = SimulatedUpstream(script)
        await upstream.start()
        client = openai.AsyncOpenAI(base_url=upstream.url + "/v1", api_key="k", max_retries=0)
        messages: Any = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        with tracer.start_as_current_span("answer"):  # one trace: retrieval, then the chat
            retrieve()
            plain = await client.chat.completions.create(
                model="gpt-test",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for _ in plain:
                pass
        json_mode = await client.chat.completions.create(
            model="gpt-test",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            response_format={"type": "json_object"},
        )
        async for _ in json_mode:
            pass
        await client.close()
        await upstream.shutdown()

    asyncio.run(calls())
    instrumentor.uninstrument()
    spans = encode_spans(span_exporter.get_finished_spans())
    logs = encode_logs(log_exporter.get_finished_logs())
    (out / "spans.pb").write_bytes(spans.SerializeToString())
    (out / "logs.pb").write_bytes(logs.SerializeToString())


if __name__ == "__main__":
    _app(sys.argv[1], Path(sys.argv[2]))
