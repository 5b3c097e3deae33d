"""Bucket boundaries are part of the metrics' contract: a change here must be deliberate."""

from __future__ import annotations

import itertools

from semhealth.agent.telemetry import buckets
from semhealth.agent.telemetry.instruments import SPECS


def test_gen_ai_buckets_are_the_semantic_conventions() -> None:
    assert buckets.GEN_AI_DURATION_S == (
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    )  # fmt: skip
    assert buckets.GEN_AI_TOKENS == (
        1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
    )  # fmt: skip
    assert buckets.GEN_AI_TTFT_S == (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    )  # fmt: skip
    assert buckets.GEN_AI_TPOT_S == (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    )  # fmt: skip


def test_relevance_buckets_are_dense_around_the_default_threshold() -> None:
    around = [b for b in buckets.RELEVANCE if 0.5 <= b <= 0.95]
    assert 0.75 in buckets.RELEVANCE
    assert max(b - a for a, b in itertools.pairwise(around)) <= 0.05 + 1e-9


def test_continuity_buckets_have_the_default_alert_threshold_as_a_boundary() -> None:
    assert 0.015 in buckets.CONTINUITY_S


def test_every_family_is_strictly_increasing() -> None:
    for spec in SPECS:
        if spec.buckets is not None:
            assert list(spec.buckets) == sorted(set(spec.buckets)), spec.name
