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
import time
from collections.abc import Callable

import orjson

from semhealth.agent.recorder import RecorderSettings
from semhealth.agent.tap import TapStats
from semhealth.agent.telemetry import Settings, Telemetry
from semhealth.collectors.collector import Exchange, StreamCollector
from semhealth.collectors.config import Config
from semhealth.collectors.record import StreamRecord

TOKENS = 50


def _request() -> bytes:
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {"type": "json_object"},
            "messages": [
                {"role": "system", "content": "You extract invoice fields as JSON. " * 20},
                {"role": "user", "content": "Extract the fields of invoice 4711."},
            ],
        }
    )


def _stream() -> list[bytes]:
    answer = orjson.dumps({"invoice": 4711, "items": [f"item {i}" for i in range(20)]}).decode()
    step = max(len(answer) // TOKENS, 1)
    pieces = [answer[i : i + step] for i in range(0, len(answer), step)]
    chunks = []
    for piece in pieces:
        delta = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        event = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o-mini", **delta}
        chunks.append(b"data: " + orjson.dumps(event) + b"\n\n")
    usage = {"prompt_tokens": 300, "completion_tokens": len(pieces), "total_tokens": 0}
    tail = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    chunks.append(b"data: " + orjson.dumps(tail) + b"\n\ndata: [DONE]\n\n")
    return chunks


def analyse(chunks: list[bytes], body: bytes) -> StreamRecord:
    exchange = Exchange(
        method="POST", path="/v1/chat/completions", start_ns=0, status=200,
        content_type="text/event-stream", content_encoding=None, response_ns=1_000_000,
        request_body=body,
    )  # fmt: skip
    collector = StreamCollector(exchange, Config())
    t = 50_000_000
    for chunk in chunks:
        t += 20_000_000
        collector.feed(chunk, t)
    return collector.finish(t + 1_000_000)


def per_call_us(fn: Callable[[], object], seconds: float) -> list[float]:
    """Median-friendly samples: µs per call over batches of 50 calls."""
    samples = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = time.perf_counter_ns()
        for _ in range(50):
            fn()
        samples.append((time.perf_counter_ns() - began) / 50 / 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    args = parser.parse_args()
    chunks, body = _stream(), _request()
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
