"""What analysing and recording one finished stream costs, per chunk, against the 10 µs target.

Both run in the agent's analysis worker, off the forwarding path. Side by side in one run,
in CPU time (the thread's, so other processes on a shared machine disturb it less), for a
JSON-mode OpenAI chat stream of 54 and of 64 content deltas (55 and 65 chunks):

- analyse: the stream's bytes to a checked record (framing, adapter, state, request
  extraction, continuity, validity with a cached schema);
- record: the recorder's instrument updates plus the tap's analysis-duration histogram,
  with the per-chunk GenAI histogram fed one ``StreamIntervals`` per stream;
- the same recording with the per-chunk histogram fed one ``record()`` per chunk interval,
  as before (the SDK's plain explicit-bucket aggregation): the old per-value path;
- that histogram alone, both ways.

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
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry

from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.recorder import Recorder, RecorderSettings
from semhealth.collectors.continuity import intervals_s

TARGET_US = 10.0  # per chunk, analysis and recording together (issue 9)
PER_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
ANALYSIS = "semhealth_analysis_duration"


class _PerValue:
    """The old path: every interval of a batch as its own ``record()`` call."""

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        values = amount.values if isinstance(amount, m.StreamIntervals) else (amount,)
        for value in values:
            self._histogram.record(value, attributes)


def _recorder(per_value: bool) -> tuple[Recorder, Histogram]:
    """A recorder on the agent's pipeline (views, a Prometheus reader), and the
    analysis-duration histogram the tap records into once per stream."""
    views = m.views()
    if per_value:
        spec = next(spec for spec in m.SPECS if spec.name == PER_CHUNK)
        plain = View(
            instrument_name=PER_CHUNK,
            attribute_keys=set(spec.attributes),
            aggregation=ExplicitBucketHistogramAggregation(spec.buckets),
        )
        views = [plain if view._instrument_name == PER_CHUNK else view for view in views]
    reader = PrometheusMetricReader(registry=CollectorRegistry(), scope_info_enabled=False)
    provider = MeterProvider(metric_readers=[reader], views=views)
    instruments = m.Instruments(provider.get_meter("semhealth.agent"))
    if per_value:
        instruments.histograms[PER_CHUNK] = _PerValue(instruments.histograms[PER_CHUNK])  # type: ignore[assignment]
    return Recorder(instruments, RecorderSettings()), instruments.histograms[ANALYSIS]


def _stream(tokens: int, seconds: float) -> tuple[int, dict[str, float]]:
    chunks, body = json_mode_stream(tokens), json_mode_request()
    record = analyse(chunks, body)
    assert record.validity and record.continuity, "the bench stream must be checked"
    recorder, duration = _recorder(per_value=False)
    old, old_duration = _recorder(per_value=True)
    gaps = intervals_s(record.delta_ns)
    attrs = {m.OPERATION: "chat", m.GEN_AI_PROVIDER: "openai", m.REQUEST_MODEL: "gpt-4o-mini",
             m.RESPONSE_MODEL: "gpt-4o-mini", m.ROUTE: "chat_completions",
             m.PROMPT_CLASS: "short"}  # fmt: skip
    batched_histogram = recorder._h[PER_CHUNK]
    plain_histogram = old._h[PER_CHUNK]

    def record_it(recorder: Recorder, duration: Histogram) -> Callable[[], None]:
        def run() -> None:
            recorder.consume_record(record)
            duration.record(0.0005)

        return run

    def cpu(fn: Callable[[], object]) -> float:
        return statistics.median(per_call_us(fn, seconds, batch=20, clock=time.thread_time_ns))

    figures = {
        "analyse": cpu(lambda: analyse(chunks, body)),
        "record": cpu(record_it(recorder, duration)),
        "record, old": cpu(record_it(old, old_duration)),
        "histogram, batch": cpu(lambda: batched_histogram.record(m.StreamIntervals(gaps), attrs)),
        "histogram, per value": cpu(lambda: plain_histogram.record(m.StreamIntervals(gaps), attrs)),
    }
    return len(chunks), figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    args = parser.parse_args()
    results = [_stream(tokens, args.seconds) for tokens in (TOKENS, 64)]
    print("JSON-mode OpenAI chat stream; µs of CPU (thread time), medians; target 10 µs a chunk")
    header = "".join(f"{f'{n} chunks':>22}" for n, _ in results)
    print(f"{'':<44}{header}")
    print(f"{'':<44}" + f"{'stream':>11}{'a chunk':>11}" * len(results))
    rows = [
        ("analyse: bytes -> checked record", lambda f: f["analyse"]),
        ("record: every instrument, one batch", lambda f: f["record"]),
        ("analyse + record", lambda f: f["analyse"] + f["record"]),
        ("record, one record() per interval (before)", lambda f: f["record, old"]),
        ("analyse + record, one per interval (before)", lambda f: f["analyse"] + f["record, old"]),
        ("per-chunk histogram: one batch", lambda f: f["histogram, batch"]),
        ("per-chunk histogram: one record() each", lambda f: f["histogram, per value"]),
    ]
    for name, value in rows:
        cells = "".join(f"{value(f):>11.1f}{value(f) / n:>11.2f}" for n, f in results)
        print(f"{name:<44}{cells}")
    for n, f in results:
        total = (f["analyse"] + f["record"]) / n
        before = (f["analyse"] + f["record, old"]) / n
        verdict = "meets" if total <= TARGET_US else "misses"
        print(
            f"{n} chunks: {total:.2f} µs a chunk ({verdict} {TARGET_US:.0f} µs), "
            f"{before / total:.2f}x less than per interval; per-chunk histogram "
            f"{f['histogram, per value'] / f['histogram, batch']:.0f}x cheaper batched"
        )


if __name__ == "__main__":
    main()
