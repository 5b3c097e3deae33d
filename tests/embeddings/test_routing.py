# ruff: noqa: RUF001 -- the Chinese and fullwidth texts carry fullwidth characters on purpose.
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.embeddings.backend import Backend
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.calibration import (
    THRESHOLD,
    load_calibration,
    roc_auc,
    share_at_least,
)
from semhealth.embeddings.config import USE_MODEL, Config, Encoder, Use, default_config
from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.jsonl import calibrate_from_jsonl
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.relevance import RelevanceScorer
from semhealth.embeddings.routing import RoutingScorer, cjk_request, has_cjk
from semhealth.embeddings.use import UseBackend
from tests.embeddings.wrappers import Recording

DATA = (
    Path(__file__).resolve().parents[2]
    / "src"
    / "semhealth"
    / "embeddings"
    / "data"
    / "relevance_pairs.jsonl"
)
MINILM = "all-MiniLM-L6-v2"
ENGLISH = ("How do I reset my password?", ["Click 'Forgot password' on the login page."])
CHINESE = ("怎样重置密码？", ["在登录页面点击“忘记密码”。"])


@pytest.fixture(scope="module")
def use() -> Iterator[UseBackend]:
    backend = UseBackend(threads=2)
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture
async def spied(
    minilm: LocalBackend, use: UseBackend
) -> AsyncIterator[tuple[RoutingScorer, Recording, Recording]]:
    english, multilingual = Recording(minilm), Recording(use)
    backends = {"default": english, "multilingual": multilingual}
    async with open_scorer(default_config(), backends=backends) as scorer:
        assert isinstance(scorer, RoutingScorer)
        yield scorer, english, multilingual


# -- has_cjk -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "怎样重置密码",  # simplified Chinese
        "怎樣重置密碼",  # traditional Chinese
        "ひらがな",  # Hiragana
        "カタカナ",  # Katakana
        "ｶﾀｶﾅ",  # halfwidth Katakana
        "비밀번호",  # Hangul syllables
        "ㄱㄴㄷ",  # Hangul compatibility jamo
        "㐀",  # Han extension A
        "𠀀",  # Han extension B, outside the BMP
        "𰀀",  # Han extension G
        "豈",  # CJK compatibility ideograph
        "Order #4411 arrived 壊れた",  # one CJK word in English text
    ],
)
def test_chinese_japanese_and_korean_text_is_cjk(text: str) -> None:
    assert has_cjk(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "How do I reset my password?",
        "café, naïve, Zürich",
        "Как сбросить пароль?",
        "كيف أعيد تعيين كلمة المرور",
        "पासवर्ड कैसे बदलें",
        "ok 👍",
        "。、「」《》",  # CJK punctuation is no script's letters
        "ＡＢＣ１２３",  # fullwidth Latin and digits
    ],
)
def test_other_scripts_and_cjk_punctuation_are_not_cjk(text: str) -> None:
    assert not has_cjk(text)


@given(st.text(), st.sampled_from("中日한ひカ𠀀"), st.text())
def test_one_cjk_character_anywhere_makes_text_cjk(before: str, cjk: str, after: str) -> None:
    assert has_cjk(before + cjk + after)


@given(st.text(alphabet=st.characters(max_codepoint=0x2E7F)))
def test_text_below_the_cjk_blocks_without_jamo_is_never_cjk(text: str) -> None:
    assert has_cjk(text) == any("\u1100" <= ch <= "\u11ff" for ch in text)


def test_a_request_is_cjk_when_only_a_chunk_or_the_answer_is() -> None:
    assert cjk_request("What does this say?", ["Nothing", "重置密码"])
    assert cjk_request("Translate 'hello' into Japanese", [], "こんにちは")
    assert not cjk_request("What does this say?", ["Nothing"], "Nothing at all")


# -- routing -----------------------------------------------------------------------------------


async def test_a_chinese_request_is_embedded_by_use_alone(
    spied: tuple[RoutingScorer, Recording, Recording],
) -> None:
    scorer, english, multilingual = spied
    await scorer.score(*CHINESE)
    assert english.calls == []
    assert multilingual.calls == [[CHINESE[0], *CHINESE[1]]]


async def test_an_english_request_is_embedded_by_minilm_alone(
    spied: tuple[RoutingScorer, Recording, Recording],
) -> None:
    scorer, english, multilingual = spied
    await scorer.score(*ENGLISH)
    assert english.calls == [[ENGLISH[0], *ENGLISH[1]]]
    assert multilingual.calls == []


async def test_an_english_query_with_a_chinese_chunk_goes_whole_to_use(
    spied: tuple[RoutingScorer, Recording, Recording],
) -> None:
    scorer, english, multilingual = spied
    await scorer.score(ENGLISH[0], [ENGLISH[1][0], CHINESE[1][0]], "Use the link.")
    assert english.calls == []
    assert sorted(multilingual.calls[0]) == sorted(
        [ENGLISH[0], ENGLISH[1][0], CHINESE[1][0], "Use the link."]
    )


async def test_routed_requests_are_counted_per_encoder(
    spied: tuple[RoutingScorer, Recording, Recording],
) -> None:
    scorer, _, _ = spied
    await scorer.score(*CHINESE)
    await scorer.score(*CHINESE)
    await scorer.score(*ENGLISH)
    assert scorer.routed == {"default": 1, "multilingual": 2}


async def test_each_encoder_applies_its_own_shipped_calibration(
    spied: tuple[RoutingScorer, Recording, Recording],
) -> None:
    scorer, _, _ = spied
    chinese = await scorer.score(*CHINESE)
    english = await scorer.score(*ENGLISH)
    assert chinese.context_raw is not None and english.context_raw is not None
    assert chinese.context == load_calibration(USE_MODEL)(chinese.context_raw)
    assert english.context == load_calibration(MINILM)(english.context_raw)


async def test_with_routing_off_the_scorer_is_the_default_encoders(minilm: LocalBackend) -> None:
    config = Config(route_cjk_to=None)
    english = Recording(minilm)
    async with open_scorer(config, backends={"default": english}) as scorer:
        assert isinstance(scorer, RelevanceScorer)
        await scorer.score(*CHINESE)
    assert english.calls == [[CHINESE[0], *CHINESE[1]]]


async def test_routing_to_the_default_encoder_itself_is_no_routing(minilm: LocalBackend) -> None:
    config = Config(route_cjk_to="default")
    async with open_scorer(config, backends={"default": minilm}) as scorer:
        assert isinstance(scorer, RelevanceScorer)


async def test_one_backend_handed_in_scores_every_request_unrouted(minilm: LocalBackend) -> None:
    english = Recording(minilm)
    async with open_scorer(default_config(), backend=english) as scorer:
        assert isinstance(scorer, RelevanceScorer)
        await scorer.score(*CHINESE)
    assert len(english.calls) == 1


async def test_backend_and_backends_together_are_refused(minilm: LocalBackend) -> None:
    with pytest.raises(ValueError, match="either backend"):
        async with open_scorer(backend=minilm, backends={"default": minilm}):
            pass


def test_a_router_needs_a_scorer_for_both_of_its_encoders(minilm: LocalBackend) -> None:
    scorer = RelevanceScorer(MicroBatcher(minilm))
    with pytest.raises(ValueError, match="the cjk encoder 'zh' has no scorer"):
        RoutingScorer({"en": scorer}, default="en", cjk="zh")


async def test_calibrating_through_the_router_is_refused(
    spied: tuple[RoutingScorer, Recording, Recording],
) -> None:
    scorer, _, _ = spied
    with pytest.raises(ValueError, match="one encoder"):
        await calibrate_from_jsonl([], scorer, "mixed")


# -- the routed default on held-out pairs --------------------------------------------------------


@pytest.fixture(scope="module")
def heldout(minilm: LocalBackend, use: UseBackend) -> dict[str, np.ndarray]:
    """Held-out pairs: the routed default's scores and raw all-MiniLM-L6-v2 on every pair."""
    rows = [orjson.loads(line) for line in DATA.read_bytes().splitlines() if line.strip()]
    rows = [row for row in rows if row["split"] == "heldout"]

    async def score() -> tuple[list[float | None], list[float | None]]:
        backends: dict[str, Backend] = {"default": minilm, "multilingual": use}
        async with open_scorer(default_config(), backends=backends) as routed:
            results = await asyncio.gather(
                *(routed.score(row["query"], [row["context"]]) for row in rows)
            )
        unrouted = Config(route_cjk_to=None)
        async with open_scorer(unrouted, backends=backends) as plain:
            raw = await asyncio.gather(
                *(plain.score(row["query"], [row["context"]]) for row in rows)
            )
        return [r.context for r in results], [r.context_raw for r in raw]

    routed, minilm_raw = asyncio.run(score())
    return {
        "routed": np.array(routed, dtype=np.float64),
        "minilm_raw": np.array(minilm_raw, dtype=np.float64),
        "labels": np.array([row["label"] for row in rows]),
        "kinds": np.array([row["kind"] for row in rows]),
        "langs": np.array([row["lang"] for row in rows]),
    }


def test_the_routed_calibrated_score_separates_at_least_as_well_as_raw_minilm(
    heldout: dict[str, np.ndarray],
) -> None:
    routed = roc_auc(heldout["routed"], heldout["labels"])
    minilm = roc_auc(heldout["minilm_raw"], heldout["labels"])
    assert routed >= minilm


def test_the_routed_score_separates_chinese_well(heldout: dict[str, np.ndarray]) -> None:
    chinese = heldout["langs"] == "zh"
    assert roc_auc(heldout["routed"][chinese], heldout["labels"][chinese]) > 0.9


def test_held_out_paraphrases_score_at_least_the_threshold(
    heldout: dict[str, np.ndarray],
) -> None:
    paraphrases = heldout["routed"][heldout["kinds"] == "paraphrase"]
    assert share_at_least(paraphrases, THRESHOLD) >= 0.8


def test_held_out_unrelated_pairs_score_below_the_threshold(
    heldout: dict[str, np.ndarray],
) -> None:
    unrelated = heldout["routed"][heldout["kinds"] == "unrelated"]
    assert share_at_least(unrelated, THRESHOLD) <= 0.05


# -- configuration -----------------------------------------------------------------------------


def test_routing_to_an_encoder_that_is_not_configured_is_named() -> None:
    config = Config(encoders=(Encoder(),))
    (issue,) = config.validate()
    assert issue.path == "route_cjk_to"
    assert issue.message == (
        "route_cjk_to names encoder 'multilingual', which is not among the encoders"
    )
    assert (
        issue.fix
        == "name one of the encoders (default), or null to score every request with 'default'"
    )


def test_one_encoder_without_routing_is_valid() -> None:
    assert Config(encoders=(Encoder(),), route_cjk_to=None).validate() == []


def test_routing_to_another_configured_encoder_is_valid() -> None:
    config = Config(encoders=(Encoder(), Encoder(name="cjk", backend="use")), route_cjk_to="cjk")
    assert config.validate() == []
    assert config.routes_cjk


def test_use_threads_are_checked_under_the_use_section() -> None:
    config = Config(
        encoders=(Encoder(), Encoder(name="multilingual", backend="use", use=Use(threads=0)))
    )
    assert [(issue.path, issue.message) for issue in config.validate()] == [
        ("encoders[1].use.threads", "threads must be at least 1, not 0")
    ]


def test_a_use_encoder_runs_the_use_model_whatever_its_local_section_says() -> None:
    assert Encoder(backend="use").model == USE_MODEL
    assert Encoder().model == MINILM
