"""Calibrated blends of several encoders' cosines, and threshold agreement."""

from __future__ import annotations

import numpy as np
import pytest

from semhealth.embeddings.calibration import (
    CalibrationError,
    fit_blend,
    fit_calibration,
    roc_auc,
    threshold_agreement,
)


def _two_encoders(seed: int = 0, n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of two noisy encoders whose errors are independent, and the labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    first = 0.5 + 0.1 * labels + rng.normal(0, 0.08, n)
    second = 0.8 + 0.05 * labels + rng.normal(0, 0.04, n)
    return np.column_stack([first, second]), labels


def test_a_blend_of_independent_encoders_ranks_better_than_either() -> None:
    cosines, labels = _two_encoders()
    blend = fit_blend(cosines, labels, ("a", "b"))
    assert blend.encoders == ("a", "b")
    assert all(weight > 0 for weight in blend.weights)
    held, held_labels = _two_encoders(seed=1)
    blended = roc_auc(blend.apply(held), held_labels)
    assert blended > max(roc_auc(held[:, 0], held_labels), roc_auc(held[:, 1], held_labels))


def test_a_blend_of_one_encoder_is_its_platt_calibration() -> None:
    cosines, labels = _two_encoders()
    blend = fit_blend(cosines[:, :1], labels, ("a",))
    platt = fit_calibration(cosines[:, 0], labels)
    grid = np.linspace(0.2, 0.9, 8)
    np.testing.assert_allclose(blend.apply(grid[:, None]), platt.apply(grid), atol=1e-6)


def test_a_blend_needs_both_classes_and_matching_columns() -> None:
    cosines, labels = _two_encoders()
    with pytest.raises(CalibrationError, match="relevant and irrelevant"):
        fit_blend(cosines, np.ones_like(labels), ("a", "b"))
    with pytest.raises(CalibrationError, match="2 encoders"):
        fit_blend(cosines[:, :1], labels, ("a", "b"))


def test_threshold_agreement_counts_scores_on_the_labels_side() -> None:
    assert threshold_agreement([0.9, 0.8, 0.2, 0.76], [1, 0, 0, 1]) == pytest.approx(0.75)
    assert threshold_agreement([0.75], [1]) == 1.0
    assert np.isnan(threshold_agreement([], []))
