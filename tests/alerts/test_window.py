"""The sketch and the slotted window against a sorted-list reference."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.alerts.window import ZERO_THRESHOLD, Sketch, Window

ALPHA = 0.01
# Float noise at a bucket's edge can add a rounding error on top of alpha.
TOLERANCE = ALPHA * (1 + 1e-9)
QS = [0.0, 0.01, 0.07, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]

positive = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False)
# Signals are scores, seconds and 0/1 ratios: mostly small positives, with exact zeros.
values = st.one_of(positive, st.just(0.0), st.floats(min_value=0.0, max_value=1.0))


def reference_quantile(data: list[float], q: float) -> float:
    ordered = sorted(data)
    rank = max(1, math.ceil(Fraction(str(q)) * len(ordered)))
    return ordered[rank - 1]


def sketch_of(data: list[float], **options: int | float) -> Sketch:
    sketch = Sketch(**options)  # type: ignore[arg-type]
    for value in data:
        sketch.add(value)
    return sketch


def assert_close(estimate: float | None, truth: float) -> None:
    assert estimate is not None
    if truth <= ZERO_THRESHOLD:  # the zero bucket answers 0, clamped to the smallest value
        assert abs(estimate - truth) <= ZERO_THRESHOLD
    else:
        assert abs(estimate - truth) <= TOLERANCE * abs(truth)


@settings(max_examples=300)
@given(data=st.lists(values, min_size=1, max_size=300), q=st.sampled_from(QS))
def test_quantile_is_within_alpha_of_the_lower_nearest_rank(data: list[float], q: float) -> None:
    assert_close(sketch_of(data).quantile(q), reference_quantile(data, q))


@given(data=st.lists(values, min_size=1, max_size=300))
def test_count_sum_mean_min_max_are_exact(data: list[float]) -> None:
    sketch = sketch_of(data)
    assert sketch.count == len(data)
    assert sketch.sum == pytest.approx(math.fsum(data), rel=1e-12, abs=1e-12)
    assert sketch.mean == pytest.approx(math.fsum(data) / len(data), rel=1e-12, abs=1e-12)
    assert sketch.min == min(data)
    assert sketch.max == max(data)


@given(
    first=st.lists(values, max_size=150),
    second=st.lists(values, max_size=150),
)
def test_merge_of_two_sketches_equals_the_sketch_of_their_concatenation(
    first: list[float], second: list[float]
) -> None:
    merged = sketch_of(first)
    merged.merge(sketch_of(second))
    whole = sketch_of(first + second)
    assert merged.count == whole.count
    assert merged.bucket_count == whole.bucket_count
    assert merged.sum == pytest.approx(whole.sum, rel=1e-12, abs=1e-12)
    # Every rank answers the same, so the two hold the same buckets.
    n = whole.count
    for rank in range(1, n + 1):
        assert merged.quantile(rank / n) == whole.quantile(rank / n)


def test_ratio_samples_give_the_exact_good_share() -> None:
    sketch = sketch_of([1.0] * 997 + [0.0] * 3, quantiles=False)
    assert sketch.sum == 997
    assert sketch.mean == 0.997


def test_empty_sketch_has_no_quantile_and_no_mean() -> None:
    sketch = Sketch()
    assert sketch.quantile(0.5) is None
    assert sketch.mean is None
    assert sketch.min is None
    assert sketch.max is None


def test_sketch_without_buckets_has_no_quantile() -> None:
    sketch = sketch_of([0.5, 0.7], quantiles=False)
    assert sketch.quantile(0.5) is None
    assert sketch.bucket_count == 0


def test_zero_and_negative_values_go_to_the_zero_bucket() -> None:
    sketch = sketch_of([-3.0, 0.0, 1e-12, 0.5])
    assert sketch.bucket_count == 1
    assert sketch.quantile(0.5) == 0.0
    assert_close(sketch.quantile(1.0), 0.5)
    assert sketch.min == -3.0


def test_non_finite_values_are_refused_and_not_counted() -> None:
    sketch = Sketch()
    assert not sketch.add(math.nan)
    assert not sketch.add(math.inf)
    assert not sketch.add(-math.inf)
    assert sketch.count == 0


def test_huge_values_do_not_overflow() -> None:
    assert_close(sketch_of([1e300, 1.7e308]).quantile(1.0), 1.7e308)


def test_quantile_outside_zero_to_one_is_none() -> None:
    assert sketch_of([1.0]).quantile(1.5) is None


@given(data=st.lists(positive, min_size=1, max_size=300))
def test_collapse_caps_buckets_and_keeps_the_top_quantile(data: list[float]) -> None:
    sketch = sketch_of(data, max_buckets=8)
    assert sketch.bucket_count <= 8
    assert sketch.count == len(data)
    assert_close(sketch.quantile(1.0), max(data))


def test_collapse_keeps_high_quantiles_accurate() -> None:
    # 1000 distinct decades below, 100 values near 1 s at the top.
    data = [10.0**-k for k in range(1, 9)] * 10 + [1.0 + i / 100 for i in range(100)]
    sketch = sketch_of(data, max_buckets=16)
    assert sketch.bucket_count <= 16
    for q in (0.9, 0.95, 0.99):
        assert_close(sketch.quantile(q), reference_quantile(data, q))


@given(
    first=st.lists(positive, max_size=100),
    second=st.lists(positive, max_size=100),
)
def test_merging_collapsed_sketches_stays_capped(first: list[float], second: list[float]) -> None:
    merged = sketch_of(first, max_buckets=4)
    merged.merge(sketch_of(second, max_buckets=4))
    assert merged.bucket_count <= 4
    assert merged.count == len(first) + len(second)
    if first or second:
        assert_close(merged.quantile(1.0), max(first + second))


def test_merge_refuses_a_different_alpha() -> None:
    with pytest.raises(ValueError, match="alpha"):
        Sketch(alpha=0.01).merge(sketch_of([1.0], alpha=0.02))


def test_merge_refuses_a_sketch_without_buckets_into_one_with_buckets() -> None:
    with pytest.raises(ValueError, match="without buckets"):
        Sketch().merge(sketch_of([1.0], quantiles=False))


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1])
def test_alpha_outside_zero_to_one_is_refused(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        Sketch(alpha=alpha)


# Windows: slot sizes, times and bounds that are exact in binary, so the reference can use
# exact arithmetic and the test says which slot a time belongs to without float doubt.
slot_sizes = st.sampled_from([0.25, 1.0, 2.0, 10.0])
times = st.integers(min_value=0, max_value=4000).map(lambda quarter: quarter / 4)


def slot_start(t: float, slot_s: float) -> Fraction:
    return math.floor(Fraction(t) / Fraction(slot_s)) * Fraction(slot_s)


@given(
    slot_s=slot_sizes,
    points=st.lists(st.tuples(times, positive), max_size=100),
    bounds=st.tuples(times, times),
)
def test_summary_holds_exactly_the_values_whose_slot_starts_inside(
    slot_s: float, points: list[tuple[float, float]], bounds: tuple[float, float]
) -> None:
    start, end = sorted(bounds)
    window = Window(slot_s=slot_s, span_s=1000.0)
    for t, value in points:
        assert window.add(value, t)
    inside = [v for t, v in points if start <= slot_start(t, slot_s) < end]
    summary = window.summary(start, end)
    assert summary.count == len(inside)
    assert summary.sum == pytest.approx(math.fsum(inside), rel=1e-12)


@given(
    slot_s=slot_sizes,
    points=st.lists(st.tuples(times, positive), max_size=100),
    cuts=st.lists(times, min_size=2, max_size=8),
)
def test_each_value_is_in_exactly_one_of_adjacent_summaries(
    slot_s: float, points: list[tuple[float, float]], cuts: list[float]
) -> None:
    window = Window(slot_s=slot_s, span_s=1000.0)
    for t, value in points:
        window.add(value, t)
    edges = [-1.0, *sorted(cuts), 1002.0]
    counts = [window.summary(a, b).count for a, b in itertools.pairwise(edges)]
    assert sum(counts) == len(points)


@given(
    slot_s=slot_sizes,
    points=st.lists(st.tuples(times, positive), min_size=1, max_size=100),
    q=st.sampled_from(QS),
)
def test_window_quantile_matches_the_reference_over_its_slots(
    slot_s: float, points: list[tuple[float, float]], q: float
) -> None:
    window = Window(slot_s=slot_s, span_s=1000.0)
    for t, value in points:
        window.add(value, t)
    assert_close(
        window.summary(0.0, 1001.0).quantile(q), reference_quantile([v for _, v in points], q)
    )


def test_window_value_at_a_slot_edge_belongs_to_the_slot_it_starts() -> None:
    window = Window(slot_s=10.0, span_s=100.0)
    window.add(1.0, 20.0)
    assert window.summary(20.0, 30.0).count == 1
    assert window.summary(10.0, 20.0).count == 0


def test_window_summary_counts_the_slot_holding_end_but_not_the_one_straddling_start() -> None:
    window = Window(slot_s=10.0, span_s=100.0)
    window.add(1.0, 15.0)  # slot [10, 20) starts before 12: out
    window.add(2.0, 25.0)  # slot [20, 30) holds the end 27: in
    summary = window.summary(12.0, 27.0)
    assert summary.count == 1
    assert summary.sum == 2.0


def test_window_keeps_a_bounded_number_of_slots() -> None:
    window = Window(slot_s=10.0, span_s=300.0)
    for t in range(0, 100_000, 3):
        window.add(0.5, float(t))
    assert window.slot_count <= 300 / 10 + 2


def test_window_refuses_values_older_than_its_span() -> None:
    window = Window(slot_s=10.0, span_s=100.0)
    assert window.add(1.0, 1000.0)
    assert not window.add(1.0, 880.0)
    assert window.add(1.0, 900.0)
    assert window.summary(0.0, 2000.0).count == 2


def test_window_refuses_non_finite_values_and_times() -> None:
    window = Window(slot_s=10.0, span_s=100.0)
    assert not window.add(math.nan, 1.0)
    assert not window.add(1.0, math.inf)
    assert window.slot_count == 0


def test_prune_drops_slots_that_start_before_the_cut() -> None:
    window = Window(slot_s=10.0, span_s=1000.0)
    for t in (5.0, 15.0, 25.0):
        window.add(1.0, t)
    window.prune(10.0)
    assert window.slot_count == 2
    assert window.summary(0.0, 100.0).count == 2


def test_mean_only_window_keeps_no_buckets() -> None:
    window = Window(slot_s=1.0, span_s=10.0, quantiles=False)
    for t in range(5):
        window.add(1.0 if t % 2 else 0.0, float(t))
    summary = window.summary(0.0, 5.0)
    assert summary.bucket_count == 0
    assert summary.mean == 0.4


@pytest.mark.parametrize(
    ("slot_s", "span_s"), [(0.0, 10.0), (-1.0, 10.0), (1.0, -1.0), (math.nan, 1.0)]
)
def test_window_refuses_nonsense_sizes(slot_s: float, span_s: float) -> None:
    with pytest.raises(ValueError):
        Window(slot_s=slot_s, span_s=span_s)


def merged_slots(window: Window, first: int, stop: int, max_buckets: int) -> Sketch:
    """The reference summary: every slot in range merged one by one, no running total."""
    merged = Sketch(max_buckets=max_buckets)
    for index, slot in window._slots.items():
        if first <= index < stop:
            merged.merge(slot)
    return merged


@settings(max_examples=200)
@given(
    points=st.lists(st.tuples(st.floats(0.0, 600.0), values), max_size=200),
    first=st.integers(-2, 70),
    length=st.integers(0, 70),
    prune_at=st.none() | st.floats(0.0, 600.0),
    max_buckets=st.sampled_from([4, 2048]),
)
def test_a_summary_from_the_running_total_equals_merging_its_slots(
    points: list[tuple[float, float]],
    first: int,
    length: int,
    prune_at: float | None,
    max_buckets: int,
) -> None:
    # max_buckets=4 makes sketches collapse, which must send summaries down the merge path.
    window = Window(slot_s=10.0, span_s=300.0, max_buckets=max_buckets)
    for t, value in points:
        window.add(value, t)
    if prune_at is not None:
        window.prune(prune_at)
    summary = window.summary_of_slots(first, first + length)
    reference = merged_slots(window, first, first + length, max_buckets)
    assert summary.count == reference.count
    assert summary.sum == pytest.approx(reference.sum, rel=1e-12, abs=1e-12)
    assert (summary.min, summary.max) == (reference.min, reference.max)
    assert [summary.quantile(q) for q in QS] == [reference.quantile(q) for q in QS]
