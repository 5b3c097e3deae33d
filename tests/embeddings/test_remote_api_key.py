"""Remote encoders behind a bearer token: the key goes on every request and nowhere else.

Real loopback servers (TEI ``/embed`` and OpenAI-compatible ``/v1/embeddings``, the real
model behind them) answer 401 to any request without the key; with it they must give the
local model's scores. The key must not reach a message, a log line or a ``repr()``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from semhealth.embeddings._http import HttpBackend
from semhealth.embeddings.config import Config, Encoder, Remote, Tls
from semhealth.embeddings.errors import BackendError, ModelLoadError
from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.remote_openai import OpenAICompatibleBackend
from semhealth.embeddings.remote_tei import TEIBackend
from tests.embeddings.bearer import KEY, Gate, keyed_server
from tests.embeddings.loopback import SHORT, EmbeddingServer, assert_same_scores, relevance_cases

MODEL = "all-MiniLM-L6-v2"  # what the servers run; it names the shipped calibration too
WRONG = "sk-wrong-key-0b5e8d71c9a24f36"
KINDS = ("tei", "openai")


def url_of(kind: str, server: EmbeddingServer) -> str:
    # The OpenAI SDK's base URL ends in /v1; TEI's is the server's root.
    return f"{server.base_url}v1" if kind == "openai" else server.base_url


def backend_of(kind: str, server: EmbeddingServer, key: str | None) -> HttpBackend:
    if kind == "openai":
        return OpenAICompatibleBackend(url_of(kind, server), MODEL, api_key=key, timeout_s=5.0)
    return TEIBackend(url_of(kind, server), api_key=key, timeout_s=5.0)


def config_of(kind: str, server: EmbeddingServer, key: str | None) -> Config:
    remote = Remote(url=url_of(kind, server), model=MODEL, api_key_env="EMBED_KEY", api_key=key)
    encoder = Encoder(name="default", backend=kind, remote=remote)
    return Config(encoders=(encoder,), route_cjk_to=None)


@pytest.fixture
def gate() -> Gate:
    return Gate(KEY)


@pytest.fixture
async def keyed(minilm: LocalBackend, gate: Gate) -> AsyncIterator[EmbeddingServer]:
    async with keyed_server(minilm, gate) as server:
        yield server


async def embed_error(backend: HttpBackend) -> BackendError:
    try:
        with pytest.raises(BackendError) as caught:
            await backend.embed(SHORT)
    finally:
        await backend.aclose()
    return caught.value


# -- the backends ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_with_the_key_the_scores_are_the_local_backends(
    kind: str, keyed: EmbeddingServer, gate: Gate, minilm: LocalBackend
) -> None:
    remote = backend_of(kind, keyed, KEY)
    try:
        await assert_same_scores(remote, minilm, relevance_cases())
    finally:
        await remote.aclose()
    assert gate.passed
    assert gate.refused == []


async def test_tei_sends_the_key_on_info_and_on_embed(keyed: EmbeddingServer, gate: Gate) -> None:
    remote = backend_of("tei", keyed, KEY)
    try:
        await remote.connect()
    finally:
        await remote.aclose()
    assert gate.passed == ["GET /info", "POST /embed"]


@pytest.mark.parametrize("kind", KINDS)
async def test_without_a_key_the_refusal_says_none_was_sent(
    kind: str, keyed: EmbeddingServer
) -> None:
    error = await embed_error(backend_of(kind, keyed, None))
    assert "answered HTTP 401" in str(error)
    assert "no API key was sent" in str(error)
    assert not error.retryable


@pytest.mark.parametrize("kind", KINDS)
async def test_a_wrong_key_is_refused_without_being_shown(
    kind: str, keyed: EmbeddingServer
) -> None:
    # The server echoes the header it got in its 401 body; the message must not carry it.
    error = await embed_error(backend_of(kind, keyed, WRONG))
    assert "refused the API key sent" in str(error)
    assert WRONG not in str(error)
    assert KEY not in str(error)


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_with_a_line_break_is_refused_without_being_shown(kind: str) -> None:
    with pytest.raises(ValueError, match="line break") as caught:
        if kind == "openai":
            OpenAICompatibleBackend("http://127.0.0.1:1/v1", MODEL, api_key=KEY + "\n")
        else:
            TEIBackend("http://127.0.0.1:1", api_key=KEY + "\n")
    assert KEY not in str(caught.value)


@pytest.mark.parametrize("kind", KINDS)
def test_the_backends_repr_does_not_show_the_key(kind: str) -> None:
    if kind == "openai":
        backend: HttpBackend = OpenAICompatibleBackend("http://h:1/v1", MODEL, api_key=KEY)
    else:
        backend = TEIBackend("http://h:1", api_key=KEY)
    assert KEY not in repr(backend)


# -- the config ------------------------------------------------------------------------------


def test_the_key_is_not_in_the_configs_repr() -> None:
    remote = Remote(url="http://tei:8080", api_key_env="TEI_API_KEY", api_key=KEY)
    config = Config(encoders=(Encoder(backend="tei", remote=remote),), route_cjk_to=None)
    for shown in (repr(remote), repr(config.encoders[0]), repr(config)):
        assert KEY not in shown
        assert "TEI_API_KEY" in shown  # the variable's name is not a secret


@pytest.mark.parametrize(
    ("key", "state"), [(None, "is not set"), ("", "is empty"), ("  ", "is empty")]
)
def test_a_named_variable_without_a_key_is_an_issue_naming_it(key: str | None, state: str) -> None:
    remote = Remote(url="http://tei:8080", api_key_env="TEI_API_KEY", api_key=key)
    (issue,) = remote.validate("tei")
    assert issue.path == "api_key_env"
    assert issue.message == f"environment variable TEI_API_KEY, named by api_key_env, {state}"
    assert "set TEI_API_KEY to the server's API key" in issue.fix


def test_a_key_in_api_key_env_is_an_issue_that_does_not_show_it() -> None:
    remote = Remote(url="http://tei:8080", api_key_env=KEY, api_key=None)
    (issue,) = remote.validate("tei")
    assert issue.message == "api_key_env is not the name of an environment variable"
    assert KEY not in str(issue)


def test_a_key_with_a_control_character_is_an_issue_that_does_not_show_it() -> None:
    remote = Remote(url="http://tei:8080", api_key_env="TEI_API_KEY", api_key=KEY + "\r\nX: y")
    (issue,) = remote.validate("tei")
    assert issue.path == "api_key_env"
    assert "line break or another control character" in issue.message
    assert KEY not in str(issue)


def test_a_scorer_encoder_takes_a_bearer_token() -> None:
    remote = Remote(url="scorer:50051", api_key_env="SCORER_KEY", api_key=KEY)
    assert remote.validate("scorer") == []


def test_tls_is_for_scorer_encoders_and_a_client_certificate_needs_its_key() -> None:
    tls = Tls(ca_file="/etc/scorer/ca.pem", server_name="scorer.internal")
    assert Remote(url="scorer:50051", tls=tls).validate("scorer") == []
    (issue,) = Remote(url="http://tei:8080", tls=tls).validate("tei")
    assert (issue.path, issue.message) == ("tls", "the tei backend takes no tls section")
    half = Tls(ca_file="/etc/scorer/ca.pem", cert_file="/etc/scorer/client.pem")
    (issue,) = Remote(url="scorer:50051", tls=half).validate("scorer")
    assert (issue.path, issue.message) == (
        "tls.key_file",
        "key_file is empty while its pair is set",
    )
    assert not Tls().enabled and tls.enabled


@pytest.mark.parametrize("kind", KINDS)
def test_a_keyed_encoder_with_its_key_is_valid(kind: str) -> None:
    remote = Remote(url="http://h:1/v1", model=MODEL, api_key_env="EMBED_KEY", api_key=KEY)
    assert remote.validate(kind) == []


# -- the scorer the sidecar builds from the config -------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_the_configured_key_gives_the_sidecars_local_scores(
    kind: str, keyed: EmbeddingServer, minilm: LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    local = Config(route_cjk_to=None)  # the default encoder: MiniLM, its shipped calibration
    async with (
        open_scorer(config_of(kind, keyed, KEY)) as remote_scorer,
        open_scorer(local, backend=minilm) as local_scorer,
    ):
        for case in relevance_cases():
            got = await remote_scorer.score(case.query, case.chunks, case.answer)
            want = await local_scorer.score(case.query, case.chunks, case.answer)
            assert got.context is not None and want.context is not None
            assert got.answer is not None and want.answer is not None
            assert abs(got.context - want.context) < 1e-5
            assert abs(got.answer - want.answer) < 1e-5
    assert KEY not in caplog.text


@pytest.mark.parametrize("kind", KINDS)
async def test_a_refused_key_fails_the_start_and_is_never_logged(
    kind: str, keyed: EmbeddingServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ModelLoadError, match="refused the API key sent") as caught:
        async with open_scorer(config_of(kind, keyed, WRONG)):
            pass
    assert WRONG not in str(caught.value)
    assert WRONG not in caplog.text
