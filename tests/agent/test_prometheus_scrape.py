"""A real Prometheus scrapes the sidecar: PromQL over our metrics, ``/metrics`` read back, and
``promtool check metrics`` on our output.

Scripted traffic with known timings goes through the proxy once per module, in two waves. The
first (one stream of each kind) creates every series before the scrape that ``rate`` starts
from: ``rate`` needs two samples of a series, and a series only exists once observed. The
second wave is what ``rate`` measures. Every stream of a kind has the same script, so the
quantiles do not depend on which wave a sample came from.

Kinds (the request's model names the kind, so queries select it by label):

    steady   7 text deltas, equal 20 ms gaps         continuity index 0 (+ timer jitter)
    choppy   7 text deltas, gaps 10/90/10/90/10/90   continuity index 40 ms exactly
    valid    JSON mode, '{"a": ' + '1}'              result="valid"
    broken   JSON mode, '{"a": ' + '1', finish stop  result="syntax"

(valid and broken share the model ``json``, so the validity rate is one series.) Every
stream's first delta is scripted 150 ms after the response head.

Tolerances. A histogram only knows which bucket a sample fell in, and ``histogram_quantile``
interpolates linearly inside the bucket that holds the quantile, so the checks are at bucket
resolution (boundaries in ``agent/buckets.py``), on medians:

- TTFT: 150 ms plus proxying lies in (0.1, 0.25]; the median must be in that bucket (PromQL
  reads 0.175, its middle, when every sample is there). No sample may be below 0.1: the proxy
  cannot see a token before the upstream sends it.
- continuity, choppy: 40 ms is the boundary of (0.03, 0.04] and (0.04, 0.05]; timer jitter
  puts samples on either side, so the median must read 0.03 .. 0.05.
- continuity, steady: only timer jitter; the median must be below 5 ms (a quarter of the gap).
- counts and the validity rate are exact.

Timings come from a real event loop on a machine that may be busy, and a CPU stall delays
every stream in flight at that moment. Medians over nine streams per kind, with at most three
streams in flight, tolerate a few stalls; the margins above (100 ms on TTFT) absorb the rest.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.analysis.tap import TapStats, observe_tap
from semhealth.agent.demo.simulator import Script, ScriptRequest
from semhealth.agent.telemetry import instruments as metrics
from semhealth.agent.telemetry.pipeline import Settings as TelemetrySettings
from semhealth.agent.telemetry.pipeline import Telemetry
from tests.agent.conftest import Stack, ThreadedStack
from tests.agent.prometheus_server import PrometheusServer, require_binary, scalar
from tests.servers import find_binary, required

TTFT_S = 0.15
STEADY_GAPS_S = (0.02,) * 6
CHOPPY_GAPS_S = (0.01, 0.09) * 3
TEXT = ("Each ", "piece ", "is ", "one ", "content ", "delta", ".")
VALID_JSON = ('{"a": ', "1}")
BROKEN_JSON = ('{"a": ', "1")

# Requests per kind: (first wave, second wave).
WAVES = {"steady": (1, 8), "choppy": (1, 8), "valid": (1, 5), "broken": (1, 3)}
TOTAL = {kind: sum(counts) for kind, counts in WAVES.items()}
EXPECTED_VALIDITY = TOTAL["valid"] / (TOTAL["valid"] + TOTAL["broken"])

TTFT_BUCKET = (0.1, 0.25)
CHOPPY_RANGE = (0.03, 0.05)
STEADY_MAX_S = 0.005

IN_FLIGHT = 3

RATE = "[30s]"  # holds every sample of this module at 1 s scrapes
TTFT_MEDIAN = (
    "histogram_quantile(0.5, sum by (le) "
    f"(rate(gen_ai_server_time_to_first_token_seconds_bucket{RATE})))"
)


def continuity_median(model: str) -> str:
    return (
        "histogram_quantile(0.5, sum by (le) (rate("
        f'semantic_health_stream_continuity_index_seconds_bucket{{model="{model}"}}{RATE})))'
    )


# --------------------------------------------------------------------------- traffic


def script_for(request: ScriptRequest) -> Script:
    body = request.json if isinstance(request.json, dict) else {}
    model = body.get("model")
    if model == "steady":
        return Script(pieces=TEXT, ttft_s=TTFT_S, gaps_s=STEADY_GAPS_S)
    if model == "choppy":
        return Script(pieces=TEXT, ttft_s=TTFT_S, gaps_s=CHOPPY_GAPS_S)
    valid = body["messages"][0]["content"] == "valid"
    return Script(pieces=VALID_JSON if valid else BROKEN_JSON, ttft_s=TTFT_S, gaps_s=0.02)


def request_body(kind: str) -> dict[str, Any]:
    model = kind if kind in ("steady", "choppy") else "json"
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": kind}],
    }
    if model == "json":
        body["response_format"] = {"type": "json_object"}
    return body


def wave_order(wave: int) -> list[str]:
    """The kinds of one wave's requests, round-robin, so streams in flight together differ."""
    queues = [[kind] * counts[wave] for kind, counts in WAVES.items()]
    rounds = itertools.zip_longest(*queues)
    return [kind for row in rounds for kind in row if kind is not None]


async def send_wave(proxy_url: str, wave: int) -> None:
    """Every request of one wave, a few at a time; each stream is read to its end."""
    url = f"{proxy_url}/v1/chat/completions"
    # Few streams in flight: a stall of the (shared, possibly busy) CPU then disturbs a few
    # samples, which the medians below ignore, instead of every stream at once.
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(session: aiohttp.ClientSession, kind: str) -> None:
        async with slots, session.post(url, json=request_body(kind)) as response:
            assert response.status == 200
            await response.read()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, kind) for kind in wave_order(wave)))


def wait_records(stack: Stack, n: int, timeout_s: float = 10.0) -> None:
    """Analysis is asynchronous; the record consumer runs after the recorder."""
    deadline = time.monotonic() + timeout_s
    while len(stack.records) < n:
        assert time.monotonic() < deadline, f"expected {n} records, got {len(stack.records)}"
        time.sleep(0.01)


def fetch_metrics(stack: Stack) -> str:
    with urllib.request.urlopen(f"{stack.agent.admin_url}/metrics", timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


@dataclass(frozen=True)
class Scraped:
    """The sidecar after both waves: its ``/metrics`` text, and Prometheus if one runs."""

    metrics: str
    prometheus: PrometheusServer | None


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    # Without the binary, the /metrics checks still run and the PromQL checks skip (or fail,
    # where REQUIRE_REAL_SERVERS=1: then PrometheusServer fails here).
    want_prometheus = find_binary("prometheus") is not None or required()
    with ThreadedStack(script_for) as stack, ExitStack() as cleanup:
        prometheus = None
        if want_prometheus:
            address = stack.agent.admin_address
            assert address is not None
            workdir = tmp_path_factory.mktemp("prometheus")
            prometheus = cleanup.enter_context(
                PrometheusServer(f"{address[0]}:{address[1]}", workdir)
            )
        sent = 0
        for wave in (0, 1):
            asyncio.run(send_wave(stack.agent.proxy_url, wave))
            sent += sum(counts[wave] for counts in WAVES.values())
            wait_records(stack, sent)
            if prometheus is not None:
                prometheus.wait_for_scrape(after=time.time())
        yield Scraped(fetch_metrics(stack), prometheus)


@pytest.fixture(scope="module")
def prometheus(scraped: Scraped) -> PrometheusServer:
    if scraped.prometheus is None:
        require_binary("prometheus")  # skips with the reason
    assert scraped.prometheus is not None
    return scraped.prometheus


# --------------------------------------------------------------------------- /metrics text

Labels = dict[str, str]


def samples(text: str, name: str, **match: str) -> list[tuple[Labels, float]]:
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in match.items())
    ]


def total(text: str, name: str, **match: str) -> float:
    return sum(value for _, value in samples(text, name, **match))


def buckets(text: str, name: str, **match: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) of one histogram, summed over the series ``match`` selects."""
    counts: dict[float, float] = {}
    for labels, value in samples(text, f"{name}_bucket", **match):
        le = float(labels["le"])
        counts[le] = counts.get(le, 0.0) + value
    return sorted(counts.items())


def median_bucket(text: str, name: str, **match: str) -> tuple[float, float]:
    """The bucket ``(lower, upper]`` that holds the median: where histogram_quantile(0.5)
    interpolates."""
    cumulative = buckets(text, name, **match)
    half = cumulative[-1][1] / 2
    lower = 0.0
    for le, count in cumulative:
        if count >= half:
            return lower, le
        lower = le
    raise AssertionError(f"{name} has no buckets")  # +Inf holds everything


def count_at_or_below(text: str, name: str, le: float, **match: str) -> float:
    return next(count for bound, count in buckets(text, name, **match) if math.isclose(bound, le))


TTFT = "gen_ai_server_time_to_first_token_seconds"
CONTINUITY = "semantic_health_stream_continuity_index_seconds"


def test_metrics_count_every_request(scraped: Scraped) -> None:
    assert total(scraped.metrics, "semantic_health_requests_total") == sum(TOTAL.values())


def test_metrics_count_valid_outputs(scraped: Scraped) -> None:
    assert total(scraped.metrics, "semantic_health_outputs_total", result="valid") == TOTAL["valid"]


def test_metrics_count_unclosed_json_as_syntax_failures(scraped: Scraped) -> None:
    outputs = total(scraped.metrics, "semantic_health_outputs_total", result="syntax")
    assert outputs == TOTAL["broken"]


def test_metrics_validity_rate_is_valid_over_checked(scraped: Scraped) -> None:
    rates = samples(scraped.metrics, "semantic_health_model_output_validity_rate")
    assert [labels["model"] for labels, _ in rates] == ["json"]
    assert rates[0][1] == pytest.approx(EXPECTED_VALIDITY)


def test_metrics_observe_ttft_of_every_stream(scraped: Scraped) -> None:
    assert total(scraped.metrics, f"{TTFT}_count") == sum(TOTAL.values())


def test_metrics_ttft_is_never_below_the_scripted_delay(scraped: Scraped) -> None:
    assert count_at_or_below(scraped.metrics, TTFT, TTFT_BUCKET[0]) == 0


def test_metrics_median_ttft_is_in_the_bucket_of_the_scripted_delay(scraped: Scraped) -> None:
    assert median_bucket(scraped.metrics, TTFT) == TTFT_BUCKET


def test_metrics_median_continuity_of_alternating_gaps_is_their_std_dev(
    scraped: Scraped,
) -> None:
    lower, upper = median_bucket(scraped.metrics, CONTINUITY, model="choppy")
    assert CHOPPY_RANGE[0] <= lower < upper <= CHOPPY_RANGE[1]


def test_metrics_median_continuity_of_equal_gaps_is_near_zero(scraped: Scraped) -> None:
    assert total(scraped.metrics, f"{CONTINUITY}_count", model="steady") == TOTAL["steady"]
    _, upper = median_bucket(scraped.metrics, CONTINUITY, model="steady")
    assert upper <= STEADY_MAX_S


# --------------------------------------------------------------------------- PromQL


def test_promql_sums_valid_outputs(prometheus: PrometheusServer) -> None:
    result = prometheus.query('sum(semantic_health_outputs_total{result="valid"})')
    assert scalar(result) == TOTAL["valid"]


def test_promql_reads_the_validity_rate(prometheus: PrometheusServer) -> None:
    result = prometheus.query("semantic_health_model_output_validity_rate")
    assert [series["metric"]["model"] for series in result] == ["json"]
    assert scalar(result) == pytest.approx(EXPECTED_VALIDITY)


def test_promql_median_ttft_is_within_its_bucket(prometheus: PrometheusServer) -> None:
    median = scalar(prometheus.query(TTFT_MEDIAN))
    assert TTFT_BUCKET[0] <= median <= TTFT_BUCKET[1]


def test_promql_median_continuity_of_alternating_gaps(prometheus: PrometheusServer) -> None:
    median = scalar(prometheus.query(continuity_median("choppy")))
    assert CHOPPY_RANGE[0] <= median <= CHOPPY_RANGE[1]


def test_promql_median_continuity_of_equal_gaps_is_near_zero(
    prometheus: PrometheusServer,
) -> None:
    median = scalar(prometheus.query(continuity_median("steady")))
    assert 0 <= median < STEADY_MAX_S


def test_promql_request_rate_is_positive(prometheus: PrometheusServer) -> None:
    rate = scalar(prometheus.query(f"sum(rate(semantic_health_requests_total{RATE}))"))
    assert rate > 0


def test_prometheus_sees_the_target_up(prometheus: PrometheusServer) -> None:
    result = prometheus.query('up{job="semhealth"}')
    assert scalar(result) == 1
    assert result[0]["metric"]["instance"].startswith("127.0.0.1:")


# --------------------------------------------------------------------------- promtool


def promtool_check_metrics(text: str) -> tuple[int, bytes, bytes]:
    """Exit status, stdout and stderr of ``promtool check metrics`` fed ``text``."""
    checked = subprocess.run(
        [require_binary("promtool"), "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    return checked.returncode, checked.stdout, checked.stderr


def every_instrument_exposed() -> str:
    """``/metrics`` of a Telemetry where every instrument has a sample: the traffic above
    never moves some of them (relevance scores, stalls, unanalysed requests)."""
    stats = TapStats()
    stats.unanalysed("body_too_large")
    telemetry = Telemetry(TelemetrySettings())
    observe_tap(telemetry.meter, stats, lambda: 0)
    try:
        for spec in metrics.SPECS:
            attributes = {key: "x" for key in spec.attributes}
            if spec.kind == "counter":
                telemetry.instruments.counters[spec.name].add(1, attributes)
            else:
                telemetry.instruments.histograms[spec.name].record(0.5, attributes)
        telemetry.recorder.validity.add(("x", "x", "x", "short", "proxy"), True, time.monotonic())
        return telemetry.render_prometheus().decode()
    finally:
        telemetry.shutdown()


def test_promtool_check_metrics_finds_nothing_in_our_output(scraped: Scraped) -> None:
    assert promtool_check_metrics(scraped.metrics) == (0, b"", b"")


def test_promtool_check_metrics_finds_nothing_in_any_instrument() -> None:
    text = every_instrument_exposed()
    exposed = {family.name for family in text_string_to_metric_families(text)}
    for spec in metrics.SPECS:  # every row of the table is in the text promtool reads
        prefix = spec.name.replace(".", "_")
        assert any(name.startswith(prefix) for name in exposed), spec.name
    assert promtool_check_metrics(text) == (0, b"", b"")
