"""What ``relevance.cpu_budget`` holds: the analysis process's CPU with relevance scoring under
a budget, against the same traffic with scoring off, side by side in one run.

A real ``semhealth run`` (forwarder and analysis processes, the default profile's e5 encoder)
relays RAG requests from a scripted upstream: each request carries a distinct context of about
``--context-words`` words (so the embedding cache never hits), three in four to model ``a`` and
one in four to model ``b``. The bench sends ``--rate`` requests a second for ``--seconds`` after a
warm-up, once with ``relevance.enabled: false`` and once per budget, and reads the analysis
process's CPU from /proc (every thread, schedstat nanoseconds).

Printed per run, over the measured seconds only: requests, analysis CPU in cores, relevance's
share (the run's CPU less the relevance-off run's), that share over the budget, the sample rate
the sidecar settled on, streams scored and left out by the budget, and the scored share of model
``b`` (0.25 when the sample is unbiased). The demand column is what scoring every stream would
cost, from the CPU per scored stream: the run is at N times its budget when it reads N.

Usage::

    python bench/relevance_budget.py                          # budgets 0.25 and 0.5
    python bench/relevance_budget.py --budgets 0.25 --rate 4 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import child_pids, command_line, free_port, process_cpu_ns

from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream

LOOPBACK = "127.0.0.1"
WORDS = [
    "cluster", "replica", "index", "shard", "retention", "policy", "quota", "tenant", "backup",
    "snapshot", "region", "latency", "throughput", "queue", "worker", "schedule", "deploy",
    "rollback", "canary", "gateway", "token", "session", "cache", "storage", "volume", "bucket",
    "network", "subnet", "firewall", "certificate", "rotation", "audit", "billing", "invoice",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    requests: int
    seconds: float
    analysis_cores: float
    sample_rate: float
    scored: int
    budgeted_out: int
    scored_b: int
    scored_all: int


def context(index: int, words: int) -> str:
    rng = random.Random(index)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" (document {index})"


def body(index: int, words: int) -> bytes:
    return orjson.dumps(
        {
            "model": "b" if index % 4 == 0 else "a",
            "stream": True,
            "messages": [
                {"role": "system", "content": context(index, words)},
                {"role": "user", "content": "Which tenant quota applies to the backup bucket?"},
            ],
        }
    )


def answer(_request: ScriptRequest) -> Script:
    return Script(pieces=("The backup ", "bucket uses ", "the tenant's quota."))


def config_text(upstream: str, budget: float | None) -> str:
    relevance = (
        "  enabled: false\n"
        if budget is None
        else f"  enabled: true\n  cpu_budget: {budget}\n  max_in_flight: 100000\n"
    )
    return f"upstream:\n  url: {upstream}\nrelevance:\n{relevance}"


async def wait_ready(session: aiohttp.ClientSession, admin: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            async with session.get(f"{admin}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("the sidecar did not become ready in 120 s")


async def scrape(session: aiohttp.ClientSession, admin: str) -> dict[tuple[str, str], float]:
    async with session.get(f"{admin}/metrics") as response:
        text = await response.text()
    return {
        (sample.name, ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict[tuple[str, str], float], name: str, **labels: str) -> float:
    wanted = {f"{k}={v}" for k, v in labels.items()}
    return sum(
        v for (n, text), v in samples.items() if n == name and wanted <= set(text.split(","))
    )


async def send(session: aiohttp.ClientSession, proxy: str, data: bytes) -> None:
    async with session.post(f"{proxy}/v1/chat/completions", data=data) as response:
        await response.read()


async def traffic(
    session: aiohttp.ClientSession, proxy: str, rate: float, seconds: float, start: int, words: int
) -> int:
    """``rate`` requests a second, each sent on time whatever the others are doing."""
    tasks = []
    loop = asyncio.get_running_loop()
    begin = loop.time()
    for n in itertools.count():
        due = begin + n / rate
        if due - begin >= seconds:
            break
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(send(session, proxy, body(start + n, words))))
    await asyncio.gather(*tasks)
    return len(tasks)


async def one_run(
    label: str, budget: float | None, upstream: str, options: argparse.Namespace, start: int
) -> Run:
    port, admin_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "semhealth.yaml"
        config.write_text(config_text(upstream, budget))
        command = [
            sys.executable, "-m", "semhealth.agent.cli", "run", "--config", str(config),
            "--listen", f"{LOOPBACK}:{port}", "--admin-listen", f"{LOOPBACK}:{admin_port}",
            "--log-level", "warning",
        ]  # fmt: skip
        process = await asyncio.create_subprocess_exec(*command)
        proxy, admin = f"http://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{admin_port}"
        try:
            async with aiohttp.ClientSession() as session:
                await wait_ready(session, admin)
                (analysis,) = [
                    pid for pid in child_pids(process.pid)
                    if "semhealth.agent.analysis" in command_line(pid)
                ]  # fmt: skip
                await traffic(session, proxy, options.rate, options.warmup, start, options.words)
                first = await scrape(session, admin)
                before, began = process_cpu_ns(analysis), time.monotonic()
                sent = await traffic(
                    session, proxy, options.rate, options.seconds, start + 10**6, options.words
                )
                after, ended = process_cpu_ns(analysis), time.monotonic()
                samples = await scrape(session, admin)
        finally:
            process.terminate()
            await process.wait()
    count = "semantic_health_context_relevance_score_count"

    def delta(name: str, **labels: str) -> int:
        return int(total(samples, name, **labels) - total(first, name, **labels))

    return Run(
        label=label,
        requests=sent,
        seconds=ended - began,
        analysis_cores=(after - before) / 1e9 / (ended - began),
        sample_rate=total(samples, "semhealth_relevance_sample_rate"),
        scored=delta("semhealth_relevance_scored_total"),
        budgeted_out=delta("semhealth_relevance_skipped_total", reason="budgeted_out"),
        scored_b=delta(count, model="b"),
        scored_all=delta(count),
    )


def table(runs: Sequence[Run], budgets: Sequence[float | None]) -> str:
    off = runs[0]
    lines = [
        f"{'run':<14}{'requests':>9}{'analysis':>10}{'relevance':>10}{'/budget':>9}"
        f"{'rate':>7}{'scored':>8}{'budgeted':>10}{'b share':>9}{'demand':>8}"
    ]
    for run, budget in zip(runs, budgets, strict=True):
        relevance = run.analysis_cores - off.analysis_cores
        over = f"{relevance / budget:.2f}" if budget else "-"
        per_stream = relevance * run.seconds / run.scored if run.scored else 0.0
        demand = per_stream * run.requests / run.seconds / budget if budget else 0.0
        share = f"{run.scored_b / run.scored_all:.2f}" if run.scored_all else "-"
        lines.append(
            f"{run.label:<14}{run.requests:>9}{run.analysis_cores:>10.3f}{relevance:>10.3f}"
            f"{over:>9}{run.sample_rate:>7.3f}{run.scored:>8}{run.budgeted_out:>10}"
            f"{share:>9}{(f'{demand:.1f}x' if budget else '-'):>8}"
        )
    return "\n".join(lines)


async def main(options: argparse.Namespace) -> None:
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    budgets: list[float | None] = [None, *options.budgets]
    runs = []
    try:
        for n, budget in enumerate(budgets):
            label = "off" if budget is None else f"budget {budget:g}"
            runs.append(await one_run(label, budget, upstream.url, options, n * 10**7))
            print(f"{label}: done", file=sys.stderr)
    finally:
        await upstream.shutdown()
    print(
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs: {options.rate:g} requests/s of "
        f"~{options.words}-word contexts for {options.seconds:g} s after {options.warmup:g} s"
    )
    print(table(runs, budgets))


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parse.add_argument("--budgets", type=float, nargs="+", default=[0.25, 0.5])
    parse.add_argument("--rate", type=float, default=4.0, help="requests a second (default 4)")
    parse.add_argument("--seconds", type=float, default=60.0, help="measured (default 60)")
    parse.add_argument("--warmup", type=float, default=20.0, help="before measuring (default 20)")
    parse.add_argument("--words", type=int, default=400, help="words a context (default 400)")
    return parse


if __name__ == "__main__":
    asyncio.run(main(parser().parse_args()))
