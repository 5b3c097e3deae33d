from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import logging
import math
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType, ModuleType

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.calibration import (
    EVEN_ODDS_SHIFT,
    IDENTITY,
    PLATT,
    THRESHOLD,
    Calibration,
    CalibrationError,
    Metric,
    fit_calibration,
    identity_calibration,
    load_calibration,
    percentiles,
    roc_auc,
    separation,
    share_at_least,
    shipped_calibrations,
    shipped_name,
)
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.relevance import RelevanceScorer

DATA = (
    Path(__file__).resolve().parents[2]
    / "src"
    / "semhealth"
    / "embeddings"
    / "data"
    / "relevance_pairs.jsonl"
)
MINILM = "all-MiniLM-L6-v2"


def separable(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Relevant pairs around 0.7, irrelevant around 0.3, overlapping a little."""
    rng = np.random.default_rng(seed)
    labels = np.repeat([1, 0], n)
    scores = np.where(labels == 1, rng.normal(0.7, 0.1, 2 * n), rng.normal(0.3, 0.1, 2 * n))
    return scores, labels


def fitted() -> Calibration:
    scores, labels = separable()
    return fit_calibration(scores, labels, encoder="test-encoder", fitted_on="synthetic")


def dig(metrics: Metric, *keys: str) -> Metric:
    for key in keys:
        assert isinstance(metrics, Mapping)
        metrics = metrics[key]
    return metrics


def document(**changes: object) -> str:
    base = json.loads(fitted().to_json())
    base.update(changes)
    return json.dumps(base)


# -- the calibration and its JSON --------------------------------------------------------------


def test_a_calibration_round_trips_through_json() -> None:
    calibration = fitted()
    assert Calibration.from_json(calibration.to_json()) == calibration


def test_the_json_document_keeps_the_fit_metadata() -> None:
    scores, labels = separable()
    calibration = fit_calibration(
        scores, labels, encoder="e", fitted_on="set", data_sha256="ab" * 32, fitted_at="2025-01-02"
    )
    loaded = json.loads(calibration.to_json())
    assert loaded["encoder"] == "e"
    assert loaded["fitted_on"] == "set"
    assert loaded["data_sha256"] == "ab" * 32
    assert loaded["fitted_at"] == "2025-01-02"
    assert loaded["n_fit"] == 80
    assert loaded["metrics"]["fit"]["raw"]["n"] == 80


def test_an_undefined_metric_is_written_as_null() -> None:
    calibration = Calibration("e", PLATT, 1.0, 0.0, "set", 1, metrics={"auc": math.nan})
    assert json.loads(calibration.to_json())["metrics"]["auc"] is None


def test_metrics_are_read_only() -> None:
    calibration = Calibration("e", PLATT, 1.0, 0.0, "set", 1, metrics={"fit": {"n": 3}})
    fit = calibration.metrics["fit"]
    assert isinstance(fit, MappingProxyType)
    with pytest.raises(TypeError):
        fit["n"] = 4  # type: ignore[index]


def test_reading_refuses_a_slope_that_is_not_positive() -> None:
    with pytest.raises(CalibrationError, match="a > 0"):
        Calibration.from_json(document(a=-1.0))


def test_reading_refuses_unknown_keys() -> None:
    with pytest.raises(CalibrationError, match="unknown keys: colour"):
        Calibration.from_json(document(colour="blue"))


def test_reading_refuses_a_missing_key() -> None:
    base = json.loads(fitted().to_json())
    del base["b"]
    with pytest.raises(CalibrationError, match="'b' is missing"):
        Calibration.from_json(json.dumps(base))


def test_reading_refuses_a_wrong_type_by_name() -> None:
    with pytest.raises(CalibrationError, match="'a' must be a number, not a string"):
        Calibration.from_json(document(a="8"))


def test_reading_refuses_another_format_version() -> None:
    with pytest.raises(CalibrationError, match="format"):
        Calibration.from_json(document(format=2))


def test_reading_refuses_text_that_is_not_json() -> None:
    with pytest.raises(CalibrationError, match="must be JSON"):
        Calibration.from_json("{not json")


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(CalibrationError, match="unknown calibration method"):
        Calibration("e", "isotonic", 1.0, 0.0, "set", 1)


# -- applying ----------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0), min_size=2, max_size=50))
def test_apply_is_monotone_and_inside_zero_to_one(cosines: list[float]) -> None:
    calibration = fitted()
    ordered = np.sort(np.array(cosines))
    scores = calibration.apply(ordered)
    assert np.all(np.diff(scores) >= 0)
    assert np.all((scores >= 0) & (scores <= 1))


def test_apply_gives_a_float_for_a_float_and_the_same_value_as_for_an_array() -> None:
    calibration = fitted()
    single = calibration.apply(0.55)
    assert isinstance(single, float)
    assert single == pytest.approx(float(calibration.apply(np.array([0.55]))[0]))


def test_calling_a_calibration_applies_it() -> None:
    calibration = fitted()
    assert calibration(0.6) == calibration.apply(0.6)


def test_a_steep_calibration_does_not_overflow() -> None:
    calibration = Calibration("e", PLATT, 5000.0, -2500.0, "set", 1)
    assert calibration.apply(np.array([-1.0, 1.0])).tolist() == [0.0, 1.0]


def test_raw_at_gives_the_cosine_that_calibrates_to_the_threshold() -> None:
    calibration = fitted()
    raw = calibration.raw_at(THRESHOLD)
    assert raw is not None
    assert calibration.apply(raw) == pytest.approx(THRESHOLD)


def test_the_identity_clips_cosine_to_zero_to_one() -> None:
    identity = identity_calibration("e")
    assert identity.method == IDENTITY
    assert identity.apply(np.array([-0.4, 0.3, 1.2])).tolist() == [0.0, 0.3, 1.0]


# -- fitting -----------------------------------------------------------------------------------


def test_a_fitted_slope_is_positive() -> None:
    assert fitted().a > 0


def test_the_fit_puts_relevant_pairs_above_irrelevant_ones() -> None:
    calibration = fitted()
    assert calibration.apply(0.7) > 0.75 > 0.25 > calibration.apply(0.3)


def test_a_perfectly_separated_sample_still_gets_a_finite_slope() -> None:
    calibration = fit_calibration([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1])
    assert 0 < calibration.a < 1e3
    assert calibration.apply(0.9) < 1.0


def test_the_fit_matches_the_maximum_likelihood_on_a_grid() -> None:
    scores, labels = separable(n=30, seed=4)
    calibration = fit_calibration(scores, labels, prior=0.0)
    positives, negatives = 30, 30
    targets = np.where(labels == 1, (positives + 1) / (positives + 2), 1 / (negatives + 2))

    def loss(a: float, b: float) -> float:
        s = a * scores + b
        return float(np.sum(np.logaddexp(0, s) - targets * s))

    # The fitted probability is the maximum-likelihood one; the score moves its even odds.
    fitted_b = calibration.b - EVEN_ODDS_SHIFT
    best = loss(calibration.a, fitted_b)
    for da in (-0.05, 0.05):
        for db in (-0.05, 0.05):
            assert loss(calibration.a + da, fitted_b + db) >= best


def test_a_fitted_score_crosses_the_threshold_at_the_fits_even_odds() -> None:
    # Mirror images about 0.42 (each relevant pair at 0.42 + d, an irrelevant one at
    # 0.42 - d, overlapping where d < 0): the likelihood is symmetric about 0.42, so the fit
    # finds relevance and irrelevance equally likely there, and only there. Known without
    # reading the fit's own intercept, so a wrong intercept fails here.
    d = np.random.default_rng(4).normal(0.2, 0.1, 30)
    scores = np.concatenate([0.42 + d, 0.42 - d])
    labels = np.repeat([1, 0], 30)
    calibration = fit_calibration(scores, labels)
    assert calibration.apply(0.42) == pytest.approx(THRESHOLD)
    assert calibration.raw_at(THRESHOLD) == pytest.approx(0.42)
    assert pytest.approx(np.log(3.0)) == EVEN_ODDS_SHIFT


def test_fitting_records_the_separation_of_the_fit() -> None:
    calibration = fitted()
    assert dig(calibration.metrics, "fit", "raw", "n") == 80
    assert dig(calibration.metrics, "fit", "calibrated", "roc_auc") == dig(
        calibration.metrics, "fit", "raw", "roc_auc"
    )


def test_fitting_one_class_is_refused() -> None:
    with pytest.raises(CalibrationError, match="relevant and irrelevant"):
        fit_calibration([0.1, 0.5, 0.9], [1, 1, 1])


def test_fitting_equal_scores_is_refused() -> None:
    with pytest.raises(CalibrationError, match="all 4 scores are equal"):
        fit_calibration([0.5] * 4, [0, 1, 0, 1])


def test_fitting_scores_that_rank_backwards_is_refused() -> None:
    scores, labels = separable()
    with pytest.raises(CalibrationError, match="rank irrelevant pairs above relevant"):
        fit_calibration(-scores, labels)


def test_fitting_labels_other_than_zero_and_one_is_refused() -> None:
    with pytest.raises(CalibrationError, match="labels must be 0"):
        fit_calibration([0.1, 0.9], [0, 2])


def test_fitting_mismatched_lengths_is_refused() -> None:
    with pytest.raises(CalibrationError, match="3 scores but 2 labels"):
        fit_calibration([0.1, 0.5, 0.9], [0, 1])


# -- metrics -----------------------------------------------------------------------------------


def brute_force_auc(scores: list[int], labels: list[int]) -> float:
    positives = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    negatives = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1)), min_size=2, max_size=40).filter(
        lambda pairs: len({label for _, label in pairs}) == 2
    )
)
def test_roc_auc_counts_every_pair_and_halves_ties(pairs: list[tuple[int, int]]) -> None:
    scores = [score for score, _ in pairs]
    labels = [label for _, label in pairs]
    assert roc_auc(scores, labels) == pytest.approx(brute_force_auc(scores, labels))


def test_roc_auc_without_both_classes_is_nan() -> None:
    assert math.isnan(roc_auc([0.1, 0.2], [1, 1]))


def test_share_at_least_counts_the_threshold_itself() -> None:
    assert share_at_least([0.74, 0.75, 0.9, 0.1]) == 0.5


def test_percentiles_name_each_point() -> None:
    assert percentiles(np.arange(101.0)) == {"p10": 10.0, "p50": 50.0, "p90": 90.0}


def test_percentiles_of_nothing_are_nan() -> None:
    assert all(math.isnan(value) for value in percentiles([]).values())


def test_separation_reports_both_groups() -> None:
    report = separation([0.9, 0.8, 0.2], [1, 1, 0])
    assert report["n"] == 3
    assert report["roc_auc"] == 1.0
    assert report["relevant"] == pytest.approx(
        {"n": 2, "p10": 0.81, "p50": 0.85, "p90": 0.89, "share_at_least_threshold": 1.0}
    )


# -- loading -----------------------------------------------------------------------------------


def test_the_default_model_ships_a_calibration() -> None:
    assert MINILM in shipped_calibrations()
    calibration = load_calibration(MINILM)
    assert calibration.method == PLATT
    assert calibration.encoder == MINILM


def test_the_hub_name_of_a_packaged_model_finds_its_calibration() -> None:
    assert shipped_name(f"sentence-transformers/{MINILM}") == MINILM
    assert load_calibration(f"sentence-transformers/{MINILM}") == load_calibration(MINILM)


def _shipped(stem: str) -> Calibration:
    """A shipped file as it is, whichever name it serves (``<encoder>.cjk`` included)."""
    folder = resources.files("semhealth.embeddings.calibrations")
    return Calibration.from_json((folder / f"{stem}.json").read_bytes())


def _data_rows() -> list[dict[str, object]]:
    return [orjson.loads(line) for line in DATA.read_bytes().splitlines() if line.strip()]


def _fit_langs(calibration: Calibration) -> list[str]:
    source, split, langs = calibration.fitted_on.split(" ")
    assert (source, split) == ("embeddings/data/relevance_pairs.jsonl", "split=fit")
    return langs.removeprefix("lang=").split(",")


@pytest.mark.parametrize("stem", shipped_calibrations())
def test_each_shipped_calibration_was_fitted_on_the_shipped_data(stem: str) -> None:
    calibration = _shipped(stem)
    assert calibration.data_sha256 == hashlib.sha256(DATA.read_bytes()).hexdigest()
    langs = _fit_langs(calibration)
    rows = [r for r in _data_rows() if r["split"] == "fit" and r["lang"] in langs]
    assert calibration.n_fit == len(rows)


@pytest.mark.parametrize("stem", shipped_calibrations())
def test_each_shipped_calibrations_recorded_threshold_is_what_its_a_and_b_give(stem: str) -> None:
    calibration = _shipped(stem)
    assert dig(calibration.metrics, "threshold") == THRESHOLD
    assert dig(calibration.metrics, "even_odds_at_threshold") is True
    recorded = dig(calibration.metrics, "raw_at_threshold")
    assert recorded == pytest.approx(calibration.raw_at(THRESHOLD), rel=1e-12)


def test_an_unknown_encoder_gets_the_identity_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        calibration = load_calibration("no-such-encoder")
    assert calibration.method == IDENTITY
    assert "no calibration for encoder 'no-such-encoder'" in caplog.text


def test_a_name_that_looks_like_a_path_gets_the_identity() -> None:
    assert load_calibration("../calibration").method == IDENTITY


def test_a_user_file_wins_over_the_shipped_one(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    calibration = fitted()
    path.write_text(calibration.to_json())
    assert load_calibration("test-encoder", path) == calibration


def test_a_user_file_for_another_encoder_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mine.json"
    path.write_text(fitted().to_json())
    with caplog.at_level(logging.WARNING):
        calibration = load_calibration(MINILM, path)
    assert calibration.encoder == "test-encoder"
    assert "fitted for encoder 'test-encoder'" in caplog.text


def test_a_missing_user_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=r"cannot read calibration file .*absent\.json"):
        load_calibration(MINILM, tmp_path / "absent.json")


def test_a_broken_user_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text(document(a=0.0))
    with pytest.raises(CalibrationError, match=r"broken\.json: .*a > 0"):
        load_calibration(MINILM, path)


# -- the shipped calibration on the held-out split, with the real model ------------------------


@pytest.fixture(scope="module")
def heldout(minilm: LocalBackend) -> dict[str, np.ndarray]:
    """Raw context scores of the held-out pairs, through the sidecar's scorer."""
    rows = [orjson.loads(line) for line in DATA.read_bytes().splitlines() if line.strip()]
    # English: the only language the fast profile routes to MiniLM (and fits it on).
    rows = [row for row in rows if row["split"] == "heldout" and row["lang"] == "en"]

    async def score() -> list[float | None]:
        batcher = MicroBatcher(minilm)
        await batcher.start()
        try:
            scorer = RelevanceScorer(batcher)
            results = await asyncio.gather(
                *(scorer.score(row["query"], [row["context"]]) for row in rows)
            )
        finally:
            await batcher.shutdown()
        return [result.context_raw for result in results]

    return {
        "raw": np.array(asyncio.run(score()), dtype=np.float64),
        "labels": np.array([row["label"] for row in rows]),
        "kinds": np.array([row["kind"] for row in rows]),
    }


def test_calibration_keeps_the_raw_ranking_on_held_out_pairs(
    heldout: dict[str, np.ndarray],
) -> None:
    calibration = load_calibration(MINILM)
    raw_auc = roc_auc(heldout["raw"], heldout["labels"])
    calibrated_auc = roc_auc(calibration.apply(heldout["raw"]), heldout["labels"])
    assert calibrated_auc >= raw_auc - 1e-12
    assert calibrated_auc == pytest.approx(raw_auc)


def test_held_out_paraphrases_mostly_score_at_least_the_threshold(
    heldout: dict[str, np.ndarray],
) -> None:
    calibrated = load_calibration(MINILM).apply(heldout["raw"])
    assert share_at_least(calibrated[heldout["kinds"] == "paraphrase"]) > 0.5


def test_held_out_unrelated_pairs_score_below_the_threshold(
    heldout: dict[str, np.ndarray],
) -> None:
    calibrated = load_calibration(MINILM).apply(heldout["raw"])
    assert share_at_least(calibrated[heldout["kinds"] == "unrelated"]) <= 0.05


def test_the_shipped_held_out_figures_are_what_the_model_gives(
    heldout: dict[str, np.ndarray],
) -> None:
    recorded = dig(load_calibration(MINILM).metrics, "heldout", "en", "raw", "roc_auc")
    assert isinstance(recorded, float)
    assert roc_auc(heldout["raw"], heldout["labels"]) == pytest.approx(recorded, abs=0.01)


# -- every shipped calibration refitted from the shipped data, with the real models -------------

# A refit matches the shipped file where it decides: the cosine that calibrates to the
# threshold. all-MiniLM-L6-v2 and USE give the same cosines on every machine (the refit's a
# and b agree to 1e-7); e5's int8 kernels do not quite (cosines ~5e-4 apart here, which
# moves its steep fit's a by ~1 % and the threshold cosine by ~1e-4). A fit with another
# intercept, such as the one without the even-odds shift (b - ln 3), moves the threshold
# cosine by ln 3 / a: 0.011 for e5 and more for the others.
RAW_AT_TOLERANCE = 0.003
SLOPE_TOLERANCE = 0.05  # relative


def _bench_fitter() -> ModuleType:
    """``bench/fit_calibration.py``: the script that wrote the shipped files."""
    path = Path(__file__).resolve().parents[2] / "bench" / "fit_calibration.py"
    spec = importlib.util.spec_from_file_location("bench_fit_calibration", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fitter() -> ModuleType:
    return _bench_fitter()


@pytest.fixture(scope="module")
def raw_fit_scores() -> dict[object, np.ndarray]:
    """Each encoder's raw scores of the fit split, kept for its other calibration (e5's CJK)."""
    return {}


def test_every_shipped_calibration_has_a_fit_and_every_fit_a_file(fitter: ModuleType) -> None:
    chosen = fitter.encoders_to_fit([], ["en", "zh"], {}, "cpu", None)
    assert sorted(shipped_name(one.name) for one in chosen) == list(shipped_calibrations())


@pytest.mark.parametrize("stem", shipped_calibrations())
async def test_each_shipped_calibration_is_what_the_fit_gives_on_the_shipped_data(
    stem: str, fitter: ModuleType, raw_fit_scores: dict[object, np.ndarray]
) -> None:
    shipped = _shipped(stem)
    (chosen,) = [
        one
        for one in fitter.encoders_to_fit([], ["en", "zh"], {}, "cpu", None)
        if shipped_name(one.name) == stem
    ]
    assert list(chosen.langs) == _fit_langs(shipped)
    pairs = fitter.load_pairs(DATA)
    fit = pairs.splits == "fit"
    if chosen.encoder not in raw_fit_scores:
        rows = fitter.Pairs(
            queries=tuple(q for q, f in zip(pairs.queries, fit, strict=True) if f),
            contexts=tuple(c for c, f in zip(pairs.contexts, fit, strict=True) if f),
            labels=pairs.labels[fit],
            langs=pairs.langs[fit],
            splits=pairs.splits[fit],
            kinds=pairs.kinds[fit],
        )
        raw_fit_scores[chosen.encoder] = await fitter.raw_scores(chosen.encoder, rows)
    raw = raw_fit_scores[chosen.encoder]
    served = np.isin(pairs.langs[fit], list(chosen.langs))
    refit = fit_calibration(raw[served], pairs.labels[fit][served], encoder=shipped.encoder)
    assert refit.n_fit == shipped.n_fit
    assert shipped.raw_at(THRESHOLD) == pytest.approx(refit.raw_at(THRESHOLD), abs=RAW_AT_TOLERANCE)
    assert shipped.a == pytest.approx(refit.a, rel=SLOPE_TOLERANCE)
