"""The OpenAI-compatible backend against a real ``/v1/embeddings`` server on loopback."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import numpy as np
import pytest

from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.errors import BackendError
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.remote_openai import OpenAICompatibleBackend
from tests.embeddings.loopback import (
    SHORT,
    TEXTS,
    EmbeddingServer,
    Script,
    assert_same_scores,
    relevance_cases,
)

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture
async def backend(server: EmbeddingServer) -> AsyncIterator[OpenAICompatibleBackend]:
    remote = OpenAICompatibleBackend(f"{server.base_url}v1", MODEL, timeout_s=2.0)
    yield remote
    await remote.aclose()


async def embed_error(backend: OpenAICompatibleBackend) -> BackendError:
    with pytest.raises(BackendError) as caught:
        await backend.embed(SHORT)
    return caught.value


# -- the same vectors and scores as the local model ------------------------------------------


async def test_gives_the_local_backends_vectors(
    backend: OpenAICompatibleBackend, reference: Vectors
) -> None:
    got = await backend.embed(TEXTS)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference, atol=1e-5)


async def test_gives_the_local_backends_relevance_scores(
    backend: OpenAICompatibleBackend, minilm: LocalBackend
) -> None:
    await assert_same_scores(backend, minilm, relevance_cases())


async def test_works_behind_the_micro_batcher(
    backend: OpenAICompatibleBackend, reference: Vectors
) -> None:
    batcher = MicroBatcher(backend)
    await batcher.start()
    try:
        got = await batcher.embed(TEXTS)
    finally:
        await batcher.shutdown()
    np.testing.assert_allclose(got, reference, atol=1e-5)


# -- what goes on the wire -------------------------------------------------------------------


async def test_sends_the_model_the_texts_and_float_encoding(
    backend: OpenAICompatibleBackend, script: Script
) -> None:
    await backend.embed(TEXTS[:2])
    assert script.bodies == [{"model": MODEL, "input": TEXTS[:2], "encoding_format": "float"}]


async def test_sends_the_api_key_as_a_bearer_token(server: EmbeddingServer, script: Script) -> None:
    remote = OpenAICompatibleBackend(f"{server.base_url}v1", MODEL, api_key="sk-test")
    try:
        await remote.embed(TEXTS[:1])
    finally:
        await remote.aclose()
    assert script.headers[0]["Authorization"] == "Bearer sk-test"


async def test_sends_an_empty_text_as_a_space_and_gets_the_empty_texts_vector(
    backend: OpenAICompatibleBackend, script: Script, minilm: LocalBackend
) -> None:
    got = await backend.embed(["", "hello"])
    assert script.bodies[0]["input"] == [" ", "hello"]
    np.testing.assert_allclose(got, await minilm.embed(["", "hello"]), atol=1e-5)


async def test_a_lone_surrogate_is_sent_as_a_question_mark(
    backend: OpenAICompatibleBackend, script: Script
) -> None:
    rows = await backend.embed(["fine", "bad \ud800 text"])
    assert script.bodies[0]["input"] == ["fine", "bad ? text"]
    assert rows.shape == (2, 384)


async def test_splits_a_call_larger_than_max_inputs_into_requests_in_order(
    server: EmbeddingServer, script: Script, reference: Vectors
) -> None:
    remote = OpenAICompatibleBackend(f"{server.base_url}v1", MODEL, max_inputs=4)
    try:
        got = await remote.embed(TEXTS)
    finally:
        await remote.aclose()
    assert [body["input"] for body in script.bodies] == [TEXTS[:4], TEXTS[4:]]
    np.testing.assert_allclose(got, reference, atol=1e-5)


async def test_an_empty_call_sends_nothing(
    backend: OpenAICompatibleBackend, script: Script
) -> None:
    await backend.connect()
    assert (await backend.embed([])).shape == (0, 384)
    assert len(script.bodies) == 1  # the probe only


# -- answers put right, and answers refused ---------------------------------------------------


async def test_puts_rows_back_in_order_by_their_index(
    backend: OpenAICompatibleBackend, script: Script, reference: Vectors
) -> None:
    script.reverse = True
    np.testing.assert_allclose(await backend.embed(TEXTS), reference, atol=1e-5)


async def test_normalises_rows_the_server_did_not(
    backend: OpenAICompatibleBackend, script: Script
) -> None:
    script.scale = 3.0
    norms = np.linalg.norm(await backend.embed(SHORT), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)


async def test_connect_learns_the_width(backend: OpenAICompatibleBackend) -> None:
    assert backend.dim == 0
    await backend.connect()
    assert backend.dim == 384


async def test_a_server_error_is_retryable(
    backend: OpenAICompatibleBackend, script: Script
) -> None:
    script.status = 500
    error = await embed_error(backend)
    assert error.retryable
    assert "HTTP 500" in str(error)


async def test_too_many_requests_is_retryable(
    backend: OpenAICompatibleBackend, script: Script
) -> None:
    script.status = 429
    assert (await embed_error(backend)).retryable


async def test_a_bad_request_is_permanent(backend: OpenAICompatibleBackend, script: Script) -> None:
    script.status = 400
    error = await embed_error(backend)
    assert not error.retryable
    assert "HTTP 400" in str(error)


async def test_an_error_never_carries_the_texts_the_server_echoed(
    backend: OpenAICompatibleBackend, script: Script
) -> None:
    script.status = 400
    message = str(await embed_error(backend))
    assert not any(text[:8] in message for text in SHORT)


async def test_a_missing_row_is_permanent(backend: OpenAICompatibleBackend, script: Script) -> None:
    script.drop_rows = 1
    error = await embed_error(backend)
    assert not error.retryable
    assert f"{len(SHORT) - 1} rows" in str(error)


async def test_rows_of_another_width_are_permanent(server: EmbeddingServer) -> None:
    remote = OpenAICompatibleBackend(f"{server.base_url}v1", MODEL, dim=768)
    try:
        error = await embed_error(remote)
    finally:
        await remote.aclose()
    assert not error.retryable
    assert "width 384, not 768" in str(error)


@pytest.mark.parametrize(
    "raw",
    [
        b"<html>gateway</html>",
        b'{"data": "none"}',
        b'{"data": [{"index": 0}]}',
        b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 0, "embedding": [1, 2]}]}',
        b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 1, "embedding": [1]}]}',
        b'{"data": [{"index": 0, "embedding": "AAAA"}, {"index": 1, "embedding": "AAAA"}]}',
        b'{"data": [{"index": 0, "embedding": [1e39]}, {"index": 1, "embedding": [1]}]}',
    ],
    ids=["not-json", "no-list", "no-embedding", "index-twice", "ragged", "base64", "overflow"],
)
async def test_an_answer_of_the_wrong_shape_is_permanent(
    backend: OpenAICompatibleBackend, script: Script, raw: bytes
) -> None:
    script.raw_body = raw
    with pytest.raises(BackendError) as caught:
        await backend.embed(TEXTS[:2])
    assert not caught.value.retryable


async def test_a_timeout_is_retryable(server: EmbeddingServer, script: Script) -> None:
    script.delay_s = 5.0
    remote = OpenAICompatibleBackend(f"{server.base_url}v1", MODEL, timeout_s=0.2)
    try:
        error = await embed_error(remote)
    finally:
        await remote.aclose()
    assert error.retryable
    assert "timed out" in str(error)


async def test_a_refused_connection_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    remote = OpenAICompatibleBackend(f"http://127.0.0.1:{port}/v1", MODEL, timeout_s=1.0)
    try:
        assert (await embed_error(remote)).retryable
    finally:
        await remote.aclose()


# -- lifecycle and settings ------------------------------------------------------------------


async def test_embed_after_close_is_permanent(backend: OpenAICompatibleBackend) -> None:
    await backend.embed(TEXTS[:1])
    await backend.aclose()
    await backend.aclose()
    assert not (await embed_error(backend)).retryable


def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s must be more than 0"):
        OpenAICompatibleBackend("http://127.0.0.1:1/v1", MODEL, timeout_s=0)
    with pytest.raises(ValueError, match="base_url must be an http"):
        OpenAICompatibleBackend("127.0.0.1:1", MODEL)
    with pytest.raises(ValueError, match="model is empty"):
        OpenAICompatibleBackend("http://127.0.0.1:1/v1", " ")
