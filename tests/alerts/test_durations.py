"""Prometheus durations: parsing and formatting agree with each other and with Prometheus."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.alerts.durations import format_duration, parse_duration

# Prometheus' own pattern (common/model/time.go, ParseDuration), which also refuses "".
PROMETHEUS_DURATION = re.compile(
    r"(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?"
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0s", 0.0),
        ("15ms", 0.015),
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1m30s500ms", 90.5),
        ("2d", 172800.0),
        ("1w", 604800.0),
        ("1y", 31536000.0),
        ("007m", 420.0),
    ],
)
def test_parse_reads_prometheus_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "5", "m", "5 m", " 5m", "5m ", "1h 30m", "1.5h", "-5m", "+5m", "5m1h", "1m1m", "5M",
     "5min", "5mm", "ms", "1s1s", "\u0665m", "5m\n"],
)  # fmt: skip
def test_parse_rejects_what_prometheus_rejects(text: str) -> None:
    assert parse_duration(text) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.015, "15ms"),
        (90.0, "1m30s"),
        (5400.0, "1h30m"),
        (604800.0, "1w"),
        (31536000.0 + 86400.0 + 0.001, "1y1d1ms"),
        (0.0004, "0s"),  # below a millisecond rounds to nothing
    ],
)
def test_format_writes_the_shortest_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**13))
def test_whole_milliseconds_round_trip_exactly(millis: int) -> None:
    assert parse_duration(format_duration(millis / 1000)) == millis / 1000


@given(st.integers(min_value=0, max_value=10**13))
def test_formatted_durations_are_prometheus_durations(millis: int) -> None:
    assert PROMETHEUS_DURATION.fullmatch(format_duration(millis / 1000))


@given(st.text(alphabet="0123456789ywdhms .-", max_size=10))
def test_parse_accepts_exactly_what_prometheus_accepts(text: str) -> None:
    prometheus = text == "0" or (text != "" and PROMETHEUS_DURATION.fullmatch(text) is not None)
    assert (parse_duration(text) is not None) == prometheus
