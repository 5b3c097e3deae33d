"""Length bucketing: which texts of a batch run through a model together.

A transformer pads every text of a call to the call's longest, so one call over a 10-token
and a 400-token text computes 800 tokens for 410 of text. Texts are sorted by length and cut
into runs that minimise the padded tokens plus a fixed cost per call (``call_tokens``, what
one more call costs in tokens' worth of work: launches, Python, small matrices); an exact
dynamic programme over the sorted lengths, O(n x run) with n at most a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Bucketing:
    """How a batch is cut into calls: ``plan_buckets``' limits and call cost."""

    max_tokens: int  # padded tokens a call
    call_tokens: int  # what one more call costs, in tokens' worth of work
    max_texts: int = 1024

    def plan(self, lengths: Sequence[int]) -> list[list[int]]:
        return plan_buckets(
            lengths,
            max_tokens=self.max_tokens,
            max_texts=self.max_texts,
            call_tokens=self.call_tokens,
        )


def plan_buckets(
    lengths: Sequence[int], *, max_tokens: int, max_texts: int, call_tokens: int
) -> list[list[int]]:
    """Indices into ``lengths``, grouped into calls, shortest first.

    A call holds at most ``max_texts`` texts and ``max_tokens`` padded tokens (its size
    times its longest), except that a text longer than ``max_tokens`` runs alone. Among
    such plans, the one with the fewest padded tokens plus ``call_tokens`` per call.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    ordered = np.array([lengths[i] for i in order], dtype=np.float64)
    count = len(order)
    best = np.zeros(count + 1)  # best[end]: cost of the first `end` sorted texts
    start_of = np.zeros(count + 1, dtype=np.int64)  # where the last call of that plan starts
    for end in range(1, count + 1):
        longest = ordered[end - 1]
        fits = max(1, min(max_texts, int(max_tokens // max(longest, 1.0))))
        first = max(0, end - fits)
        starts = np.arange(first, end)
        costs = best[first:end] + (end - starts) * longest + call_tokens
        pick = int(np.argmin(costs))
        best[end], start_of[end] = costs[pick], first + pick
    calls: list[list[int]] = []
    end = count
    while end > 0:
        start = int(start_of[end])
        calls.append(order[start:end])
        end = start
    return calls[::-1]
