"""The text facts every package reads: which characters are CJK, and the token estimate."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors import request
from semhealth.common.text import cjk_count, estimate_tokens, has_cjk, utf8_safe
from semhealth.embeddings import estimate_tokens as embeddings_estimate


def test_han_kana_and_hangul_are_cjk_and_fullwidth_latin_is_not() -> None:
    assert has_cjk("天气") and has_cjk("ひらがな") and has_cjk("カタカナ") and has_cjk("한국어")
    assert not has_cjk("\uff21\uff22\uff23") and not has_cjk("。、") and not has_cjk("plain ascii")


def test_a_cjk_character_counts_one_token_and_four_others_count_one() -> None:
    assert estimate_tokens(["天气很好"]) == 4
    assert estimate_tokens(["abcd"]) == 1
    assert estimate_tokens(["abcde"]) == 2
    assert estimate_tokens(["天气 abc"]) == 2 + 1


def test_texts_estimated_together_pool_their_other_characters() -> None:
    # Two texts of two letters are one token together, not one each.
    assert estimate_tokens(["ab", "cd"]) == 1
    assert estimate_tokens([]) == 0


@given(st.lists(st.text(), max_size=5))
def test_the_estimate_is_the_cjk_count_plus_a_quarter_of_the_rest(texts: list[str]) -> None:
    cjk = sum(cjk_count(text) for text in texts)
    others = sum(len(text) for text in texts) - cjk
    assert estimate_tokens(texts) == cjk + math.ceil(others / 4)


@given(st.text())
def test_the_embeddings_batch_cost_is_the_shared_estimate_and_at_least_one(text: str) -> None:
    assert embeddings_estimate(text) == max(1, estimate_tokens([text]))


def test_the_collectors_classify_prompts_with_the_shared_estimate() -> None:
    assert request.estimate_tokens is estimate_tokens


@given(st.text())
def test_utf8_safe_always_encodes(text: str) -> None:
    utf8_safe(text).encode("utf-8")


def test_utf8_safe_replaces_only_lone_surrogates() -> None:
    assert utf8_safe("ok \ud800 ok") == "ok ? ok"
    assert utf8_safe("天气") == "天气"
