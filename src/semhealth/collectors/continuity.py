"""Stream continuity: how evenly a response's deltas arrived.

``stream_continuity_index`` is the population standard deviation of the
intervals between consecutive content deltas of one stream. A smooth stream
at any speed scores near zero; a stream that stutters (bursts, then pauses)
scores high, even when its mean rate is fine.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Sequence

from semhealth.collectors.record import Continuity, StreamRecord


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (NumPy's default) of an ascending, non-empty sequence."""
    if not sorted_values:
        raise ValueError("quantile of an empty sequence")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def intervals_s(delta_ns: Sequence[int]) -> list[float]:
    return [(b - a) / 1e9 for a, b in itertools.pairwise(delta_ns)]


def pstdev(values: Sequence[float]) -> float:
    # Shifted by the first value: equal intervals then give exactly 0 (a rounded mean
    # would leave ~1e-17), and large values lose less precision.
    n = len(values)
    shifted = [v - values[0] for v in values]
    mean = math.fsum(shifted) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in shifted) / n)


def measure_continuity(record: StreamRecord, stall_threshold_s: float) -> Continuity:
    """Continuity of ``record``. A stall is a gap strictly longer than ``stall_threshold_s``."""
    return continuity_of(record.delta_ns, record.ttft_s, stall_threshold_s)


def continuity_of(
    delta_ns: Sequence[int], ttft_s: float | None, stall_threshold_s: float
) -> Continuity:
    """``measure_continuity`` from a stream's delta arrival times (monotonic ns) and TTFT,
    for whoever builds the record."""
    gaps = intervals_s(delta_ns)
    if not gaps:
        return Continuity(ttft_s, len(delta_ns), None, None, None, None, 0)
    ordered = sorted(gaps)
    return Continuity(
        ttft_s=ttft_s,
        deltas=len(delta_ns),
        index_s=pstdev(gaps),
        p50_gap_s=quantile(ordered, 0.5),
        p95_gap_s=quantile(ordered, 0.95),
        max_gap_s=ordered[-1],
        stalls=len(ordered) - bisect_right(ordered, stall_threshold_s),  # gaps over it
    )
