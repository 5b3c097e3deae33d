"""The text-embeddings-inference backend against a real ``/embed`` server on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.errors import BackendError
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.remote_tei import TEIBackend
from tests.embeddings.loopback import (
    SHORT,
    TEXTS,
    EmbeddingServer,
    Script,
    assert_same_scores,
    relevance_cases,
)


@pytest.fixture
async def backend(server: EmbeddingServer) -> AsyncIterator[TEIBackend]:
    remote = TEIBackend(server.base_url, timeout_s=2.0)
    yield remote
    await remote.aclose()


async def embed_error(backend: TEIBackend) -> BackendError:
    with pytest.raises(BackendError) as caught:
        await backend.embed(SHORT)
    return caught.value


# -- the same vectors and scores as the local model ------------------------------------------


async def test_gives_the_local_backends_vectors(backend: TEIBackend, reference: Vectors) -> None:
    got = await backend.embed(TEXTS)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference, atol=1e-5)


async def test_gives_the_local_backends_relevance_scores(
    backend: TEIBackend, minilm: LocalBackend
) -> None:
    await assert_same_scores(backend, minilm, relevance_cases())


# -- what goes on the wire -------------------------------------------------------------------


async def test_sends_inputs_asking_the_server_to_normalise_and_truncate(
    backend: TEIBackend, script: Script
) -> None:
    await backend.embed(TEXTS[:2])
    assert script.bodies == [{"inputs": TEXTS[:2], "normalize": True, "truncate": True}]


async def test_truncation_can_be_turned_off(server: EmbeddingServer, script: Script) -> None:
    remote = TEIBackend(server.base_url, truncate=False)
    try:
        await remote.embed(TEXTS[:1])
    finally:
        await remote.aclose()
    assert script.bodies[0]["truncate"] is False


def test_is_named_by_its_url_without_credentials() -> None:
    remote = TEIBackend("http://user:secret@tei.internal:8080")
    assert remote.name == "http://tei.internal:8080"
    assert "secret" not in remote.name


async def test_a_call_larger_than_the_servers_batch_limit_goes_in_slices(
    backend: TEIBackend, script: Script, reference: Vectors
) -> None:
    script.info = {"model_id": "minilm", "max_client_batch_size": 4}
    await backend.connect()
    script.bodies.clear()
    got = await backend.embed(TEXTS)
    assert [body["inputs"] for body in script.bodies] == [TEXTS[:4], TEXTS[4:]]
    np.testing.assert_allclose(got, reference, atol=1e-5)


async def test_connect_learns_the_width_and_tolerates_a_missing_info(
    backend: TEIBackend, script: Script
) -> None:
    script.info = None
    await backend.connect()
    assert backend.dim == 384
    assert backend.max_inputs == 32


# -- answers put right, and answers refused ---------------------------------------------------


async def test_normalises_rows_the_server_did_not(backend: TEIBackend, script: Script) -> None:
    script.scale = 0.25
    norms = np.linalg.norm(await backend.embed(SHORT), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)


async def test_a_server_error_is_retryable(backend: TEIBackend, script: Script) -> None:
    script.status = 503
    assert (await embed_error(backend)).retryable


async def test_an_overloaded_server_is_retryable(backend: TEIBackend, script: Script) -> None:
    script.status = 429  # TEI's answer when its queue is full
    assert (await embed_error(backend)).retryable


async def test_a_batch_too_large_for_the_server_is_permanent(
    backend: TEIBackend, script: Script
) -> None:
    script.status = 413
    error = await embed_error(backend)
    assert not error.retryable
    assert "HTTP 413" in str(error)


async def test_an_error_never_carries_the_texts_the_server_echoed(
    backend: TEIBackend, script: Script
) -> None:
    script.status = 422
    message = str(await embed_error(backend))
    assert not any(text[:8] in message for text in SHORT)


async def test_a_missing_row_is_permanent(backend: TEIBackend, script: Script) -> None:
    script.drop_rows = 2
    error = await embed_error(backend)
    assert not error.retryable
    assert f"{len(SHORT) - 2} rows" in str(error)


async def test_rows_of_different_widths_are_permanent(backend: TEIBackend, script: Script) -> None:
    script.raw_body = b"[[0.1, 0.2], [0.3]]"
    with pytest.raises(BackendError) as caught:
        await backend.embed(TEXTS[:2])
    assert not caught.value.retryable


async def test_an_answer_that_is_not_a_list_is_permanent(
    backend: TEIBackend, script: Script
) -> None:
    script.raw_body = b'{"error": "busy"}'
    with pytest.raises(BackendError) as caught:
        await backend.embed(TEXTS[:2])
    assert not caught.value.retryable


async def test_a_timeout_is_retryable(server: EmbeddingServer, script: Script) -> None:
    script.delay_s = 5.0
    remote = TEIBackend(server.base_url, timeout_s=0.2)
    try:
        error = await embed_error(remote)
    finally:
        await remote.aclose()
    assert error.retryable
    assert "timed out" in str(error)


async def test_embed_after_close_is_permanent(backend: TEIBackend) -> None:
    await backend.aclose()
    assert not (await embed_error(backend)).retryable
