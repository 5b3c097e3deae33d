"""Relevance from embeddings: how well the context and the answer match the query.

``context_relevance_score`` is the mean of the top-k cosine similarities between the query
and the context chunks; ``answer_relevance_score`` is the query's similarity to the answer.
Rows are L2-normalised, so cosine similarity is a dot product.

Raw cosine means different things per model (one model's 0.6 is another's 0.85), so the
scorer passes each raw score through ``calibrate``, a monotone map from a model's cosine to
a score where 0.75 means what the default alert assumes. It is the identity until a fitted
calibration for the model is handed in; both the raw and the calibrated scores are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from semhealth.embeddings.backend import Embedder
from semhealth.embeddings.batcher import MicroBatcher

DEFAULT_TOP_K = 3


def identity(score: float) -> float:
    """The calibration of an uncalibrated model: scores are raw cosine similarities."""
    return score


def context_relevance(
    query_vec: ArrayLike, chunk_vecs: ArrayLike, top_k: int = DEFAULT_TOP_K
) -> float:
    """Mean of the ``top_k`` highest similarities between the query and the chunks.

    With fewer than ``top_k`` chunks, the mean over all of them. Raises ``ValueError`` for
    no chunks or ``top_k < 1``: there is no score to give, and callers check first.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, not {top_k}")
    query = np.asarray(query_vec, dtype=np.float32).reshape(-1)
    chunks = np.asarray(chunk_vecs, dtype=np.float32).reshape(-1, query.shape[0])
    if chunks.shape[0] == 0:
        raise ValueError("no context chunks to compare with the query")
    similarities = chunks @ query
    k = min(top_k, similarities.shape[0])
    top = np.partition(similarities, similarities.shape[0] - k)[-k:]
    return _cosine(float(top.mean()))


def answer_relevance(query_vec: ArrayLike, answer_vec: ArrayLike) -> float:
    """Cosine similarity between the query and the answer."""
    query = np.asarray(query_vec, dtype=np.float32).reshape(-1)
    answer = np.asarray(answer_vec, dtype=np.float32).reshape(-1)
    return _cosine(float(query @ answer))


@dataclass(frozen=True, slots=True)
class RelevanceScores:
    """One record's scores; None where there was nothing to compare (no chunks, no answer)."""

    context: float | None  # calibrated context_relevance_score
    answer: float | None  # calibrated answer_relevance_score
    context_raw: float | None  # mean top-k cosine, before calibration
    answer_raw: float | None  # cosine, before calibration
    chunks: int  # context chunks compared with the query


class Scorer(Protocol):
    """What scores a request: one encoder's ``RelevanceScorer``, or a ``RoutingScorer``."""

    async def score(
        self, query: str, context_chunks: Sequence[str] = (), answer: str | None = None
    ) -> RelevanceScores: ...


class RelevanceScorer:
    """Scores a record's query against its context chunks and its answer.

    All of one record's texts go to ``embedder`` (normally a ``MicroBatcher``) in one call.
    ``calibrate`` maps this encoder's raw cosine to a calibrated score; it must be monotone
    and is the identity until a calibration for the model is fitted. Errors of the embedder
    (``Overloaded``, ``Closed``, ``BackendError``) reach the caller, who counts them.
    """

    def __init__(
        self,
        embedder: Embedder,
        *,
        top_k: int = DEFAULT_TOP_K,
        calibrate: Callable[[float], float] = identity,
    ) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, not {top_k}")
        self.embedder = embedder
        self.top_k = top_k
        self.calibrate = calibrate

    async def score(
        self, query: str, context_chunks: Sequence[str] = (), answer: str | None = None
    ) -> RelevanceScores:
        chunks = [chunk for chunk in context_chunks if chunk.strip()]
        has_answer = answer is not None and bool(answer.strip())
        if not query.strip() or (not chunks and not has_answer):
            return RelevanceScores(None, None, None, None, 0)
        texts = [query, *chunks]
        if has_answer and answer is not None:
            texts.append(answer)
        vectors = await self.embedder.embed(texts)
        context_raw = (
            context_relevance(vectors[0], vectors[1 : 1 + len(chunks)], self.top_k)
            if chunks
            else None
        )
        answer_raw = answer_relevance(vectors[0], vectors[-1]) if has_answer else None
        return RelevanceScores(
            context=self._calibrated(context_raw),
            answer=self._calibrated(answer_raw),
            context_raw=context_raw,
            answer_raw=answer_raw,
            chunks=len(chunks),
        )

    def batchers(self) -> tuple[MicroBatcher, ...]:
        """The micro-batcher this scorer embeds through; none when it holds a bare backend."""
        return (self.embedder,) if isinstance(self.embedder, MicroBatcher) else ()

    def _calibrated(self, raw: float | None) -> float | None:
        return None if raw is None else self.calibrate(raw)


def _cosine(value: float) -> float:
    # Rounding can carry a dot product of unit vectors a hair past +-1.
    return min(1.0, max(-1.0, value))
