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

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from semhealth.embeddings.relevance import RelevanceScorer, RelevanceScores

# Han (the URO, extensions A to I, compatibility ideographs, radicals), Hiragana, Katakana
# (with its phonetic extensions and halfwidth forms), and Hangul (syllables, jamo and their
# extensions, halfwidth forms). CJK punctuation and fullwidth Latin are not a script's letters.
_CJK = re.compile(
    "["
    "\u1100-\u11ff"  # Hangul Jamo
    "\u2e80-\u2fdf"  # CJK Radicals Supplement, Kangxi Radicals
    "\u3005\u3007\u3021-\u3029\u3038-\u303b"  # ideographic iteration mark, numerals
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3130-\u318f"  # Hangul Compatibility Jamo
    "\u31f0-\u31ff"  # Katakana Phonetic Extensions
    "\u3400-\u4dbf"  # CJK Unified Ideographs Extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\ua960-\ua97f"  # Hangul Jamo Extended-A
    "\uac00-\ud7ff"  # Hangul Syllables, Hangul Jamo Extended-B
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uff66-\uff9f"  # Halfwidth Katakana
    "\uffa0-\uffdc"  # Halfwidth Hangul
    "\U0001b000-\U0001b16f"  # Kana Supplement, Kana Extended-A, Small Kana Extension
    "\U00020000-\U0003134f"  # Extensions B to G, Compatibility Ideographs Supplement
    "\U00031350-\U000323af"  # Extension H
    "]"
)


def has_cjk(text: str) -> bool:
    """Whether ``text`` holds a Chinese, Japanese or Korean character (Han, kana or Hangul)."""
    # Most traffic is ASCII: one C-level scan answers it without the regex.
    return not text.isascii() and _CJK.search(text) is not None


def cjk_request(query: str, context_chunks: Sequence[str] = (), answer: str | None = None) -> bool:
    """Whether any text of a request (query, a context chunk, the answer) has CJK text."""
    texts = (query, *context_chunks, *(() if answer is None else (answer,)))
    return any(has_cjk(text) for text in texts)


class Scorer(Protocol):
    """What scores a request: one encoder's ``RelevanceScorer``, or a ``RoutingScorer``."""

    async def score(
        self, query: str, context_chunks: Sequence[str] = (), answer: str | None = None
    ) -> RelevanceScores: ...


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
