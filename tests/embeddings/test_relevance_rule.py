"""The context rule: windows of long chunks, query-aware selection, and pooling."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.cache import Cache
from semhealth.embeddings.config import Config
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.relevance import (
    ContextRule,
    RelevanceScorer,
    context_relevance,
    pool,
    select_windows,
    windows,
)
from tests.embeddings.wrappers import Recording

SIMS = np.array([0.9, 0.2, 0.5, 0.1])


def test_max_pooling_takes_the_best_chunk() -> None:
    assert pool(SIMS, ContextRule(pooling="max")) == pytest.approx(0.9)


def test_mean_pooling_averages_the_top_k() -> None:
    assert pool(SIMS, ContextRule(pooling="mean", top_k=2)) == pytest.approx(0.7)
    assert pool(SIMS, ContextRule(pooling="mean", top_k=9)) == pytest.approx(SIMS.mean())


def test_softmax_pooling_lies_between_the_mean_and_the_max_and_sharpens_with_temperature() -> None:
    sharp = pool(SIMS, ContextRule(pooling="softmax", temperature=0.01))
    soft = pool(SIMS, ContextRule(pooling="softmax", temperature=10.0))
    assert sharp == pytest.approx(0.9, abs=1e-6)
    assert soft == pytest.approx(SIMS.mean(), abs=0.01)
    middle = pool(SIMS, ContextRule(pooling="softmax", temperature=0.2))
    weights = np.exp(SIMS / 0.2)
    assert middle == pytest.approx(float(weights @ SIMS / weights.sum()))


def test_pooling_no_chunks_is_refused() -> None:
    with pytest.raises(ValueError, match="no context chunks"):
        pool([], ContextRule())


def test_context_relevance_pools_by_the_rule_given() -> None:
    query = np.array([1.0, 0.0], dtype=np.float32)
    chunks = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    assert context_relevance(query, chunks, rule=ContextRule(pooling="max")) == 1.0
    assert context_relevance(query, chunks, top_k=2) == pytest.approx(0.5)


def test_a_long_text_is_cut_into_overlapping_windows_of_the_original_text() -> None:
    text = " ".join(f"w{i}," for i in range(10))
    cut = windows(text, 4, 1)
    assert cut == ["w0, w1, w2, w3,", "w3, w4, w5, w6,", "w6, w7, w8, w9,"]
    assert windows(text, 0) == [text]
    assert windows(text, 10) == [text]


def test_chinese_is_cut_by_characters() -> None:
    assert windows("数据库连接池满了", 4, 2) == ["数据库连", "库连接池", "接池满了"]


def test_selection_keeps_the_chunks_sharing_most_query_terms_in_order() -> None:
    chunks = ["the weather is mild", "reset the password here", "password rules", "billing"]
    assert select_windows("How to reset a password", chunks, 2) == chunks[1:3]
    assert select_windows("anything", chunks, 0) == chunks
    assert select_windows("数据库连接", ["天气", "连接池", "数据库连接池"], 1) == ["数据库连接池"]


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        (ContextRule(top_k=0), "top_k"),
        (ContextRule(pooling="median"), "pooling"),
        (ContextRule(temperature=0.0), "temperature"),
        (ContextRule(window_words=10, overlap_words=10), "overlap_words"),
        (ContextRule(max_windows=-1), "max_windows"),
        (ContextRule(windows_per_chunk=-1), "windows_per_chunk"),
    ],
)
def test_a_bad_rule_is_refused_by_name(
    rule: ContextRule, problem: str, minilm: LocalBackend
) -> None:
    assert any(problem in message for message in rule.validate())
    with pytest.raises(ValueError, match=problem):
        RelevanceScorer(minilm, rule=rule)


async def test_the_scorer_windows_a_long_chunk_and_finds_its_relevant_part(
    minilm: LocalBackend,
) -> None:
    filler = (
        "The cafeteria serves lunch from noon to two and closes early on public holidays. "
        "Parking permits are renewed every January at the front desk of building C. "
    ) * 6
    answer = "To reset your password, click Forgot password on the login page and follow the link."
    long_chunk = filler + answer + " " + filler
    query = "How do I reset my password?"
    recording = Recording(minilm)
    every = ContextRule(window_words=40, overlap_words=10, windows_per_chunk=0)
    windowed = RelevanceScorer(recording, rule=every)
    whole = RelevanceScorer(minilm, rule=ContextRule(window_words=0, pooling="mean"))
    cut = await windowed.score(query, [long_chunk])
    given = await whole.score(query, [long_chunk])
    assert cut.chunks == len(windows(long_chunk, 40, 10)) > 1
    assert len(recording.calls[0]) == 1 + cut.chunks
    assert cut.context_raw is not None and given.context_raw is not None
    assert cut.context_raw > given.context_raw + 0.2


async def test_selection_embeds_only_the_windows_it_keeps(minilm: LocalBackend) -> None:
    recording = Recording(minilm)
    rule = ContextRule(window_words=5, overlap_words=0, windows_per_chunk=0, max_windows=2)
    scorer = RelevanceScorer(recording, rule=rule)
    text = "one two three four five six seven reset nine ten eleven twelve password reset now"
    scores = await scorer.score("password reset", [text])
    assert scores.chunks == 2
    assert recording.calls[0][1:] == [
        "six seven reset nine ten",
        "eleven twelve password reset now",
    ]


def test_the_config_sets_the_rule_and_names_a_bad_setting() -> None:
    settings: dict[str, Any] = {
        "pooling": "softmax",
        "window_words": 32,
        "overlap_words": 8,
        "windows_per_chunk": 3,
        "max_windows": 4,
        "top_k": 2,
    }
    assert ContextRule.of(Config(**settings)) == ContextRule(**settings)
    assert ContextRule.of(Config()) == ContextRule()
    issues = Config(
        pooling="median", window_words=8, overlap_words=8, windows_per_chunk=-1, max_windows=-1
    ).validate()
    assert {issue.path for issue in issues} == {
        "pooling",
        "overlap_words",
        "windows_per_chunk",
        "max_windows",
    }
    assert any("max, mean, softmax" in issue.fix for issue in issues)


def test_selection_weighs_a_query_term_few_windows_hold_above_one_most_hold() -> None:
    chunks = ["the password rules", "the password expiry", "the vpn client", "the password history"]
    assert select_windows("vpn password", chunks, 1) == ["the vpn client"]


async def test_a_repeated_documents_windows_are_cache_hits_whatever_the_query(
    minilm: LocalBackend,
) -> None:
    # Five windows of eight words (step six); vpn is in the second only, password in the
    # fourth, laptop in the fifth.
    words = [f"filler{i:02d}" for i in range(30)]
    words[9], words[21], words[27] = "vpn", "password", "laptop"
    document = " ".join(words)
    cut = windows(document, 8, 2)
    recording = Recording(minilm)
    batcher = MicroBatcher(recording, cache=Cache(64))
    rule = ContextRule(window_words=8, overlap_words=2, windows_per_chunk=2)
    scorer = RelevanceScorer(batcher, rule=rule, prefixes=("query: ", "passage: "))
    await batcher.start()
    try:
        await scorer.score("vpn password", [document])
        first = ["query: vpn password", f"passage: {cut[1]}", f"passage: {cut[3]}"]
        assert sorted(recording.calls[-1]) == sorted(first)
        await scorer.score("vpn laptop", ["  ", document])
    finally:
        await batcher.shutdown()
    # The second window, cut and prefixed as before, came from the cache.
    assert sorted(recording.calls[-1]) == sorted(["query: vpn laptop", f"passage: {cut[4]}"])
    assert batcher.stats().cache.hits == 1


async def test_by_default_a_long_chunk_embeds_only_the_window_bm25_ranks_best(
    minilm: LocalBackend,
) -> None:
    filler = "The cafeteria serves lunch from noon to two and closes early on public holidays. "
    long_chunk = filler * 8 + "Reset your VPN password on the self-service portal. " + filler * 8
    recording = Recording(minilm)
    scorer = RelevanceScorer(recording, rule=ContextRule.of(Config()))
    scores = await scorer.score("How do I reset my VPN password?", [long_chunk])
    cut = windows(long_chunk, Config().window_words, Config().overlap_words)
    assert len(cut) > 2
    assert scores.chunks == 1
    assert len(recording.calls[0]) == 2 and "VPN password" in recording.calls[0][1]
