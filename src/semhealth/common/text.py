"""Facts about a text that more than one package needs: which characters are CJK, and a
token estimate without a tokenizer.

``has_cjk`` routes a request to the multilingual encoder; ``estimate_tokens`` counts one
token per CJK character and one per four others, for the collectors' prompt class and the
embedding batcher's batch cost alike.

``utf8_safe`` makes a text sendable: a lone surrogate is legal in a Python str but not in
UTF-8, so a tokenizer or orjson refuses it, and with it the whole batch or request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

# Han (the URO, extensions A to I, compatibility ideographs, radicals), Hiragana, Katakana
# (with its phonetic extensions and halfwidth forms), and Hangul (syllables, jamo and their
# extensions, halfwidth forms). CJK punctuation and fullwidth Latin are not a script's letters.
CJK_CLASS = (
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
CJK = re.compile(CJK_CLASS)


def has_cjk(text: str) -> bool:
    """Whether ``text`` holds a Chinese, Japanese or Korean character (Han, kana or Hangul)."""
    # Most traffic is ASCII: one C-level scan answers it without the regex.
    return not text.isascii() and CJK.search(text) is not None


def cjk_count(text: str) -> int:
    """How many characters of ``text`` are CJK (as ``has_cjk`` defines them)."""
    return 0 if text.isascii() else len(CJK.findall(text))


CHARS_PER_TOKEN = 4  # other characters per token, the usual ratio for English BPE vocabularies


def estimate_tokens(texts: Iterable[str]) -> int:
    """A cheap token estimate of ``texts`` together: one per CJK character, one per four other
    characters, rounded up. The upstream's reported usage is the real count; this only sizes
    and classes work."""
    cjk = other = 0
    for text in texts:
        count = cjk_count(text)
        cjk += count
        other += len(text) - count
    return cjk + math.ceil(other / CHARS_PER_TOKEN)


def utf8_safe(text: str) -> str:
    """``text``, with each lone surrogate replaced by "?" so that it encodes as UTF-8.

    One bad text must not fail a batch (the tokenizer) or a request (orjson) that carries
    other callers' texts too.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text
