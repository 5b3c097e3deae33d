"""OTLP push, end to end: the agent exports to real OTLP receivers (gRPC and HTTP/protobuf)
the same values its Prometheus ``/metrics`` shows, and a dead collector never hurts the proxy.

Each scenario runs once per module on an event loop of its own (``_run_apart``) and hands the
tests plain data: what the receiver got and what ``/metrics`` said at the same moment. Exports
are triggered with ``MeterProvider.force_flush`` (a blocking call, so off the event loop)
rather than by sleeping until the reader's interval comes round.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import grpc  # type: ignore[import-untyped]
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE, Metric
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream
from semhealth.agent.telemetry.pipeline import OTLPSettings
from semhealth.agent.telemetry.pipeline import Settings as TelemetrySettings
from semhealth.collectors.record import StreamRecord
from tests.agent.conftest import ScriptFor, Stack, agent_config
from tests.agent.otlp_receiver import (
    GrpcReceiver,
    HistogramValue,
    HttpReceiver,
    SeriesKey,
    Value,
    flatten,
    latest_metrics,
    resource_attributes,
)
from tests.servers import free_port

T = TypeVar("T")
Receiver = GrpcReceiver | HttpReceiver
PromKey = tuple[str, frozenset[tuple[str, str]]]

SERVICE = "semhealth-otlp-test"
HEADERS = (("x-collector-token", "t0ken-42"),)
CHAT = "/v1/chat/completions"
USAGE_CHAT = {
    "model": "gpt-4o",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "say hello"}],
}
VALID_JSON = '{"answer": 42, "unit": "none"}'
INVALID_JSON = '{"answer": 42, "unit": "none",}'
STREAMS = 3  # chat streams with usage
RECORDS = STREAMS + 2  # ... and two JSON-mode streams
INPUT_TOKENS = 11
OUTPUT_TOKENS = 4


def _json_mode(text: str) -> dict[str, Any]:
    # The script answers with the user's content: the test decides what the "model" outputs.
    return {
        "model": "gpt-4o",
        "stream": True,
        "response_format": {"type": "json_object"},
        "messages": [{"role": "user", "content": text}],
    }


def _answer(request: ScriptRequest) -> Script:
    body = request.json if isinstance(request.json, dict) else {}
    if "response_format" in body:
        text = body["messages"][-1]["content"]
        cut = len(text) // 2
        return Script(pieces=(text[:cut], text[cut:]), ttft_s=0.005, gaps_s=0.002)
    return Script(
        pieces=("Hel", "lo", " there"),
        ttft_s=0.005,
        gaps_s=0.002,
        input_tokens=INPUT_TOKENS,
        output_tokens=OUTPUT_TOKENS,
    )


# --------------------------------------------------------------------------- helpers


def _run_apart(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a scenario on a fresh event loop in a worker thread, apart from pytest's loops."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(main())).result(timeout=60)


@asynccontextmanager
async def _receiving(receiver: Receiver) -> AsyncIterator[Receiver]:
    await receiver.start()
    try:
        yield receiver
    finally:
        await receiver.shutdown()


@asynccontextmanager
async def _otlp_stack(script_for: ScriptFor, otlp: OTLPSettings) -> AsyncIterator[Stack]:
    """A scripted upstream and an agent in front of it that pushes its metrics per ``otlp``."""
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    records: list[StreamRecord] = []
    telemetry = TelemetrySettings(service_name=SERVICE, otlp=otlp)
    settings = Settings(consumers=[records.append], telemetry=telemetry)
    agent = Agent(agent_config(upstream.url), settings)
    try:
        await agent.start()
        yield Stack(upstream, agent, records)
    finally:
        await agent.shutdown()
        await upstream.shutdown()


async def _flush(agent: Agent) -> None:
    """Collect and export now; the SDK blocks until the exporter returns. Its result says
    nothing about the export (the periodic reader's ``force_flush`` answers True regardless)."""
    await asyncio.to_thread(agent.telemetry.provider.force_flush, 5_000)


async def _until_idle(agent: Agent, timeout_s: float = 5.0) -> None:
    """No exchange open and no chunk queued, so the observable gauges hold still too."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while agent.proxy.active_streams or agent.tap.stats.queue_depth:
        assert asyncio.get_running_loop().time() < deadline, "the agent did not become idle"
        await asyncio.sleep(0.01)


async def _post(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with client.post(url, json=body) as response:
        await response.read()
        return response.status


async def _send_traffic(client: aiohttp.ClientSession, agent: Agent) -> list[int]:
    bodies = [USAGE_CHAT] * STREAMS + [_json_mode(VALID_JSON), _json_mode(INVALID_JSON)]
    return [await _post(client, agent.proxy_url + CHAT, body) for body in bodies]


async def _scrape(client: aiohttp.ClientSession, agent: Agent) -> dict[PromKey, float]:
    async with client.get(agent.admin_url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _exports_within(receiver: Receiver, timeout_s: float) -> int:
    """How many exports arrived once the first did, 0 if none within ``timeout_s``."""
    try:
        return len(await receiver.wait_requests(1, timeout_s))
    except AssertionError:
        return 0


async def _records_within(stack: Stack, n: int, timeout_s: float) -> int:
    """How many records there are once ``n`` are, or when ``timeout_s`` has passed."""
    try:
        return len(await stack.wait_records(n, timeout_s))
    except AssertionError:
        return len(stack.records)


def _attrs(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())


def _total(values: dict[SeriesKey, Value], name: str, **where: str) -> HistogramValue:
    """The sum of every histogram series of ``name`` whose attributes include ``where``."""
    points = [
        value
        for (metric, attrs), value in values.items()
        if metric == name and _attrs(**where) <= attrs and isinstance(value, HistogramValue)
    ]
    assert points, f"no {name} series with {where}"
    return HistogramValue(
        count=sum(p.count for p in points),
        sum=sum(p.sum for p in points),
        bucket_counts=(),
        explicit_bounds=(),
    )


def _counter(values: dict[SeriesKey, Value], name: str, **where: str) -> float:
    found = [
        value
        for (metric, attrs), value in values.items()
        if metric == name and _attrs(**where) <= attrs and not isinstance(value, HistogramValue)
    ]
    assert found, f"no {name} series with {where}"
    return float(sum(found))


# ---- OTLP -> Prometheus names, as the OpenTelemetry Prometheus exporter writes them

_UNIT_SUFFIX = {"": "", "s": "_seconds", "{token}": ""}  # a new unit must be added here


def _prometheus_name(metric: Metric) -> str:
    assert metric.unit in _UNIT_SUFFIX, f"unit {metric.unit!r} of {metric.name}: add its suffix"
    name = metric.name.replace(".", "_") + _UNIT_SUFFIX[metric.unit]
    if metric.WhichOneof("data") == "sum" and metric.sum.is_monotonic:
        name += "_total"
    return name


def _labels(attrs: frozenset[tuple[str, Any]]) -> frozenset[tuple[str, str]]:
    return frozenset((key.replace(".", "_"), str(value)) for key, value in attrs)


def _bucket_samples(
    name: str, labels: frozenset[tuple[str, str]], value: HistogramValue
) -> dict[PromKey, float]:
    """Prometheus buckets are cumulative (``le``); OTLP's are per bucket."""
    out: dict[PromKey, float] = {}
    running = 0
    bounds = [*(repr(float(b)) for b in value.explicit_bounds), "+Inf"]
    for bound, count in zip(bounds, value.bucket_counts, strict=True):
        running += count
        out[(name + "_bucket", labels | {("le", bound)})] = float(running)
    return out


def _as_prometheus(
    values: dict[SeriesKey, Value], metrics: dict[str, Metric]
) -> dict[PromKey, float]:
    """The samples ``/metrics`` must show if it agrees with what OTLP delivered."""
    out: dict[PromKey, float] = {}
    for (name, attrs), value in values.items():
        prom = _prometheus_name(metrics[name])
        labels = _labels(attrs)
        if isinstance(value, HistogramValue):
            out[(prom + "_count", labels)] = float(value.count)
            out[(prom + "_sum", labels)] = value.sum
            out.update(_bucket_samples(prom, labels, value))
        else:
            out[(prom, labels)] = float(value)
    return out


def _normalise_le(samples: dict[PromKey, float]) -> dict[PromKey, float]:
    """``le`` as ``repr(float)``, whatever spelling the exposition used (``1`` vs ``1.0``)."""
    out: dict[PromKey, float] = {}
    for (name, labels), value in samples.items():
        fixed = frozenset(
            (key, repr(float(text)) if key == "le" and text != "+Inf" else text)
            for key, text in labels
        )
        out[(name, fixed)] = value
    return out


@pytest.fixture(scope="module", autouse=True)
def _no_otel_environment() -> Iterator[None]:
    """OTEL_* variables would change the exporters (temporality, headers, compression)."""
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("OTEL_")]:
            patch.delenv(key)
        yield


# --------------------------------------------------------------------------- pushing


@dataclass(frozen=True, slots=True)
class Pushed:
    """What one healthy push scenario left behind."""

    unasked_exports: int  # pushed by the reader on its own interval, before any flush
    statuses: list[int]
    values: dict[SeriesKey, Value]
    metrics: dict[str, Metric]
    resource: dict[str, Any]
    headers: list[dict[str, str]]
    prometheus: dict[PromKey, float]


def _receiver_for(protocol: str) -> Receiver:
    return GrpcReceiver() if protocol == "grpc" else HttpReceiver()


async def _push(protocol: str) -> Pushed:
    async with _receiving(_receiver_for(protocol)) as receiver:
        otlp = OTLPSettings(
            endpoint=receiver.endpoint,
            protocol=protocol,
            headers=HEADERS,
            interval_s=0.5,
            timeout_s=1.0,
        )
        async with _otlp_stack(_answer, otlp) as stack, aiohttp.ClientSession() as client:
            unasked = await _exports_within(receiver, timeout_s=10.0)
            statuses = await _send_traffic(client, stack.agent)
            await stack.wait_records(RECORDS)
            await _until_idle(stack.agent)
            await _flush(stack.agent)
            # Nothing changes once the agent is idle: both readers see the same totals.
            prometheus = await _scrape(client, stack.agent)
            received = receiver.received
    requests = [item.request for item in received]
    return Pushed(
        unasked_exports=unasked,
        statuses=statuses,
        values=flatten(requests),
        metrics=latest_metrics(requests),
        resource=resource_attributes(requests),
        headers=[item.headers for item in received],
        prometheus=prometheus,
    )


@pytest.fixture(scope="module", params=["grpc", "http/protobuf"])
def pushed(request: pytest.FixtureRequest) -> Pushed:
    protocol: str = request.param
    return _run_apart(lambda: _push(protocol))


def test_agent_pushes_on_its_interval_without_a_flush(pushed: Pushed) -> None:
    assert pushed.unasked_exports >= 1


def test_proxy_answers_every_request_while_pushing(pushed: Pushed) -> None:
    assert pushed.statuses == [200] * RECORDS


def test_output_results_arrive_by_result(pushed: Pushed) -> None:
    assert _counter(pushed.values, "semantic_health_outputs", result="valid") == 1
    assert _counter(pushed.values, "semantic_health_outputs", result="syntax") == 1


def test_input_token_usage_arrives_as_a_histogram(pushed: Pushed) -> None:
    usage = _total(pushed.values, "gen_ai.client.token.usage", **{"gen_ai.token.type": "input"})
    assert (usage.count, usage.sum) == (STREAMS, STREAMS * INPUT_TOKENS)


def test_output_token_usage_arrives_as_a_histogram(pushed: Pushed) -> None:
    usage = _total(pushed.values, "gen_ai.client.token.usage", **{"gen_ai.token.type": "output"})
    assert (usage.count, usage.sum) == (STREAMS, STREAMS * OUTPUT_TOKENS)


def test_time_to_first_token_counts_every_stream(pushed: Pushed) -> None:
    assert _total(pushed.values, "gen_ai.server.time_to_first_token").count == RECORDS


def test_records_counter_arrives(pushed: Pushed) -> None:
    assert _counter(pushed.values, "semhealth_records") == RECORDS


def test_resource_names_the_service(pushed: Pushed) -> None:
    assert pushed.resource["service.name"] == SERVICE


def test_configured_headers_reach_the_collector(pushed: Pushed) -> None:
    assert pushed.headers
    for headers in pushed.headers:
        assert headers.get("x-collector-token") == "t0ken-42"


def test_sums_and_histograms_are_cumulative(pushed: Pushed) -> None:
    # Temporality is what makes OTLP and /metrics totals comparable at all.
    for metric in pushed.metrics.values():
        kind = metric.WhichOneof("data")
        if kind in ("sum", "histogram"):
            data = metric.sum if kind == "sum" else metric.histogram
            assert data.aggregation_temporality == AGGREGATION_TEMPORALITY_CUMULATIVE, metric.name


def test_every_pushed_series_equals_its_prometheus_series(pushed: Pushed) -> None:
    expected = _as_prometheus(pushed.values, pushed.metrics)
    shown = {k: v for k, v in pushed.prometheus.items() if k[0] != "target_info"}
    # Equal to the last bits of a double: a sum of float durations can come out of the text
    # format one ulp away from the pushed double (0.002299141 against 0.0022991409999999998).
    assert _normalise_le(shown) == pytest.approx(_normalise_le(expected), rel=1e-12, abs=0)


def test_named_series_match_prometheus_by_hand(pushed: Pushed) -> None:
    # The mapping spelled out for the series the issue names, independent of _as_prometheus.
    gen_ai = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "openai",
        "gen_ai_request_model": "gpt-4o",
        "gen_ai_response_model": "gpt-4o",
        "prompt_class": "short",
        "provider": "openai_chat",
        "route": "chat_completions",
        "source": "proxy",
    }
    ttft = _total(pushed.values, "gen_ai.server.time_to_first_token")
    prom = pushed.prometheus
    key = "gen_ai_server_time_to_first_token_seconds"
    assert prom[(key + "_count", frozenset(gen_ai.items()))] == ttft.count
    assert prom[(key + "_sum", frozenset(gen_ai.items()))] == ttft.sum
    inputs = frozenset({**gen_ai, "gen_ai_token_type": "input"}.items())
    assert prom[("gen_ai_client_token_usage_sum", inputs)] == STREAMS * INPUT_TOKENS
    valid = frozenset(
        {
            "model": "gpt-4o",
            "prompt_class": "short",
            "provider": "openai_chat",
            "result": "valid",
            "route": "chat_completions",
            "source": "proxy",
        }.items()
    )
    assert prom[("semantic_health_outputs_total", valid)] == 1


# --------------------------------------------------------------------------- outages


@dataclass(frozen=True, slots=True)
class Outage:
    """What one scenario with a failing collector left behind."""

    statuses: list[int]
    records: int
    failures_before: float
    failures_after: float
    attempts: int | None  # None: nothing listens, so nothing counts attempts


def _outage_settings(endpoint: str, protocol: str) -> OTLPSettings:
    # A 0.5 s deadline is shorter than the exporters' first backoff (0.8-1.2 s), so each
    # export is exactly one try; the long interval leaves exports to the test's flushes.
    return OTLPSettings(endpoint=endpoint, protocol=protocol, interval_s=60.0, timeout_s=0.5)


async def _through_outage(otlp: OTLPSettings) -> tuple[list[int], int, float, float]:
    async with _otlp_stack(_answer, otlp) as stack, aiohttp.ClientSession() as client:
        before = await _scrape(client, stack.agent)
        statuses = await _send_traffic(client, stack.agent)
        await stack.wait_records(RECORDS)
        await _flush(stack.agent)  # returns, whatever the export's fate
        after = await _scrape(client, stack.agent)
        statuses.append(await _post(client, stack.agent.proxy_url + CHAT, USAGE_CHAT))
        records = await _records_within(stack, RECORDS + 1, timeout_s=5.0)
    key: PromKey = ("semhealth_otlp_export_failures_total", frozenset())
    return statuses, records, before[key], after[key]


async def _outage(kind: str) -> Outage:
    if kind in ("grpc closed port", "http closed port"):
        protocol = "grpc" if kind.startswith("grpc") else "http/protobuf"
        path = "" if protocol == "grpc" else "/v1/metrics"
        otlp = _outage_settings(f"http://127.0.0.1:{free_port()}{path}", protocol)
        return Outage(*await _through_outage(otlp), attempts=None)
    failing: Receiver = (
        GrpcReceiver(fail_with=grpc.StatusCode.UNAVAILABLE)
        if kind == "grpc UNAVAILABLE"
        else HttpReceiver(fail_with=503)
    )
    protocol = "grpc" if isinstance(failing, GrpcReceiver) else "http/protobuf"
    async with _receiving(failing) as receiver:
        result = await _through_outage(_outage_settings(receiver.endpoint, protocol))
        return Outage(*result, attempts=receiver.attempts)


@pytest.fixture(
    scope="module",
    params=["grpc UNAVAILABLE", "http 503", "grpc closed port", "http closed port"],
)
def outage(request: pytest.FixtureRequest) -> Outage:
    kind: str = request.param
    return _run_apart(lambda: _outage(kind))


def test_proxy_answers_every_request_while_the_collector_fails(outage: Outage) -> None:
    assert outage.statuses == [200] * (RECORDS + 1)


def test_streams_are_still_analysed_while_the_collector_fails(outage: Outage) -> None:
    assert outage.records == RECORDS + 1


def test_failed_export_is_counted_on_metrics(outage: Outage) -> None:
    assert outage.failures_before == 0
    assert outage.failures_after >= 1


@pytest.mark.parametrize("outage", ["grpc UNAVAILABLE", "http 503"], indirect=True)
def test_refusing_collector_was_asked(outage: Outage) -> None:
    assert outage.attempts is not None
    assert outage.attempts >= 1


async def test_exports_resume_once_the_collector_recovers() -> None:
    async with _receiving(HttpReceiver(fail_with=503)) as receiver:
        otlp = _outage_settings(receiver.endpoint, "http/protobuf")
        async with _otlp_stack(_answer, otlp) as stack, aiohttp.ClientSession() as client:
            await _post(client, stack.agent.proxy_url + CHAT, USAGE_CHAT)
            await stack.wait_records(1)
            await _flush(stack.agent)
            receiver.fail_with = None
            await _flush(stack.agent)
            failures = (await _scrape(client, stack.agent))[
                ("semhealth_otlp_export_failures_total", frozenset())
            ]
        values = receiver.values()
    assert _counter(values, "semhealth_records") == 1
    assert failures == 1


# --------------------------------------------------------------------------- the receivers


async def test_http_receiver_decodes_gzip_bodies() -> None:
    async with _receiving(HttpReceiver()) as receiver:
        exporter = OTLPMetricExporter(endpoint=receiver.endpoint, compression=Compression.Gzip)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
        provider = MeterProvider(metric_readers=[reader])
        provider.get_meter("test").create_counter("gzip_probe").add(3, {"k": "v"})
        try:
            await asyncio.to_thread(provider.force_flush, 5_000)
        finally:
            await asyncio.to_thread(provider.shutdown)
        received = receiver.received
    assert received[0].headers["content-encoding"] == "gzip"
    assert received[0].request.resource_metrics
    assert flatten([received[0].request])[("gzip_probe", _attrs(k="v"))] == 3


async def test_http_receiver_refuses_a_body_that_is_not_protobuf() -> None:
    async with _receiving(HttpReceiver()) as receiver, aiohttp.ClientSession() as client:
        async with client.post(receiver.endpoint, json={"resourceMetrics": []}) as response:
            status = response.status
        attempts, kept = receiver.attempts, receiver.requests
    assert status == 415
    assert attempts == 1
    assert kept == []


async def test_receivers_shut_down_safely_without_start_and_twice() -> None:
    for receiver in (GrpcReceiver(), HttpReceiver()):
        await receiver.shutdown()
        await receiver.start()
        await receiver.shutdown()
        await receiver.shutdown()
        assert receiver.requests == []
