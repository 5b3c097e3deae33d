"""The shared scorer service and its client, over real gRPC on loopback with the real model."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import grpc  # type: ignore[import-untyped]
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from semhealth.embeddings import _wire
from semhealth.embeddings.backend import Backend, Vectors
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.config import Batching
from semhealth.embeddings.errors import BackendError, EncoderNotServed, ModelLoadError, Overloaded
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.remote_scorer import DEADLINE, RemoteScorerBackend, ScorerOverloaded
from semhealth.embeddings.scorer_service import ScorerServer, ServedEncoder, serve_scorer
from tests.embeddings.loopback import TEXTS, assert_same_scores, relevance_cases
from tests.embeddings.wrappers import Failing, Gated, Recording

ENCODER = "minilm"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Scaled(Recording):
    """Answers rows three times too long: a scorer whose backend forgot to normalise."""

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await super().embed(texts) * np.float32(3.0)


class Closing(Recording):
    """Remembers being closed."""

    closed = False

    async def aclose(self) -> None:
        self.closed = True


@asynccontextmanager
async def serving(
    backend: Backend, batching: Batching | None = None
) -> AsyncIterator[tuple[ScorerServer, MicroBatcher]]:
    batcher = MicroBatcher(backend, batching or Batching(flush_timeout_s=0.002))
    await batcher.start()
    server = await serve_scorer({ENCODER: batcher})
    try:
        await server.wait_ready()
        yield server, batcher
    finally:
        await server.shutdown(1.0)
        await batcher.shutdown(1.0)


@asynccontextmanager
async def client_of(
    server: ScorerServer, encoder: str = ENCODER, timeout_s: float = 5.0
) -> AsyncIterator[RemoteScorerBackend]:
    client = RemoteScorerBackend(f"127.0.0.1:{server.port}", encoder, timeout_s)
    try:
        yield client
    finally:
        await client.aclose()


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait for a count the scorer keeps; it has no event to wait on, so poll."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def health_of(server: ScorerServer, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
    return int(answer.status)


async def watch_health_until(server: ScorerServer, status: int) -> None:
    """Follow the health service's Watch stream until it reports ``status``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        async for answer in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5.0):
            if answer.status == status:
                return
    raise AssertionError(f"the health stream ended before reporting {status}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- the same vectors and scores as the local model ------------------------------------------


async def test_gives_the_local_backends_vectors(minilm: LocalBackend, reference: Vectors) -> None:
    async with serving(minilm) as (server, _), client_of(server) as client:
        got = await client.embed(TEXTS)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference, atol=1e-5)


async def test_gives_the_local_backends_relevance_scores(minilm: LocalBackend) -> None:
    async with serving(minilm) as (server, _), client_of(server) as client:
        await assert_same_scores(client, minilm, relevance_cases())


async def test_the_client_normalises_rows_the_scorer_did_not(minilm: LocalBackend) -> None:
    async with serving(Scaled(minilm)) as (server, _), client_of(server) as client:
        norms = np.linalg.norm(await client.embed(TEXTS[:3]), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)


async def test_a_lone_surrogate_does_not_fail_the_call(minilm: LocalBackend) -> None:
    async with serving(minilm) as (server, _), client_of(server) as client:
        got = await client.embed(["fine", "bad \ud800 text"])
    np.testing.assert_allclose(got, await minilm.embed(["fine", "bad ? text"]), atol=1e-5)


async def test_an_empty_call_makes_no_rpc(minilm: LocalBackend) -> None:
    async with serving(minilm) as (server, _), client_of(server) as client:
        await client.connect()
        assert (await client.embed([])).shape == (0, 384)
        assert server.stats().rpcs == 0


# -- batching across callers -----------------------------------------------------------------


async def test_concurrent_clients_are_batched_together(minilm: LocalBackend) -> None:
    gated = Gated(minilm)
    texts = [
        f"client {client} asks question {question}" for client in range(4) for question in range(5)
    ]
    async with serving(gated, Batching(flush_timeout_s=0.01)) as (server, _):
        clients = [RemoteScorerBackend(f"127.0.0.1:{server.port}", ENCODER) for _ in range(4)]
        calls = [
            asyncio.create_task(clients[index // 5].embed([text]))
            for index, text in enumerate(texts)
        ]
        # Hold the first batch until every RPC has reached the scorer.
        await until(lambda: server.stats().rpcs == len(texts))
        gated.release()
        rows = await asyncio.gather(*calls)
        for client in clients:
            await client.aclose()
    assert len(gated.calls) < len(texts)
    assert sum(len(call) for call in gated.calls) == len(texts)
    np.testing.assert_allclose(np.concatenate(rows), await minilm.embed(texts), atol=1e-5)


# -- Info and health -------------------------------------------------------------------------


async def test_info_tells_the_encoders_model_width_and_device(minilm: LocalBackend) -> None:
    async with serving(minilm) as (server, _), client_of(server) as client:
        info = await client.connect()
    assert info == _wire.Info(ENCODER, minilm.name, 384, minilm.device)
    assert (client.dim, client.device) == (384, minilm.device)


async def test_health_reports_serving_once_loaded(minilm: LocalBackend) -> None:
    async with serving(minilm) as (server, _):
        assert await health_of(server) == SERVING
        assert await health_of(server, _wire.SERVICE) == SERVING


async def test_health_reports_not_serving_while_the_model_loads(minilm: LocalBackend) -> None:
    loaded = threading.Event()

    def load() -> Backend:
        loaded.wait(timeout=10.0)
        return Recording(minilm)

    server = await serve_scorer({ENCODER: ServedEncoder(load)})
    try:
        assert await health_of(server) == NOT_SERVING
        async with client_of(server) as client:
            with pytest.raises(BackendError, match="UNAVAILABLE") as caught:
                await client.embed(TEXTS[:1])
            assert caught.value.retryable
            loaded.set()
            await server.wait_ready()
            assert await health_of(server) == SERVING
            assert (await client.embed(TEXTS[:1])).shape == (1, 384)
    finally:
        loaded.set()
        await server.shutdown(1.0)


async def test_a_model_that_fails_to_load_fails_start_up(minilm: LocalBackend) -> None:
    failures: list[BaseException] = []

    def load() -> Backend:
        raise ModelLoadError("no weights here")

    server = await serve_scorer({ENCODER: ServedEncoder(load)}, on_task_failure=failures.append)
    try:
        with pytest.raises(ModelLoadError, match="no weights here"):
            await server.wait_ready()
        assert len(failures) == 1
        assert await health_of(server) == NOT_SERVING
        async with client_of(server) as client:
            with pytest.raises(BackendError, match="FAILED_PRECONDITION") as caught:
                await client.embed(TEXTS[:1])
        assert not caught.value.retryable
    finally:
        await server.shutdown(1.0)


async def test_an_unexpected_load_failure_becomes_a_model_load_error() -> None:
    def load() -> Backend:
        raise RuntimeError("CUDA driver missing")

    server = await serve_scorer({ENCODER: ServedEncoder(load)})
    try:
        with pytest.raises(ModelLoadError, match="RuntimeError") as caught:
            await server.wait_ready()
        assert isinstance(caught.value.__cause__, RuntimeError)
    finally:
        await server.shutdown(1.0)


class WorkerKiller(BaseException):
    """Not an Exception: escapes the batcher's per-batch handler and ends its worker."""


async def test_a_dead_worker_turns_health_to_not_serving(minilm: LocalBackend) -> None:
    failures: list[BaseException] = []
    encoder = ServedEncoder(lambda: Failing(minilm, WorkerKiller()))
    server = await serve_scorer({ENCODER: encoder}, on_task_failure=failures.append)
    try:
        await server.wait_ready()
        assert await health_of(server) == SERVING
        async with client_of(server) as client:
            with pytest.raises(BackendError, match="INTERNAL") as caught:
                await client.embed(TEXTS[:1])
        assert not caught.value.retryable
        assert len(failures) == 1
        await watch_health_until(server, NOT_SERVING)
    finally:
        await server.shutdown(1.0)


# -- deadlines, overload, failures -----------------------------------------------------------


async def test_a_deadline_shorter_than_the_batch_is_shed_by_the_client(
    minilm: LocalBackend,
) -> None:
    gated = Gated(minilm)
    async with serving(gated) as (server, _), client_of(server, timeout_s=0.2) as client:
        try:
            with pytest.raises(ScorerOverloaded, match="did not answer 2 texts") as caught:
                await client.embed(TEXTS[:2])
            # Overload, as the sidecar counts it: shed work, not an error.
            assert isinstance(caught.value, Overloaded)
            assert caught.value.reason == DEADLINE
            # The scorer gave up its wait for the batch too.
            await until(lambda: server.stats().expired == 1)
            assert server.stats().texts == 0
        finally:
            gated.release()


async def test_a_full_queue_answers_resource_exhausted_and_the_client_sheds(
    minilm: LocalBackend,
) -> None:
    gated = Gated(minilm)
    batching = Batching(queue_size=4, max_batch=4, flush_timeout_s=0.0)
    async with serving(gated, batching) as (server, batcher), client_of(server) as client:
        try:
            first = asyncio.create_task(client.embed([f"first {i}" for i in range(4)]))
            await gated.entered.wait()  # the worker holds these four
            second = asyncio.create_task(client.embed([f"second {i}" for i in range(4)]))
            await until(lambda: batcher.stats().waiting == 4)  # and these fill the queue
            with pytest.raises(Overloaded) as caught:
                await client.embed(["one too many"])
            assert (caught.value.requested, caught.value.free, caught.value.queue_size) == (1, 0, 4)
            assert server.stats().overloaded == 1
        finally:
            gated.release()
        assert (await first).shape == (await second).shape == (4, 384)


async def test_a_retryable_backend_failure_is_retryable_for_the_client(
    minilm: LocalBackend,
) -> None:
    failing = Failing(minilm, BackendError("GPU busy", retryable=True))
    async with serving(failing) as (server, _), client_of(server) as client:
        with pytest.raises(BackendError, match="UNAVAILABLE") as caught:
            await client.embed(TEXTS[:2])
        assert caught.value.retryable
        assert server.stats().failed == 1


async def test_a_permanent_backend_failure_is_permanent_for_the_client(
    minilm: LocalBackend,
) -> None:
    failing = Failing(minilm, BackendError("wrong shape", retryable=False))
    async with serving(failing) as (server, _), client_of(server) as client:
        with pytest.raises(BackendError, match="INTERNAL") as caught:
            await client.embed(TEXTS[:2])
        assert not caught.value.retryable


async def test_an_unknown_encoder_is_a_permanent_error_naming_what_is_served(
    minilm: LocalBackend,
) -> None:
    async with serving(minilm) as (server, _), client_of(server, encoder="other") as client:
        with pytest.raises(EncoderNotServed, match="does not serve encoder 'other'") as caught:
            await client.connect()
        assert not caught.value.retryable
        assert caught.value.served == ("minilm",)


async def test_a_malformed_request_is_refused_as_an_invalid_argument(
    minilm: LocalBackend,
) -> None:
    async with serving(minilm) as (server, _):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            raw = channel.unary_unary(_wire.EMBED_METHOD)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await raw(b'{"encoder": "minilm", "texts": "not a list"}', timeout=2.0)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'texts' is not a list of strings" in caught.value.details()


async def test_no_scorer_listening_is_a_retryable_error() -> None:
    client = RemoteScorerBackend(f"127.0.0.1:{free_port()}", ENCODER, timeout_s=2.0)
    try:
        with pytest.raises(BackendError, match="UNAVAILABLE") as caught:
            await client.embed(TEXTS[:1])
        assert caught.value.retryable
    finally:
        await client.aclose()


async def test_embed_after_the_client_closes_is_permanent(minilm: LocalBackend) -> None:
    async with serving(minilm) as (server, _), client_of(server) as client:
        await client.aclose()
        await client.aclose()
        with pytest.raises(BackendError, match="closed") as caught:
            await client.embed(TEXTS[:1])
        assert not caught.value.retryable


def test_client_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s must be more than 0"):
        RemoteScorerBackend("127.0.0.1:1", ENCODER, 0.0)
    with pytest.raises(ValueError, match="encoder is empty"):
        RemoteScorerBackend("127.0.0.1:1", "")


def test_the_client_does_not_import_torch() -> None:
    probe = "import semhealth.embeddings.remote_scorer, sys; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


# -- lifecycle -------------------------------------------------------------------------------


async def test_shutdown_without_start_is_safe_twice(minilm: LocalBackend) -> None:
    server = ScorerServer({ENCODER: ServedEncoder(lambda: Recording(minilm))})
    await server.shutdown()
    await server.shutdown()


async def test_a_fresh_scorer_serves_on_the_same_config_after_shutdown(
    minilm: LocalBackend,
) -> None:
    port = free_port()
    for _ in range(2):
        server = await serve_scorer({ENCODER: ServedEncoder(lambda: Recording(minilm))}, port=port)
        try:
            await server.wait_ready()
            async with client_of(server) as client:
                assert (await client.embed(TEXTS[:1])).shape == (1, 384)
        finally:
            await server.shutdown(1.0)
        await server.shutdown(1.0)


async def test_shutdown_closes_what_the_scorer_built_and_leaves_what_it_was_given(
    minilm: LocalBackend,
) -> None:
    built = Closing(minilm)
    given = MicroBatcher(Closing(minilm))
    await given.start()
    server = await serve_scorer({"built": ServedEncoder(lambda: built), "given": given})
    await server.wait_ready()
    await server.shutdown(1.0)
    try:
        assert built.closed
        assert (await given.embed(TEXTS[:1])).shape == (1, 384)
    finally:
        await given.shutdown()


async def test_a_port_in_use_fails_start(minilm: LocalBackend) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ScorerServer({ENCODER: ServedEncoder(lambda: Recording(minilm))}, port=port)
        with pytest.raises(OSError, match="could not bind"):
            await server.start()
        await server.shutdown()
