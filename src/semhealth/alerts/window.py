"""Bounded windows of samples: a relative-error quantile sketch, kept per time slot.

Memory is bounded whatever the traffic. A ``Sketch`` counts values in logarithmic
buckets (DDSketch: Masson, Rim and Lee, VLDB 2019). Bucket ``k`` holds the values in
``(gamma**(k-1), gamma**k]`` with ``gamma = (1 + alpha) / (1 - alpha)``, and it answers with
``2 * gamma**k / (gamma + 1)``, which is within relative error ``alpha`` of every value in
the bucket. A quantile is the value of rank ``ceil(q * n)`` (the lower nearest rank,
1-based) among the ``n`` values; the sketch's answer is within relative error ``alpha`` of
it. Count, sum, min and max are exact (the sum up to float rounding). A ratio signal's
samples are 1.0 (good) or 0.0, so its sum is exactly the good count and its mean the ratio.

Values at or below ``1e-9`` (zero, and negatives, which no signal produces) share one zero
bucket that answers 0.0. Past ``max_buckets`` buckets the lowest ones collapse into the
lowest kept one, as DDSketch's collapsing-lowest store does: high quantiles (the ones our
rules watch) keep their accuracy, the lowest lose it. At ``alpha = 0.01`` 2048 buckets span
a factor of about 1e17 between the smallest and largest value, so real signals never
collapse.

A ``Window`` keeps one sketch per slot of ``slot_s`` seconds (slot ``k`` is
``[k * slot_s, (k + 1) * slot_s)``), so a window's summary is a merge of slots and expiry is
dropping whole slots. ``summary(start, end)`` merges the slots whose start lies in
``[start, end)``: the slot holding ``end`` counts (its samples are the newest), the one
straddling ``start`` does not. A window of ``w`` seconds therefore covers between
``w - slot_s`` and ``w`` seconds of samples; pick ``slot_s`` small against ``w``.
"""

from __future__ import annotations

import math
import sys

DEFAULT_ALPHA = 0.01
DEFAULT_MAX_BUCKETS = 2048
ZERO_THRESHOLD = 1e-9
# Past this, math.exp raises OverflowError.
_MAX_EXP = math.log(sys.float_info.max)


class Sketch:
    """Count, sum, min, max and (optionally) log-bucketed counts of a set of values.

    ``quantiles=False`` keeps only the exact aggregates: windows of mean and ratio rules
    need no buckets. Mutable and not thread-safe.
    """

    __slots__ = (
        "_alpha",
        "_buckets",
        "_count",
        "_floor",
        "_gamma",
        "_log_gamma",
        "_max",
        "_max_buckets",
        "_min",
        "_quantiles",
        "_sum",
        "_zero",
    )

    def __init__(
        self,
        *,
        alpha: float = DEFAULT_ALPHA,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
        quantiles: bool = True,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if max_buckets < 1:
            raise ValueError(f"max_buckets must be at least 1, got {max_buckets}")
        self._alpha = alpha
        self._gamma = (1.0 + alpha) / (1.0 - alpha)
        self._log_gamma = math.log(self._gamma)
        self._max_buckets = max_buckets
        self._quantiles = quantiles
        self._buckets: dict[int, int] = {}
        # Keys below the floor were collapsed; later values below it join the floor bucket.
        self._floor: int | None = None
        self._zero = 0
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def count(self) -> int:
        return self._count

    @property
    def sum(self) -> float:
        return self._sum

    @property
    def min(self) -> float | None:
        return self._min if self._count else None

    @property
    def max(self) -> float | None:
        return self._max if self._count else None

    @property
    def mean(self) -> float | None:
        return self._sum / self._count if self._count else None

    @property
    def bucket_count(self) -> int:
        """Buckets in use, not counting the zero bucket."""
        return len(self._buckets)

    def key(self, value: float) -> int | None:
        """The bucket of ``value``; None for the zero bucket."""
        if value <= ZERO_THRESHOLD:
            return None
        return math.ceil(math.log(value) / self._log_gamma)

    def add(self, value: float) -> bool:
        """Count ``value``; False (and nothing counted) when it is NaN or infinite."""
        if not math.isfinite(value):
            return False
        self._count += 1
        self._sum += value
        self._min = min(self._min, value)
        self._max = max(self._max, value)
        if not self._quantiles:
            return True
        key = self.key(value)
        if key is None:
            self._zero += 1
            return True
        if self._floor is not None and key < self._floor:
            key = self._floor
        count = self._buckets.get(key)
        self._buckets[key] = 1 if count is None else count + 1
        if count is None and len(self._buckets) > self._max_buckets:
            self._collapse()
        return True

    def merge(self, other: Sketch) -> None:
        """Add ``other``'s values to this sketch; both must use the same ``alpha``."""
        if other._alpha != self._alpha:
            raise ValueError(f"cannot merge sketches of alpha {other._alpha} and {self._alpha}")
        if self._quantiles and not other._quantiles:
            raise ValueError("cannot merge a sketch without buckets into one with buckets")
        if other._count == 0:
            return
        self._count += other._count
        self._sum += other._sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)
        if not self._quantiles:
            return
        self._zero += other._zero
        if other._floor is not None and (self._floor is None or other._floor > self._floor):
            self._floor = other._floor
            self._lift_below_floor()
        # Window summaries merge thousands of buckets per evaluation: locals keep it quick.
        buckets = self._buckets
        get = buckets.get
        floor = self._floor
        if floor is None:
            for key, count in other._buckets.items():
                buckets[key] = get(key, 0) + count
        else:
            for key, count in other._buckets.items():
                key = max(key, floor)
                buckets[key] = get(key, 0) + count
        if len(self._buckets) > self._max_buckets:
            self._collapse()

    @property
    def collapsed(self) -> bool:
        """Whether low buckets were folded together (past ``max_buckets``): counts of a
        collapsed sketch can no longer be taken apart exactly."""
        return self._floor is not None

    def copy(self) -> Sketch:
        twin = Sketch(alpha=self._alpha, max_buckets=self._max_buckets, quantiles=self._quantiles)
        twin._buckets = dict(self._buckets)
        twin._floor = self._floor
        twin._zero = self._zero
        twin._count = self._count
        twin._sum = self._sum
        twin._min = self._min
        twin._max = self._max
        return twin

    def remove_counts(self, other: Sketch) -> None:
        """Take ``other``'s counts back out of a sketch ``other`` was merged into.

        Only for sketches that never collapsed (``collapsed`` False on both): then every
        bucket count is exact and comes apart. ``sum``, ``min`` and ``max`` are the caller's
        to set again (``set_extremes``): extremes cannot be subtracted.
        """
        self._count -= other._count
        self._zero -= other._zero
        buckets = self._buckets
        for key, count in other._buckets.items():
            left = buckets[key] - count
            if left:
                buckets[key] = left
            else:
                del buckets[key]

    def set_extremes(self, total: float, low: float, high: float) -> None:
        self._sum = total
        self._min = low
        self._max = high

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0 <= q <= 1) within relative error ``alpha``; None when empty
        or when this sketch keeps no buckets."""
        if not self._quantiles or self._count == 0 or not 0.0 <= q <= 1.0:
            return None
        rank = _rank(q, self._count)
        seen = self._zero
        if seen >= rank:
            return self._clamp(0.0)
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen >= rank:
                return self._clamp(self._value_of(key))
        return self._max  # unreachable while counts agree; the largest value is the safe answer

    def _value_of(self, key: int) -> float:
        # 2 * gamma**k / (gamma + 1), in log space; past the largest float, the largest value
        # seen (after clamping) is the answer.
        exponent = key * self._log_gamma + math.log(2.0 / (self._gamma + 1.0))
        return math.exp(exponent) if exponent < _MAX_EXP else math.inf

    def _clamp(self, value: float) -> float:
        # The true quantile lies in [min, max], so clamping never adds error.
        return min(max(value, self._min), self._max)

    def _collapse(self) -> None:
        keys = sorted(self._buckets)
        excess = len(keys) - self._max_buckets
        target = keys[excess]
        for key in keys[:excess]:
            self._buckets[target] += self._buckets.pop(key)
        self._floor = target

    def _lift_below_floor(self) -> None:
        floor = self._floor
        if floor is None:
            return
        low = [key for key in self._buckets if key < floor]
        for key in low:
            self._buckets[floor] = self._buckets.get(floor, 0) + self._buckets.pop(key)


def _rank(q: float, n: int) -> int:
    """``ceil(q * n)``, at least 1. The product is rounded first so that float noise
    (``0.07 * 100 == 7.000000000000001``) cannot push the rank up by one."""
    return max(1, math.ceil(round(q * n, 6)))


class Window:
    """Samples over the last ``span_s`` seconds, one ``Sketch`` per slot of ``slot_s``.

    Slots older than ``span_s`` before the newest sample, or before ``prune``'s cut-off,
    are dropped, so memory is at most ``span_s / slot_s + 2`` slots of at most
    ``max_buckets`` buckets each.
    """

    __slots__ = (
        "_alpha",
        "_keep",
        "_max_buckets",
        "_newest",
        "_quantiles",
        "_slot_s",
        "_slots",
        "_total",
    )

    def __init__(
        self,
        *,
        slot_s: float,
        span_s: float,
        quantiles: bool = True,
        alpha: float = DEFAULT_ALPHA,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> None:
        if not slot_s > 0.0 or not math.isfinite(slot_s):
            raise ValueError(f"slot_s must be a positive number, got {slot_s}")
        if not span_s >= 0.0 or not math.isfinite(span_s):
            raise ValueError(f"span_s must be a non-negative number, got {span_s}")
        Sketch(alpha=alpha, max_buckets=max_buckets)  # fail here, not on the first sample
        self._slot_s = slot_s
        self._alpha = alpha
        self._max_buckets = max_buckets
        self._quantiles = quantiles
        # A span covers ceil(span / slot) whole slots plus the one its start falls in.
        self._keep = math.ceil(span_s / slot_s) + 1
        self._slots: dict[int, Sketch] = {}
        self._newest: int | None = None
        # Every kept slot merged, kept up to date as samples arrive and slots expire: a
        # summary of (nearly) all slots is then one copy and a few subtractions instead of
        # a merge of every slot, which was most of an evaluation's cost.
        self._total = self._new_sketch()

    @property
    def slot_s(self) -> float:
        return self._slot_s

    @property
    def slot_count(self) -> int:
        return len(self._slots)

    def slot_of(self, t: float) -> int:
        """The index of the slot ``t`` belongs to: ``floor(t / slot_s)``."""
        return math.floor(t / self._slot_s)

    def first_slot_from(self, t: float) -> int:
        """The index of the first slot starting at or after ``t``: ``ceil(t / slot_s)``."""
        return math.ceil(t / self._slot_s)

    def add(self, value: float, t: float) -> bool:
        """Count ``value`` at time ``t``. False, and nothing counted, when ``value`` or ``t``
        is not finite or ``t`` is older than the span kept."""
        if not math.isfinite(value) or not math.isfinite(t):
            return False
        index = self.slot_of(t)
        if self._newest is not None and index <= self._newest - self._keep:
            return False
        slot = self._slots.get(index)
        if slot is None:
            slot = self._new_sketch()
            self._slots[index] = slot
            if self._newest is None or index > self._newest:
                self._newest = index
                # New slots appear at most once per slot_s, so expiry runs that rarely.
                self._drop_before(index - self._keep + 1)
        added = slot.add(value)
        if added:
            self._total.add(value)
        return added

    def summary(self, start: float, end: float) -> Sketch:
        """A new sketch merging the slots whose start lies in ``[start, end)``."""
        if not (math.isfinite(start) and math.isfinite(end)):
            return self._new_sketch()
        return self.summary_of_slots(self.first_slot_from(start), self.first_slot_from(end))

    def summary_of_slots(self, first: int, stop: int) -> Sketch:
        """A new sketch merging the slots ``first <= index < stop``."""
        inside = [slot for index, slot in self._slots.items() if first <= index < stop]
        outside = [slot for index, slot in self._slots.items() if not first <= index < stop]
        if len(outside) < len(inside) and self._separable():
            return self._total_without(outside, inside)
        merged = self._new_sketch()
        for slot in inside:
            merged.merge(slot)
        return merged

    def _separable(self) -> bool:
        return not self._total.collapsed and not any(s.collapsed for s in self._slots.values())

    def _total_without(self, outside: list[Sketch], inside: list[Sketch]) -> Sketch:
        filled = [slot for slot in inside if slot.count]
        if not filled:
            return self._new_sketch()
        summary = self._total.copy()
        for slot in outside:
            summary.remove_counts(slot)
        # From the slots themselves: extremes cannot be subtracted, and a sum kept by
        # adding and subtracting would drift.
        summary.set_extremes(
            math.fsum(slot.sum for slot in filled),
            min(slot.min for slot in filled if slot.min is not None),
            max(slot.max for slot in filled if slot.max is not None),
        )
        return summary

    def prune(self, before: float) -> None:
        """Drop the slots that start before ``before``: nothing asks for them any more."""
        if math.isfinite(before):
            self._drop_before(self.first_slot_from(before))

    def _new_sketch(self) -> Sketch:
        return Sketch(alpha=self._alpha, max_buckets=self._max_buckets, quantiles=self._quantiles)

    def _drop_before(self, index: int) -> None:
        old = [key for key in self._slots if key < index]
        if not old:
            return
        separable = self._separable()
        for key in old:
            slot = self._slots.pop(key)
            if separable:
                self._total.remove_counts(slot)
        if not separable:
            self._rebuild_total()

    def _rebuild_total(self) -> None:
        total = self._new_sketch()
        for slot in self._slots.values():
            total.merge(slot)
        self._total = total
