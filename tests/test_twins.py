"""Definitions that collectors and embeddings each keep, because neither imports the other.

Each pair is pinned equal here, so changing one without the other is a failing test, not
two sidecar stages that quietly disagree about the same text.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors import request
from semhealth.embeddings import _text, estimate_tokens


def test_the_cjk_character_set_is_the_same_in_collectors_and_embeddings() -> None:
    # Which characters count one token each (collectors' prompt class, the batcher's batch
    # cost) and which route a request to the multilingual encoder.
    assert request.CJK_CLASS == _text.CJK_CLASS


@given(st.text(min_size=1))
def test_both_token_estimates_agree_on_any_text(text: str) -> None:
    assert request.estimate_tokens([text]) == estimate_tokens(text)

