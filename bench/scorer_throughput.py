"""Scorer throughput: one-at-a-time ``encode`` against the micro-batcher, side by side.

For short texts (a query) and long ones (a context chunk), in one run:

- **one-at-a-time encode**: ``model.encode([text])`` per text, a scorer without batching;
- **batcher xK**: K concurrent streams, each sending its texts one at a time through one
  ``MicroBatcher`` over one ``LocalBackend``, as the sidecar does (K = 1, 50, 200);
- **one large encode**: ``model.encode(all_texts, batch_size=max_batch)`` over the same texts,
  sentence-transformers sorting them by length itself: the ceiling batching can approach.

Every model call runs on one dedicated thread, as in the sidecar. The cache is off (every
text is distinct anyway). Rounds alternate the order of the modes and the median round is
reported, so a busy machine slows every mode alike; the ratios are the figures to compare.

    python bench/scorer_throughput.py                 # ~2 min on 2 quiet CPU cores
    python bench/scorer_throughput.py --quick         # ~30 s
    python bench/scorer_throughput.py --device cuda   # fp16 on the GPU, 4x the texts
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read at import; the model ships in a package

from sentence_transformers import SentenceTransformer

from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.cache import Cache
from semhealth.embeddings.config import DEFAULT_MODEL, Batching
from semhealth.embeddings.local import LocalBackend, resolve_model

WORDS = tuple(
    " ".join(
        (
            "account access billing invoice payment refund card charge plan upgrade password",
            "reset login email link token server request response stream model latency",
            "error timeout retry queue batch worker thread memory disk network cluster node",
            "river forest mountain valley weather rain summer winter city street market",
            "price report table chart figure data sample value average median budget tax",
            "customer support ticket agent answer question context document chapter page",
            "contract clause term notice period renewal cancel subscription delivery order",
        )
    ).split()
)


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    words: tuple[int, int]  # words per text, low and high
    texts: int  # texts per round of the concurrent modes and the large encode
    sequential: int  # texts per round of the one-at-a-time modes, slower, so fewer


@dataclass(slots=True)
class Mode:
    label: str
    texts: int
    run: Callable[[Mode], Awaitable[float]]  # seconds for one round
    seconds: list[float] = field(default_factory=list)
    mean_batches: list[float] = field(default_factory=list)


def make_texts(kind: Kind, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(*kind.words))]
        out.append(f"{index}: " + " ".join(words).capitalize() + ".")
    return out


async def off_loop(executor: ThreadPoolExecutor, work: Callable[[], object]) -> float:
    """Seconds ``work`` takes on the model thread."""
    start = time.perf_counter()
    await asyncio.get_running_loop().run_in_executor(executor, work)
    return time.perf_counter() - start


async def through_batcher(
    backend: LocalBackend, config: Batching, texts: list[str], streams: int, mode: Mode
) -> float:
    """Seconds for ``streams`` callers to embed ``texts``, each one text at a time."""
    batcher = MicroBatcher(backend, config, cache=Cache(0))
    await batcher.start()

    async def stream(share: list[str]) -> None:
        for text in share:
            await batcher.embed([text])

    start = time.perf_counter()
    await asyncio.gather(*(stream(texts[index::streams]) for index in range(streams)))
    elapsed = time.perf_counter() - start
    stats = batcher.stats()
    await batcher.shutdown()
    mode.mean_batches.append(stats.embedded / max(1, stats.batches))
    return elapsed


def make_modes(
    kind: Kind,
    backend: LocalBackend,
    model: SentenceTransformer,
    executor: ThreadPoolExecutor,
    config: Batching,
    streams: list[int],
) -> list[Mode]:
    texts = make_texts(kind, kind.texts, seed=7)
    sequential = texts[: kind.sequential]

    def one_at_a_time() -> None:
        for text in sequential:
            model.encode([text], show_progress_bar=False)

    def large() -> None:
        model.encode(texts, batch_size=config.max_batch, show_progress_bar=False)

    def batched(chosen: list[str], count: int) -> Callable[[Mode], Awaitable[float]]:
        return lambda mode: through_batcher(backend, config, chosen, count, mode)

    modes = [
        Mode("one-at-a-time encode", len(sequential), lambda _: off_loop(executor, one_at_a_time))
    ]
    for count in streams:
        chosen = sequential if count == 1 else texts
        modes.append(Mode(f"batcher x{count}", len(chosen), batched(chosen, count)))
    modes.append(Mode("one large encode", len(texts), lambda _: off_loop(executor, large)))
    return modes


async def bench_kind(modes: list[Mode], rounds: int) -> None:
    for index in range(rounds):
        for mode in modes if index % 2 == 0 else modes[::-1]:
            mode.seconds.append(await mode.run(mode))


def print_table(kind: Kind, modes: list[Mode]) -> None:
    rates = [mode.texts / statistics.median(mode.seconds) for mode in modes]
    single, ceiling = rates[0], rates[-1]
    low, high = kind.words
    print(f"\n{kind.name} texts, {low}-{high} words: {kind.texts} texts per round")
    print(f"{'mode':<22}{'texts/s':>9}{'vs one-at-a-time':>18}{'vs large encode':>17}{'batch':>7}")
    for mode, rate in zip(modes, rates, strict=True):
        batch = f"{statistics.median(mode.mean_batches):.1f}" if mode.mean_batches else ""
        print(
            f"{mode.label:<22}{rate:>9.1f}{rate / single:>17.2f}x{rate / ceiling:>17.0%}{batch:>7}"
        )


async def main(args: argparse.Namespace) -> None:
    backend = await asyncio.to_thread(
        LocalBackend, args.model, device=args.device, threads=args.threads
    )
    # The baselines' own copy of the model, on the same device, precision and thread count.
    model = SentenceTransformer(resolve_model(args.model), device=backend.device)
    if backend.fp16:
        model.half()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-encode")
    gpu = backend.device == "cuda"
    config = Batching(
        queue_size=max(4096, max(args.streams)),
        max_batch=args.max_batch or (256 if gpu else 64),
        max_batch_tokens=args.max_batch_tokens or (32768 if gpu else 4096),
        flush_timeout_s=args.flush_ms / 1000,
    )
    precision = " fp16" if backend.fp16 else ""
    print(
        f"{args.model} on {backend.device}{precision}, {backend.threads} torch threads, "
        f"{os.cpu_count()} CPUs; max_batch {config.max_batch}, max_batch_tokens "
        f"{config.max_batch_tokens}, flush {args.flush_ms:g} ms; median of {args.rounds} rounds; "
        f"one-at-a-time and x1 over the first quarter of the texts"
    )
    scale = 4 if gpu else 1
    kinds = [
        Kind("short", (6, 14), args.short * scale, max(50, args.short * scale // 4)),
        Kind("long", (110, 170), args.long * scale, max(20, args.long * scale // 4)),
    ]
    try:
        for kind in kinds:
            modes = make_modes(kind, backend, model, executor, config, args.streams)
            warm = make_texts(kind, 64, seed=1)
            await backend.embed(warm)  # allocate, pick kernels, fill the tokenizer's caches
            await bench_kind(modes, args.rounds)
            print_table(kind, modes)
    finally:
        executor.shutdown(wait=True)
        await backend.aclose()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Scorer throughput, batched and not.")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 50, 200])
    parser.add_argument("--short", type=int, default=600, help="short texts per round")
    parser.add_argument("--long", type=int, default=96, help="long texts per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-batch", type=int, help="default: 64 on a CPU, 256 on CUDA")
    parser.add_argument("--max-batch-tokens", type=int, help="default: 4096 CPU, 32768 CUDA")
    parser.add_argument("--flush-ms", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="fewer texts, one round")
    args = parser.parse_args()
    if args.quick:
        args.short, args.long, args.rounds = 240, 60, 1
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
