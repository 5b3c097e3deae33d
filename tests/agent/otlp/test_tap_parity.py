"""The same traffic through both taps: an app instrumented with a real GenAI instrumentation
calls the scripted upstream through the sidecar's proxy, and exports its spans to the same
agent's OTLP receiver. The records and metrics semhealth builds from the spans match those the
proxy tap builds from the bytes, within stated tolerances, and the next hop gets every span.

Tolerances: counts, token usage, structured-output verdicts and the model are equal; relevance
scores are equal to 1e-6 (same texts, same model); TTFT (only OpenLLMetry records chunk times)
differs by the client's side of the call: the span's first chunk event comes after the proxy's
first delta, by at most 150 ms on a loaded machine.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import load_config
from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream
from semhealth.agent.relevance import LoadedEncoders
from semhealth.collectors import StreamRecord
from tests.agent.otlp.collector import Collector

ROOT = Path(__file__).resolve().parents[3]
SYSTEM = "Paris is the capital of France. It lies on the Seine."
QUESTION = "What is the capital of France?"
PIECES = ("The", " capital", " is", " Paris", ".")
JSON_PIECES = ('{"city":', ' "Paris"}')
CALLS = 3  # streamed chats, then one JSON-mode chat
TTFT_TOLERANCE_S = 0.15
MODES = {
    "openai_v2": {
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_AND_EVENT",
        "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
    },
    "openllmetry": {"TRACELOOP_TRACE_CONTENT": "true"},
}


def script(request: ScriptRequest) -> Script:
    pieces = JSON_PIECES if b"response_format" in request.body else PIECES
    return Script(pieces=pieces, ttft_s=0.05, gaps_s=0.02, input_tokens=9)


def run_app(mode: str, proxy_url: str, otlp_url: str) -> None:
    env = {**os.environ, **MODES[mode], "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-W", "ignore", __file__, mode, proxy_url, otlp_url],
        env=env,
        check=True,
        timeout=120,
        cwd=ROOT,
    )


async def until(records: list[StreamRecord], source: str, count: int) -> list[StreamRecord]:
    for _ in range(200):
        found = [r for r in records if r.source == source]
        if len(found) >= count:
            return sorted(found, key=lambda r: r.start_ns)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{source}: {len([r for r in records if r.source == source])} records")


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_the_otlp_tap_sees_what_the_proxy_tap_sees(
    mode: str, fast_encoders: LoadedEncoders
) -> None:
    upstream = SimulatedUpstream(script)
    await upstream.start()
    hop = Collector()
    await hop.start()
    records: list[StreamRecord] = []
    scores: dict[tuple[str, int], Any] = {}
    overrides: dict[str, object] = {
        "upstream.url": upstream.url,
        "listen.proxy": "127.0.0.1:0",
        "listen.admin": "127.0.0.1:0",
        "relevance.enabled": True,
        "relevance.profile": "fast",
        "otlp_receiver.http_listen": "127.0.0.1:0",
        "otlp_receiver.trace_wait_s": 0.2,
        "otlp_receiver.route_attribute": "semhealth.route",
        "otlp_receiver.forward.endpoint": hop.grpc_endpoint,
    }
    agent = Agent(
        load_config(None, {}, overrides),
        Settings(consumers=[records.append], loaded_encoders=fast_encoders),
    )
    await agent.start()
    try:
        assert agent.relevance is not None and agent.intake is not None
        agent.relevance.also_record(
            lambda record, s: scores.__setitem__((record.source, record.start_ns), s)
        )
        http = agent.intake.receiver.http_address
        assert http is not None
        await asyncio.to_thread(
            run_app, mode, agent.proxy_url + "/v1", f"http://127.0.0.1:{http[1]}/v1/traces"
        )
        proxied = await until(records, "proxy", CALLS + 1)
        spanned = await until(records, "otlp", CALLS + 1)
        for _ in range(100):  # scores come after the records
            if len(scores) >= 2 * CALLS:
                break
            await asyncio.sleep(0.05)
    finally:
        await agent.shutdown()
        await upstream.shutdown()
    forwarded = hop.bodies("traces")
    await hop.stop()

    _same_calls(proxied, spanned)
    _same_scores(proxied, spanned, scores)
    if mode == "openllmetry":  # the only instrumentation that records chunk times
        _close_ttft(proxied, spanned)
    else:
        assert all(r.ttft_s is None for r in spanned)  # not recorded, never invented
    assert forwarded, "the next hop got nothing"


def _same_calls(proxied: Sequence[StreamRecord], spanned: Sequence[StreamRecord]) -> None:
    assert [r.route for r in proxied] == ["chat_completions"] * (CALLS + 1)
    assert [r.route for r in spanned] == ["chat_completions"] * (CALLS + 1)
    for ours, theirs in zip(proxied, spanned, strict=True):
        assert (theirs.model, theirs.status) == (ours.model, ours.status)
        assert theirs.usage == ours.usage
        assert theirs.output_text == ours.output_text
        assert theirs.request.query == ours.request.query
        assert theirs.request.context == ours.request.context
        assert [v.result for v in theirs.validity] == [v.result for v in ours.validity]
    assert [v.result for v in proxied[-1].validity] == ["valid"]  # the JSON-mode call


def _same_scores(
    proxied: Sequence[StreamRecord], spanned: Sequence[StreamRecord], scores: dict[Any, Any]
) -> None:
    for ours, theirs in zip(proxied[:CALLS], spanned[:CALLS], strict=True):
        a = scores[("proxy", ours.start_ns)]
        b = scores[("otlp", theirs.start_ns)]
        assert a.context is not None and a.answer is not None
        assert b.context == pytest.approx(a.context, abs=1e-6)
        assert b.answer == pytest.approx(a.answer, abs=1e-6)


def _close_ttft(proxied: Sequence[StreamRecord], spanned: Sequence[StreamRecord]) -> None:
    for ours, theirs in zip(proxied, spanned, strict=True):
        assert ours.ttft_s is not None and theirs.ttfb_s is not None
        # The span starts before the proxy sees the request and its first chunk event comes
        # after the proxy relayed it: the app's view is the longer one.
        assert ours.ttfb_s is not None
        assert theirs.ttfb_s >= ours.ttfb_s - 0.005
        assert theirs.ttfb_s <= ours.ttfb_s + TTFT_TOLERANCE_S


# --- the instrumented app (run as a script in its own interpreter) ------------------------------


def _app(mode: str, proxy_url: str, otlp_url: str) -> None:  # pragma: no cover - subprocess
    import openai
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    resource = Resource.create({"service.name": "rag-app", "semhealth.route": "chat_completions"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp_url)))
    logger_provider = LoggerProvider(resource=resource)
    instrumentor: Any
    if mode == "openai_v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as V2

        instrumentor = V2()  # type: ignore[no-untyped-call]
    else:
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor as Traceloop

        instrumentor = Traceloop(use_attributes=True)
    instrumentor.instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    client = openai.OpenAI(base_url=proxy_url, api_key="k", max_retries=0)
    messages: Any = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    extra: list[dict[str, Any]] = [{}] * CALLS + [{"response_format": {"type": "json_object"}}]
    for options in extra:
        stream = client.chat.completions.create(
            model="gpt-test",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **options,
        )
        for _ in stream:
            pass
    client.close()
    instrumentor.uninstrument()
    tracer_provider.shutdown()


if __name__ == "__main__":
    _app(sys.argv[1], sys.argv[2], sys.argv[3])
