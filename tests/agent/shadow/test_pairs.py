"""A primary and a shadow record of the same request, compared; and the verdict over pairs."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from semhealth.agent.config import Tolerances
from semhealth.agent.shadow.diff import default_segmenter
from semhealth.agent.shadow.pairs import agreement, compare
from semhealth.agent.shadow.stats import bootstrap_mean, judge
from semhealth.collectors import RequestFacts, StreamRecord, StructureRequest, ToolCall
from semhealth.embeddings import LocalBackend, RelevanceScorer

SEGMENT = default_segmenter()


def record(text: str = "", **fields: object) -> StreamRecord:
    base = StreamRecord(
        route="chat",
        provider="openai_chat",
        model="m",
        prompt_class="short",
        request=RequestFacts(query="What is the capital of France?", analysed=True),
        status=200,
        start_ns=0,
        end_ns=1_000_000_000,
        first_delta_ns=200_000_000,
        output_text=text,
        done=True,
        streamed=True,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_the_same_answer_is_an_exact_pair() -> None:
    pair = compare("x1", record("Paris."), record("Paris."), SEGMENT)
    assert pair.result == "exact"
    assert pair.tokens is not None and pair.tokens.distance == 0.0


def test_a_different_answer_gives_its_token_measures() -> None:
    pair = compare(
        "x2",
        record("The capital of France is Paris."),
        record("The capital of France is Lyon."),
        SEGMENT,
    )
    assert pair.result == "differs"
    assert pair.tokens is not None
    assert (pair.tokens.first_divergence, pair.tokens.distance) == (5, pytest.approx(1 / 7))


def test_json_answers_are_diffed_by_path_when_the_request_asked_for_json() -> None:
    facts = RequestFacts(query="q", structure=(StructureRequest("json_object"),), analysed=True)
    pair = compare(
        "x3",
        record('{"city": "Paris", "pop": 2}', request=facts),
        record('{"pop": 2, "city": "Lyon"}', request=facts),
        SEGMENT,
    )
    assert pair.json is not None
    assert (pair.json.equal, pair.json.paths) == (False, ("$.city",))


def test_tool_calls_are_compared_and_decide_exactness() -> None:
    ours = (ToolCall(0, "a", "get_weather", '{"city": "Paris"}'),)
    theirs = (ToolCall(0, "b", "get_weather", '{"city": "Lyon"}'),)
    pair = compare("x4", record(tool_calls=ours), record(tool_calls=theirs), SEGMENT)
    assert pair.result == "differs"
    assert pair.tools is not None and pair.tools.argument_paths == ("0:$.city",)


def test_a_failed_candidate_is_a_candidate_error_with_its_own_service_figures() -> None:
    pair = compare("x5", record("Paris."), record(status=503, error_type="503"), SEGMENT)
    assert pair.result == "candidate_error"
    assert pair.tokens is None
    assert (pair.primary.status, pair.shadow.status, pair.shadow.error_type) == (200, 503, "503")
    assert pair.primary.ttft_s == pytest.approx(0.2)


async def test_agreement_is_high_for_a_paraphrase_and_low_for_an_unrelated_answer(
    minilm: LocalBackend,
) -> None:
    scorer = RelevanceScorer(minilm)
    primary = record("The capital of France is Paris.")
    close = record("Paris is France's capital city.")
    far = record("Photosynthesis turns light into chemical energy in plants.")
    near_pair = await agreement(compare("a", primary, close, SEGMENT), primary, close, scorer)
    far_pair = await agreement(compare("b", primary, far, SEGMENT), primary, far, scorer)
    assert near_pair.agreement is not None and far_pair.agreement is not None
    assert near_pair.agreement > far_pair.agreement + 0.2


async def test_exact_answers_agree_fully_without_embedding(minilm: LocalBackend) -> None:
    primary = record("Paris.")
    pair = await agreement(compare("c", primary, primary, SEGMENT), primary, primary, None)  # type: ignore[arg-type]
    assert pair.agreement == 1.0


# --------------------------------------------------------------------------- the verdict


def test_a_bootstrap_interval_contains_the_mean_and_narrows_with_more_pairs() -> None:
    rng = random.Random(3)
    few = bootstrap_mean([rng.gauss(0.2, 0.05) for _ in range(20)])
    many = bootstrap_mean([rng.gauss(0.2, 0.05) for _ in range(2000)])
    assert few is not None and many is not None
    assert few.low <= few.mean <= few.high
    assert many.high - many.low < few.high - few.low
    assert many.low < 0.2 < many.high


def test_no_values_have_no_interval_and_one_value_a_point() -> None:
    assert bootstrap_mean([]) is None
    one = bootstrap_mean([0.4])
    assert one is not None and (one.low, one.high) == (0.4, 0.4)


def _judge(distance: float, agree: float, ttft: float, failures: int, pairs: int = 100) -> str:
    return judge(
        token_distances=[distance] * pairs,
        agreements=[agree] * pairs,
        ttft_ratios=[ttft] * pairs,
        candidate_errors=[1.0] * failures + [0.0] * (pairs - failures),
        tolerances=Tolerances(),
    ).verdict


def test_a_candidate_within_every_tolerance_passes() -> None:
    assert _judge(0.1, 0.95, 1.0, 0) == "pass"


@pytest.mark.parametrize(
    ("distance", "agree", "ttft", "failures"),
    [(0.8, 0.95, 1.0, 0), (0.1, 0.5, 1.0, 0), (0.1, 0.95, 1.6, 0), (0.1, 0.95, 1.0, 10)],
    ids=["tokens", "agreement", "ttft", "errors"],
)
def test_a_candidate_past_any_tolerance_fails(
    distance: float, agree: float, ttft: float, failures: int
) -> None:
    assert _judge(distance, agree, ttft, failures) == "fail"


def test_a_candidate_that_errors_on_every_request_fails_though_nothing_else_was_measured() -> None:
    verdict = judge(
        token_distances=[],
        agreements=[],
        ttft_ratios=[],
        candidate_errors=[1.0] * 35,
        tolerances=Tolerances(),
    )
    assert verdict.verdict == "fail"
    assert [c.passed for c in verdict.checks] == [None, None, None, False]


def test_a_measure_that_could_not_be_taken_with_nothing_failed_is_insufficient() -> None:
    verdict = judge(
        token_distances=[0.1] * 100,
        agreements=[],  # relevance off: no agreement to measure
        ttft_ratios=[1.0] * 100,
        candidate_errors=[0.0] * 100,
        tolerances=Tolerances(),
    )
    assert verdict.verdict == "insufficient"


# Per-pair values whose mean passes its tolerance while the interval's conservative end does
# not (tolerances: the defaults). Every other measure is well within its own.
CONSERVATIVE_END_CASES = {
    # 1 failure in 100: a mean of 0.01 meets max_error_rate 0.01; resamples with two or more
    # failures put the interval's high end above it.
    "candidate_error_rate": {"candidate_errors": [1.0] + [0.0] * 99},
    # 0 and 0.9 in turn: mean 0.45 under max_token_distance 0.5, high end above it.
    "token_distance": {"token_distances": [0.0, 0.9] * 25},
    # 1.0 and 0.64 in turn: mean 0.82 over min_agreement 0.8, low end under it.
    "answer_agreement": {"agreements": [1.0, 0.64] * 25},
    # 0.8 and 1.5 in turn: mean 1.15 under max_ttft_ratio 1.2, high end above it.
    "ttft_ratio": {"ttft_ratios": [0.8, 1.5] * 25},
}


@pytest.mark.parametrize("name", CONSERVATIVE_END_CASES)
def test_each_check_is_judged_on_the_conservative_end_of_its_interval(name: str) -> None:
    measures: dict[str, list[float]] = {
        "token_distances": [0.1] * 50,
        "agreements": [0.95] * 50,
        "ttft_ratios": [1.0] * 50,
        "candidate_errors": [0.0] * 50,
    }
    measures.update(CONSERVATIVE_END_CASES[name])
    verdict = judge(**measures, tolerances=Tolerances())  # type: ignore[arg-type]
    checks = {check.name: check for check in verdict.checks}
    check = checks[name]
    assert check.interval is not None
    if name == "answer_agreement":  # a floor: its conservative end is the low one
        assert check.interval.mean >= check.limit > check.interval.low
    else:
        assert check.interval.mean <= check.limit < check.interval.high
    assert check.passed is False
    assert [other.passed for other in verdict.checks if other.name != name] == [True] * 3
    assert verdict.verdict == "fail"


def test_too_few_pairs_is_no_verdict() -> None:
    assert _judge(0.1, 0.95, 1.0, 0, pairs=5) == "insufficient"
