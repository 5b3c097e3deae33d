"""Prometheus-style durations (``90s``, ``5m``, ``1h30m``, ``15ms``) to seconds and back.

Written by hand because the format is small and the two directions must agree
exactly with what Prometheus accepts in a rule file (units ms, s, m, h, d, w, y;
no fractions), so that an exported rule says what the agent evaluates.
"""

from __future__ import annotations

import re

_UNITS = (("y", 365 * 86400.0), ("w", 7 * 86400.0), ("d", 86400.0), ("h", 3600.0),
          ("m", 60.0), ("s", 1.0), ("ms", 0.001))  # fmt: skip
_SECONDS = dict(_UNITS)
_PATTERN = re.compile(r"([0-9]+)(ms|y|w|d|h|m|s)")  # ASCII digits only, as Prometheus


def parse_duration(text: str) -> float | None:
    """Seconds for a Prometheus duration; None if ``text`` is not one.

    Units must run from largest to smallest, each at most once, as Prometheus requires.
    """
    if text == "0":
        return 0.0
    position = 0
    total_ms = 0  # whole milliseconds, so "13s931ms" is exactly 13.931, as format_duration wrote it
    last_rank = -1
    for match in _PATTERN.finditer(text):
        if match.start() != position:
            return None
        rank = [unit for unit, _ in _UNITS].index(match.group(2))
        if rank <= last_rank:
            return None
        last_rank = rank
        total_ms += int(match.group(1)) * round(_SECONDS[match.group(2)] * 1000)
        position = match.end()
    if position != len(text) or not text:
        return None
    return total_ms / 1000


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration for ``seconds`` (rounded to whole milliseconds)."""
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    parts = []
    for unit, size in _UNITS:
        unit_ms = round(size * 1000)
        count, millis = divmod(millis, unit_ms)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
