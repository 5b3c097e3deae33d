"""Proxied traffic judged on the caller's trace: the real ``openai`` SDK sends chat requests
with a ``traceparent`` through the sidecar, the real MiniLM model scores them, and the
``gen_ai.evaluation.result`` events arrive at a real OTLP receiver parented to the caller's
span, with the scores the agent's own metrics recorded and none of the traffic's text.

The second test runs the planes as ``semhealth run`` does (a forwarding process and an
analysis process): the header crosses the tap wire before it becomes the events' parent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream
from semhealth.agent.otlp.evaluation import (
    ANSWER_RELEVANCE,
    CONTEXT_RELEVANCE,
    DEFAULT_THRESHOLD,
    EVALUATION_NAME,
    EVENT_NAME,
    NOT_RELEVANT,
    OUTPUT_VALIDITY,
    RELEVANT,
    SCORE_LABEL,
    SCORE_VALUE,
)
from semhealth.agent.relevance import LoadedEncoders
from semhealth.collectors.record import StreamRecord
from tests.agent.conftest import Stack, agent_config
from tests.agent.otlp_receiver import GrpcReceiver, HttpReceiver, attributes
from tests.agent.test_cli import _env, _wait_ready
from tests.agent.test_relevance_e2e import RELEVANT as PAIRS
from tests.agent.test_relevance_e2e import UNRELATED_CONTEXT, metrics, value, wait_for
from tests.servers import free_port

CANARY_QUERY, CANARY_CONTEXT, CANARY_OUTPUT = "zqxquery91", "zqxcontext27", "zqxoutput64"
FITS = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")  # trace id, span id
UNRELATED = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")


def json_answer(_request: ScriptRequest) -> Script:
    """A JSON-mode answer, streamed in pieces; valid JSON, so output validity is ``valid``."""
    return Script(pieces=('{"answer": "', CANARY_OUTPUT, '", "steps": 2}'))


def traceparent(ids: tuple[str, str]) -> str:
    return f"00-{ids[0]}-{ids[1]}-01"


async def ask(
    base_url: str, model: str, query: str, context: str, ids: tuple[str, str] | None
) -> str:
    """One streamed JSON-mode chat call with the real SDK; the caller's span in ``traceparent``."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="test-key", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": f"{context} {CANARY_CONTEXT}"},
                {"role": "user", "content": f"{query} {CANARY_QUERY}"},
            ],
            response_format={"type": "json_object"},
            stream=True,
            extra_headers={"traceparent": traceparent(ids)} if ids else None,
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    finally:
        await client.close()


def by_span(records: list[LogRecord]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """(trace id, span id) -> evaluation name -> the event's attributes."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for record in records:
        assert record.event_name == EVENT_NAME
        attrs = dict(attributes(record.attributes))
        events = out.setdefault((record.trace_id.hex(), record.span_id.hex()), {})
        name = str(attrs[EVALUATION_NAME])
        assert name not in events, f"two {name} events on one span"
        events[name] = attrs
    return out


def expected_label(score: float) -> str:
    return RELEVANT if score >= DEFAULT_THRESHOLD else NOT_RELEVANT


def assert_no_text(receiver: GrpcReceiver | HttpReceiver) -> None:
    for received in receiver.logs:
        for canary in (CANARY_QUERY, CANARY_CONTEXT, CANARY_OUTPUT):
            assert canary.encode() not in received.raw


@pytest.fixture(params=["grpc", "http/protobuf"])
async def receiver(request: pytest.FixtureRequest) -> AsyncIterator[GrpcReceiver | HttpReceiver]:
    server: GrpcReceiver | HttpReceiver = (
        GrpcReceiver() if request.param == "grpc" else HttpReceiver()
    )
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown()


def evaluation_overrides(receiver: GrpcReceiver | HttpReceiver) -> dict[str, Any]:
    # gRPC: the collector's address; HTTP: its base URL (/v1/logs is appended).
    if isinstance(receiver, GrpcReceiver):
        endpoint, protocol = receiver.endpoint, "grpc"
    else:
        endpoint, protocol = receiver.url, "http/protobuf"
    return {
        "otlp_receiver.evaluation.enabled": True,
        "otlp_receiver.evaluation.endpoint": endpoint,
        "otlp_receiver.forward.protocol": protocol,
    }


@asynccontextmanager
async def judged_stack(
    receiver: GrpcReceiver | HttpReceiver, loaded: LoadedEncoders
) -> AsyncIterator[Stack]:
    upstream = SimulatedUpstream(json_answer)
    await upstream.start()
    records: list[StreamRecord] = []
    config = agent_config(
        upstream.url,
        **{
            "relevance.enabled": True,
            "relevance.profile": "fast",
            **evaluation_overrides(receiver),
        },
    )
    agent = Agent(config, Settings(consumers=[records.append], loaded_encoders=loaded))
    try:
        await agent.start()
        yield Stack(upstream, agent, records)
    finally:
        await agent.shutdown()
        await upstream.shutdown()


async def test_evaluations_of_proxied_calls_arrive_on_the_callers_spans(
    receiver: GrpcReceiver | HttpReceiver, fast_encoders: LoadedEncoders
) -> None:
    (query, context), unrelated = PAIRS[0], UNRELATED_CONTEXT[0]
    async with judged_stack(receiver, fast_encoders) as stack, aiohttp.ClientSession() as session:
        agent = stack.agent
        answers = [
            await ask(agent.proxy_url, "fits", query, context, FITS),
            await ask(agent.proxy_url, "unrelated", query, unrelated, UNRELATED),
            await ask(agent.proxy_url, "untraced", query, context, None),
        ]
        assert all(CANARY_OUTPUT in text for text in answers)  # the client got its bytes

        async def all_scored() -> bool:
            return value(await metrics(session, agent), "semhealth_relevance_scored_total") == 3

        await wait_for(all_scored)
        await receiver.wait_log_records(6)

        async def all_exported() -> bool:
            samples = await metrics(session, agent)
            return value(samples, "semhealth_evaluation_events_total", result="exported") == 6

        await wait_for(all_exported)  # the agent counts each event the endpoint took
        samples = await metrics(session, agent)
    # The agent has shut down, flushing what was queued: nothing more came.
    received = receiver.log_records()
    assert len(received) == 6  # three evaluations for each traced call, none for the other
    assert value(samples, "semhealth_evaluation_events_total") == 6  # and none dropped
    events = by_span(received)
    assert set(events) == {FITS, UNRELATED}
    for ids, model in ((FITS, "fits"), (UNRELATED, "unrelated")):
        span = events[ids]
        assert set(span) == {CONTEXT_RELEVANCE, ANSWER_RELEVANCE, OUTPUT_VALIDITY}
        assert span[OUTPUT_VALIDITY][SCORE_VALUE] == 1.0
        assert span[OUTPUT_VALIDITY][SCORE_LABEL] == "valid"
        for name, metric in (
            (CONTEXT_RELEVANCE, "semantic_health_context_relevance_score_sum"),
            (ANSWER_RELEVANCE, "semantic_health_answer_relevance_score_sum"),
        ):
            score = span[name][SCORE_VALUE]
            # The score on the trace is the one the agent's metrics recorded for that call.
            assert score == pytest.approx(value(samples, metric, model=model), abs=1e-9)
            assert span[name][SCORE_LABEL] == expected_label(score)
    # The real model tells the fitting context from the unrelated one.
    assert (
        events[FITS][CONTEXT_RELEVANCE][SCORE_VALUE]
        > events[UNRELATED][CONTEXT_RELEVANCE][SCORE_VALUE]
    )
    assert_no_text(receiver)


# --------------------------------------------------------------------------- two planes


@asynccontextmanager
async def sidecar_process(upstream_url: str, receiver: GrpcReceiver) -> AsyncIterator[str]:
    """``semhealth run`` (forwarder and analysis processes) with evaluation events on."""
    proxy_port, admin_port = free_port(), free_port()
    env = _env()
    env["SEMHEALTH_OTLP_RECEIVER__EVALUATION__ENABLED"] = "true"
    env["SEMHEALTH_OTLP_RECEIVER__EVALUATION__ENDPOINT"] = receiver.endpoint
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run",
        "--upstream", upstream_url,
        "--listen", f"127.0.0.1:{proxy_port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        env=env,
    )  # fmt: skip
    try:
        await _wait_ready(f"http://127.0.0.1:{admin_port}", deadline_s=60)
        yield f"http://127.0.0.1:{proxy_port}"
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the planes are separate processes")
async def test_the_header_crosses_the_tap_wire_to_the_analysis_process() -> None:
    receiver = GrpcReceiver()
    await receiver.start()
    upstream = SimulatedUpstream(json_answer)
    await upstream.start()
    try:
        async with sidecar_process(upstream.url, receiver) as proxy:
            query, context = PAIRS[1]
            await ask(proxy, "m", query, context, FITS)
            await ask(proxy, "m", query, context, None)
            await receiver.wait_log_records(1, timeout_s=20)
        # semhealth has stopped, flushing what it had queued: the untraced call added nothing.
        (event,) = receiver.log_records()
        assert (event.trace_id.hex(), event.span_id.hex()) == FITS
        assert dict(attributes(event.attributes)) == {
            EVALUATION_NAME: OUTPUT_VALIDITY,
            SCORE_VALUE: 1.0,
            SCORE_LABEL: "valid",
        }
        assert_no_text(receiver)
    finally:
        await upstream.shutdown()
        await receiver.shutdown()
