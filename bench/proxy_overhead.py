"""What a proxy adds to streamed LLM responses: direct, through nginx and through the sidecar.

Four processes on loopback, as in production the sidecar is its own process:

* an upstream (this file, ``--serve-upstream``) that streams OpenAI-chat SSE, one event
  (one write) per token, each event carrying the upstream's send time
  (``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process on a Linux
  machine). It waits the TTFT before the first token and the gap before each later one;
* Debian's nginx, configured by this file as a plain streaming reverse proxy (keep-alive
  upstream, no buffering either way): the best C proxy on the machine, the yardstick;
* the sidecar, ``python -m semhealth.agent.cli run --upstream ...``, with the processes
  it starts (forwarding workers, the analysis process);
* this process, the client, opening K concurrent streams.

Per-chunk latency is the client's arrival time minus the upstream's send time, for every
content event; TTFT is request sent to first content event. The three modes, direct, nginx
and sidecar, take turns in rounds whose order rotates, in one run, so machine noise hits
all three. A proxy's *added* figure is its figure minus direct's, and the sidecar is judged
by its added figure over nginx's. The run's *noise floor* for a figure is how much direct
differs from itself: the figure over direct's even rounds against the same figure over its
odd rounds. Where nginx's added figure is not above that floor the ratio would divide by
noise, so the report says so and gives the sidecar's added figure in floors instead.
Throughput rounds stream without gaps or TTFT and report MB/s and tokens/s. A latency round
is a wave at K above 1, its K streams starting and ending together; a steady round's K
workers open the same streams one after another for ``--steady-s`` seconds, their first
streams spread over one stream's length, so streams end one by one as steady traffic's do
(what the sidecar's batching of copies meets in production). Steady rounds report CPU only.

CPU comes from Linux schedstat, per class of process, found again at every reading by
walking ``/proc/PID/task/*/children``: nginx's whole tree (master and workers); the
sidecar's forwarding process(es); its analysis process, a descendant whose command line
names ``semhealth.agent.analysis`` (while the sidecar is one process, analysis is part of
the forwarding figure, and the report says so). Forwarding is given per request, analysis
per content event relayed. Before the rounds, every server is watched idle for ``IDLE_S``
seconds: its CPU and its wake-ups (schedstat's count of times a thread was run) a second, so
what a quiet sidecar costs is reported apart from what a stream costs. The report ends with
the chunks the sidecar's tap shed per round
shape, each class's resident memory, and, when ``semhealth run`` takes ``--workers``, the
no-gap round at the highest concurrency again against a sidecar started with
``--workers auto`` (the main run passes ``--workers 1``).

    python bench/proxy_overhead.py            # default, several minutes on 2 cores
    python bench/proxy_overhead.py --quick    # about 1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import glob
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import aiohttp
import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
MODES = ("direct", "nginx", "sidecar")
CONCURRENCY = (1, 50, 200)
CHAT_PATH = "/v1/chat/completions"
TOKENS_HEADER = "X-Bench-Tokens"
GAP_HEADER = "X-Bench-Gap-Us"
TTFT_HEADER = "X-Bench-Ttft-Us"
SIDECAR_MODULE = "semhealth.agent.cli"
# A descendant of the sidecar whose command line holds this is its analysis process; any
# other descendant forwards (a worker), unless its parent is the analysis process.
ANALYSIS_MARK = "semhealth.agent.analysis"
NGINX_FALLBACK = "/usr/sbin/nginx"  # Debian's, for a PATH without /usr/sbin
READY_TIMEOUT_S = 30.0
STREAM_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
POLL_S = 0.05
IDLE_S = 10.0  # how long the servers are watched doing nothing, before the rounds
IDLE_CPU_NS = 2_000_000  # per POLL_S and process: what an idle aiohttp process spends, with margin
# How long the sidecar must stay that idle before its round's CPU is read: longer than any
# wait of a stream's end in a forwarder (250 ms), so its last batch's analysis is in the round.
QUIET_S = 1.0
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
    ttft_ms: float
    min_streams: int
    throughput_tokens: int
    steady_s: float
    concurrency: tuple[int, ...]
    nginx: str | None
    nginx_workers: int
    sidecar_args: tuple[str, ...]

    @property
    def gap_us(self) -> int:
        return round(self.gap_ms * 1000)

    @property
    def ttft_us(self) -> int:
        return round(self.ttft_ms * 1000)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (~1 minute)")
    parser.add_argument("--rounds", type=int, help="measured rounds per mode (default 4, quick 2)")
    parser.add_argument("--tokens", type=int, help="tokens per latency stream (default 64)")
    parser.add_argument("--gap-ms", type=float, help="gap between tokens (default 20)")
    parser.add_argument(
        "--ttft-ms", type=float, help="wait before the first token of a latency stream (default 50)"
    )
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
        "--steady-s",
        type=float,
        help="how long a steady round's K workers open one stream after another, at every "
        "K above 1 (default 6, quick 3; 0: no steady rounds)",
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", help="stream counts (default 1 50 200)"
    )
    parser.add_argument(
        "--nginx", metavar="PATH", help=f"nginx binary (default: on PATH, else {NGINX_FALLBACK})"
    )
    parser.add_argument(
        "--nginx-workers", type=int, default=1, metavar="N", help="nginx worker_processes (1)"
    )
    parser.add_argument(
        "--sidecar-arg",
        action="append",
        metavar="ARG",
        help="appended to the sidecar's command line; repeatable; "
        "give options with '=', e.g. --sidecar-arg=--config=FILE",
    )
    parser.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser


def options_from(args: argparse.Namespace) -> Options:
    quick: bool = args.quick
    return Options(
        rounds=_pick(args.rounds, 2 if quick else 4),
        tokens=_pick(args.tokens, 32 if quick else 64),
        gap_ms=_pick(args.gap_ms, 20.0),
        ttft_ms=_pick(args.ttft_ms, 50.0),
        min_streams=_pick(args.min_streams, 4 if quick else 10),
        throughput_tokens=_pick(args.throughput_tokens, 10_000 if quick else 40_000),
        steady_s=_pick(args.steady_s, 3.0 if quick else 6.0),
        concurrency=tuple(args.concurrency or CONCURRENCY),
        nginx=find_nginx(args.nginx),
        nginx_workers=args.nginx_workers,
        sidecar_args=tuple(args.sidecar_arg or ()),
    )


def _pick(given: T | None, default: T) -> T:
    return default if given is None else given


def find_nginx(given: str | None) -> str | None:
    if given is not None:
        return given
    return shutil.which("nginx") or (NGINX_FALLBACK if os.access(NGINX_FALLBACK, os.X_OK) else None)


def check_options(options: Options) -> list[str]:
    problems = []
    if options.rounds < 1:
        problems.append("--rounds must be at least 1")
    if options.tokens < 1:
        problems.append("--tokens must be at least 1")
    if options.gap_ms < 0:
        problems.append("--gap-ms must not be negative")
    if options.ttft_ms < 0:
        problems.append("--ttft-ms must not be negative")
    if options.min_streams < 1:
        problems.append("--min-streams must be at least 1")
    if options.throughput_tokens < 1:
        problems.append("--throughput-tokens must be at least 1")
    if options.steady_s < 0:
        problems.append("--steady-s must not be negative")
    if any(k < 1 for k in options.concurrency):
        problems.append("--concurrency values must be at least 1")
    if options.nginx_workers < 1:
        problems.append("--nginx-workers must be at least 1")
    if options.nginx is None:
        problems.append("nginx not found: install it (apt-get install nginx) or pass --nginx PATH")
    elif not os.access(options.nginx, os.X_OK):
        problems.append(f"--nginx {options.nginx} is not an executable file")
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
    ttft_s = int(request.headers.get(TTFT_HEADER, "0")) / 1e6
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for seq in range(tokens):
        await _pace(seq, gap_s, ttft_s)
        await response.write(content_event(seq))
    await response.write(final_events(tokens))
    await response.write_eof()
    return response


async def _pace(seq: int, gap_s: float, ttft_s: float) -> None:
    # The first token waits the TTFT, a stand-in for prefill; each later one the gap.
    wait_s = ttft_s if seq == 0 else gap_s
    if wait_s > 0:
        await asyncio.sleep(wait_s)
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
    # The upstream serves every mode and cannot know when a round is timed: what start-up
    # built leaves the collector's sight, so its collections walk only what the streams made
    # (the sidecar's forwarder does the same).
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------- process trees


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


def process_wakeups(pid: int) -> int:
    """Times the scheduler has run a process's threads (schedstat's third field): each is a
    wake-up, for a process that sleeps in epoll between events."""
    total = 0
    for task in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(task, "rb") as stat:
                total += int(stat.read().split()[2])
        except (OSError, ValueError, IndexError):
            continue
    return total


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS), in bytes; 0 where unavailable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def child_pids(pid: int) -> list[int]:
    """A process's children, from each of its threads' ``children`` file."""
    # A child is listed under the thread that forked it, so every thread is read.
    found: list[int] = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path, "rb") as children:
                found.extend(int(entry) for entry in children.read().split())
        except (OSError, ValueError):
            continue
    return found


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_running(pid: int) -> bool:
    """Whether a pid names a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


@dataclass(frozen=True, slots=True)
class Tree:
    """A server process and its descendants, each put in a class by its command line.

    The descendants are walked again at every reading: a server may start its children a
    moment after it answers, and may restart them. A descendant whose command line holds
    a mark gets that mark's class; any other takes its parent's class.
    """

    root: int
    name: str
    marks: tuple[tuple[str, str], ...] = ()  # (substring of the command line, class)

    def processes(self) -> dict[int, str]:
        """pid -> class, for the root and every descendant alive now."""
        found = {self.root: self.name}
        pending = [self.root]
        while pending:
            parent = pending.pop()
            for child in child_pids(parent):
                if child not in found:
                    found[child] = self._class_of(child, found[parent])
                    pending.append(child)
        return found

    def _class_of(self, pid: int, inherited: str) -> str:
        line = command_line(pid)
        return next((name for mark, name in self.marks if mark in line), inherited)


CpuReading = dict[int, tuple[str, int]]  # pid -> (class, CPU ns the process has spent so far)


def read_cpu(trees: Sequence[Tree]) -> CpuReading:
    return {
        pid: (name, process_cpu_ns(pid)) for tree in trees for pid, name in tree.processes().items()
    }


def cpu_between(before: CpuReading, after: CpuReading) -> dict[str, int]:
    """CPU ns per class between two readings. A process that started in between counts
    from zero; one that ended in between is lost, as schedstat goes with it."""
    spent: dict[str, int] = {}
    for pid, (name, now) in after.items():
        then = before.get(pid, (name, 0))[1]
        spent[name] = spent.get(name, 0) + max(now - then, 0)
    return spent


@dataclass(frozen=True, slots=True)
class Footprint:
    """One class of process at one moment: how many, and their resident memory summed."""

    processes: int
    rss_bytes: int


def read_footprint(trees: Sequence[Tree]) -> dict[str, Footprint]:
    counts: dict[str, int] = {}
    rss: dict[str, int] = {}
    for tree in trees:
        for pid, name in tree.processes().items():
            counts[name] = counts.get(name, 0) + 1
            rss[name] = rss.get(name, 0) + rss_bytes(pid)
    return {name: Footprint(counts[name], rss[name]) for name in counts}


async def wait_idle(tree: Tree) -> None:
    """Wait (bounded) until the tree uses under IDLE_CPU_NS per process in every poll for
    QUIET_S, so that what a forwarder still held when the round's last stream ended has
    reached analysis and been analysed."""
    reading = read_cpu((tree,))
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        previous, reading = reading, read_cpu((tree,))
        if sum(cpu_between(previous, reading).values()) >= IDLE_CPU_NS * len(reading):
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_S:
            return


# --------------------------------------------------------------------------- processes


class Children:
    """Child processes that are always stopped: SIGTERM, then SIGKILL after a grace period.

    Whatever a child started and left behind when it stopped is stopped the same way, so
    a sidecar whose shutdown forgets a worker does not leave it spinning under later runs.
    """

    def __init__(self) -> None:
        self._procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
        self._files = contextlib.ExitStack()

    def spawn(self, name: str, cmd: Sequence[str]) -> subprocess.Popen[bytes]:
        # The log lives as long as the child; the exit stack closes it in stop_all.
        log = self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self._procs.append((name, proc, log))
        return proc

    def directory(self, prefix: str) -> str:
        """A temporary directory, removed after every child has stopped."""
        return self._files.enter_context(tempfile.TemporaryDirectory(prefix=prefix))

    def log_tail(self, proc: subprocess.Popen[bytes]) -> str:
        for _name, known, log in self._procs:
            if known is proc:
                log.seek(0, os.SEEK_END)
                log.seek(max(log.tell() - TAIL_BYTES, 0))
                return log.read().decode(errors="replace")
        return ""

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop one child now; its log stays readable until stop_all."""
        _stop([proc])

    def stop_all(self) -> None:
        _stop([proc for _name, proc, _log in self._procs])
        self._procs.clear()
        self._files.close()


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    left = [pid for proc in procs for pid in Tree(proc.pid, "").processes() if pid != proc.pid]
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
    _stop_leftovers(left)


def _stop_leftovers(pids: Sequence[int]) -> None:
    """Descendants still running after their parent stopped: SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        running = [pid for pid in pids if is_running(pid)]
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while running and time.monotonic() < deadline:
            time.sleep(POLL_S)
            running = [pid for pid in running if is_running(pid)]
        if not running:
            return


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


def sidecar_command(
    upstream_url: str, port: int, admin_port: int, extra: Sequence[str]
) -> list[str]:
    return [
        sys.executable,
        "-m",
        SIDECAR_MODULE,
        "run",
        "--upstream",
        upstream_url,
        "--listen",
        f"{LOOPBACK}:{port}",
        "--admin-listen",
        f"{LOOPBACK}:{admin_port}",
        "--log-level",
        "warning",
        *extra,
    ]


def sidecar_has_workers() -> bool:
    """Whether this semhealth's ``run`` takes ``--workers`` (the multi-process sidecar)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", SIDECAR_MODULE, "run", "--help"],
            capture_output=True,
            timeout=READY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"--workers" in done.stdout


def sidecar_args(options: Options, workers: str | None) -> tuple[str, ...]:
    """The pass-through arguments, then ``--workers`` when asked for and not given already."""
    given = options.sidecar_args
    if workers is None or any(arg.split("=", 1)[0] == "--workers" for arg in given):
        return given
    return (*given, "--workers", workers)


def nginx_config(directory: str, *, port: int, upstream_port: int, workers: int) -> str:
    """A plain streaming reverse proxy: what a careful operator would put in front of an
    SSE upstream. Every path nginx writes is inside ``directory``."""
    # Run as root, nginx's workers would switch to 'nobody' and lose access to the
    # private temporary directory; there is nothing to protect on a bench machine.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""{user}daemon off;
worker_processes {workers};
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    upstream bench_upstream {{
        server {LOOPBACK}:{upstream_port};
        keepalive 64;
    }}
    server {{
        listen {LOOPBACK}:{port};
        location / {{
            proxy_pass http://bench_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
            proxy_send_timeout 600s;
        }}
    }}
}}
"""


def write_nginx_config(directory: str, *, port: int, upstream_port: int, workers: int) -> None:
    text = nginx_config(directory, port=port, upstream_port=upstream_port, workers=workers)
    with open(os.path.join(directory, "nginx.conf"), "w", encoding="utf-8") as conf:
        conf.write(text)


def nginx_command(nginx: str, directory: str) -> list[str]:
    # -e: the start-up error log too, before the configuration has been read.
    conf = os.path.join(directory, "nginx.conf")
    return [nginx, "-p", directory, "-c", conf, "-e", os.path.join(directory, "error.log")]


def nginx_version(nginx: str) -> str:
    try:
        done = subprocess.run([nginx, "-v"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "nginx (version unknown)"
    return done.stderr.decode(errors="replace").strip().removeprefix("nginx version: ")


async def wait_ready(
    session: aiohttp.ClientSession,
    url: str,
    proc: subprocess.Popen[bytes],
    what: str,
    timeout_s: float = READY_TIMEOUT_S,
) -> str | None:
    """Poll ``url`` until it answers 200; returns a reason when it never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"{what} exited with status {proc.returncode}"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as response:
                if response.status == 200:
                    return None
        await asyncio.sleep(0.05)
    return f"{what} was not ready after {timeout_s:.0f} s"


@dataclass(frozen=True, slots=True)
class Server:
    """A started server: its process, the URL the client uses and how its CPU is read."""

    proc: subprocess.Popen[bytes]
    url: str
    tree: Tree
    admin_url: str = ""


async def start_server(
    group: Children,
    control: aiohttp.ClientSession,
    *,
    name: str,
    cmd: Sequence[str],
    ready_url: str,
    timeout_s: float = READY_TIMEOUT_S,
) -> subprocess.Popen[bytes]:
    proc = group.spawn(name, cmd)
    problem = await wait_ready(control, ready_url, proc, name, timeout_s)
    if problem is not None:
        raise RuntimeError(f"{problem}\n{group.log_tail(proc)}")
    return proc


async def start_upstream(group: Children, control: aiohttp.ClientSession) -> Server:
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    cmd = upstream_command(port)
    proc = await start_server(group, control, name="upstream", cmd=cmd, ready_url=url + "/healthz")
    return Server(proc, url, Tree(proc.pid, "upstream"))


async def start_nginx(
    group: Children, control: aiohttp.ClientSession, options: Options, upstream_url: str
) -> Server:
    assert options.nginx is not None  # check_options saw to it
    directory = group.directory("bench-nginx-")
    port = free_port()
    upstream_port = int(upstream_url.rsplit(":", 1)[1])
    write_nginx_config(
        directory, port=port, upstream_port=upstream_port, workers=options.nginx_workers
    )
    url = f"http://{LOOPBACK}:{port}"
    # Ready once a request goes all the way through it to the upstream.
    proc = await start_server(
        group,
        control,
        name="nginx",
        cmd=nginx_command(options.nginx, directory),
        ready_url=url + "/healthz",
    )
    return Server(proc, url, Tree(proc.pid, "nginx"))


async def start_sidecar(
    group: Children, control: aiohttp.ClientSession, upstream_url: str, args: Sequence[str]
) -> Server:
    port, admin_port = free_port(), free_port()
    admin_url = f"http://{LOOPBACK}:{admin_port}"
    proc = await start_server(
        group,
        control,
        name="sidecar",
        cmd=sidecar_command(upstream_url, port, admin_port, args),
        ready_url=admin_url + "/readyz",
    )
    tree = Tree(proc.pid, "sidecar", marks=((ANALYSIS_MARK, "analysis"),))
    return Server(proc, f"http://{LOOPBACK}:{port}", tree, admin_url)


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
    # CPU time each class of server process spent on the round; the sidecar's includes
    # the analysis backlog it worked through after the last byte went out.
    cpu_ns: dict[str, int] = field(default_factory=dict)
    # Chunks the sidecar's tap shed during the round; None outside sidecar rounds, or when
    # its /metrics could not be read.
    shed_chunks: int | None = None


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """What each stream of a round asks the upstream for."""

    tokens: int
    gap_us: int
    ttft_us: int = 0


async def run_stream(session: aiohttp.ClientSession, base_url: str, shape: Shape) -> StreamResult:
    headers = {
        "Content-Type": "application/json",
        TOKENS_HEADER: str(shape.tokens),
        GAP_HEADER: str(shape.gap_us),
        TTFT_HEADER: str(shape.ttft_us),
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
    shape: Shape,
) -> RoundResult:
    async def worker() -> list[StreamResult]:
        return [await run_stream(session, base_url, shape) for _ in range(streams_per_worker)]

    return await timed_round(lambda: [worker() for _ in range(workers)])


async def run_steady(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    workers: int,
    seconds: float,
    shape: Shape,
) -> RoundResult:
    """Each worker opens one stream after another until ``seconds`` have passed, the
    workers' first streams spread over one stream's length: streams start and end one after
    another, as steady traffic's do, where a latency round's start and end together."""
    length_s = (shape.ttft_us + shape.tokens * shape.gap_us) / 1e6

    end = math.inf  # set as the round starts

    async def worker(index: int) -> list[StreamResult]:
        await asyncio.sleep(length_s * index / workers)
        results = [await run_stream(session, base_url, shape)]  # K in flight, however short
        while time.monotonic() < end:
            results.append(await run_stream(session, base_url, shape))
        return results

    def start() -> list[Coroutine[Any, Any, list[StreamResult]]]:
        nonlocal end
        end = time.monotonic() + seconds
        return [worker(index) for index in range(workers)]

    return await timed_round(start)


async def timed_round(
    start: Callable[[], list[Coroutine[Any, Any, list[StreamResult]]]],
) -> RoundResult:
    """Run the workers ``start`` makes, with this process's collector held, and time them."""
    with collector_held():
        began = time.monotonic_ns()
        batches = await asyncio.gather(*start())
        wall = time.monotonic_ns() - began
    return RoundResult([result for batch in batches for result in batch], wall)


@contextlib.contextmanager
def collector_held() -> Iterator[None]:
    """This process's garbage collector off while a round is timed, run before it instead.

    The client is a Python process with aiohttp loaded: a full collection pauses it for
    milliseconds, every stream of the round it lands in waits, and that mode's TTFT p99 at 50
    streams was the pause. In an ad hoc driver (50 streams, ten rounds a mode, direct and the
    sidecar alternating), the top 1 % of the sidecar's TTFTs fell in one round, the same one,
    in each of three runs with the collector running, and in no one round when it was held.
    """
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def client_session(concurrency: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency + 8, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT_S)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


# --------------------------------------------------------------------------- aggregation


@dataclass(slots=True)
class Usage:
    """What one round shape cost in one mode, pooled over its rounds."""

    requests: int = 0
    tokens: int = 0  # content events delivered: one per token, each its own upstream write
    body_bytes: int = 0
    wall_ns: int = 0
    cpu_ns: dict[str, int] = field(default_factory=dict)
    shed: int | None = 0  # None once a round's count was unknown

    def add(self, result: RoundResult) -> None:
        self.requests += len(result.streams)
        self.tokens += sum(stream.tokens for stream in result.streams)
        self.body_bytes += sum(stream.body_bytes for stream in result.streams)
        self.wall_ns += result.wall_ns
        for name, amount in result.cpu_ns.items():
            self.cpu_ns[name] = self.cpu_ns.get(name, 0) + amount
        if self.shed is not None and result.shed_chunks is not None:
            self.shed += result.shed_chunks
        else:
            self.shed = None

    def cpu_us_per(self, name: str, count: int) -> float:
        """CPU µs one class spent per request, token, ...; NaN when it has no process."""
        if name not in self.cpu_ns or count <= 0:
            return math.nan
        return self.cpu_ns[name] / count / 1e3


@dataclass(slots=True)
class Samples:
    """Everything measured for one (concurrency, mode). Latencies are kept per round, for
    the noise floor; everything else is pooled."""

    ttft_rounds: list[list[int]] = field(default_factory=list)
    chunk_rounds: list[list[int]] = field(default_factory=list)
    streams: int = 0
    errors: int = 0
    latency: Usage = field(default_factory=Usage)
    throughput: Usage = field(default_factory=Usage)
    steady: Usage = field(default_factory=Usage)  # CPU only: its latencies are not pooled

    def add_latency(self, result: RoundResult) -> None:
        self._count(result)
        self.latency.add(result)
        ok = [stream for stream in result.streams if stream.error is None]
        self.ttft_rounds.append([s.ttft_ns for s in ok if s.ttft_ns is not None])
        self.chunk_rounds.append([ns for s in ok for ns in s.chunk_latencies_ns])

    def add_throughput(self, result: RoundResult) -> None:
        self._count(result)
        self.throughput.add(result)

    def add_steady(self, result: RoundResult) -> None:
        self._count(result)
        self.steady.add(result)

    def _count(self, result: RoundResult) -> None:
        self.streams += len(result.streams)
        self.errors += sum(1 for stream in result.streams if stream.error is not None)


def percentile(values: Sequence[int], q: float) -> float:
    """Nearest-rank percentile; NaN when there is nothing to rank."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(math.ceil(q * len(ordered)) - 1, 0)
    return float(ordered[min(rank, len(ordered) - 1)])


def pooled(rounds: Sequence[Sequence[int]]) -> list[int]:
    return [value for one in rounds for value in one]


def split_half(rounds: Sequence[Sequence[int]], q: float) -> float:
    """How much a percentile differs from itself in one mode: the percentile over the even
    rounds against the same over the odd rounds, as an absolute difference.

    An added figure is the difference of two figures pooled over every round. Each half
    pools half as many rounds, so the spread between halves runs about √2 times the
    typical noise of an added figure: a floor on the generous side, itself one draw. The
    halves also differ in where the mode ran in the rotation. NaN under two rounds.
    """
    if len(rounds) < 2:
        return math.nan
    return abs(percentile(pooled(rounds[0::2]), q) - percentile(pooled(rounds[1::2]), q))


def rate(amount: int, wall_ns: int) -> float:
    return amount / (wall_ns / 1e9) if wall_ns > 0 else math.nan


# --------------------------------------------------------------------------- report

Results = dict[int, dict[str, Samples]]


@dataclass(frozen=True, slots=True)
class Figure:
    """One latency figure the report compares across modes."""

    label: str
    rounds_of: Callable[[Samples], list[list[int]]]
    q: float
    scale: float  # ns per unit shown
    digits: int

    def value(self, samples: Samples) -> float:
        return percentile(pooled(self.rounds_of(samples)), self.q) / self.scale

    def floor(self, direct: Samples) -> float:
        return split_half(self.rounds_of(direct), self.q) / self.scale


FIGURES = (
    Figure("TTFT p50 ms", lambda s: s.ttft_rounds, 0.5, 1e6, 2),
    Figure("TTFT p99 ms", lambda s: s.ttft_rounds, 0.99, 1e6, 2),
    Figure("chunk p50 µs", lambda s: s.chunk_rounds, 0.5, 1e3, 0),
    Figure("chunk p99 µs", lambda s: s.chunk_rounds, 0.99, 1e3, 0),
)
LATENCY_COLUMNS = (
    "streams",
    "figure",
    "direct",
    "noise floor",
    "nginx (added)",
    "sidecar (added)",
    "sidecar / nginx, added",
)
THROUGHPUT_COLUMNS = (
    "streams",
    "MB/s direct / nginx / sidecar",
    "tokens/s direct / nginx / sidecar",
    "nginx / direct",
    "sidecar / direct",
    "sidecar / nginx",
)
CPU_COLUMNS = (
    "streams",
    "round",
    "requests per mode",
    "upstream µs/request",
    "nginx µs/request",
    "sidecar forwarding µs/request",
    "sidecar / nginx",
    "sidecar analysis µs/event",
    "sidecar tree / nginx",
    "sidecar tap shed chunks",
)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _number(value: float, digits: int) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def added_ratio(sidecar: float, nginx: float, floor: float) -> str:
    """Sidecar-added over nginx-added, unless nginx's added figure is not above the noise."""
    if math.isnan(sidecar) or math.isnan(nginx):
        return "n/a"
    if math.isnan(floor) or nginx > floor:
        if nginx <= 0:
            return "n/a"
        # Below direct is noise by definition; a negative ratio would read as a figure.
        return f"x{sidecar / nginx:.2f}" if sidecar > 0 else "sidecar not above direct"
    if sidecar <= floor:
        return "neither above noise"
    if floor <= 0:
        return "nginx not above noise"
    return f"nginx not above noise; sidecar {sidecar / floor:.1f} floors"


def latency_table(results: Results) -> str:
    lines = [_row(LATENCY_COLUMNS), _row(["---:", "---", *["---:"] * 5])]
    for k, by_mode in results.items():
        direct = by_mode["direct"]
        for figure in FIGURES:
            base = figure.value(direct)
            added = {mode: figure.value(by_mode[mode]) - base for mode in ("nginx", "sidecar")}
            floor = figure.floor(direct)
            digits = figure.digits
            cells = [
                f"{_number(base + added[mode], digits)} ({added[mode]:+,.{digits}f})"
                for mode in ("nginx", "sidecar")
            ]
            lines.append(
                _row(
                    [
                        str(k),
                        figure.label,
                        _number(base, digits),
                        _number(floor, digits),
                        *cells,
                        added_ratio(added["sidecar"], added["nginx"], floor),
                    ]
                )
            )
    return "\n".join(lines)


def sample_line(results: Results) -> str:
    counts = ", ".join(
        f"{len(pooled(d.ttft_rounds))} TTFT and {len(pooled(d.chunk_rounds)):,} chunk samples "
        f"over {len(d.ttft_rounds)} rounds at {k} streams"
        for k, d in ((k, by_mode["direct"]) for k, by_mode in results.items())
    )
    return f"Per mode: {counts}."


def throughput_table(results: Results) -> str:
    lines = [_row(THROUGHPUT_COLUMNS), _row(["---:"] * len(THROUGHPUT_COLUMNS))]
    for k, by_mode in results.items():
        use = {mode: by_mode[mode].throughput for mode in MODES}
        mb = {mode: rate(u.body_bytes, u.wall_ns) / 1e6 for mode, u in use.items()}
        tok = {mode: rate(u.tokens, u.wall_ns) for mode, u in use.items()}
        lines.append(
            _row(
                [
                    str(k),
                    " / ".join(f"{mb[mode]:.1f}" for mode in MODES),
                    " / ".join(f"{tok[mode]:,.0f}" for mode in MODES),
                    f"{tok['nginx'] / tok['direct']:.2f}",
                    f"{tok['sidecar'] / tok['direct']:.2f}",
                    f"{tok['sidecar'] / tok['nginx']:.2f}",
                ]
            )
        )
    return "\n".join(lines)


def cpu_table(results: Results, shapes: dict[str, str]) -> str:
    lines = [_row(CPU_COLUMNS), _row(["---:", "---", *["---:"] * 8])]
    for k, by_mode in results.items():
        rows = [
            (shapes["latency"], [by_mode[mode].latency for mode in MODES]),
            (shapes["throughput"], [by_mode[mode].throughput for mode in MODES]),
        ]
        if by_mode["sidecar"].steady.requests:
            rows.insert(1, (shapes["steady"], [by_mode[mode].steady for mode in MODES]))
        for label, (direct, nginx, sidecar) in rows:
            nginx_us = nginx.cpu_us_per("nginx", nginx.requests)
            sidecar_us = sidecar.cpu_us_per("sidecar", sidecar.requests)
            analysis_us = sidecar.cpu_us_per("analysis", sidecar.tokens)
            # The whole process tree: forwarding and analysis per request (in one process,
            # forwarding's figure holds both).
            per_request = sidecar.cpu_us_per("analysis", sidecar.requests)
            tree_us = sidecar_us + (0.0 if math.isnan(per_request) else per_request)
            lines.append(
                _row(
                    [
                        str(k),
                        label,
                        f"{sidecar.requests:,}",
                        _number(direct.cpu_us_per("upstream", direct.requests), 0),
                        _number(nginx_us, 0),
                        _number(sidecar_us, 0),
                        _number(sidecar_us / nginx_us, 2),
                        "in forwarding" if math.isnan(analysis_us) else _number(analysis_us, 1),
                        _number(tree_us / nginx_us, 2),
                        "absent" if sidecar.shed is None else f"{sidecar.shed:,}",
                    ]
                )
            )
    return "\n".join(lines)


def target_lines(results: Results) -> list[str]:
    """The absolute targets, judged at the highest concurrency measured, nginx alongside."""
    k = max(results)
    by_mode = results[k]
    ttft, chunk = FIGURES[1], FIGURES[3]

    def added(figure: Figure, mode: str) -> float:
        return figure.value(by_mode[mode]) - figure.value(by_mode["direct"])

    ttft_ms, chunk_us = added(ttft, "sidecar"), added(chunk, "sidecar")
    ttft_floor, chunk_floor = ttft.floor(by_mode["direct"]), chunk.floor(by_mode["direct"])
    return [
        f"- added p99 TTFT at {k} streams: sidecar {ttft_ms:+.2f} ms, nginx "
        f"{added(ttft, 'nginx'):+.2f} ms, noise floor {_number(ttft_floor, 2)} ms (target < 1 ms: "
        f"{'met' if ttft_ms < 1 else 'not met'})",
        f"- added p99 per chunk at {k} streams: sidecar {chunk_us:+.0f} µs, nginx "
        f"{added(chunk, 'nginx'):+.0f} µs, noise floor {_number(chunk_floor, 0)} µs "
        f"(target < 100 µs: {'met' if chunk_us < 100 else 'not met'})",
    ]


def noise_lines(results: Results) -> list[str]:
    """Say when the floor understates the run's noise: a proxy cannot be faster than direct
    by more than noise, so an added figure below minus the floor is noise the floor missed."""
    misses = [
        f"{mode} {figure.label} at {k} streams"
        for k, by_mode in results.items()
        for figure in FIGURES
        for mode in ("nginx", "sidecar")
        if figure.value(by_mode[mode]) - figure.value(by_mode["direct"])
        < -figure.floor(by_mode["direct"])
    ]
    if not misses:
        return []
    return [
        f"- the noise floor understates this run's noise: {len(misses)} added figures are "
        f"below minus the floor ({', '.join(misses[:4])}{', ...' if len(misses) > 4 else ''}); "
        "run more rounds or on a quieter machine before reading the ratios"
    ]


def error_lines(results: Results) -> list[str]:
    return [
        f"- errors at {k} streams, {mode}: {samples.errors} of {samples.streams} streams"
        for k, by_mode in results.items()
        for mode, samples in by_mode.items()
        if samples.errors
    ]


def _mib(footprint: Footprint | None) -> str:
    if footprint is None:
        return "no process"
    plural = "" if footprint.processes == 1 else "es"
    return f"{footprint.rss_bytes / 2**20:.1f} MiB ({footprint.processes} process{plural})"


def analysis_note(footprint: dict[str, Footprint]) -> str:
    if "analysis" in footprint:
        return "the analysis process's CPU is its own column"
    return (
        f"the sidecar ran no process whose command line names {ANALYSIS_MARK}, so analysis "
        "ran in the forwarding process(es): the forwarding figure includes it"
    )


def rss_line(footprint: dict[str, Footprint]) -> str:
    return (
        f"RSS (VmRSS) at the end of the run: nginx {_mib(footprint.get('nginx'))}; sidecar "
        f"forwarding {_mib(footprint.get('sidecar'))}; sidecar analysis "
        f"{_mib(footprint.get('analysis'))}; upstream {_mib(footprint.get('upstream'))}"
    )


@dataclass(frozen=True, slots=True)
class Idle:
    """Each class of server process with no traffic: CPU and wake-ups per second."""

    seconds: float
    cpu_ms_per_s: dict[str, float]
    wakeups_per_s: dict[str, float]


async def measure_idle(trees: Sequence[Tree], seconds: float) -> Idle:
    """What the servers spend doing nothing: their timers, flushes and health checks."""

    def wakeups() -> dict[str, int]:
        counts: dict[str, int] = {}
        for tree in trees:
            for pid, name in tree.processes().items():
                counts[name] = counts.get(name, 0) + process_wakeups(pid)
        return counts

    cpu_before, woken_before = read_cpu(trees), wakeups()
    await asyncio.sleep(seconds)
    spent, woken = cpu_between(cpu_before, read_cpu(trees)), wakeups()
    return Idle(
        seconds,
        {name: ns / 1e6 / seconds for name, ns in spent.items()},
        {name: (woken[name] - woken_before.get(name, 0)) / seconds for name in woken},
    )


def idle_line(idle: Idle) -> str:
    cells = [
        f"{name} {idle.cpu_ms_per_s.get(name, 0.0):.2f} ms of CPU and "
        f"{idle.wakeups_per_s.get(name, 0.0):.1f} wake-ups a second"
        for name in ("nginx", "sidecar", "analysis")
    ]
    return (
        f"Idle, no traffic for {idle.seconds:g} s after start-up (sidecar: its forwarding "
        f"process(es); analysis: its analysis process): {'; '.join(cells)}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkersRepeat:
    """The no-gap round at the highest concurrency against a sidecar with ``--workers auto``,
    alternating with direct, after the main run's sidecar has stopped."""

    streams: int
    args: tuple[str, ...]
    samples: dict[str, Samples]
    footprint: dict[str, Footprint]


def no_gap_summary(direct: Usage, sidecar: Usage) -> str:
    shed = "absent" if sidecar.shed is None else f"{sidecar.shed:,}"
    speed = rate(sidecar.tokens, sidecar.wall_ns) / rate(direct.tokens, direct.wall_ns)
    forwarding = _number(sidecar.cpu_us_per("sidecar", sidecar.requests), 0)
    return (
        f"{shed} chunks shed, tokens/s x{speed:.2f} of direct, {forwarding} µs/request forwarding"
    )


def workers_lines(
    results: Results, main_args: Sequence[str], repeat: WorkersRepeat | None, has_workers: bool
) -> list[str]:
    if not has_workers:
        return [
            "- `semhealth run --help` has no `--workers`: the no-gap round was not repeated "
            "with `--workers auto`"
        ]
    if repeat is None:
        return []
    main = results[repeat.streams]
    d, s = repeat.samples["direct"].throughput, repeat.samples["sidecar"].throughput
    return [
        f"- no-gap round at {repeat.streams} streams, sidecar `{' '.join(main_args)}`: "
        f"{no_gap_summary(main['direct'].throughput, main['sidecar'].throughput)}",
        f"- the same round, then, against a fresh sidecar `{' '.join(repeat.args)}` "
        f"(direct measured again alongside): {no_gap_summary(d, s)}; at its end forwarding "
        f"{_mib(repeat.footprint.get('sidecar'))}, analysis "
        f"{_mib(repeat.footprint.get('analysis'))}",
    ]


def environment_line(loop_name: str, nginx: str) -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpus} CPUs usable ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
        f"event loop {loop_name}, {nginx}, {platform.system()} {platform.release()}"
    )


def options_line(options: Options, main_args: Sequence[str]) -> str:
    return (
        f"latency: {options.tokens} tokens per stream, {options.ttft_ms:g} ms to the first, "
        f"{options.gap_ms:g} ms gaps, at least {options.min_streams} streams per round; "
        f"{steady_line(options)}; "
        f"throughput: {options.throughput_tokens} tokens per round without gaps; "
        f"{options.rounds} rounds per mode, the order of direct/nginx/sidecar rotating; "
        f"nginx worker_processes {options.nginx_workers}; sidecar arguments: "
        f"{' '.join(main_args) or 'none'}"
    )


def steady_line(options: Options) -> str:
    if not options.steady_s:
        return "steady: off"
    return (
        f"steady: at K above 1, K workers opening those streams one after another for "
        f"{options.steady_s:g} s (CPU only)"
    )


def metrics_line(metrics: MetricSamples, sidecar_streams: int) -> str:
    def get(name: str, **labels: str) -> str:
        value = metric_value(metrics, name, **labels)
        return "absent" if value is None else f"{value:.0f}"

    return (
        f'sidecar after the run: semhealth_dropped_total{{stage="tap"}} = '
        f"{get('semhealth_dropped_total', stage='tap')}, semhealth_streams_shed_total = "
        f"{get('semhealth_streams_shed_total')}, semhealth_records_total = "
        f"{get('semhealth_records_total')} for {sidecar_streams} streams sent through it, "
        f"semhealth_analysis_errors_total = {get('semhealth_analysis_errors_total')}"
    )


# --------------------------------------------------------------------------- sidecar metrics

MetricSamples = list[tuple[str, dict[str, str], float]]


def parse_metrics(text: str) -> MetricSamples:
    """Every sample of a Prometheus text exposition: name, labels, value."""
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def metric_value(metrics: MetricSamples, name: str, **labels: str) -> float | None:
    """A sample's value summed over the label sets that carry ``labels``; None if none."""
    values = [
        value
        for sample, sample_labels, value in metrics
        if sample == name and all(sample_labels.get(k) == v for k, v in labels.items())
    ]
    return sum(values) if values else None


async def read_metrics(session: aiohttp.ClientSession, admin_url: str) -> MetricSamples:
    try:
        async with session.get(admin_url + "/metrics") as response:
            return parse_metrics(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []


async def settle_sidecar(
    session: aiohttp.ClientSession, admin_url: str, expected: int
) -> MetricSamples:
    """Wait (bounded) until the sidecar analysed every stream so far, so its analysis
    does not spill over into the next round and steal CPU from the other modes."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    metrics: MetricSamples = []
    while time.monotonic() < deadline:
        metrics = await read_metrics(session, admin_url)
        done = (metric_value(metrics, "semhealth_records_total") or 0.0) + (
            metric_value(metrics, "semhealth_analysis_errors_total") or 0.0
        )
        if done >= expected:
            break
        await asyncio.sleep(POLL_S)
    return metrics


# --------------------------------------------------------------------------- the run


RoundOf = Callable[[aiohttp.ClientSession, str], Awaitable[RoundResult]]


@dataclass(slots=True)
class Bench:
    """The modes measured, the servers behind them and the sidecar's running counts."""

    modes: tuple[str, ...]
    urls: dict[str, str]
    trees: tuple[Tree, ...]  # every server whose CPU a round reads
    sidecar: Server
    control: aiohttp.ClientSession
    sidecar_streams: int = 0
    tap_dropped: float | None = 0.0
    metrics: MetricSamples = field(default_factory=list)

    async def measure(
        self,
        sessions: dict[str, aiohttp.ClientSession],
        mode: str,
        run: RoundOf,
    ) -> RoundResult:
        before = read_cpu(self.trees)
        result = await run(sessions[mode], self.urls[mode])
        if mode != "sidecar":
            return dataclasses.replace(result, cpu_ns=cpu_between(before, read_cpu(self.trees)))
        # Idle first, measured from outside, so the CPU figures hold the analysis backlog
        # but not the /metrics renders that settle_sidecar then asks for.
        await wait_idle(self.sidecar.tree)
        cpu = cpu_between(before, read_cpu(self.trees))
        self.sidecar_streams += len(result.streams)
        self.metrics = await settle_sidecar(
            self.control, self.sidecar.admin_url, self.sidecar_streams
        )
        dropped = metric_value(self.metrics, "semhealth_dropped_total", stage="tap")
        shed = None
        if dropped is not None and self.tap_dropped is not None:
            shed = round(dropped - self.tap_dropped)
        self.tap_dropped = dropped
        return dataclasses.replace(result, cpu_ns=cpu, shed_chunks=shed)


def mode_order(modes: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    # Rotated, so over the rounds each mode runs in each position, after each of the others.
    shift = round_index % len(modes)
    return modes[shift:] + modes[:shift]


def round_of(*, workers: int, streams_per_worker: int, shape: Shape) -> RoundOf:
    def run(session: aiohttp.ClientSession, url: str) -> Awaitable[RoundResult]:
        return run_round(
            session, url, workers=workers, streams_per_worker=streams_per_worker, shape=shape
        )

    return run


def warm_up_round(options: Options, k: int) -> RoundOf:
    return round_of(workers=k, streams_per_worker=1, shape=Shape(tokens=options.tokens, gap_us=0))


def steady_round(options: Options, k: int) -> RoundOf:
    shape = Shape(tokens=options.tokens, gap_us=options.gap_us, ttft_us=options.ttft_us)

    async def run(session: aiohttp.ClientSession, url: str) -> RoundResult:
        return await run_steady(session, url, workers=k, seconds=options.steady_s, shape=shape)

    return run


def throughput_round(options: Options, k: int) -> RoundOf:
    shape = Shape(tokens=max(options.throughput_tokens // k, 1), gap_us=0)
    return round_of(workers=k, streams_per_worker=1, shape=shape)


@contextlib.asynccontextmanager
async def sessions_for(
    modes: Sequence[str], k: int
) -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    """One client session per mode, so each keeps its own pooled connections."""
    async with contextlib.AsyncExitStack() as stack:
        yield {mode: await stack.enter_async_context(client_session(k)) for mode in modes}


async def bench_concurrency(bench: Bench, options: Options, k: int) -> dict[str, Samples]:
    per_worker = max(math.ceil(options.min_streams / k), 1)
    latency = round_of(
        workers=k,
        streams_per_worker=per_worker,
        shape=Shape(tokens=options.tokens, gap_us=options.gap_us, ttft_us=options.ttft_us),
    )
    warm_up, throughput = warm_up_round(options, k), throughput_round(options, k)
    # At one stream a latency round is already steady: one stream after another.
    steady = steady_round(options, k) if k > 1 and options.steady_s > 0 else None
    samples = {mode: Samples() for mode in bench.modes}
    async with sessions_for(bench.modes, k) as sessions:
        for mode in bench.modes:  # warm-up: open the connections every way, discard the figures
            await bench.measure(sessions, mode, warm_up)
        for index in range(options.rounds):
            for mode in mode_order(bench.modes, index):
                samples[mode].add_latency(await bench.measure(sessions, mode, latency))
            if steady is not None:  # +1 as the throughput rounds: no mode runs twice in a row
                for mode in mode_order(bench.modes, index + 1):
                    samples[mode].add_steady(await bench.measure(sessions, mode, steady))
            for mode in mode_order(bench.modes, index + 1):
                samples[mode].add_throughput(await bench.measure(sessions, mode, throughput))
    return samples


async def bench_no_gap(bench: Bench, options: Options, k: int) -> dict[str, Samples]:
    """Only the throughput rounds of ``bench_concurrency``, as many, in the same order."""
    warm_up, throughput = warm_up_round(options, k), throughput_round(options, k)
    samples = {mode: Samples() for mode in bench.modes}
    async with sessions_for(bench.modes, k) as sessions:
        for mode in bench.modes:
            await bench.measure(sessions, mode, warm_up)
        for index in range(options.rounds):
            for mode in mode_order(bench.modes, index + 1):
                samples[mode].add_throughput(await bench.measure(sessions, mode, throughput))
    return samples


async def repeat_with_workers(
    group: Children, control: aiohttp.ClientSession, options: Options, upstream: Server
) -> WorkersRepeat:
    k = max(options.concurrency)
    args = (*options.sidecar_args, "--workers", "auto")  # the last --workers wins
    print(
        f"... {k} concurrent streams without gaps, sidecar --workers auto",
        file=sys.stderr,
        flush=True,
    )
    sidecar = await start_sidecar(group, control, upstream.url, args)
    bench = Bench(
        modes=("direct", "sidecar"),
        urls={"direct": upstream.url, "sidecar": sidecar.url},
        trees=(upstream.tree, sidecar.tree),
        sidecar=sidecar,
        control=control,
    )
    samples = await bench_no_gap(bench, options, k)
    return WorkersRepeat(
        streams=k, args=args, samples=samples, footprint=read_footprint((sidecar.tree,))
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Tools:
    """What the run found out about the programs it measures, before it started them."""

    nginx_version: str
    sidecar_has_workers: bool


def probe_tools(options: Options) -> Tools:
    assert options.nginx is not None  # check_options saw to it
    return Tools(
        nginx_version=nginx_version(options.nginx), sidecar_has_workers=sidecar_has_workers()
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts:
    """What the report says around the tables."""

    loop_name: str
    tools: Tools
    sidecar_args: tuple[str, ...]
    metrics: MetricSamples
    sidecar_streams: int
    footprint: dict[str, Footprint]
    repeat: WorkersRepeat | None
    idle: Idle
    load_before: float
    load_after: float


async def run_bench(options: Options, loop_name: str, tools: Tools) -> str:
    results: Results = {}
    load_before = os.getloadavg()[0]
    main_args = sidecar_args(options, "1" if tools.sidecar_has_workers else None)
    repeat = None
    with children() as group:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as control:
            upstream = await start_upstream(group, control)
            nginx = await start_nginx(group, control, options, upstream.url)
            sidecar = await start_sidecar(group, control, upstream.url, main_args)
            bench = Bench(
                modes=MODES,
                urls={"direct": upstream.url, "nginx": nginx.url, "sidecar": sidecar.url},
                trees=(upstream.tree, nginx.tree, sidecar.tree),
                sidecar=sidecar,
                control=control,
            )
            await wait_idle(sidecar.tree)
            idle = await measure_idle(bench.trees, IDLE_S)
            for k in options.concurrency:
                print(f"... {k} concurrent streams", file=sys.stderr, flush=True)
                results[k] = await bench_concurrency(bench, options, k)
            metrics = await settle_sidecar(control, sidecar.admin_url, bench.sidecar_streams)
            footprint = read_footprint(bench.trees)
            if tools.sidecar_has_workers:
                group.stop(sidecar.proc)  # its CPU and memory stay out of the repeat
                repeat = await repeat_with_workers(group, control, options, upstream)
    facts = RunFacts(
        loop_name=loop_name,
        tools=tools,
        sidecar_args=main_args,
        metrics=metrics,
        sidecar_streams=bench.sidecar_streams,
        footprint=footprint,
        repeat=repeat,
        idle=idle,
        load_before=load_before,
        load_after=os.getloadavg()[0],
    )
    return render_report(results, options, facts)


def render_report(results: Results, options: Options, facts: RunFacts) -> str:
    cpus = os.cpu_count() or 0
    note = (
        f"Note: upstream, nginx, sidecar and client share these {cpus} cores (1-minute load "
        f"average {facts.load_before:.1f} before the run, {facts.load_after:.1f} after); at "
        "high concurrency the CPU is saturated and every latency includes queueing, which is "
        "why each proxy is compared with direct, side by side, rather than in absolute terms."
    )
    shapes = {
        "latency": f"{options.gap_ms:g} ms gaps",
        "steady": f"steady, {options.gap_ms:g} ms gaps",
        "throughput": "no gaps",
    }
    parts = [
        f"Environment: {environment_line(facts.loop_name, facts.tools.nginx_version)}",
        f"Workload: {options_line(options, facts.sidecar_args)}",
        note,
        "",
        "Latency. A proxy's cell is its figure (added: minus direct's). The noise floor is "
        "how much direct differs from itself: the figure over its even rounds against its "
        "odd rounds. The ratio is sidecar-added / nginx-added where nginx's added figure is "
        "above that floor; otherwise the sidecar's added figure in floors.",
        "",
        latency_table(results),
        "",
        sample_line(results),
        "",
        "Throughput, no gaps between tokens:",
        "",
        throughput_table(results),
        "",
        "CPU per request for forwarding (nginx: master and workers; sidecar: its forwarding "
        "process(es)), and the sidecar's analysis process per content event relayed; the "
        "sidecar's whole tree (forwarding and analysis per request) against nginx; the "
        "upstream's from the direct rounds. Shed: chunks the sidecar's tap dropped "
        '(semhealth_dropped_total{stage="tap"}) in those rounds; steady: streams opened one '
        f"after another, not in waves; {analysis_note(facts.footprint)}:",
        "",
        cpu_table(results, shapes),
        "",
        *target_lines(results),
        *noise_lines(results),
        *error_lines(results),
        f"- {idle_line(facts.idle)}",
        f"- {rss_line(facts.footprint)}",
        *workers_lines(results, facts.sidecar_args, facts.repeat, facts.tools.sidecar_has_workers),
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
    tools = probe_tools(options)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        report = run_async(run_bench(options, loop_name, tools))
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
