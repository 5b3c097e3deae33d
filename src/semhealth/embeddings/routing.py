"""Routing by script: each request goes to the encoder that suits its language.

all-MiniLM-L6-v2 separates relevant from irrelevant English context better than any
multilingual encoder measured here, but Chinese barely better than chance; USE multilingual
v3 does both well. So a request with Chinese, Japanese or Korean text goes to the
multilingual encoder and every other request to the default one. Each encoder has its own
calibration, which is what makes their scores comparable: a calibrated 0.75 means the same
probability of relevance whichever encoder produced it.

A whole request goes to one encoder, never text by text: cosine similarity is only defined
between vectors of the same model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from semhealth.common.text import has_cjk
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.relevance import RelevanceScorer, RelevanceScores

__all__ = ["RoutingScorer", "cjk_request", "has_cjk"]


def cjk_request(query: str, context_chunks: Sequence[str] = (), answer: str | None = None) -> bool:
    """Whether any text of a request (query, a context chunk, the answer) has CJK text."""
    texts = (query, *context_chunks, *(() if answer is None else (answer,)))
    return any(has_cjk(text) for text in texts)


class RoutingScorer:
    """Scores each request with ``default``'s scorer, or ``cjk``'s when it has CJK text.

    ``scorers`` maps encoder names to their scorers, each with its own batcher, cache
    entries and calibration. A request goes to ``cjk`` when its query, any context chunk or
    its answer has CJK text: an English question with a Chinese answer is compared across
    languages, which only the multilingual encoder can do. ``routed`` counts requests per
    encoder. Errors of the chosen scorer reach the caller, as ``RelevanceScorer``'s do.
    """

    def __init__(self, scorers: Mapping[str, RelevanceScorer], *, default: str, cjk: str) -> None:
        for role, name in (("default", default), ("cjk", cjk)):
            if name not in scorers:
                raise ValueError(f"the {role} encoder '{name}' has no scorer")
        self.scorers = dict(scorers)
        self.default = default
        self.cjk = cjk
        self.routed = dict.fromkeys(self.scorers, 0)

    def route(
        self, query: str, context_chunks: Sequence[str] = (), answer: str | None = None
    ) -> str:
        """The name of the encoder that scores this request."""
        return self.cjk if cjk_request(query, context_chunks, answer) else self.default

    async def score(
        self, query: str, context_chunks: Sequence[str] = (), answer: str | None = None
    ) -> RelevanceScores:
        name = self.route(query, context_chunks, answer)
        self.routed[name] += 1
        return await self.scorers[name].score(query, context_chunks, answer)

    def batchers(self) -> tuple[MicroBatcher, ...]:
        """The micro-batchers behind the encoders this scorer routes to, each once."""
        found = (batcher for scorer in self.scorers.values() for batcher in scorer.batchers())
        return tuple({id(batcher): batcher for batcher in found}.values())
