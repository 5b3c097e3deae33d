"""Soak under overload: many concurrent streams through ``semhealth run`` for a long time,
with clients aborting at random, the relevance scorer saturated so it sheds, alert rules
evaluated, and OTLP pushed to a real receiver.

The pieces, on loopback:

* the bench upstream of ``proxy_overhead.py`` (one SSE event per token, paced);
* an OTLP/HTTP metrics receiver in this process, counting what the agent pushes;
* the sidecar, ``semhealth run`` (its forwarding and analysis processes), with relevance
  scoring on and a small in-flight limit so that scoring sheds, the default alert rules
  evaluated every second, and OTLP push every two seconds;
* this process's clients: ``--streams`` concurrent loops, each sending streamed chat requests
  one after another; a share (``--abort-rate``) hang up after a random number of events.

What counts as a client-visible error: a status other than 200, a failed connection, or a
stream that ended before ``data: [DONE]`` or with another number of content events than the
upstream sent, on a request the client did not abort itself.

Reported: client-visible errors (must be 0), what the agent shed by stage, resident memory
and open file descriptors of the forwarding and analysis processes over time (flat: under
5 % growth after the warm-up), the admin probe's latency (the forwarding process answers
``/healthz`` on its own event loop, so its tail is that loop's lag under load), and records
produced against streams completed (a stream that ends while ``limits.tap_queue_ends`` ends
wait for analysis gets none, counted). The last line reads
``soak: <streams> streams, <errors> client-visible errors, RSS growth <pct>%``; the exit
status is 1 when there were errors or when either process's RSS grew by 5 % or more after
the warm-up.

    python bench/soak.py               # 500 streams for 10 minutes
    python bench/soak.py --quick       # 40 streams for 30 s: the CI profile
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

import aiohttp
import orjson
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families
from proxy_overhead import (
    ANALYSIS_MARK,
    CHAT_PATH,
    GAP_HEADER,
    LOOPBACK,
    TOKENS_HEADER,
    Children,
    Tree,
    children,
    free_port,
    percentile,
    rss_bytes,
    start_server,
    start_upstream,
)

SIDECAR_MODULE = "semhealth.agent.cli"
GROWTH_LIMIT_PCT = 5.0
CACHE_ENTRIES = "semhealth_embedding_cache_entries"
# A question with context, so relevance has something to score.
REQUEST = {
    "model": "soak-model",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [
        {"role": "system", "content": "Context: the warehouse ships orders within two days."},
        {"role": "user", "content": "How long does shipping take?"},
    ],
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    streams: int
    duration_s: float
    warmup_s: float
    tokens: int
    gap_ms: float
    abort_rate: float
    sample_every_s: float
    seed: int


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short CI profile")
    parser.add_argument("--streams", type=int, help="concurrent streams (default 500)")
    parser.add_argument("--duration", type=float, help="seconds of load (default 600)")
    parser.add_argument("--warmup", type=float, help="seconds before growth is measured")
    parser.add_argument("--tokens", type=int, default=30, help="content events per stream")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="upstream gap per event")
    parser.add_argument("--abort-rate", type=float, default=0.1, help="share of clients aborting")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    quick = args.quick
    duration = args.duration or (30.0 if quick else 600.0)
    return Options(
        streams=args.streams or (40 if quick else 500),
        duration_s=duration,
        warmup_s=args.warmup if args.warmup is not None else min(duration / 3, 60.0),
        tokens=args.tokens,
        gap_ms=args.gap_ms,
        abort_rate=args.abort_rate,
        sample_every_s=2.0 if quick else 10.0,
        seed=args.seed,
    )


# --------------------------------------------------------------------------- OTLP receiver


@dataclass
class Receiver:
    """Counts the OTLP/HTTP metric exports the agent pushes, and their data points."""

    exports: int = 0
    points: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportMetricsServiceRequest.FromString(body)
        self.exports += 1
        self.points += sum(
            len(metric.sum.data_points) + len(metric.histogram.data_points)
            for resource in export.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        )
        return web.Response(
            body=ExportMetricsServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )


@contextlib.asynccontextmanager
async def receiving(receiver: Receiver) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/metrics", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port).start()
    try:
        yield f"http://{LOOPBACK}:{port}/v1/metrics"
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------- the sidecar


def sidecar_config(upstream: str, proxy: int, admin: int, otlp: str) -> str:
    return f"""\
upstream: {{url: '{upstream}'}}
listen: {{proxy: '{LOOPBACK}:{proxy}', admin: '{LOOPBACK}:{admin}'}}
relevance: {{enabled: auto, sample_rate: 1.0, max_in_flight: 4}}
telemetry: {{otlp: {{endpoint: '{otlp}', protocol: http/protobuf, interval_s: 2, timeout_s: 2}}}}
alerts: {{default_rules: true, evaluation_interval_s: 1}}
"""


async def start_sidecar(
    group: Children, control: aiohttp.ClientSession, upstream: str, otlp: str
) -> tuple[str, str, Tree]:
    proxy, admin = free_port(), free_port()
    directory = group.directory("semhealth-soak-")
    path = os.path.join(directory, "semhealth.yaml")
    # A few hundred bytes before anything runs: writing them blocks nothing that matters.
    with open(path, "w", encoding="utf-8") as config:  # noqa: ASYNC230
        config.write(sidecar_config(upstream, proxy, admin, otlp))
    admin_url = f"http://{LOOPBACK}:{admin}"
    cmd = [sys.executable, "-m", SIDECAR_MODULE, "run", "--config", path, "--log-level", "warning"]
    # Ready once the analysis process has loaded its encoders: slow on a busy machine.
    proc = await start_server(
        group, control, name="sidecar", cmd=cmd, ready_url=admin_url + "/readyz", timeout_s=180
    )
    tree = Tree(proc.pid, "forwarding", marks=((ANALYSIS_MARK, "analysis"),))
    return f"http://{LOOPBACK}:{proxy}", admin_url, tree


# --------------------------------------------------------------------------- clients


@dataclass
class Tally:
    completed: int = 0
    aborted: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


async def one_stream(
    session: aiohttp.ClientSession, url: str, options: Options, rng: random.Random, tally: Tally
) -> None:
    abort_after = rng.randrange(options.tokens) if rng.random() < options.abort_rate else None
    headers = {TOKENS_HEADER: str(options.tokens), GAP_HEADER: str(round(options.gap_ms * 1000))}
    events = 0
    done = False
    try:
        async with session.post(url + CHAT_PATH, data=orjson.dumps(REQUEST), headers=headers) as r:
            if r.status != 200:
                tally.error(f"status {r.status}")
                await r.read()
                return
            async for line in r.content:
                if line.startswith(b'data: {"bench_sent_ns"'):
                    events += 1
                    if abort_after is not None and events > abort_after:
                        tally.aborted += 1
                        r.close()  # hang up mid-stream, as an impatient client does
                        return
                elif line.startswith(b"data: [DONE]"):
                    done = True
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.error(type(exc).__name__)
        return
    if not done or events != options.tokens:
        tally.error("stream cut short")
        return
    tally.completed += 1


async def client_loop(
    session: aiohttp.ClientSession,
    url: str,
    options: Options,
    rng: random.Random,
    tally: Tally,
    stop_at: float,
) -> None:
    while time.monotonic() < stop_at:
        await one_stream(session, url, options, rng, tally)


# --------------------------------------------------------------------------- sampling


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    rss: dict[str, int]
    fds: dict[str, int]
    cache_entries: int = 0  # CACHE_ENTRIES: bounded memory that fills


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def read_sample(tree: Tree, t: float) -> Sample:
    rss: dict[str, int] = {}
    fds: dict[str, int] = {}
    for pid, name in tree.processes().items():
        rss[name] = rss.get(name, 0) + rss_bytes(pid)
        fds[name] = fds.get(name, 0) + open_fds(pid)
    return Sample(t, rss, fds)


async def take_sample(
    tree: Tree, t: float, control: aiohttp.ClientSession, admin_url: str
) -> Sample:
    """Memory and descriptors from /proc, and the embedding cache's size from /metrics: a
    cache filling is bounded memory, and the column tells it apart from a leak."""
    sample = read_sample(tree, t)
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        metrics = await agent_metrics(control, admin_url)
        sample = replace(sample, cache_entries=int(metrics.get(CACHE_ENTRIES, 0)))
    return sample


async def sample_loop(
    tree: Tree,
    admin_url: str,
    control: aiohttp.ClientSession,
    every_s: float,
    samples: list[Sample],
    probes_ns: list[int],
    start: float,
    stop_at: float,
) -> None:
    """Memory and descriptors every ``every_s``; the admin probe ten times a second."""
    next_sample = time.monotonic()
    while time.monotonic() < stop_at:
        now = time.monotonic()
        if now >= next_sample:
            samples.append(await take_sample(tree, now - start, control, admin_url))
            next_sample = now + every_s
        began = time.monotonic_ns()
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with control.get(admin_url + "/healthz") as response:
                await response.read()
                probes_ns.append(time.monotonic_ns() - began)
        await asyncio.sleep(0.1)


def growth_pct(samples: Sequence[Sample], warmup_s: float, what: str, name: str) -> float:
    """Growth of the last sample over the first one after the warm-up, in percent."""
    settled = [s for s in samples if s.t >= warmup_s]
    if len(settled) < 2:
        return 0.0
    first = getattr(settled[0], what).get(name, 0)
    last = getattr(settled[-1], what).get(name, 0)
    return 100.0 * (last - first) / first if first else 0.0


# --------------------------------------------------------------------------- the agent's view


async def agent_metrics(control: aiohttp.ClientSession, admin_url: str) -> dict[str, float]:
    """The agent's counters, summed by name plus one label where it tells stages apart."""
    async with control.get(admin_url + "/metrics") as response:
        text = await response.text()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if "stage" in sample.labels:
                key += f"{{{sample.labels['stage']}}}"
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


# --------------------------------------------------------------------------- the run


async def soak(options: Options) -> int:
    rng = random.Random(options.seed)
    tally = Tally()
    samples: list[Sample] = []
    probes_ns: list[int] = []
    receiver = Receiver()
    limits = aiohttp.TCPConnector(limit=options.streams + 10, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    with children() as group:
        async with (
            receiving(receiver) as otlp,
            aiohttp.ClientSession() as control,
            aiohttp.ClientSession(connector=limits, timeout=timeout) as session,
        ):
            upstream = await start_upstream(group, control)
            proxy_url, admin_url, tree = await start_sidecar(group, control, upstream.url, otlp)
            start = time.monotonic()
            stop_at = start + options.duration_s
            print(
                f"soak: {options.streams} streams for {options.duration_s:g} s "
                f"({options.tokens} events, {options.gap_ms:g} ms apart, "
                f"{options.abort_rate:.0%} of clients abort)",
                file=sys.stderr,
            )
            clients = [
                client_loop(
                    session, proxy_url, options, random.Random(rng.random()), tally, stop_at
                )
                for _ in range(options.streams)
            ]
            sampler = sample_loop(
                tree, admin_url, control, options.sample_every_s, samples, probes_ns, start, stop_at
            )
            await asyncio.gather(sampler, *clients)
            samples.append(await take_sample(tree, time.monotonic() - start, control, admin_url))
            await asyncio.sleep(3.0)  # the last records, and one more OTLP push
            metrics = await agent_metrics(control, admin_url)
    worst_growth = report(options, tally, samples, probes_ns, metrics, receiver)
    return exit_status(tally.error_count, worst_growth)


def exit_status(errors: int, rss_growth_pct: float) -> int:
    """1 when a client saw an error or memory was not flat after the warm-up, else 0."""
    return 1 if errors or rss_growth_pct >= GROWTH_LIMIT_PCT else 0


def report(
    options: Options,
    tally: Tally,
    samples: Sequence[Sample],
    probes_ns: Sequence[int],
    metrics: dict[str, float],
    receiver: Receiver,
) -> float:
    """Print the report; the worst RSS growth after the warm-up, in percent."""
    ended = tally.completed + tally.aborted
    records = metrics.get("semhealth_records_total", 0.0)
    unrecorded = metrics.get("semhealth_dropped_total{records}", 0.0)
    print(f"streams completed {tally.completed}, aborted by the client {tally.aborted}")
    print(f"client-visible errors: {tally.error_count} {tally.errors or ''}".rstrip())
    print(
        f"records produced {records:.0f} for {ended} streams ended "
        f"({records / max(ended, 1):.3f}); {unrecorded:.0f} ended while the tap's budget of "
        "ends was full (no record, counted)"
    )
    shed = {k: v for k, v in metrics.items() if k.startswith("semhealth_dropped_total")}
    stages = ", ".join(
        f"{key.split('{', 1)[1].rstrip('}')}={value:.0f}" for key, value in shed.items()
    )
    print(f"shed by stage: {stages or 'none'}")
    print(
        f"streams shed by the tap {metrics.get('semhealth_streams_shed_total', 0):.0f}, "
        f"tap wire resets {metrics.get('semhealth_tap_wire_resets_total', 0):.0f} "
        "(analysis fell too far behind: the streams in flight were lost to it, never to clients)"
    )
    print(f"relevance scored {metrics.get('semhealth_relevance_scored_total', 0):.0f}")
    print(f"OTLP exports received {receiver.exports} ({receiver.points} data points)")
    if probes_ns:
        p50, p99 = percentile(probes_ns, 0.5) / 1e6, percentile(probes_ns, 0.99) / 1e6
        print(
            f"admin probe (forwarding loop lag): p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
            f"max {max(probes_ns) / 1e6:.2f} ms"
        )
    header = f"{'t (s)':>7} {'fwd RSS MiB':>12} {'ana RSS MiB':>12} {'fwd fds':>8} {'ana fds':>8}"
    print(f"{header} {'cache entries':>14}")
    for sample in samples:
        print(
            f"{sample.t:7.0f} {sample.rss.get('forwarding', 0) / 2**20:12.1f} "
            f"{sample.rss.get('analysis', 0) / 2**20:12.1f} "
            f"{sample.fds.get('forwarding', 0):8d} {sample.fds.get('analysis', 0):8d} "
            f"{sample.cache_entries:14d}"
        )
    growth = {
        name: growth_pct(samples, options.warmup_s, "rss", name)
        for name in ("forwarding", "analysis")
    }
    fd_growth = {
        name: growth_pct(samples, options.warmup_s, "fds", name)
        for name in ("forwarding", "analysis")
    }
    print(
        "growth after warm-up: "
        + ", ".join(f"{n} RSS {g:+.1f}%, fds {fd_growth[n]:+.1f}%" for n, g in growth.items())
    )
    worst = max(growth.values())
    verdict = "flat" if worst < GROWTH_LIMIT_PCT else f"over the {GROWTH_LIMIT_PCT:g}% limit"
    print(f"memory: {verdict}")
    print(
        f"soak: {options.streams} streams, {tally.error_count} client-visible errors, "
        f"RSS growth {worst:.1f}%"
    )
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    with contextlib.suppress(AttributeError):
        import uvloop

        uvloop.install()
    return asyncio.run(soak(options))


if __name__ == "__main__":
    sys.exit(main())
