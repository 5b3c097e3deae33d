"""The scorer's Prometheus metrics: a real scorer and model, real gRPC calls, then a scrape of
``/metrics`` over HTTP, checking each series moved by exactly what the calls did."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import aiohttp
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from semhealth.embeddings.backend import Backend
from semhealth.embeddings.config import Batching
from semhealth.embeddings.errors import BackendError, Overloaded
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.remote_scorer import RemoteScorerBackend
from semhealth.embeddings.scorer_metrics import (
    BATCH_BUCKETS,
    LATENCY_BUCKETS_S,
    NO_ENCODER,
    MetricsServer,
)
from semhealth.embeddings.scorer_service import ScorerServer, ServedEncoder, serve_scorer
from tests.embeddings.test_scorer_service import WorkerKiller
from tests.embeddings.wrappers import Failing, Gated, Recording
from tests.servers import free_port

ENCODER = "minilm"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@asynccontextmanager
async def scraped_scorer(
    load: Callable[[], Backend], batching: Batching | None = None
) -> AsyncIterator[tuple[ScorerServer, MetricsServer]]:
    """A scorer that loads ``load``'s backend itself (so its model calls are measured), and
    its ``/metrics`` listener on a free loopback port."""
    encoder = ServedEncoder(load, batching or Batching(flush_timeout_s=0.002))
    server = await serve_scorer({ENCODER: encoder})
    metrics = MetricsServer(server.metrics.render, "127.0.0.1", 0)
    try:
        await metrics.start()
        yield server, metrics
    finally:
        await server.shutdown(1.0)
        await metrics.shutdown()


@asynccontextmanager
async def client_of(
    server: ScorerServer, encoder: str = ENCODER, timeout_s: float = 5.0
) -> AsyncIterator[RemoteScorerBackend]:
    client = RemoteScorerBackend(f"127.0.0.1:{server.port}", encoder, timeout_s)
    try:
        yield client
    finally:
        await client.aclose()


async def scrape(metrics: MetricsServer) -> Samples:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{metrics.port}/metrics") as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, encoder: str = ENCODER, **labels: str) -> float:
    return samples[(name, frozenset({"encoder": encoder, **labels}.items()))]


def failed(samples: Samples, code: str, encoder: str = ENCODER) -> float:
    """Calls that ended with ``code``; a code no call ended with has no series yet."""
    key = frozenset({"encoder": encoder, "code": code}.items())
    return samples.get(("semhealth_scorer_failed_requests_total", key), 0.0)


def queued(server: ScorerServer) -> int:
    queue = server.encoder_stats()[0].queue
    return queue.queued if queue is not None else 0


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


# -- what the calls did ----------------------------------------------------------------------


async def test_embed_calls_move_the_counters_and_histograms(minilm: LocalBackend) -> None:
    recording = Recording(minilm)
    async with scraped_scorer(lambda: recording) as (server, metrics):
        await server.wait_ready()
        async with client_of(server) as client:
            await client.embed(["alpha one", "beta two", "gamma three"])
            await client.embed(["delta four", "epsilon five"])
        samples = await scrape(metrics)

    calls = len(recording.calls)
    assert value(samples, "semhealth_scorer_requests_total") == 2
    assert value(samples, "semhealth_scorer_texts_total") == 5
    assert value(samples, "semhealth_scorer_overloaded_texts_total") == 0
    assert value(samples, "semhealth_scorer_encoder_up") == 1
    assert value(samples, "semhealth_scorer_queue_texts") == 0
    assert value(samples, "semhealth_scorer_queue_capacity_texts") == Batching().queue_size
    # Every text is new, so every one reached the model, in as many calls as it made.
    assert value(samples, "semhealth_scorer_batch_texts_sum") == 5
    assert value(samples, "semhealth_scorer_batch_texts_count") == calls
    assert value(samples, "semhealth_scorer_model_call_duration_seconds_count") == calls
    assert value(samples, "semhealth_scorer_model_call_duration_seconds_sum") > 0
    assert value(samples, "semhealth_scorer_embed_duration_seconds_count", code="OK") == 2
    embedded_s = value(samples, "semhealth_scorer_embed_duration_seconds_sum", code="OK")
    model_s = value(samples, "semhealth_scorer_model_call_duration_seconds_sum")
    assert embedded_s >= model_s  # an Embed waits for its batches, and then some
    assert not any(name == "semhealth_scorer_failed_requests_total" for name, _ in samples)


async def test_cached_texts_are_answered_without_a_model_call(minilm: LocalBackend) -> None:
    async with scraped_scorer(lambda: Recording(minilm)) as (server, metrics):
        await server.wait_ready()
        async with client_of(server) as client:
            await client.embed(["the same text"])
            await client.embed(["the same text"])
        samples = await scrape(metrics)
    assert value(samples, "semhealth_scorer_texts_total") == 2
    assert value(samples, "semhealth_scorer_batch_texts_sum") == 1


async def test_a_full_queue_counts_the_rejected_texts(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    batching = Batching(queue_size=4, max_batch=4, flush_timeout_s=0.0)
    async with scraped_scorer(lambda: gated, batching) as (server, metrics):
        await server.wait_ready()
        async with client_of(server) as client:
            try:
                first = asyncio.create_task(client.embed([f"first {i}" for i in range(4)]))
                await gated.entered.wait()  # the worker holds these four
                second = asyncio.create_task(client.embed([f"second {i}" for i in range(4)]))
                await until(lambda: queued(server) == 4)  # these fill it
                with pytest.raises(Overloaded):
                    await client.embed(["one too many", "and another"])
                full = await scrape(metrics)
            finally:
                gated.release()
            await first
            await second
        after = await scrape(metrics)

    assert value(full, "semhealth_scorer_queue_texts") == 4
    assert value(full, "semhealth_scorer_queue_capacity_texts") == 4
    assert value(full, "semhealth_scorer_overloaded_texts_total") == 2
    assert failed(full, "RESOURCE_EXHAUSTED") == 1
    code = "RESOURCE_EXHAUSTED"
    assert value(full, "semhealth_scorer_embed_duration_seconds_count", code=code) == 1
    assert value(after, "semhealth_scorer_queue_texts") == 0
    assert value(after, "semhealth_scorer_requests_total") == 3
    assert value(after, "semhealth_scorer_texts_total") == 8


async def test_a_passed_deadline_is_counted_as_a_failed_call(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    async with scraped_scorer(lambda: gated) as (server, metrics):
        await server.wait_ready()
        async with client_of(server, timeout_s=0.2) as client:
            try:
                with pytest.raises(Overloaded, match="did not answer 1 texts"):
                    await client.embed(["waits past its deadline"])
                await until(lambda: server.stats().expired == 1)
                samples = await scrape(metrics)
            finally:
                gated.release()

    # The scorer's own timer or the client's cancel, whichever reached it first.
    assert failed(samples, "DEADLINE_EXCEEDED") + failed(samples, "CANCELLED") == 1
    assert value(samples, "semhealth_scorer_texts_total") == 0


async def test_an_unknown_encoder_is_counted_without_its_name(minilm: LocalBackend) -> None:
    async with scraped_scorer(lambda: Recording(minilm)) as (server, metrics):
        await server.wait_ready()
        async with client_of(server, encoder="chosen-by-a-client") as client:
            with pytest.raises(BackendError, match="NOT_FOUND"):
                await client.embed(["anything"])
        samples = await scrape(metrics)

    assert failed(samples, "NOT_FOUND", encoder=NO_ENCODER) == 1
    assert value(samples, "semhealth_scorer_requests_total", encoder=NO_ENCODER) == 1
    assert value(samples, "semhealth_scorer_requests_total") == 0
    labels = {label for _, pairs in samples for _, label in pairs}
    assert "chosen-by-a-client" not in labels
    # No queue behind it: an up gauge of 0 would read as an encoder that is down.
    up = {
        dict(pairs)["encoder"] for name, pairs in samples if name == "semhealth_scorer_encoder_up"
    }
    assert up == {ENCODER}


async def test_an_encoder_is_down_until_its_model_loads(minilm: LocalBackend) -> None:
    loaded = threading.Event()

    def load() -> Backend:
        loaded.wait(timeout=10.0)
        return Recording(minilm)

    async with scraped_scorer(load) as (server, metrics):
        try:
            loading = await scrape(metrics)
        finally:
            loaded.set()
        await server.wait_ready()
        ready = await scrape(metrics)

    assert value(loading, "semhealth_scorer_encoder_up") == 0
    assert value(loading, "semhealth_scorer_queue_capacity_texts") == 0
    assert value(ready, "semhealth_scorer_encoder_up") == 1


async def test_an_encoder_whose_worker_died_is_down(minilm: LocalBackend) -> None:
    async with scraped_scorer(lambda: Failing(minilm, WorkerKiller())) as (server, metrics):
        await server.wait_ready()
        async with client_of(server) as client:
            with pytest.raises(BackendError, match="INTERNAL"):
                await client.embed(["ends the worker"])
        samples = await scrape(metrics)
    assert value(samples, "semhealth_scorer_encoder_up") == 0
    assert failed(samples, "INTERNAL") == 1


# -- the instruments and the listener --------------------------------------------------------


def test_bucket_boundaries_are_pinned() -> None:
    # A change here changes every dashboard's quantiles: make it on purpose.
    assert LATENCY_BUCKETS_S == (
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
    )  # fmt: skip
    assert BATCH_BUCKETS == (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)


async def test_each_scorer_has_its_own_registry(minilm: LocalBackend) -> None:
    first = ScorerServer({ENCODER: ServedEncoder(lambda: Recording(minilm))})
    second = ScorerServer({ENCODER: ServedEncoder(lambda: Recording(minilm))})
    assert first.metrics.registry is not second.metrics.registry
    assert (
        REGISTRY.get_sample_value("semhealth_scorer_requests_total", {"encoder": ENCODER}) is None
    )


async def test_the_listener_shuts_down_without_start_and_twice() -> None:
    listener = MetricsServer(lambda: b"", "127.0.0.1", 0)
    await listener.shutdown()
    await listener.shutdown()


async def test_a_fresh_listener_serves_on_the_same_port_after_shutdown() -> None:
    port = free_port()
    for body in (b"first\n", b"second\n"):
        listener = MetricsServer(partial(bytes, body), "127.0.0.1", port)
        await listener.start()
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/metrics") as response,
            ):
                assert await response.read() == body
        finally:
            await listener.shutdown()
            await listener.shutdown()


async def test_a_port_in_use_fails_start() -> None:
    taken = MetricsServer(lambda: b"", "127.0.0.1", 0)
    await taken.start()
    try:
        with pytest.raises(OSError):
            await MetricsServer(lambda: b"", "127.0.0.1", taken.port).start()
    finally:
        await taken.shutdown()
