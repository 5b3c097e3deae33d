"""What the sidecar adds: TTFT, per-chunk latency and throughput, direct vs through it.

Three processes on loopback, as in production the sidecar is its own process:

* an upstream (this file, ``--serve-upstream``) that streams OpenAI-chat SSE, one event
  per token, each event carrying the upstream's send time (``time.monotonic_ns()``:
  CLOCK_MONOTONIC, one clock for every process on a Linux machine);
* the sidecar, ``python -m semhealth.agent.cli run --upstream ...``;
* this process, the client, opening K concurrent streams.

Per-chunk latency is the client's arrival time minus the upstream's send time, for every
content event; TTFT is request sent to first content event. Direct and sidecar rounds
alternate (A B B A ...) in one run so machine noise hits both, and the report gives the
difference and the ratio. Throughput rounds stream without gaps and report MB/s and
tokens/s. Both tables also give the CPU time the sidecar and the upstream spent per
token (Linux schedstat), a figure that queueing on a busy machine does not inflate; and
the report ends with the sidecar's own counters, to show whether analysis shed work.

    python bench/proxy_overhead.py            # default, about 1-2 minutes on 2 cores
    python bench/proxy_overhead.py --quick    # about 30 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import glob
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import aiohttp
import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
MODES = ("direct", "sidecar")
CONCURRENCY = (1, 50, 200)
CHAT_PATH = "/v1/chat/completions"
TOKENS_HEADER = "X-Bench-Tokens"
GAP_HEADER = "X-Bench-Gap-Us"
READY_TIMEOUT_S = 30.0
STREAM_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
POLL_S = 0.05
IDLE_CPU_NS = 2_000_000  # per POLL_S: what an idle aiohttp process spends, with margin
TAIL_BYTES = 4000
# The upstream yields to its loop this often when streaming without gaps, so concurrent
# streams interleave as they would on a real model server instead of running one by one.
BURST_TOKENS = 16
REQUEST_BODY = orjson.dumps(
    {
        "model": "bench-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Count words for the benchmark, please."},
        ],
    }
)


# --------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    rounds: int
    tokens: int
    gap_ms: float
    min_streams: int
    throughput_tokens: int
    concurrency: tuple[int, ...]

    @property
    def gap_us(self) -> int:
        return round(self.gap_ms * 1000)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (~30 s)")
    parser.add_argument("--rounds", type=int, help="measured rounds per mode (default 4, quick 2)")
    parser.add_argument("--tokens", type=int, help="tokens per latency stream (default 50)")
    parser.add_argument("--gap-ms", type=float, help="gap between tokens (default 5)")
    parser.add_argument(
        "--min-streams",
        type=int,
        help="at least this many latency streams per round, run K at a time (default 10)",
    )
    parser.add_argument(
        "--throughput-tokens",
        type=int,
        help="tokens per throughput round, split over the K streams (default 40000)",
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", help="stream counts (default 1 50 200)"
    )
    parser.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser


def options_from(args: argparse.Namespace) -> Options:
    quick: bool = args.quick
    return Options(
        rounds=_pick(args.rounds, 2 if quick else 4),
        tokens=_pick(args.tokens, 30 if quick else 50),
        gap_ms=_pick(args.gap_ms, 5.0),
        min_streams=_pick(args.min_streams, 4 if quick else 10),
        throughput_tokens=_pick(args.throughput_tokens, 10_000 if quick else 40_000),
        concurrency=tuple(args.concurrency or CONCURRENCY),
    )


def _pick(given: T | None, default: T) -> T:
    return default if given is None else given


def check_options(options: Options) -> list[str]:
    problems = []
    if options.rounds < 1:
        problems.append("--rounds must be at least 1")
    if options.tokens < 1:
        problems.append("--tokens must be at least 1")
    if options.gap_ms < 0:
        problems.append("--gap-ms must not be negative")
    if options.min_streams < 1:
        problems.append("--min-streams must be at least 1")
    if options.throughput_tokens < 1:
        problems.append("--throughput-tokens must be at least 1")
    if any(k < 1 for k in options.concurrency):
        problems.append("--concurrency values must be at least 1")
    return problems


# --------------------------------------------------------------------------- upstream


def content_event(seq: int) -> bytes:
    """One token as an OpenAI chat.completion.chunk event, stamped just before it is sent."""
    chunk = {
        "bench_sent_ns": time.monotonic_ns(),
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": {"content": f" word{seq % 10}"}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def final_events(tokens: int) -> bytes:
    stop = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    usage = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [],
        "usage": {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": tokens + 12},
    }
    return (
        b"data: " + orjson.dumps(stop) + b"\n\ndata: " + orjson.dumps(usage) + b"\n\n"
        b"data: [DONE]\n\n"
    )


async def handle_chat(request: web.Request) -> web.StreamResponse:
    await request.read()
    tokens = int(request.headers.get(TOKENS_HEADER, "50"))
    gap_s = int(request.headers.get(GAP_HEADER, "5000")) / 1e6
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for seq in range(tokens):
        await _pace(seq, gap_s)
        await response.write(content_event(seq))
    await response.write(final_events(tokens))
    await response.write_eof()
    return response


async def _pace(seq: int, gap_s: float) -> None:
    # The first token also waits one gap: a stand-in for prefill.
    if gap_s > 0:
        await asyncio.sleep(gap_s)
    elif seq % BURST_TOKENS == 0:
        await asyncio.sleep(0)


async def handle_healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def serve_upstream(port: int) -> None:
    app = web.Application()
    app.router.add_post(CHAT_PATH, handle_chat)
    app.router.add_get("/healthz", handle_healthz)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, port, backlog=1024).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------- processes


class Children:
    """Child processes that are always stopped: SIGTERM, then SIGKILL after a grace period."""

    def __init__(self) -> None:
        self._procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
        self._files = contextlib.ExitStack()

    def spawn(self, name: str, cmd: Sequence[str]) -> subprocess.Popen[bytes]:
        # The log lives as long as the child; the exit stack closes it in stop_all.
        log = self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self._procs.append((name, proc, log))
        return proc

    def log_tail(self, proc: subprocess.Popen[bytes]) -> str:
        for _name, known, log in self._procs:
            if known is proc:
                log.seek(0, os.SEEK_END)
                log.seek(max(log.tell() - TAIL_BYTES, 0))
                return log.read().decode(errors="replace")
        return ""

    def stop_all(self) -> None:
        for _name, proc, _log in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for _name, proc, _log in self._procs:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        self._procs.clear()
        self._files.close()


@contextlib.contextmanager
def children() -> Iterator[Children]:
    group = Children()
    try:
        yield group
    finally:
        group.stop_all()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def upstream_command(port: int) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--serve-upstream", str(port)]


def sidecar_command(upstream_url: str, port: int, admin_port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "semhealth.agent.cli",
        "run",
        "--upstream",
        upstream_url,
        "--listen",
        f"{LOOPBACK}:{port}",
        "--admin-listen",
        f"{LOOPBACK}:{admin_port}",
        "--log-level",
        "warning",
    ]


async def wait_ready(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], what: str
) -> str | None:
    """Poll ``url`` until it answers 200; returns a reason when it never does."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"{what} exited with status {proc.returncode}"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as response:
                if response.status == 200:
                    return None
        await asyncio.sleep(0.05)
    return f"{what} was not ready after {READY_TIMEOUT_S:.0f} s"


# --------------------------------------------------------------------------- client


@dataclass(frozen=True, slots=True)
class StreamResult:
    ttft_ns: int | None
    chunk_latencies_ns: list[int]
    body_bytes: int
    tokens: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RoundResult:
    streams: list[StreamResult]
    wall_ns: int
    # CPU time each server process spent on the round; the sidecar's includes the
    # analysis backlog it worked through after the last byte went out.
    cpu_ns: dict[str, int] = field(default_factory=dict)


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events (without their blank line) and the incomplete rest."""
    *events, rest = buffer.split(b"\n\n")
    return events, rest


def sent_ns_of(event: bytes) -> int | None:
    """The upstream's send stamp of a content event; None for other events."""
    if not event.startswith(b"data: {"):
        return None
    try:
        payload = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return None
    stamp = payload.get("bench_sent_ns") if isinstance(payload, dict) else None
    return stamp if isinstance(stamp, int) else None


class _StreamReading:
    """Per-stream accumulation while a response is read."""

    __slots__ = ("body_bytes", "buffer", "first_ns", "latencies")

    def __init__(self) -> None:
        self.buffer = b""
        self.body_bytes = 0
        self.first_ns: int | None = None
        self.latencies: list[int] = []

    def feed(self, data: bytes, arrival_ns: int) -> None:
        self.body_bytes += len(data)
        events, self.buffer = split_events(self.buffer + data)
        for event in events:
            sent = sent_ns_of(event)
            if sent is None:
                continue
            if self.first_ns is None:
                self.first_ns = arrival_ns
            self.latencies.append(arrival_ns - sent)


async def run_stream(
    session: aiohttp.ClientSession, base_url: str, tokens: int, gap_us: int
) -> StreamResult:
    headers = {
        "Content-Type": "application/json",
        TOKENS_HEADER: str(tokens),
        GAP_HEADER: str(gap_us),
    }
    reading = _StreamReading()
    sent_ns = time.monotonic_ns()
    try:
        async with session.post(base_url + CHAT_PATH, data=REQUEST_BODY, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                return StreamResult(None, [], 0, 0, f"status {resp.status}")
            async for data in resp.content.iter_any():
                reading.feed(data, time.monotonic_ns())
    except (aiohttp.ClientError, TimeoutError) as exc:
        return StreamResult(None, [], reading.body_bytes, 0, type(exc).__name__)
    ttft = None if reading.first_ns is None else reading.first_ns - sent_ns
    return StreamResult(ttft, reading.latencies, reading.body_bytes, len(reading.latencies))


async def run_round(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    workers: int,
    streams_per_worker: int,
    tokens: int,
    gap_us: int,
) -> RoundResult:
    async def worker() -> list[StreamResult]:
        return [
            await run_stream(session, base_url, tokens, gap_us) for _ in range(streams_per_worker)
        ]

    start = time.monotonic_ns()
    batches = await asyncio.gather(*(worker() for _ in range(workers)))
    wall = time.monotonic_ns() - start
    return RoundResult([result for batch in batches for result in batch], wall)


def client_session(concurrency: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency + 8, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT_S)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


# --------------------------------------------------------------------------- aggregation


@dataclass(slots=True)
class Samples:
    """Everything measured for one (concurrency, mode), pooled over rounds."""

    ttft_ns: list[int] = field(default_factory=list)
    chunk_ns: list[int] = field(default_factory=list)
    streams: int = 0
    errors: int = 0
    lat_tokens: int = 0
    lat_cpu_ns: dict[str, int] = field(default_factory=dict)
    tp_bytes: int = 0
    tp_tokens: int = 0
    tp_wall_ns: int = 0
    tp_cpu_ns: dict[str, int] = field(default_factory=dict)

    def add_latency(self, result: RoundResult) -> None:
        _add_into(self.lat_cpu_ns, result.cpu_ns)
        self.lat_tokens += sum(stream.tokens for stream in result.streams)
        for stream in result.streams:
            self.streams += 1
            if stream.error is not None:
                self.errors += 1
                continue
            if stream.ttft_ns is not None:
                self.ttft_ns.append(stream.ttft_ns)
            self.chunk_ns.extend(stream.chunk_latencies_ns)

    def add_throughput(self, result: RoundResult) -> None:
        self.streams += len(result.streams)
        self.errors += sum(1 for stream in result.streams if stream.error is not None)
        self.tp_bytes += sum(stream.body_bytes for stream in result.streams)
        self.tp_tokens += sum(stream.tokens for stream in result.streams)
        self.tp_wall_ns += result.wall_ns
        _add_into(self.tp_cpu_ns, result.cpu_ns)


def _add_into(totals: dict[str, int], amounts: dict[str, int]) -> None:
    for name, amount in amounts.items():
        totals[name] = totals.get(name, 0) + amount


def percentile(values: Sequence[int], q: float) -> float:
    """Nearest-rank percentile; NaN when there is nothing to rank."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(math.ceil(q * len(ordered)) - 1, 0)
    return float(ordered[min(rank, len(ordered) - 1)])


def rate(amount: int, wall_ns: int) -> float:
    return amount / (wall_ns / 1e9) if wall_ns > 0 else math.nan


def cpu_cell(cpu_ns: dict[str, int], tokens: int) -> str:
    """Sidecar / upstream CPU per token, in µs."""
    if tokens <= 0 or not cpu_ns:
        return "n/a"
    sidecar, upstream = cpu_ns.get("sidecar", 0), cpu_ns.get("upstream", 0)
    return f"{sidecar / tokens / 1e3:.0f} / {upstream / tokens / 1e3:.0f}"


def process_cpu_ns(pid: int) -> int:
    """CPU time of a process, all its threads, in ns (Linux /proc; 0 where unavailable)."""
    # schedstat counts nanoseconds; utime/stime in /proc/PID/stat count 10 ms ticks,
    # too coarse for rounds of a few hundred milliseconds.
    total = 0
    for task in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(task, "rb") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    return total


async def wait_idle(pid: int) -> None:
    """Wait (bounded) until the process uses under IDLE_CPU_NS of CPU between two polls."""
    cpu = process_cpu_ns(pid)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        previous, cpu = cpu, process_cpu_ns(pid)
        if cpu - previous < IDLE_CPU_NS:
            return


# --------------------------------------------------------------------------- report

Results = dict[int, dict[str, Samples]]
LATENCY_COLUMNS = (
    "streams",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "chunk p50 µs",
    "chunk p99 µs",
    "samples (TTFT, chunks)",
    "CPU µs/token sidecar / upstream",
)
THROUGHPUT_COLUMNS = (
    "streams",
    "MB/s direct",
    "MB/s sidecar",
    "ratio",
    "tokens/s direct",
    "tokens/s sidecar",
    "ratio",
    "CPU µs/token sidecar / upstream",
)


def _cell(direct: float, sidecar: float, scale: float, digits: int) -> str:
    d, s = direct / scale, sidecar / scale
    added = s - d
    ratio = s / d if d > 0 else math.nan
    return f"{d:.{digits}f} / {s:.{digits}f} (+{added:.{digits}f}, x{ratio:.2f})".replace("+-", "-")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def latency_table(results: Results) -> str:
    lines = [_row(LATENCY_COLUMNS), _row(["---:", *["---"] * (len(LATENCY_COLUMNS) - 1)])]
    for k, by_mode in results.items():
        d, s = by_mode["direct"], by_mode["sidecar"]
        cells = [
            _cell(percentile(d.ttft_ns, q), percentile(s.ttft_ns, q), 1e6, 2) for q in (0.5, 0.99)
        ] + [
            _cell(percentile(d.chunk_ns, q), percentile(s.chunk_ns, q), 1e3, 0) for q in (0.5, 0.99)
        ]
        counts = f"{len(d.ttft_ns)}+{len(s.ttft_ns)}, {len(d.chunk_ns)}+{len(s.chunk_ns)}"
        lines.append(_row([str(k), *cells, counts, cpu_cell(s.lat_cpu_ns, s.lat_tokens)]))
    return "\n".join(lines)


def throughput_table(results: Results) -> str:
    lines = [_row(THROUGHPUT_COLUMNS), _row(["---:"] * len(THROUGHPUT_COLUMNS))]
    for k, by_mode in results.items():
        d, s = by_mode["direct"], by_mode["sidecar"]
        mb_d, mb_s = rate(d.tp_bytes, d.tp_wall_ns) / 1e6, rate(s.tp_bytes, s.tp_wall_ns) / 1e6
        tok_d, tok_s = rate(d.tp_tokens, d.tp_wall_ns), rate(s.tp_tokens, s.tp_wall_ns)
        lines.append(
            f"| {k} | {mb_d:.1f} | {mb_s:.1f} | {mb_s / mb_d:.2f} "
            f"| {tok_d:,.0f} | {tok_s:,.0f} | {tok_s / tok_d:.2f} "
            f"| {cpu_cell(s.tp_cpu_ns, s.tp_tokens)} |"
        )
    return "\n".join(lines)


def target_lines(results: Results) -> list[str]:
    """The issue's targets, judged at the highest concurrency measured."""
    k = max(results)
    d, s = results[k]["direct"], results[k]["sidecar"]
    ttft_ms = (percentile(s.ttft_ns, 0.99) - percentile(d.ttft_ns, 0.99)) / 1e6
    chunk_us = (percentile(s.chunk_ns, 0.99) - percentile(d.chunk_ns, 0.99)) / 1e3
    return [
        f"- added p99 TTFT at {k} streams: {ttft_ms:+.2f} ms (target < 1 ms: "
        f"{'met' if ttft_ms < 1 else 'not met'})",
        f"- added p99 per chunk at {k} streams: {chunk_us:+.0f} µs (target < 100 µs: "
        f"{'met' if chunk_us < 100 else 'not met'})",
    ]


def error_lines(results: Results) -> list[str]:
    return [
        f"- errors at {k} streams, {mode}: {samples.errors} of {samples.streams} streams"
        for k, by_mode in results.items()
        for mode, samples in by_mode.items()
        if samples.errors
    ]


def environment_line(loop_name: str) -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpus} CPUs usable ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
        f"event loop {loop_name}, {platform.system()} {platform.release()}"
    )


def options_line(options: Options) -> str:
    return (
        f"latency: {options.tokens} tokens per stream, {options.gap_ms:g} ms gap, "
        f"at least {options.min_streams} streams per round; throughput: "
        f"{options.throughput_tokens} tokens per round without gaps; "
        f"{options.rounds} rounds per mode, alternating direct/sidecar"
    )


def metrics_line(metrics: dict[str, float], sidecar_streams: int) -> str:
    def get(name: str) -> str:
        value = metrics.get(name)
        return "absent" if value is None else f"{value:.0f}"

    return (
        f'sidecar after the run: semhealth_dropped_total{{stage="tap"}} = '
        f"{get('semhealth_dropped_total')}, semhealth_streams_shed_total = "
        f"{get('semhealth_streams_shed_total')}, semhealth_records_total = "
        f"{get('semhealth_records_total')} for {sidecar_streams} streams sent through it, "
        f"semhealth_analysis_errors_total = {get('semhealth_analysis_errors_total')}"
    )


# --------------------------------------------------------------------------- sidecar metrics


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets (the few counters the report needs)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


async def read_metrics(session: aiohttp.ClientSession, admin_url: str) -> dict[str, float]:
    try:
        async with session.get(admin_url + "/metrics") as response:
            return parse_metrics(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}


async def settle_sidecar(
    session: aiohttp.ClientSession, admin_url: str, expected: int
) -> dict[str, float]:
    """Wait (bounded) until the sidecar analysed every stream so far, so its analysis
    does not spill over into the next round and steal CPU from the other mode."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    metrics: dict[str, float] = {}
    while time.monotonic() < deadline:
        metrics = await read_metrics(session, admin_url)
        done = metrics.get("semhealth_records_total", 0.0) + metrics.get(
            "semhealth_analysis_errors_total", 0.0
        )
        if done >= expected:
            break
        await asyncio.sleep(POLL_S)
    return metrics


# --------------------------------------------------------------------------- the run


RoundOf = Callable[[aiohttp.ClientSession, str], Awaitable[RoundResult]]


@dataclass(slots=True)
class Bench:
    """The two targets, the sessions that reach them and the sidecar's running count."""

    urls: dict[str, str]
    admin_url: str
    control: aiohttp.ClientSession
    pids: dict[str, int]
    sidecar_streams: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    async def measure(
        self,
        sessions: dict[str, aiohttp.ClientSession],
        mode: str,
        run: RoundOf,
    ) -> RoundResult:
        if mode != "sidecar":
            return await run(sessions[mode], self.urls[mode])
        before = self.cpu_now()
        result = await run(sessions[mode], self.urls[mode])
        # Idle first, measured from outside, so the CPU figures hold the analysis backlog
        # but not the /metrics renders that settle_sidecar then asks for.
        await wait_idle(self.pids["sidecar"])
        cpu = {name: now - before[name] for name, now in self.cpu_now().items()}
        self.sidecar_streams += len(result.streams)
        self.metrics = await settle_sidecar(self.control, self.admin_url, self.sidecar_streams)
        return dataclasses.replace(result, cpu_ns=cpu)

    def cpu_now(self) -> dict[str, int]:
        return {name: process_cpu_ns(pid) for name, pid in self.pids.items()}


def mode_order(round_index: int) -> tuple[str, ...]:
    # A B B A: neither mode always runs first, after the other has warmed the machine.
    return MODES if round_index % 2 == 0 else MODES[::-1]


def round_of(*, workers: int, streams_per_worker: int, tokens: int, gap_us: int) -> RoundOf:
    def run(session: aiohttp.ClientSession, url: str) -> Awaitable[RoundResult]:
        return run_round(
            session,
            url,
            workers=workers,
            streams_per_worker=streams_per_worker,
            tokens=tokens,
            gap_us=gap_us,
        )

    return run


async def bench_concurrency(bench: Bench, options: Options, k: int) -> dict[str, Samples]:
    per_worker = max(math.ceil(options.min_streams / k), 1)
    latency = round_of(
        workers=k, streams_per_worker=per_worker, tokens=options.tokens, gap_us=options.gap_us
    )
    warm_up = round_of(workers=k, streams_per_worker=1, tokens=options.tokens, gap_us=0)
    throughput = round_of(
        workers=k,
        streams_per_worker=1,
        tokens=max(options.throughput_tokens // k, 1),
        gap_us=0,
    )
    samples = {mode: Samples() for mode in MODES}
    async with client_session(k) as direct, client_session(k) as sidecar:
        sessions = {"direct": direct, "sidecar": sidecar}
        for mode in MODES:  # warm-up: open the connections both ways, discard the figures
            await bench.measure(sessions, mode, warm_up)
        for index in range(options.rounds):
            for mode in mode_order(index):
                samples[mode].add_latency(await bench.measure(sessions, mode, latency))
            for mode in mode_order(index + 1):
                samples[mode].add_throughput(await bench.measure(sessions, mode, throughput))
    return samples


async def start_processes(group: Children, control: aiohttp.ClientSession) -> Bench:
    upstream_port, proxy_port, admin_port = free_port(), free_port(), free_port()
    upstream_url = f"http://{LOOPBACK}:{upstream_port}"
    admin_url = f"http://{LOOPBACK}:{admin_port}"
    upstream = group.spawn("upstream", upstream_command(upstream_port))
    problem = await wait_ready(control, upstream_url + "/healthz", upstream, "upstream")
    if problem is not None:
        raise RuntimeError(f"{problem}\n{group.log_tail(upstream)}")
    sidecar = group.spawn("sidecar", sidecar_command(upstream_url, proxy_port, admin_port))
    problem = await wait_ready(control, admin_url + "/readyz", sidecar, "sidecar")
    if problem is not None:
        raise RuntimeError(f"{problem}\n{group.log_tail(sidecar)}")
    urls = {"direct": upstream_url, "sidecar": f"http://{LOOPBACK}:{proxy_port}"}
    return Bench(
        urls=urls,
        admin_url=admin_url,
        control=control,
        pids={"sidecar": sidecar.pid, "upstream": upstream.pid},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts:
    """What the report says around the tables."""

    loop_name: str
    metrics: dict[str, float]
    sidecar_streams: int
    load_before: float
    load_after: float


async def run_bench(options: Options, loop_name: str) -> str:
    results: Results = {}
    load_before = os.getloadavg()[0]
    with children() as group:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as control:
            bench = await start_processes(group, control)
            for k in options.concurrency:
                print(f"... {k} concurrent streams", file=sys.stderr, flush=True)
                results[k] = await bench_concurrency(bench, options, k)
            metrics = await settle_sidecar(control, bench.admin_url, bench.sidecar_streams)
    facts = RunFacts(
        loop_name=loop_name,
        metrics=metrics,
        sidecar_streams=bench.sidecar_streams,
        load_before=load_before,
        load_after=os.getloadavg()[0],
    )
    return render_report(results, options, facts)


def render_report(results: Results, options: Options, facts: RunFacts) -> str:
    cpus = os.cpu_count() or 0
    note = (
        f"Note: upstream, sidecar and client share these {cpus} cores (1-minute load average "
        f"{facts.load_before:.1f} before the run, {facts.load_after:.1f} after); at high "
        "concurrency the CPU is saturated and every latency includes queueing, which is why "
        "the sidecar is compared with direct, side by side, rather than in absolute terms."
    )
    parts = [
        f"Environment: {environment_line(facts.loop_name)}",
        f"Workload: {options_line(options)}",
        note,
        "",
        "Latency, cells are direct / sidecar (added, ratio):",
        "",
        latency_table(results),
        "",
        "Throughput, no gaps between tokens:",
        "",
        throughput_table(results),
        "",
        *target_lines(results),
        *error_lines(results),
        f"- {metrics_line(facts.metrics, facts.sidecar_streams)}",
    ]
    return "\n".join(parts)


# --------------------------------------------------------------------------- entry


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when it is installed, as the sidecar does."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serve_upstream is not None:
        port: int = args.serve_upstream
        run_async(serve_upstream(port))
        return 0
    options = options_from(args)
    problems = check_options(options)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    loop_name = "uvloop" if _has_uvloop() else "asyncio"
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        report = run_async(run_bench(options, loop_name))
    except KeyboardInterrupt:
        return 130
    except RuntimeError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    print(f"$ {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(report, flush=True)
    return 0


def _exit_on_sigterm(_signum: int, _frame: object) -> None:
    # SystemExit unwinds the run like Ctrl-C does, so the children are stopped too.
    raise SystemExit(143)


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
