"""OTLP input judged on its own trace: an app's GenAI spans (made with the OpenTelemetry SDK as
the GenAI conventions write them, exported over OTLP/gRPC) reach semhealth's receiver, the real
MiniLM model scores them, and the ``gen_ai.evaluation.result`` events arrive at a real OTLP
receiver parented to each chat span, with its ``gen_ai.response.id`` and none of its text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import load_config
from semhealth.agent.otlp.evaluation import (
    ANSWER_RELEVANCE,
    CONTEXT_RELEVANCE,
    OUTPUT_VALIDITY,
    RESPONSE_ID,
    SCORE_LABEL,
    SCORE_VALUE,
)
from semhealth.agent.relevance import LoadedEncoders
from semhealth.collectors import StreamRecord
from tests.agent.otlp.test_evaluation_e2e import by_span, expected_label
from tests.agent.otlp_receiver import GrpcReceiver
from tests.agent.test_relevance_e2e import RELEVANT as PAIRS
from tests.agent.test_relevance_e2e import UNRELATED_CONTEXT

CANARY = "zqxspantext53"


def parts(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "content": text}]


def chat_span(
    tracer: Any, query: str, context: str, answer: dict[str, Any], response_id: str
) -> None:
    """One chat span with content, as the current GenAI conventions record it."""
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.id": response_id,
        "gen_ai.output.type": "json",
        "gen_ai.system_instructions": json.dumps(parts(f"{context} {CANARY}")),
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": parts(query)}]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": parts(json.dumps(answer)), "finish_reason": "stop"}]
        ),
    }
    with tracer.start_as_current_span("chat gpt-4o", attributes=attributes):
        pass


def app_spans() -> list[ReadableSpan]:
    """Two calls of an app: one given the fitting context, one an unrelated one."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-bot"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("app")
    (query, context), unrelated = PAIRS[2], UNRELATED_CONTEXT[2]
    answer = {"ports": [5432, 5433], "note": CANARY}
    chat_span(tracer, query, context, answer, "chatcmpl-fits")
    chat_span(tracer, query, unrelated, answer, "chatcmpl-unrelated")
    provider.shutdown()
    return list(memory.get_finished_spans())


async def export(target: str, spans: Sequence[ReadableSpan]) -> SpanExportResult:
    exporter = OTLPSpanExporter(endpoint=target, insecure=True)
    try:  # the SDK's export blocks; the agent answers on this loop meanwhile
        return await asyncio.to_thread(exporter.export, spans)
    finally:
        await asyncio.to_thread(exporter.shutdown)


@asynccontextmanager
async def receiver_agent(
    events: GrpcReceiver, loaded: LoadedEncoders, records: list[StreamRecord]
) -> AsyncIterator[Agent]:
    overrides: dict[str, object] = {
        "listen.admin": "127.0.0.1:0",
        "relevance.enabled": True,
        "relevance.profile": "fast",
        "otlp_receiver.grpc_listen": "127.0.0.1:0",
        "otlp_receiver.trace_wait_s": 0.2,
        "otlp_receiver.evaluation.enabled": True,
        "otlp_receiver.evaluation.endpoint": events.endpoint,
    }
    config = load_config(None, {}, overrides)
    agent = Agent(config, Settings(consumers=[records.append], loaded_encoders=loaded))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.shutdown()


async def test_evaluations_of_received_spans_arrive_on_those_spans(
    fast_encoders: LoadedEncoders,
) -> None:
    spans = app_spans()
    events = GrpcReceiver()
    await events.start()
    records: list[StreamRecord] = []
    try:
        async with receiver_agent(events, fast_encoders, records) as agent:
            assert agent.intake is not None and agent.intake.receiver.grpc_address is not None
            target = f"127.0.0.1:{agent.intake.receiver.grpc_address[1]}"
            assert await export(target, spans) is SpanExportResult.SUCCESS
            await events.wait_log_records(6, timeout_s=30)
        received = events.log_records()
    finally:
        await events.shutdown()

    assert len(received) == 6  # nothing more was flushed at shutdown
    judged = by_span(received)
    fits, unrelated = (  # in the order the app made them
        (format(span.context.trace_id, "032x"), format(span.context.span_id, "016x"))
        for span in spans
    )
    assert set(judged) == {fits, unrelated}
    for span_ids, response_id in ((fits, "chatcmpl-fits"), (unrelated, "chatcmpl-unrelated")):
        span = judged[span_ids]
        assert set(span) == {CONTEXT_RELEVANCE, ANSWER_RELEVANCE, OUTPUT_VALIDITY}
        assert {attrs[RESPONSE_ID] for attrs in span.values()} == {response_id}
        assert (span[OUTPUT_VALIDITY][SCORE_VALUE], span[OUTPUT_VALIDITY][SCORE_LABEL]) == (
            1.0,
            "valid",
        )
        for name in (CONTEXT_RELEVANCE, ANSWER_RELEVANCE):
            assert span[name][SCORE_LABEL] == expected_label(span[name][SCORE_VALUE])
    assert (
        judged[fits][CONTEXT_RELEVANCE][SCORE_VALUE]
        > (judged[unrelated][CONTEXT_RELEVANCE][SCORE_VALUE])
    )
    assert {record.source for record in records} == {"otlp"}
    for received_logs in events.logs:
        assert CANARY.encode() not in received_logs.raw
