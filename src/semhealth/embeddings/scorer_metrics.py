"""The shared scorer's Prometheus metrics and the plain-HTTP ``/metrics`` listener.

Counters and gauges are read at scrape time from what the scorer already keeps
(``EncoderStats``: its per-encoder counters, the batcher's queue), so nothing is counted
twice. Only the histograms are observed as calls happen, into a registry of the scorer's
own (never prometheus_client's global one, so two scorers in a process never mix).

Each instrument, its unit and bucket family:

====================================================  =========  ============================
name                                                  kind       buckets / labels
====================================================  =========  ============================
semhealth_scorer_requests_total                       counter    encoder
semhealth_scorer_texts_total                          counter    encoder (texts answered)
semhealth_scorer_overloaded_texts_total               counter    encoder
semhealth_scorer_failed_requests_total                counter    encoder, code (gRPC status)
semhealth_scorer_rejected_requests_total              counter    encoder, reason (shed)
semhealth_scorer_expired_texts_total                  counter    encoder (dropped unencoded)
semhealth_scorer_refused_requests_total               counter    reason (token, limits)
semhealth_scorer_queue_texts                          gauge      encoder
semhealth_scorer_queue_capacity_texts                 gauge      encoder
semhealth_scorer_throughput_texts_per_second          gauge      encoder (recent batches)
semhealth_scorer_encoder_up                           gauge      encoder (1 loaded, serving)
semhealth_scorer_batch_texts                          histogram  BATCH_BUCKETS; encoder
semhealth_scorer_model_call_duration_seconds          histogram  LATENCY_BUCKETS_S; encoder
semhealth_scorer_embed_duration_seconds               histogram  LATENCY_BUCKETS_S; encoder, code
====================================================  =========  ============================
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from semhealth.embeddings.backend import Backend, Vectors

# 1 ms to 10 s: a cached text answers in about a millisecond; clients' deadlines are seconds.
LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# Texts per model call: powers of two up to the largest max_batch worth configuring.
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
# Calls that named no encoder this scorer serves (or could not be read) are counted here;
# the name a client sent is never a label value, so a bad client cannot add series.
NO_ENCODER = "unknown"
OK = "OK"


@dataclass(frozen=True, slots=True)
class Queue:
    """A served encoder's state now: what the gauges show."""

    up: bool  # loaded and its batcher's worker alive
    queued: int  # texts waiting in its batcher's queue
    queue_size: int  # the queue's capacity; 0 until loaded
    expired_texts: int = 0  # texts dropped before encoding: every caller had gone
    texts_per_s: float | None = None  # the batcher's throughput estimate; None: no batch yet


@dataclass(frozen=True, slots=True)
class EncoderStats:
    """One encoder's figures at one instant, as the scorer keeps them.

    ``queue`` is None for ``NO_ENCODER``: calls that named no served encoder have calls and
    failures but no texts or queue, and a gauge of 0 there would read as an encoder that is
    down.
    """

    encoder: str
    requests: int  # Embed calls received
    texts: int  # texts those calls had embedded
    overloaded_texts: int  # texts of calls answered RESOURCE_EXHAUSTED
    failed: Mapping[str, int]  # calls that ended with a non-OK gRPC status, by status name
    queue: Queue | None
    # Calls shed as overload, by reason (expected_wait, queue_full).
    rejected: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(slots=True)
class ScorerMetrics:
    """The scorer's registry: histograms it observes, counters it reads from ``stats``."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    batch_texts: Histogram = field(init=False)
    model_call_seconds: Histogram = field(init=False)
    embed_seconds: Histogram = field(init=False)

    def __post_init__(self) -> None:
        registry = self.registry
        self.batch_texts = Histogram(
            "semhealth_scorer_batch_texts",
            "Texts per model call the scorer's batcher made.",
            ["encoder"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.model_call_seconds = Histogram(
            "semhealth_scorer_model_call_duration_seconds",
            "Duration of one model call (a batch), failed ones included.",
            ["encoder"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.embed_seconds = Histogram(
            "semhealth_scorer_embed_duration_seconds",
            "Duration of an Embed RPC in the scorer, from receipt to answer, by gRPC status.",
            ["encoder", "code"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )

    def read_stats(
        self,
        stats: Callable[[], Sequence[EncoderStats]],
        refused: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        """Export the counters and gauges ``stats`` reports, and the calls ``refused``
        counts (by the scorer's guard, by reason), read at every scrape."""
        self.registry.register(_StatsCollector(stats, refused))

    def observe_batch(self, encoder: str, texts: int, seconds: float) -> None:
        self.batch_texts.labels(encoder).observe(texts)
        self.model_call_seconds.labels(encoder).observe(seconds)

    def observe_embed(self, encoder: str, code: str, seconds: float) -> None:
        self.embed_seconds.labels(encoder, code).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StatsCollector(Collector):
    def __init__(
        self,
        stats: Callable[[], Sequence[EncoderStats]],
        refused: Callable[[], Mapping[str, int]],
    ) -> None:
        self._stats = stats
        self._refused = refused

    def describe(self) -> list[object]:
        # Nothing to describe before a scrape: the families depend on the encoders served.
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        snapshot = self._stats()
        requests = _counter("requests", "Embed calls received.")
        texts = _counter("texts", "Texts Embed calls had embedded.")
        overloaded = _counter(
            "overloaded_texts", "Texts of Embed calls answered RESOURCE_EXHAUSTED (queue full)."
        )
        failed = CounterMetricFamily(
            "semhealth_scorer_failed_requests",
            "Embed calls that ended with a non-OK gRPC status.",
            labels=["encoder", "code"],
        )
        rejected = CounterMetricFamily(
            "semhealth_scorer_rejected_requests",
            "Embed calls shed as overload (RESOURCE_EXHAUSTED at once), by reason: "
            "expected_wait (it could not be answered before its deadline), queue_full.",
            labels=["encoder", "reason"],
        )
        expired = _counter(
            "expired_texts", "Texts dropped before encoding: every caller's deadline had passed."
        )
        queued = _gauge("queue_texts", "Texts waiting in the encoder's batcher queue.")
        capacity = _gauge("queue_capacity_texts", "Capacity of the encoder's batcher queue.")
        rate = _gauge(
            "throughput_texts_per_second",
            "The encoder's recent throughput, which admission by expected wait uses.",
        )
        up = _gauge("encoder_up", "1 when the encoder is loaded and serving, else 0.")
        for stats in snapshot:
            name = [stats.encoder]
            requests.add_metric(name, stats.requests)
            for code, count in sorted(stats.failed.items()):
                failed.add_metric([stats.encoder, code], count)
            for reason, count in sorted(stats.rejected.items()):
                rejected.add_metric([stats.encoder, reason], count)
            queue = stats.queue
            if queue is not None:  # a served encoder: texts reach its queue
                texts.add_metric(name, stats.texts)
                overloaded.add_metric(name, stats.overloaded_texts)
                expired.add_metric(name, queue.expired_texts)
                queued.add_metric(name, queue.queued)
                capacity.add_metric(name, queue.queue_size)
                rate.add_metric(name, queue.texts_per_s or 0.0)
                up.add_metric(name, 1.0 if queue.up else 0.0)
        refused = CounterMetricFamily(
            "semhealth_scorer_refused_requests",
            "Calls refused before reaching an encoder, by reason: unauthenticated, "
            "too_many_texts, too_many_bytes, rate_limited.",
            labels=["reason"],
        )
        for reason, count in sorted(self._refused().items()):
            refused.add_metric([reason], count)
        yield from (requests, texts, overloaded, failed, rejected, expired, refused)
        yield from (queued, capacity, rate, up)


def _counter(name: str, help_text: str) -> CounterMetricFamily:
    return CounterMetricFamily(f"semhealth_scorer_{name}", help_text, labels=["encoder"])


def _gauge(name: str, help_text: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"semhealth_scorer_{name}", help_text, labels=["encoder"])


class MeteredBackend:
    """A backend that reports each model call's size and duration, then passes it on.

    The batcher drives it like any backend (the one-method seam), so the scorer sees every
    batch without the batcher knowing about metrics.
    """

    def __init__(self, inner: Backend, observe: Callable[[int, float], None]) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        # The scorer's Info answer reads the device, when the backend has one.
        self.device = getattr(inner, "device", None)
        self._observe = observe

    async def embed(self, texts: Sequence[str]) -> Vectors:
        started = time.perf_counter()
        try:
            return await self.inner.embed(texts)
        finally:
            self._observe(len(texts), time.perf_counter() - started)

    async def aclose(self) -> None:
        await self.inner.aclose()


class MetricsServer:
    """Serves ``render()`` at ``GET /metrics`` over plain HTTP on ``host:port``.

    ``port`` 0 picks a free port; ``self.port`` is the bound one after ``start``.
    """

    def __init__(self, render: Callable[[], bytes], host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._render = render
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Bind and serve; raises ``OSError`` when the address cannot be bound."""
        if self._runner is not None:
            return
        runner = web.AppRunner(_metrics_app(self._render), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = _bound_port(runner, self.port)

    async def shutdown(self) -> None:
        """Stop serving; safe without ``start`` and twice."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


def _metrics_app(render: Callable[[], bytes]) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        # Off the loop: a scrape must not hold up the Embed calls sharing it.
        body = await asyncio.to_thread(render)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked
