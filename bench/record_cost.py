"""What analysing and recording one finished stream costs, per chunk, against the 10 µs target.

Both run in the agent's analysis worker, off the forwarding path. Side by side in one run,
in CPU time (the thread's, so other processes on a shared machine disturb it less), for a
JSON-mode OpenAI chat stream of 54 and of 64 content deltas (55 and 65 chunks):

- analyse: the stream's bytes to a checked record (framing, adapter, state, request
  extraction, continuity, validity with a cached schema);
- record: the recorder's instrument updates plus the tap's analysis-duration histogram, as
  the agent makes them: held by series and handed to the SDK once a collection
  (``semhealth.agent.telemetry.batching``), with a collection every ``COLLECT_EVERY`` streams;
- the same recording with every measurement its own SDK call, the per-chunk intervals one
  ``StreamIntervals`` batch (the path before measurements were held);
- and with the per-chunk histogram fed one ``record()`` per chunk interval (the SDK's plain
  explicit-bucket aggregation): the path before that;
- the per-chunk histogram alone, one batch against one call per interval.

    python bench/record_cost.py            # ~25 s
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from _workload import TOKENS, analyse, json_mode_request, json_mode_stream, per_call_us
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry, generate_latest

from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.batching import StreamIntervals
from semhealth.agent.telemetry.recorder import Recorder, RecorderSettings
from semhealth.collectors.continuity import intervals_s

TARGET_US = 10.0  # per chunk, analysis and recording together (issue 9)
PER_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
ANALYSIS = "semhealth_analysis_duration"
COLLECT_EVERY = 200  # streams between two collections (a scrape every 15 s at 13 streams/s)


class _PerValue:
    """The oldest path: every interval of a batch as its own ``record()`` call."""

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        values = amount.values if isinstance(amount, StreamIntervals) else (amount,)
        for value in values:
            self._histogram.record(value, attributes)


class _Direct:
    """The agent's instruments without holding: each measurement its own SDK call."""

    def __init__(self, meter: Meter, *, per_value: bool) -> None:
        self.counters: dict[str, Any] = {}
        self.histograms: dict[str, Any] = {}
        for spec in m.SPECS:
            if spec.kind == "counter":
                self.counters[spec.name] = meter.create_counter(spec.name, unit=spec.unit)
            else:
                histogram = meter.create_histogram(spec.name, unit=spec.unit)
                wrap = per_value and spec.name == PER_CHUNK
                self.histograms[spec.name] = _PerValue(histogram) if wrap else histogram


def _recorder(mode: str) -> tuple[Recorder, Any, Callable[[], object]]:
    """A recorder on the agent's pipeline (views, a Prometheus reader), the
    analysis-duration histogram the tap records into once per stream, and a collection."""
    views = m.views()
    if mode == "per value":
        spec = next(spec for spec in m.SPECS if spec.name == PER_CHUNK)
        plain = View(
            instrument_name=PER_CHUNK,
            attribute_keys=set(spec.attributes),
            aggregation=ExplicitBucketHistogramAggregation(spec.buckets),
        )
        views = [plain if view._instrument_name == PER_CHUNK else view for view in views]
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    provider = MeterProvider(metric_readers=[reader], views=views)
    meter = provider.get_meter("semhealth.agent")
    instruments: Any = (
        m.Instruments(meter) if mode == "held" else _Direct(meter, per_value=mode == "per value")
    )
    recorder = Recorder(instruments, RecorderSettings())
    return recorder, instruments.histograms[ANALYSIS], lambda: generate_latest(registry)


def _stream(tokens: int, seconds: float) -> tuple[int, dict[str, float]]:
    chunks, body = json_mode_stream(tokens), json_mode_request()
    record = analyse(chunks, body)
    assert record.validity and record.continuity, "the bench stream must be checked"
    recorders = {mode: _recorder(mode) for mode in ("held", "direct", "per value")}
    gaps = intervals_s(record.delta_ns)
    attrs = {m.OPERATION: "chat", m.GEN_AI_PROVIDER: "openai", m.REQUEST_MODEL: "gpt-4o-mini",
             m.RESPONSE_MODEL: "gpt-4o-mini", m.ROUTE: "chat_completions",
             m.PROMPT_CLASS: "short"}  # fmt: skip
    batched_histogram = recorders["direct"][0]._h[PER_CHUNK]
    plain_histogram = recorders["per value"][0]._h[PER_CHUNK]

    def record_it(mode: str) -> Callable[[], None]:
        recorder, duration, collect = recorders[mode]
        streams = 0

        def run() -> None:
            nonlocal streams
            recorder.consume_record(record)
            duration.record(0.0005)
            streams += 1
            if streams % COLLECT_EVERY == 0:
                collect()

        return run

    def cpu(fn: Callable[[], object]) -> float:
        return statistics.median(per_call_us(fn, seconds, batch=20, clock=time.thread_time_ns))

    figures = {
        "analyse": cpu(lambda: analyse(chunks, body)),
        "record": cpu(record_it("held")),
        "record, direct": cpu(record_it("direct")),
        "record, per value": cpu(record_it("per value")),
        "histogram, batch": cpu(lambda: batched_histogram.record(StreamIntervals(gaps), attrs)),
        "histogram, per value": cpu(lambda: plain_histogram.record(StreamIntervals(gaps), attrs)),
    }
    return len(chunks), figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    args = parser.parse_args()
    results = [_stream(tokens, args.seconds) for tokens in (TOKENS, 64)]
    print("JSON-mode OpenAI chat stream; µs of CPU (thread time), medians; target 10 µs a chunk")
    header = "".join(f"{f'{n} chunks':>22}" for n, _ in results)
    print(f"{'':<48}{header}")
    print(f"{'':<48}" + f"{'stream':>11}{'a chunk':>11}" * len(results))
    rows = [
        ("analyse: bytes -> checked record", lambda f: f["analyse"]),
        ("record: held, one SDK call a series", lambda f: f["record"]),
        ("analyse + record", lambda f: f["analyse"] + f["record"]),
        ("record: one SDK call a measurement (before)", lambda f: f["record, direct"]),
        ("record: and one a chunk interval (before that)", lambda f: f["record, per value"]),
        ("per-chunk histogram: one batch", lambda f: f["histogram, batch"]),
        ("per-chunk histogram: one record() each", lambda f: f["histogram, per value"]),
    ]
    for name, value in rows:
        cells = "".join(f"{value(f):>11.1f}{value(f) / n:>11.2f}" for n, f in results)
        print(f"{name:<48}{cells}")
    for n, f in results:
        total = (f["analyse"] + f["record"]) / n
        verdict = "meets" if total <= TARGET_US else "misses"
        print(
            f"{n} chunks: {total:.2f} µs a chunk ({verdict} {TARGET_US:.0f} µs); recording "
            f"{f['record, direct'] / f['record']:.1f}x cheaper held than one SDK call a "
            f"measurement; per-chunk histogram "
            f"{f['histogram, per value'] / f['histogram, batch']:.0f}x cheaper batched"
        )


if __name__ == "__main__":
    main()
