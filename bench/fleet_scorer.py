"""A fleet on one scorer: 50 simulated sidecars scoring through one ``semhealth scorer``.

In one run, on this machine:

- **one large encode**: ``model.encode(texts)`` over every text at once, in this process:
  the ceiling that batching across callers can approach;
- **fleet, steady**: N sidecars (default 50), each built as a sidecar builds its remote
  scorer (``open_scorer`` with ``backend: scorer``: its own micro-batcher over its own gRPC
  channel), each scoring records (a query and two context chunks) at a fixed rate;
- **fleet, overload**: the same sidecars scoring as fast as they can, so the scorer's
  queue fills and answers RESOURCE_EXHAUSTED, which a sidecar sheds and counts.

Reported: texts per second through the scorer against the large encode (the ratio),
per-record latency, records shed, the scorer's CPU per 1,000 texts (Linux schedstat), and
its resident memory after each phase (and 3 s after it, idle).
The scorer is a subprocess (``semhealth scorer``), as in production; the simulated sidecars
share this process and the same cores, so the figures are a floor for the scorer.

    python bench/fleet_scorer.py            # about 2 minutes on 2 cores
    python bench/fleet_scorer.py --quick    # about 40 s

``--overload``: the scorer's admission under overload instead. Its capacity first (callers
always waiting on one call, deadlines far away), then ``--sidecars`` callers each sending
5-text calls with ``--deadline-s`` deadlines, open loop (whatever comes back), at 1x and 2x
that capacity for ``--seconds`` each. Reported per phase: goodput (texts answered in the
window) against capacity, and how calls ended: OK, RESOURCE_EXHAUSTED (shed by the
scorer), DEADLINE_EXCEEDED, other; then the scorer's own counters (/metrics), and its
resident memory at ready and after each of the five waves (warm-up, capacity, 1x, 2x,
capacity again), each read at the wave's end and again after 3 s idle.
The callers are the sidecars' remote backends (what each sidecar's batcher calls).

    python bench/fleet_scorer.py --overload --sidecars 50 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in a package

sys.path.insert(0, str(Path(__file__).parent))
from scorer_throughput import Kind, make_texts

from semhealth.embeddings import EmbeddingError, Overloaded, Scorer, open_scorer
from semhealth.embeddings.config import Config, Encoder, Remote
from semhealth.embeddings.remote_scorer import RemoteScorerBackend

IDLE_S = 3.0  # after a phase, before the idle RSS: the scorer trims its heap 1 s after a call
RECORD_KIND = Kind("record", words=(8, 40), texts=0, sequential=0)
SCORER_CONFIG = """\
relevance:
  route_cjk_to: null
  encoders:
    - name: default
      local: {model: all-MiniLM-L6-v2, device: cpu, threads: 2}
"""


@dataclass(slots=True)
class Phase:
    name: str
    records: int = 0
    shed: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)
    seconds: float = 0.0
    scorer_cpu_ns: int = 0
    rss: tuple[float, float] = (float("nan"), float("nan"))  # MiB at its end, and 3 s after

    @property
    def texts(self) -> int:
        return self.records * 3  # a query and two context chunks


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_cpu_ns(pid: int) -> int:
    """CPU time of a process (all its threads), from /proc/PID/task/*/schedstat."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
    return total


def start_scorer(
    port: int, config_path: str, metrics_port: int | None = None
) -> subprocess.Popen[bytes]:
    metrics = f"127.0.0.1:{metrics_port}" if metrics_port else "off"
    command = [sys.executable, "-m", "semhealth.agent.cli", "scorer", "--config", config_path,
               "--listen", f"127.0.0.1:{port}", "--metrics-listen", metrics]  # fmt: skip
    return subprocess.Popen(command, stderr=subprocess.DEVNULL)


async def wait_scoring(port: int) -> None:
    """Until the scorer answers a real score: connecting succeeds before the model loads."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            async with open_scorer(sidecar_config(port)) as scorer:
                await scorer.score("warm-up query", ["warm-up context"], None)
                return
        except EmbeddingError:
            await asyncio.sleep(0.5)
    raise SystemExit("semhealth scorer did not start scoring")


def sidecar_config(port: int) -> Config:
    """A sidecar's relevance configuration that scores through the shared scorer."""
    encoder = Encoder(name="default", backend="scorer", remote=Remote(url=f"127.0.0.1:{port}"))
    return Config(encoders=(encoder,), encoder="default", route_cjk_to=None)


async def run_phase(
    phase: Phase,
    port: int,
    sidecars: int,
    records: list[str],
    rate: float | None,
    pid: int,
    in_flight: int = 1,
) -> None:
    """Each sidecar scores its share of ``records``: at ``rate`` records/s, one at a time; or,
    with ``rate`` None, flat out with ``in_flight`` records at once (a sidecar relaying many
    streams scores many records together)."""
    config = sidecar_config(port)
    cpu_before = process_cpu_ns(pid)
    start = time.perf_counter()

    async def score_one(scorer: Scorer, text: str) -> None:
        context = [f"{text} (first chunk)", f"{text} (second chunk)"]
        t0 = time.perf_counter()
        try:
            await scorer.score(text, context, None)
        except Overloaded:
            phase.shed += 1
            return
        except EmbeddingError:
            phase.errors += 1
            return
        phase.latencies_s.append(time.perf_counter() - t0)
        phase.records += 1

    async def paced(scorer: Scorer, share: list[str], rate: float) -> None:
        began = time.perf_counter()
        for number, text in enumerate(share):
            await asyncio.sleep(max(0.0, began + number / rate - time.perf_counter()))
            await score_one(scorer, text)

    async def lane(scorer: Scorer, share: list[str]) -> None:
        for text in share:
            await score_one(scorer, text)

    async def sidecar(index: int) -> None:
        share = records[index::sidecars]
        async with open_scorer(config) as scorer:
            if rate is not None:
                await paced(scorer, share, rate)
            else:
                await asyncio.gather(*(lane(scorer, share[k::in_flight]) for k in range(in_flight)))

    await asyncio.gather(*(sidecar(index) for index in range(sidecars)))
    phase.seconds = time.perf_counter() - start
    phase.scorer_cpu_ns = process_cpu_ns(pid) - cpu_before
    phase.rss = await rss_after(pid)


async def rss_after(pid: int) -> tuple[float, float]:
    """The scorer's RSS in MiB now, and after it has idled for ``IDLE_S``: the heap its
    model's calls freed is given back once they stop, so the second is its floor."""
    now = rss_mib(pid)
    await asyncio.sleep(IDLE_S)
    return now, rss_mib(pid)


def large_encode_rate(texts: list[str]) -> float:
    """Texts per second of one ``encode`` over every text, with the scorer's 2 threads: the
    ceiling batching across callers can approach. Run while the scorer is idle."""
    import torch
    from sentence_transformers import SentenceTransformer

    from semhealth.embeddings.local import resolve_model

    torch.set_num_threads(2)
    model = SentenceTransformer(resolve_model("all-MiniLM-L6-v2"), device="cpu")
    model.encode(texts[:64], show_progress_bar=False)  # warm-up
    start = time.perf_counter()
    model.encode(texts, batch_size=64, show_progress_bar=False)
    return len(texts) / (time.perf_counter() - start)


def report(
    phases: list[Phase],
    ceiling: float,
    sidecars: int,
    rate: float,
    in_flight: int,
    rss_ready: float,
) -> None:
    print(f"one large encode (this process, 2 threads): {ceiling:,.0f} texts/s")
    print()
    print(
        f"| phase ({sidecars} sidecars) | records scored | shed | errors | texts/s "
        "| x one large encode | latency p50 / p99 ms | scorer CPU ms per 1,000 texts "
        "| scorer RSS MiB at the end / idle |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for phase in phases:
        rate_s = phase.texts / phase.seconds if phase.seconds else 0.0
        lat = sorted(phase.latencies_s)
        p50 = statistics.median(lat) * 1e3 if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3 if lat else float("nan")
        cpu = phase.scorer_cpu_ns / 1e6 / max(phase.texts, 1) * 1000
        print(
            f"| {phase.name} | {phase.records:,} | {phase.shed:,} | {phase.errors} | "
            f"{rate_s:,.0f} | {rate_s / ceiling:.2f} | {p50:.1f} / {p99:.1f} | {cpu:,.0f} | "
            f"{phase.rss[0]:,.0f} / {phase.rss[1]:,.0f} |"
        )
    print()
    print(f"scorer RSS at ready: {rss_ready:,.0f} MiB")
    print(
        f"steady: each sidecar {rate:g} records/s (3 texts each), one at a time; overload: as "
        f"fast as it can, {in_flight} records at once per sidecar"
    )


async def main(args: argparse.Namespace) -> None:
    records_total = 600 if args.quick else 2000
    # Each phase its own texts: the scorer caches vectors, and a repeat would measure the cache.
    records = make_texts(RECORD_KIND, records_total, seed=11)
    flood = make_texts(RECORD_KIND, records_total, seed=12)
    warm = make_texts(RECORD_KIND, 100, seed=13)
    texts = [
        t for text in records for t in (text, f"{text} (first chunk)", f"{text} (second chunk)")
    ]
    before = large_encode_rate(texts)
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(SCORER_CONFIG)
    scorer = start_scorer(port, handle.name)
    try:
        await wait_scoring(port)
        rss_ready = rss_mib(scorer.pid)
        warming = Phase("warm-up")
        await run_phase(warming, port, args.sidecars, warm, None, scorer.pid)
        steady = Phase("steady")
        await run_phase(steady, port, args.sidecars, records, args.rate, scorer.pid)
        overload = Phase("overload")
        await run_phase(overload, port, args.sidecars, flood, None, scorer.pid, args.in_flight)
    finally:
        scorer.terminate()
        scorer.wait(30)
        os.unlink(handle.name)
    # A busy machine slows one encode too: the faster of two, before and after the fleet.
    ceiling = max(before, large_encode_rate(texts))
    report(
        [warming, steady, overload], ceiling, args.sidecars, args.rate, args.in_flight, rss_ready
    )


# -- --overload: admission under 1x and 2x the scorer's capacity -------------------------------

CALL_TEXTS = 5


@dataclass(slots=True)
class Ends:
    """How one overload phase's calls ended."""

    ok_texts: int = 0  # texts answered inside the window
    codes: dict[str, int] = field(default_factory=dict)

    def add(self, code: str) -> None:
        self.codes[code] = self.codes.get(code, 0) + 1


def code_of(exc: EmbeddingError) -> str:
    """The gRPC status a sidecar's remote backend heard, whichever version raised it."""
    reason = getattr(exc, "reason", None)
    if reason == "deadline" or "DEADLINE_EXCEEDED" in str(exc):
        return "DEADLINE_EXCEEDED"
    if isinstance(exc, Overloaded) or "RESOURCE_EXHAUSTED" in str(exc):
        return "RESOURCE_EXHAUSTED"
    return "other"


async def overload_call(
    client: RemoteScorerBackend, texts: list[str], ends: Ends, end: float
) -> None:
    try:
        await client.embed(texts)
    except EmbeddingError as exc:
        ends.add(code_of(exc))
        return
    ends.add("OK")
    if time.monotonic() <= end:
        ends.ok_texts += len(texts)


def call_texts(texts: list[str], number: int) -> list[str]:
    return [
        f"{number}.{k} {texts[(number * CALL_TEXTS + k) % len(texts)]}" for k in range(CALL_TEXTS)
    ]


async def capacity(port: int, texts: list[str], callers: int, seconds: float) -> float:
    """Texts/s with ``callers`` always waiting on one call and deadlines far away."""
    ends = Ends()
    counter = iter(range(10**9))
    made = [RemoteScorerBackend(f"127.0.0.1:{port}", "default", 120.0) for _ in range(callers)]
    start = time.monotonic()
    end = start + seconds

    async def lane(client: RemoteScorerBackend) -> None:
        while time.monotonic() < end:
            await overload_call(client, call_texts(texts, next(counter) + 10**6), ends, end)

    await asyncio.gather(*(lane(client) for client in made))
    for client in made:
        await client.aclose()
    return ends.ok_texts / seconds


async def offered(
    port: int, texts: list[str], callers: int, texts_per_s: float, seconds: float, deadline_s: float
) -> Ends:
    """``callers`` send 5-text calls at ``texts_per_s`` in all, whatever comes back."""
    ends = Ends()
    made = [RemoteScorerBackend(f"127.0.0.1:{port}", "default", deadline_s) for _ in range(callers)]
    interval = callers * CALL_TEXTS / texts_per_s
    start = time.monotonic()
    end = start + seconds
    calls: list[asyncio.Task[None]] = []
    counter = iter(range(10**9))

    async def caller(index: int, client: RemoteScorerBackend) -> None:
        due = start + interval * index / callers
        while due < end:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            text = call_texts(texts, next(counter))
            calls.append(asyncio.create_task(overload_call(client, text, ends, end)))
            due += interval

    await asyncio.gather(*(caller(index, client) for index, client in enumerate(made)))
    await asyncio.gather(*calls)
    for client in made:
        await client.aclose()
    return ends


def scrape(port: int) -> dict[str, float]:
    """The scorer's counters (name{labels} -> value), summed over encoders."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "encoder"
            )
            key = f"{sample.name}{{{labels}}}"
            found[key] = found.get(key, 0.0) + sample.value
    return found


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def overload_main(args: argparse.Namespace) -> None:
    texts = make_texts(RECORD_KIND, 4000, seed=21)
    port, metrics_port = free_port(), free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(SCORER_CONFIG)
    scorer = start_scorer(port, handle.name, metrics_port)
    try:
        await wait_scoring(port)
        rss_ready = rss_mib(scorer.pid)
        waves: list[tuple[str, tuple[float, float]]] = []
        await capacity(port, texts, 8, 5.0)  # warm
        waves.append(("warm-up", await rss_after(scorer.pid)))
        cap = await capacity(port, texts, args.sidecars, args.seconds / 2)
        waves.append(("capacity", await rss_after(scorer.pid)))
        rows = []
        for factor in (1.0, 2.0):
            before = scrape(metrics_port)
            ends = await offered(
                port, texts, args.sidecars, factor * cap, args.seconds, args.deadline_s
            )
            after = scrape(metrics_port)
            moved = {
                k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)
            }
            rows.append((factor, ends, moved))
            waves.append((f"{factor:g}x", await rss_after(scorer.pid)))
        cap_after = await capacity(port, texts, args.sidecars, args.seconds / 2)
        waves.append(("capacity again", await rss_after(scorer.pid)))
    finally:
        scorer.terminate()
        scorer.wait(30)
        os.unlink(handle.name)
    print(f"scorer capacity: {cap:,.0f} texts/s before the overload phases, {cap_after:,.0f} after")
    print(f"{args.sidecars} callers, 5 texts per call, {args.deadline_s:g} s deadlines, "
          f"{args.seconds:g} s per phase (machine shared: figures move with its load)")  # fmt: skip
    print()
    print(
        "| offered | goodput texts/s | x capacity | OK | RESOURCE_EXHAUSTED "
        "| DEADLINE_EXCEEDED | other |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for factor, ends, _ in rows:
        goodput = ends.ok_texts / args.seconds
        codes = ends.codes
        print(
            f"| {factor:g}x ({factor * cap:,.0f} texts/s) | {goodput:,.0f} | {goodput / cap:.2f} | "
            f"{codes.get('OK', 0):,} | {codes.get('RESOURCE_EXHAUSTED', 0):,} | "
            f"{codes.get('DEADLINE_EXCEEDED', 0):,} | {codes.get('other', 0):,} |"
        )
    print()
    for factor, _, moved in rows:
        shown = {k: int(v) for k, v in sorted(moved.items())
                 if ("_total" in k or k.endswith("_count{}")) and "bucket" not in k}  # fmt: skip
        print(f"scorer counters at {factor:g}x: {shown}")
    print()
    print(f"scorer RSS: {rss_ready:,.0f} MiB at ready")
    print()
    print("| wave | scorer RSS MiB at its end | after 3 s idle |")
    print("| --- | ---: | ---: |")
    for name, (end, idle) in waves:
        print(f"| {name} | {end:,.0f} | {idle:,.0f} |")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer records (~40 s)")
    parser.add_argument("--sidecars", type=int, default=50, help="simulated sidecars (50)")
    parser.add_argument(
        "--rate", type=float, default=1.0, help="records/s per sidecar when steady (1)"
    )
    parser.add_argument(
        "--in-flight", type=int, default=8, help="records at once per sidecar in overload (8)"
    )
    parser.add_argument(
        "--overload", action="store_true", help="admission at 1x and 2x capacity instead"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="per --overload phase (20)")
    parser.add_argument("--deadline-s", type=float, default=5.0, help="--overload deadlines (5)")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    asyncio.run(overload_main(arguments) if arguments.overload else main(arguments))
