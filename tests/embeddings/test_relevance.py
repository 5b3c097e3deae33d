from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.relevance import (
    RelevanceScorer,
    RelevanceScores,
    answer_relevance,
    context_relevance,
)
from tests.embeddings.wrappers import Recording


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


QUERY = unit(1, 0, 0)
# Similarities to QUERY: 1.0, 0.8, 0.6, 0.0
CHUNKS = np.stack([unit(1, 0, 0), unit(0.8, 0.6, 0), unit(0.6, 0.8, 0), unit(0, 0, 1)])


# -- the math --------------------------------------------------------------------------------


def test_context_relevance_is_the_mean_of_the_top_k_similarities() -> None:
    assert context_relevance(QUERY, CHUNKS, top_k=3) == pytest.approx((1.0 + 0.8 + 0.6) / 3)


def test_context_relevance_ignores_chunks_past_the_top_k() -> None:
    assert context_relevance(QUERY, CHUNKS[::-1], top_k=2) == pytest.approx(0.9)


def test_context_relevance_with_fewer_chunks_than_k_averages_them_all() -> None:
    assert context_relevance(QUERY, CHUNKS[2:], top_k=3) == pytest.approx(0.3)


def test_context_relevance_takes_one_chunk_as_a_vector() -> None:
    assert context_relevance(QUERY, unit(0.8, 0.6, 0)) == pytest.approx(0.8)


def test_context_relevance_without_chunks_is_refused() -> None:
    with pytest.raises(ValueError, match="no context chunks"):
        context_relevance(QUERY, np.empty((0, 3), dtype=np.float32))


def test_context_relevance_refuses_a_top_k_below_one() -> None:
    with pytest.raises(ValueError, match="top_k"):
        context_relevance(QUERY, CHUNKS, top_k=0)


def test_answer_relevance_is_the_cosine_similarity() -> None:
    assert answer_relevance(QUERY, unit(0.6, 0.8, 0)) == pytest.approx(0.6)


def test_rounding_never_carries_a_score_past_one() -> None:
    slightly_long = QUERY * np.float32(1.0000005)
    assert answer_relevance(QUERY, slightly_long) == 1.0


# -- the scorer ------------------------------------------------------------------------------


class Fixed:
    """Hands back prepared rows, so the scorer's arithmetic can be checked by hand."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        return self.rows[: len(texts)].astype(np.float32)


async def test_the_scorer_calibrates_and_keeps_the_raw_scores() -> None:
    rows = np.stack([QUERY, *CHUNKS[:3], unit(0.6, 0.8, 0)])
    scorer = RelevanceScorer(Fixed(rows), calibrate=lambda raw: raw / 2)
    scores = await scorer.score("query", ["a", "b", "c"], "answer")
    assert scores.context_raw == pytest.approx(0.8)
    assert scores.context == pytest.approx(0.4)
    assert scores.answer_raw == pytest.approx(0.6)
    assert scores.answer == pytest.approx(0.3)
    assert scores.chunks == 3


async def test_the_scorer_embeds_a_record_in_one_call(minilm: LocalBackend) -> None:
    recording = Recording(minilm)
    await RelevanceScorer(recording).score("query", ["one", "two"], "answer")
    assert recording.calls == [["query", "one", "two", "answer"]]


async def test_without_an_answer_only_context_is_scored() -> None:
    fixed = Fixed(np.stack([QUERY, *CHUNKS]))
    scores = await RelevanceScorer(fixed).score("query", ["a", "b"])
    assert scores.answer is None and scores.answer_raw is None
    assert scores.context is not None


async def test_without_context_only_the_answer_is_scored() -> None:
    fixed = Fixed(np.stack([QUERY, unit(0.6, 0.8, 0)]))
    scores = await RelevanceScorer(fixed).score("query", [], "answer")
    assert scores.context is None and scores.chunks == 0
    assert scores.answer == pytest.approx(0.6)


async def test_blank_chunks_are_not_compared() -> None:
    fixed = Fixed(np.stack([QUERY, *CHUNKS]))
    await RelevanceScorer(fixed).score("query", ["a", "  ", ""])
    assert fixed.calls == [["query", "a"]]


async def test_a_blank_query_scores_nothing_and_embeds_nothing() -> None:
    fixed = Fixed(np.stack([QUERY, *CHUNKS]))
    scores = await RelevanceScorer(fixed).score("  ", ["a"], "answer")
    assert scores == RelevanceScores(None, None, None, None, 0)
    assert fixed.calls == []


def test_the_scorer_refuses_a_top_k_below_one() -> None:
    with pytest.raises(ValueError, match="top_k"):
        RelevanceScorer(Fixed(np.stack([QUERY])), top_k=0)


async def test_relevant_context_scores_above_unrelated_context(minilm: LocalBackend) -> None:
    batcher = MicroBatcher(minilm)
    await batcher.start()
    scorer = RelevanceScorer(batcher)
    query = "How do I reset my password if I can't log in?"
    try:
        relevant = await scorer.score(
            query,
            [
                "If you cannot sign in, click 'Forgot password' on the login page and follow "
                "the reset link we email you.",
                "Reset links stay valid for 30 minutes.",
            ],
        )
        unrelated = await scorer.score(
            query,
            [
                "The river's floodplain supports willow and alder along its lower reaches.",
                "Add a webhook endpoint in the dashboard to receive payment events.",
            ],
        )
    finally:
        await batcher.shutdown()
    assert relevant.context is not None and unrelated.context is not None
    assert relevant.context > unrelated.context + 0.2


async def test_a_relevant_answer_scores_above_an_unrelated_one(minilm: LocalBackend) -> None:
    scorer = RelevanceScorer(minilm)
    query = "What is the capital of France?"
    right = await scorer.score(query, [], "The capital of France is Paris.")
    wrong = await scorer.score(query, [], "Photosynthesis turns light into chemical energy.")
    assert right.answer is not None and wrong.answer is not None
    assert right.answer > wrong.answer
