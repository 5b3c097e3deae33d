"""What recording one finished stream costs, next to what analysing it costs.

Both run in the agent's analysis worker, off the forwarding path, once per
stream. Side by side in one run: analysing a 50-token OpenAI chat stream from
its bytes (framing, adapter, state) and recording its record into every
instrument (continuity, validity with a cached schema, GenAI metrics).

    python bench/record_cost.py            # ~10 s
"""

from __future__ import annotations

import argparse
import statistics

from _workload import analyse, json_mode_request, json_mode_stream, per_call_us

from semhealth.agent.recorder import RecorderSettings
from semhealth.agent.tap import TapStats
from semhealth.agent.telemetry import Settings, Telemetry
from semhealth.collectors.record import StreamRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    args = parser.parse_args()
    chunks, body = json_mode_stream(), json_mode_request()
    record = analyse(chunks, body)
    assert record.output_text and record.request.structure, "the bench stream must be structured"
    telemetry = Telemetry(Settings(), tap_stats=TapStats(), active_streams=lambda: 0)
    recorder = telemetry.recorder
    bare = Telemetry(
        Settings(recorder=RecorderSettings()), tap_stats=TapStats(), active_streams=lambda: 0
    ).recorder
    unstructured = StreamRecord(**{**_fields(record), "request": record.request.__class__()})
    results = {
        "analyse the stream's bytes": per_call_us(lambda: analyse(chunks, body), args.seconds),
        "record it (validity + all metrics)": per_call_us(
            lambda: recorder.consume_record(record), args.seconds
        ),
        "record it, no structured output": per_call_us(
            lambda: bare.consume_record(unstructured), args.seconds
        ),
    }
    base = statistics.median(results["analyse the stream's bytes"])
    print(f"one {len(chunks)}-chunk OpenAI chat stream, JSON mode, {len(chunks) - 1} deltas")
    print(f"{'':<38}{'median µs':>10}{'p90 µs':>9}{'x analyse':>11}")
    for name, samples in results.items():
        ordered = sorted(samples)
        p90 = ordered[int(len(ordered) * 0.9)]
        median = statistics.median(samples)
        print(f"{name:<38}{median:>10.1f}{p90:>9.1f}{median / base:>11.2f}")
    telemetry.shutdown()


def _fields(record: StreamRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


if __name__ == "__main__":
    main()
