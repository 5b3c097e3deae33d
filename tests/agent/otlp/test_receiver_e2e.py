"""The OTLP tap end to end: SDK exporter -> semhealth's receiver -> the same records, metrics
and consumers as the proxy's (``source="otlp"``), and every request on to a real next hop.

In one process (the ``Agent``), then as ``semhealth run`` in a subprocess: receiver-only (no
upstream, so no forwarding processes, and the admin port still answers), and beside a proxy,
where the receiver lives in the analysis process.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http._log_exporter import (
    OTLPLogExporter as HttpLogExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import load_config
from semhealth.agent.demo.simulator import Script, SimulatedUpstream
from semhealth.agent.otlp.codec import TRACES
from semhealth.agent.otlp.intake import Intake, intake_settings
from semhealth.collectors import StreamRecord
from tests.agent.otlp.collector import Collector
from tests.agent.otlp.test_receiver import export_spans, make_logs, spans_bytes
from tests.agent.test_cli import _env, _wait_ready
from tests.servers import free_port

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def chat_spans(n: int, service: str = "support-bot") -> list[ReadableSpan]:
    """``n`` chat spans as the GenAI conventions write them, content included."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    for i in range(n):
        question = [{"role": "user", "parts": [{"type": "text", "content": f"Question {i}?"}]}]
        answer = [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": f"Answer {i}."}],
                "finish_reason": "stop",
            }
        ]
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.response.model": "gpt-4o-2024-08-06",
            "gen_ai.usage.input_tokens": 12,
            "gen_ai.usage.output_tokens": 3,
            "gen_ai.input.messages": json.dumps(question),
            "gen_ai.output.messages": json.dumps(answer),
        }
        with tracer.start_as_current_span("chat gpt-4o", attributes=attributes):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


async def scrape(admin: str) -> Series:
    async with aiohttp.ClientSession() as client:
        async with client.get(admin + "/metrics") as response:
            assert response.status == 200, await response.text()
            text = await response.text()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            series[key] = series.get(key, 0.0) + sample.value
    return series


def value(series: Series, name: str, **labels: str) -> float:
    """The sum over series of ``name`` that carry ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in series.items() if n == name and wanted <= have)


def sources(series: Series, name: str) -> set[str]:
    return {dict(labels).get("source", "") for (n, labels), _ in series.items() if n == name}


async def until_metric(admin: str, name: str, at_least: float, **labels: str) -> Series:
    for _ in range(300):
        series = await scrape(admin)
        if value(series, name, **labels) >= at_least:
            return series
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name}{labels} never reached {at_least}")


# -- one process --------------------------------------------------------------------------------


@asynccontextmanager
async def receiver_only_agent(
    hop: Collector, records: list[StreamRecord], **settings: Any
) -> AsyncIterator[Agent]:
    overrides: dict[str, object] = {
        "listen.admin": "127.0.0.1:0",
        "relevance.enabled": False,
        "otlp_receiver.grpc_listen": "127.0.0.1:0",
        "otlp_receiver.http_listen": "127.0.0.1:0",
        "otlp_receiver.trace_wait_s": 0.2,
        "otlp_receiver.forward.endpoint": hop.grpc_endpoint,
        **settings,
    }
    agent = Agent(load_config(None, {}, overrides), Settings(consumers=[records.append]))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.shutdown()


def _port(address: tuple[str, int] | None) -> int:
    assert address is not None
    return address[1]


async def test_an_agent_without_upstream_builds_otlp_records_and_forwards_every_byte() -> None:
    spans = chat_spans(3)
    hop = Collector()
    await hop.start()
    records: list[StreamRecord] = []
    try:
        async with receiver_only_agent(hop, records) as agent:
            assert agent.proxy is None and agent.intake is not None
            receiver = agent.intake.receiver
            exporter = HttpSpanExporter(
                endpoint=f"http://127.0.0.1:{_port(receiver.http_address)}/v1/traces"
            )
            assert await export_spans(exporter, spans) is SpanExportResult.SUCCESS
            await hop.wait_exports(1)
            series = await until_metric(
                agent.admin_url, "gen_ai_client_operation_duration_seconds_count", 3, source="otlp"
            )
            assert value(series, "semhealth_otlp_received_total", signal="traces") == 3
            assert (
                value(series, "semhealth_otlp_forward_total", signal="traces", outcome="forwarded")
                == 1
            )
            assert sources(series, "gen_ai_client_operation_duration_seconds_count") == {"otlp"}
            # A refused request is counted by reason, and the receiver keeps serving.
            async with aiohttp.ClientSession() as client:
                async with client.post(
                    f"http://127.0.0.1:{_port(receiver.http_address)}/v1/traces",
                    data=b"\xff\xff not protobuf",
                    headers={"Content-Type": "application/x-protobuf"},
                ) as response:
                    assert response.status == 400
            series = await scrape(agent.admin_url)
            rejected = value(
                series, "semhealth_otlp_rejected_total", signal="traces", reason="malformed"
            )
            assert rejected == 1
            assert value(series, "semhealth_otlp_genai_total", event="records") == 3
            # Each span's 12 input and 3 output tokens: one observation of each type a span.
            for kind, tokens in (("input", 12), ("output", 3)):
                usage = {"source": "otlp", "gen_ai_token_type": kind}
                assert value(series, "gen_ai_client_token_usage_count", **usage) == 3
                assert value(series, "gen_ai_client_token_usage_sum", **usage) == 3 * tokens
        assert hop.bodies("traces") == [spans_bytes(spans)]
        assert [r.source for r in records] == ["otlp"] * 3
        assert {r.model for r in records} == {"gpt-4o-2024-08-06"}
    finally:
        await hop.stop()


async def test_shutdown_builds_the_records_of_traces_still_waiting() -> None:
    hop = Collector()
    await hop.start()
    records: list[StreamRecord] = []
    try:
        # A long wait: only shutdown can build these records in this test's time.
        async with receiver_only_agent(hop, records, **{"otlp_receiver.trace_wait_s": 60}) as a:
            assert a.intake is not None
            target = f"127.0.0.1:{_port(a.intake.receiver.grpc_address)}"
            exporter = GrpcSpanExporter(endpoint=target, insecure=True)
            assert await export_spans(exporter, chat_spans(2)) is SpanExportResult.SUCCESS
            await asyncio.sleep(0.3)
            assert records == []
        assert [r.source for r in records] == ["otlp", "otlp"]
        assert len(hop.bodies("traces")) == 1  # forwarded before the agent stopped
    finally:
        await hop.stop()


# -- semhealth run ------------------------------------------------------------------------------


@asynccontextmanager
async def semhealth_run(
    tmp_path: Path, hop: Collector, *extra: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, str, str]]:
    """``semhealth run`` with its receiver on two free ports; yields the process, the admin
    URL, the gRPC target and the HTTP base URL."""
    grpc_port, http_port, admin_port = free_port(), free_port(), free_port()
    config = tmp_path / "semhealth.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "otlp_receiver": {
                    "trace_wait_s": 0.2,
                    "forward": {"endpoint": hop.http_endpoint, "protocol": "http/protobuf"},
                }
            }
        )
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run",
        "--config", str(config),
        "--otlp-grpc-listen", f"127.0.0.1:{grpc_port}",
        "--otlp-http-listen", f"127.0.0.1:{http_port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        *extra,
        env=_env(),
    )  # fmt: skip
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        await _wait_ready(admin, deadline_s=60)
        yield process, admin, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


async def _send_spans_and_logs(target: str, http: str, spans: Sequence[ReadableSpan]) -> bytes:
    exporter = GrpcSpanExporter(endpoint=target, insecure=True)
    assert await export_spans(exporter, spans) is SpanExportResult.SUCCESS
    logs = make_logs(2)
    await export_spans(HttpLogExporter(endpoint=http + "/v1/logs"), logs)
    return bytes(encode_logs(logs).SerializeToString())


async def test_semhealth_run_receiver_only_has_no_forwarders_and_serves_metrics(
    tmp_path: Path,
) -> None:
    hop = Collector()
    await hop.start()
    spans = chat_spans(2)
    try:
        async with semhealth_run(tmp_path, hop) as (process, admin, target, http):
            assert children(process.pid) == []  # no proxy, so no forwarding or analysis child
            logs = await _send_spans_and_logs(target, http, spans)
            series = await until_metric(
                admin, "gen_ai_client_operation_duration_seconds_count", 2, source="otlp"
            )
            assert value(series, "semhealth_otlp_received_total", signal="traces") == 2
            assert value(series, "semhealth_otlp_received_total", signal="logs") == 2
            await hop.wait_exports(2)
            async with aiohttp.ClientSession() as client:
                async with client.get(admin + "/healthz") as response:
                    assert response.status == 200
        assert hop.bodies("traces") == [spans_bytes(spans)]
        assert hop.bodies("logs") == [logs]
    finally:
        await hop.stop()


async def test_semhealth_run_with_a_proxy_runs_the_receiver_in_the_analysis_process(
    tmp_path: Path,
) -> None:
    upstream = SimulatedUpstream(lambda r: Script(pieces=("hello", " world")))
    await upstream.start()
    hop = Collector()
    await hop.start()
    proxy_port = free_port()
    spans = chat_spans(1)
    try:
        extra = ("--upstream", upstream.url, "--listen", f"127.0.0.1:{proxy_port}")
        async with semhealth_run(tmp_path, hop, *extra) as (_, admin, target, http):
            await _send_spans_and_logs(target, http, spans)
            async with aiohttp.ClientSession() as client:
                async with client.post(
                    f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
                    json={
                        "model": "m",
                        "stream": True,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                ) as response:
                    assert response.status == 200
                    await response.read()
            series = await until_metric(
                admin, "gen_ai_client_operation_duration_seconds_count", 1, source="otlp"
            )
            series = await until_metric(
                admin, "gen_ai_client_operation_duration_seconds_count", 1, source="proxy"
            )
            assert sources(series, "gen_ai_client_operation_duration_seconds_count") == {
                "otlp",
                "proxy",
            }
            await hop.wait_exports(2)
        assert hop.bodies("traces") == [spans_bytes(spans)]
    finally:
        await hop.stop()
        await upstream.shutdown()


# -- the intake's lifecycle ---------------------------------------------------------------------


def _intake(grpc_port: int, hop: Collector) -> Intake:
    overrides: dict[str, object] = {
        "otlp_receiver.grpc_listen": f"127.0.0.1:{grpc_port}",
        "otlp_receiver.forward.endpoint": hop.http_endpoint,
        "otlp_receiver.forward.protocol": "http/protobuf",
    }
    config = load_config(None, {}, overrides).otlp_receiver
    return Intake(intake_settings(config), lambda record: None)


async def test_intake_lifecycle_and_a_failed_start_closing_the_next_hop() -> None:
    hop = Collector()
    await hop.start()
    port = free_port()
    try:
        never = _intake(port, hop)
        await never.shutdown(1.0)
        await never.shutdown(1.0)
        for _ in range(2):  # start -> shutdown -> a fresh instance on the same config
            intake = _intake(port, hop)
            await intake.start()
            exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
            assert await export_spans(exporter, chat_spans(1)) is SpanExportResult.SUCCESS
            await intake.shutdown(2.0)
            assert intake.stats.forward is not None
            assert intake.stats.forward.outcomes == {("traces", "forwarded"): 1}
        running = _intake(port, hop)
        await running.start()
        try:
            clash = _intake(port, hop)  # the same port: the receiver cannot listen
            try:
                await clash.start()
            except OSError as exc:
                assert f"cannot listen for OTLP/gRPC on 127.0.0.1:{port}" in str(exc)
            else:
                raise AssertionError("a second receiver on the same port started")
            assert clash.next_hop is not None
            clash.next_hop.submit(TRACES, b"")  # closed again: counted, never sent
            assert clash.stats.forward is not None
            assert clash.stats.forward.outcomes == {("traces", "dropped_shutdown"): 1}
        finally:
            await running.shutdown(1.0)
        assert len(hop.bodies("traces")) == 2
    finally:
        await hop.stop()
