"""The scorer's locked port: TLS, mutual TLS, a bearer token, and limits per call and caller.

Real gRPC on loopback with the real model; certificates made with ``cryptography``. Each
refusal must reach the client with the right status (shed, or a permanent error) and be
counted by reason, and no token may appear in a log or an error message.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.config import Batching
from semhealth.embeddings.errors import BackendError, Overloaded
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.remote_scorer import (
    RemoteScorerBackend,
    ScorerOverloaded,
    tls_credentials,
)
from semhealth.embeddings.scorer_guard import (
    RATE_LIMITED,
    TOO_MANY_BYTES,
    TOO_MANY_TEXTS,
    UNAUTHENTICATED,
    ScorerGuard,
    ScorerLimits,
    ScorerTls,
)
from semhealth.embeddings.scorer_service import ScorerServer, serve_scorer
from tests.embeddings.certs import Pki, make_pki
from tests.embeddings.loopback import TEXTS

ENCODER = "minilm"
TOKEN = "s3cret-token-8f2a"


@asynccontextmanager
async def guarded(
    minilm: LocalBackend, *, credentials: Any = None, guard: ScorerGuard | None = None
) -> AsyncIterator[ScorerServer]:
    batcher = MicroBatcher(minilm, Batching(flush_timeout_s=0.002))
    await batcher.start()
    server = await serve_scorer({ENCODER: batcher}, credentials=credentials, guard=guard)
    try:
        await server.wait_ready()
        yield server
    finally:
        await server.shutdown(1.0)
        await batcher.shutdown(1.0)


async def embed_with(server: ScorerServer, texts: list[str], **settings: Any) -> Vectors:
    """One call from a fresh client, as a sidecar makes it; the client is closed after."""
    host = settings.pop("host", "127.0.0.1")
    client = RemoteScorerBackend(f"{host}:{server.port}", ENCODER, 10.0, **settings)
    try:
        return await client.embed(texts)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# -- TLS and mutual TLS ----------------------------------------------------------------------


async def test_tls_serves_a_client_that_trusts_the_ca(
    minilm: LocalBackend, pki: Pki, reference: Vectors
) -> None:
    tls = ScorerTls(cert_file=pki.server.cert, key_file=pki.server.key)
    async with guarded(minilm, credentials=tls.credentials()) as server:
        got = await embed_with(server, TEXTS, credentials=tls_credentials(pki.ca))
        # A name the certificate carries, asked for explicitly.
        named = await embed_with(
            server, TEXTS[:2], credentials=tls_credentials(pki.ca), server_name="localhost"
        )
        # Plain text to a TLS port never gets an answer.
        with pytest.raises(BackendError, match="UNAVAILABLE"):
            await embed_with(server, TEXTS[:1])
    np.testing.assert_allclose(got, reference, atol=1e-5)
    np.testing.assert_allclose(named, reference[:2], atol=1e-5)


async def test_tls_refuses_a_client_that_does_not_trust_the_certificate(
    minilm: LocalBackend, pki: Pki, tmp_path: Path
) -> None:
    stranger = make_pki(tmp_path, "another CA")
    tls = ScorerTls(cert_file=pki.server.cert, key_file=pki.server.key)
    async with guarded(minilm, credentials=tls.credentials()) as server:
        with pytest.raises(BackendError, match="UNAVAILABLE"):
            await embed_with(server, TEXTS[:1], credentials=tls_credentials(stranger.ca))
        assert server.stats().rpcs == 0


async def test_mutual_tls_takes_only_clients_with_a_certificate_of_its_ca(
    minilm: LocalBackend, pki: Pki, tmp_path: Path
) -> None:
    tls = ScorerTls(cert_file=pki.server.cert, key_file=pki.server.key, client_ca_file=pki.ca)
    sidecar = pki.client(tmp_path, "sidecar-a")
    stranger = make_pki(tmp_path, "another CA").client(tmp_path, "intruder")
    async with guarded(minilm, credentials=tls.credentials()) as server:
        mutual = tls_credentials(pki.ca, sidecar.cert, sidecar.key)
        assert (await embed_with(server, TEXTS[:2], credentials=mutual)).shape == (2, 384)
        for credentials in (
            tls_credentials(pki.ca),  # no client certificate
            tls_credentials(pki.ca, stranger.cert, stranger.key),  # one of another CA
        ):
            with pytest.raises(BackendError, match="UNAVAILABLE"):
                await embed_with(server, TEXTS[:1], credentials=credentials)
        assert server.stats().rpcs == 1


def test_unreadable_tls_files_are_named_not_printed(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.pem")
    with pytest.raises(OSError, match=r"--tls-key-file .*nowhere\.pem"):
        ScorerTls(cert_file=missing, key_file=missing).credentials()
    not_pem = tmp_path / "key.txt"
    not_pem.write_text("the private key would be here")
    with pytest.raises(OSError, match=r"tls\.ca_file .*not a PEM file") as caught:
        tls_credentials(str(not_pem))
    assert "private key would be" not in str(caught.value)
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        tls_credentials(None, str(not_pem), None)


# -- the bearer token ------------------------------------------------------------------------


async def test_a_bearer_token_is_required_and_checked(
    minilm: LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with guarded(minilm, guard=ScorerGuard(token=TOKEN)) as server:
        assert (await embed_with(server, TEXTS[:2], token=TOKEN)).shape == (2, 384)
        refused = []
        for settings in ({}, {"token": "wrong-token"}):
            with pytest.raises(BackendError, match="UNAUTHENTICATED") as caught:
                await embed_with(server, TEXTS[:1], **settings)
            assert not caught.value.retryable and not isinstance(caught.value, Overloaded)
            refused.append(str(caught.value))
        # Info (what a sidecar calls at start-up) needs the token too.
        client = RemoteScorerBackend(f"127.0.0.1:{server.port}", ENCODER, 5.0)
        try:
            with pytest.raises(BackendError, match="UNAUTHENTICATED"):
                await client.connect()
        finally:
            await client.aclose()
        # The health service stays open for probes.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5.0)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        stats = server.stats()
    assert stats.refused[UNAUTHENTICATED] == 3
    assert stats.rpcs == 3  # the good call and the two refused Embed calls
    for text in (*refused, caplog.text, repr(server.metrics.render())):
        assert TOKEN not in text and "wrong-token" not in text
    assert TEXTS[0] not in caplog.text


def test_a_client_token_that_cannot_be_sent_is_refused_unprinted() -> None:
    with pytest.raises(ValueError, match="token is empty or holds") as caught:
        RemoteScorerBackend("127.0.0.1:1", ENCODER, token="half\nof-a-token")
    assert "of-a-token" not in str(caught.value)


# -- limits per call and per caller ----------------------------------------------------------


async def test_calls_over_the_size_limits_are_refused_as_permanent(minilm: LocalBackend) -> None:
    limits = ScorerLimits(max_texts_per_call=3, max_bytes_per_call=400)
    async with guarded(minilm, guard=ScorerGuard(limits=limits)) as server:
        assert (await embed_with(server, TEXTS[:3])).shape == (3, 384)
        with pytest.raises(BackendError, match=r"4 texts in one call; .* at most 3") as many:
            await embed_with(server, TEXTS[:4])
        with pytest.raises(BackendError, match=r"bytes in one call; .* at most 400") as large:
            await embed_with(server, ["x" * 500])
        stats = server.stats()
    # No retry or shedding makes such a call fit: a permanent error, not shed work.
    for caught in (many, large):
        assert not caught.value.retryable and not isinstance(caught.value, Overloaded)
    assert (stats.refused[TOO_MANY_TEXTS], stats.refused[TOO_MANY_BYTES]) == (1, 1)
    assert stats.texts == 3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_each_caller_has_its_own_rate(minilm: LocalBackend) -> None:
    clock = Clock()
    limits = ScorerLimits(caller_texts_per_s=2.0, caller_burst_texts=4)
    async with guarded(minilm, guard=ScorerGuard(limits=limits, clock=clock)) as server:
        # No token is required here, so each presented one names its caller.
        assert (await embed_with(server, TEXTS[:4], token="caller-a")).shape == (4, 384)
        with pytest.raises(ScorerOverloaded) as caught:
            await embed_with(server, TEXTS[4:5], token="caller-a")
        assert caught.value.reason == RATE_LIMITED
        # Another caller's bucket is its own.
        assert (await embed_with(server, TEXTS[:3], token="caller-b")).shape == (3, 384)
        clock.now += 1.0  # two texts' worth of rate comes back to caller a
        assert (await embed_with(server, TEXTS[4:6], token="caller-a")).shape == (2, 384)
        with pytest.raises(ScorerOverloaded):
            await embed_with(server, TEXTS[:1], token="caller-a")
        stats = server.stats()
        metrics = server.metrics.render().decode()
    assert stats.refused[RATE_LIMITED] == 2
    assert 'semhealth_scorer_refused_requests_total{reason="rate_limited"} 2.0' in metrics
    assert "caller-a" not in metrics


async def test_callers_with_client_certificates_are_told_apart_by_subject(
    minilm: LocalBackend, pki: Pki, tmp_path: Path
) -> None:
    tls = ScorerTls(cert_file=pki.server.cert, key_file=pki.server.key, client_ca_file=pki.ca)
    limits = ScorerLimits(caller_texts_per_s=0.001, caller_burst_texts=3)
    a, b = pki.client(tmp_path, "sidecar-a"), pki.client(tmp_path, "sidecar-b")
    guard = ScorerGuard(limits=limits)
    async with guarded(minilm, credentials=tls.credentials(), guard=guard) as server:
        for pair in (a, b):
            credentials = tls_credentials(pki.ca, pair.cert, pair.key)
            assert (await embed_with(server, TEXTS[:3], credentials=credentials)).shape[0] == 3
            with pytest.raises(ScorerOverloaded):
                await embed_with(server, TEXTS[3:4], credentials=credentials)
    assert guard.refused[RATE_LIMITED] == 2
    assert guard.callers == 2


def test_limits_that_cannot_work_are_named() -> None:
    problems = ScorerLimits(max_texts_per_call=0, caller_texts_per_s=-1).validate()
    assert problems == [
        "max texts per call must be at least 1, not 0",
        "the caller rate must be 0 or more, not -1",
    ]
