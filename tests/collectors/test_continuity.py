"""Stream continuity: quantiles, the index and stalls, from a record's delta arrival times."""

from __future__ import annotations

import itertools
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.continuity import (
    gaps_ns,
    intervals_s,
    measure_continuity,
    pstdev,
    quantile,
)
from semhealth.collectors.record import RequestFacts, StreamRecord

MS = 1_000_000


def _record(delta_ns: tuple[int, ...], start_ns: int = 0) -> StreamRecord:
    return StreamRecord(
        route="chat_completions",
        provider="openai_chat",
        model="m",
        prompt_class="short",
        request=RequestFacts(),
        status=200,
        start_ns=start_ns,
        end_ns=(delta_ns[-1] if delta_ns else start_ns) + MS,
        first_delta_ns=delta_ns[0] if delta_ns else None,
        delta_ns=delta_ns,
    )


# Gaps 100, 100, 400, 50 ms after a first delta 100 ms in: one stutter in an otherwise even stream.
STUTTER = _record((100 * MS, 200 * MS, 300 * MS, 700 * MS, 750 * MS))


# NumPy's default (method="linear") quantile, computed by hand: position (n - 1) * q.
@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 0.25, 1.75),
        ([1.0, 2.0, 3.0, 4.0], 0.95, 3.85),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 0.9, 46.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 0.5, 30.0),
        ([0.1, 0.4], 0.5, 0.25),
        ([7.0], 0.95, 7.0),
        ([1.0, 5.0, 9.0], 0.0, 1.0),
        ([1.0, 5.0, 9.0], 1.0, 9.0),
    ],
)
def test_quantile_matches_numpy_linear_interpolation(
    values: list[float], q: float, expected: float
) -> None:
    assert quantile(values, q) == pytest.approx(expected)


def test_quantile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        quantile([], 0.5)


# Gaps are negative where arrival times are out of order (a clock step in a recording).
@given(st.lists(st.integers(min_value=-(10**13), max_value=10**13), min_size=1, max_size=300))
def test_pstdev_equals_the_standard_library(values: list[int]) -> None:
    assert pstdev(values) == pytest.approx(statistics.pstdev(values), rel=1e-9, abs=1e-6)


@given(st.integers(min_value=-(10**13), max_value=10**13), st.integers(min_value=1, max_value=500))
def test_pstdev_of_equal_values_is_exactly_zero(value: int, n: int) -> None:
    assert pstdev([value] * n) == 0.0


def test_gaps_are_nanoseconds_between_consecutive_arrivals() -> None:
    assert gaps_ns((5, 250 * MS, 1250 * MS)) == [250 * MS - 5, 1000 * MS]


def test_intervals_are_seconds_between_consecutive_arrivals() -> None:
    assert intervals_s((0, 250 * MS, 1250 * MS)) == [0.25, 1.0]


def test_ttft_runs_from_request_start_to_first_delta() -> None:
    record = _record((130 * MS, 140 * MS), start_ns=30 * MS)
    assert measure_continuity(record, 0.5).ttft_s == pytest.approx(0.1)


def test_index_is_the_population_std_dev_of_the_gaps() -> None:
    # Mean 0.1625; squared deviations sum to 0.076875; sqrt(0.076875 / 4).
    assert measure_continuity(STUTTER, 0.5).index_s == pytest.approx(0.01921875**0.5)


def test_gap_quantiles_and_max_are_reported() -> None:
    continuity = measure_continuity(STUTTER, 0.5)
    # Sorted gaps 0.05, 0.1, 0.1, 0.4: p50 at position 1.5, p95 at 2.85.
    assert continuity.p50_gap_s == pytest.approx(0.1)
    assert continuity.p95_gap_s == pytest.approx(0.355)
    assert continuity.max_gap_s == pytest.approx(0.4)
    assert continuity.deltas == 5


def test_stalls_are_gaps_strictly_over_the_threshold() -> None:
    # Two gaps are exactly 0.1 s: at the threshold, not over it.
    assert measure_continuity(STUTTER, 0.1).stalls == 1
    assert measure_continuity(STUTTER, 0.09).stalls == 3
    assert measure_continuity(STUTTER, 0.4).stalls == 0


def test_one_delta_has_ttft_but_no_gap_figures() -> None:
    continuity = measure_continuity(_record((80 * MS,)), 0.5)
    assert continuity.ttft_s == pytest.approx(0.08)
    assert continuity.deltas == 1
    assert continuity.index_s is None
    assert continuity.p50_gap_s is None
    assert continuity.p95_gap_s is None
    assert continuity.max_gap_s is None
    assert continuity.stalls == 0


def test_no_deltas_has_no_ttft() -> None:
    continuity = measure_continuity(_record(()), 0.5)
    assert continuity.ttft_s is None
    assert continuity.deltas == 0
    assert continuity.index_s is None
    assert continuity.stalls == 0


@given(
    start=st.integers(min_value=0, max_value=10**12),
    first=st.integers(min_value=0, max_value=10**10),
    step=st.integers(min_value=0, max_value=10**10),
    count=st.integers(min_value=2, max_value=300),
)
def test_evenly_spaced_deltas_have_index_zero(
    start: int, first: int, step: int, count: int
) -> None:
    deltas = tuple(start + first + i * step for i in range(count))
    assert measure_continuity(_record(deltas, start), 0.5).index_s == 0.0


# Gaps below 1000 s in ns: every distinct integer gap stays a distinct float in seconds.
arrivals = st.lists(st.integers(min_value=0, max_value=10**12), min_size=2, max_size=100).map(
    lambda gaps: tuple(itertools.accumulate(gaps))
)


@given(arrivals, st.integers(min_value=0, max_value=10**12))
def test_stalls_count_the_gaps_over_the_threshold(
    deltas: tuple[int, ...], threshold_ns: int
) -> None:
    over = sum(1 for a, b in itertools.pairwise(deltas) if b - a > threshold_ns)
    assert measure_continuity(_record(deltas), threshold_ns / 1e9).stalls == over


@given(arrivals)
def test_gap_figures_are_ordered(deltas: tuple[int, ...]) -> None:
    continuity = measure_continuity(_record(deltas), 0.5)
    min_gap = min(b - a for a, b in itertools.pairwise(deltas)) / 1e9
    assert continuity.max_gap_s is not None
    assert continuity.p95_gap_s is not None
    assert continuity.p50_gap_s is not None
    assert continuity.max_gap_s >= continuity.p95_gap_s >= continuity.p50_gap_s >= min_gap
