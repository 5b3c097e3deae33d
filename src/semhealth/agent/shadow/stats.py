"""Confidence intervals over pairs, and the verdict against the configured tolerances.

The interval is a percentile bootstrap of the mean: resample the pairs with replacement,
take the mean of each resample, and read the interval from those means. It is a dozen
lines of numpy, vectorised over all resamples at once; scipy's ``stats.bootstrap`` does the
same but would make scipy a dependency of the sidecar for one function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from semhealth.agent.config import Tolerances


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over ``n`` pairs and its ``confidence`` bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float


def bootstrap_mean(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval | None:
    """None with no values; a zero-width interval with one."""
    data = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if data.size == 0:
        return None
    mean = float(data.mean())
    if data.size == 1:
        return Interval(mean, mean, mean, 1, confidence)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, data.size, size=(resamples, data.size))
    means = data[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(mean, float(low), float(high), int(data.size), confidence)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    interval: Interval | None
    limit: float
    passed: bool | None  # None: not enough pairs to say


@dataclass(frozen=True, slots=True)
class Verdict:
    """``pass``, ``fail`` or ``insufficient`` (no check failed, and there were fewer pairs than
    ``min_pairs`` or a check could not be measured), with every check behind it."""

    verdict: str
    pairs: int
    checks: tuple[Check, ...]


def _upper_within(interval: Interval | None, limit: float, enough: bool) -> bool | None:
    return None if interval is None or not enough else interval.high <= limit


def _lower_within(interval: Interval | None, limit: float, enough: bool) -> bool | None:
    return None if interval is None or not enough else interval.low >= limit


def judge(
    *,
    token_distances: Sequence[float],
    agreements: Sequence[float],
    ttft_ratios: Sequence[float],
    candidate_errors: Sequence[float],
    tolerances: Tolerances,
) -> Verdict:
    """The verdict over one route's pairs (each sequence: one value per pair that has it;
    ``candidate_errors``: 1.0 or 0.0 for every pair)."""
    pairs = len(candidate_errors)
    enough = pairs >= tolerances.min_pairs
    distance = bootstrap_mean(token_distances)
    agree = bootstrap_mean(agreements)
    ttft = bootstrap_mean(ttft_ratios)
    errors = bootstrap_mean(candidate_errors)
    checks = (
        Check(
            "token_distance",
            distance,
            tolerances.max_token_distance,
            _upper_within(distance, tolerances.max_token_distance, enough),
        ),
        Check(
            "answer_agreement",
            agree,
            tolerances.min_agreement,
            _lower_within(agree, tolerances.min_agreement, enough),
        ),
        Check(
            "ttft_ratio",
            ttft,
            tolerances.max_ttft_ratio,
            _upper_within(ttft, tolerances.max_ttft_ratio, enough),
        ),
        Check(
            "candidate_error_rate",
            errors,
            tolerances.max_error_rate,
            _upper_within(errors, tolerances.max_error_rate, enough),
        ),
    )
    return Verdict(_verdict(checks), pairs, checks)


def _verdict(checks: Sequence[Check]) -> str:
    """A check that failed fails the route, whatever else could not be measured (a candidate
    that errors on every request leaves nothing else to measure); ``insufficient`` only when
    nothing failed and something could not be said; ``pass`` when every check passed."""
    if any(check.passed is False for check in checks):
        return "fail"
    if any(check.passed is None for check in checks):
        return "insufficient"
    return "pass"
