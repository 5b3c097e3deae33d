"""Annotation templates render as Prometheus renders them, and check() refuses the rest.

Expected outputs are Prometheus' own (template/template_test.go) where it has them, and Go's
``%v`` for a float64 (strconv's shortest ``'g'``: exponent form below 1e-4 and from 1e6).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.alerts.templates import (
    check,
    humanize,
    humanize_duration,
    humanize_percentage,
    render,
)

INF = math.inf
NAN = math.nan


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0"), (1.0, "1"), (1234567.0, "1.235M"), (0.12, "120m"), (0.7234, "723.4m"),
     (-0.002, "-2m"), (INF, "+Inf"), (-INF, "-Inf"), (NAN, "NaN")],
)  # fmt: skip
def test_humanize_matches_prometheus(value: float, text: str) -> None:
    assert humanize(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0s"), (1.0, "1s"), (60.0, "1m 0s"), (3600.0, "1h 0m 0s"), (86400.0, "1d 0h 0m 0s"),
     (86400.0 + 3600.0, "1d 1h 0m 0s"), (-(86400.0 * 2 + 3600 * 3 + 60 * 4 + 5), "-2d 3h 4m 5s"),
     (899.99, "14m 59s"), (0.1, "100ms"), (0.0001, "100us"), (0.12345, "123.5ms"),
     (60.1, "1m 0s"), (60.5, "1m 0s"), (1.2345, "1.234s"), (12.345, "12.35s"), (0.015, "15ms"),
     (75.0, "1m 15s"), (INF, "+Inf"), (-INF, "-Inf"), (NAN, "NaN")],
)  # fmt: skip
def test_humanize_duration_matches_prometheus(value: float, text: str) -> None:
    assert humanize_duration(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(-0.22222, "-22.22%"), (0.0, "0%"), (0.1234567, "12.35%"), (1.23456, "123.5%"),
     (0.985, "98.5%"), (-0.05, "-5%")],
)  # fmt: skip
def test_humanize_percentage_matches_prometheus(value: float, text: str) -> None:
    assert humanize_percentage(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.1, "0.1"), (1e22, "1e+22"), (2.0, "2"), (-0.5, "-0.5"), (100000.0, "100000"),
     (1e6, "1e+06"), (123456789.0, "1.23456789e+08"), (-1234567.0, "-1.234567e+06"),
     (0.0001, "0.0001"), (1e-05, "1e-05"), (0.00012345, "0.00012345"),
     (0.30000000000000004, "0.30000000000000004"), (0.0, "0"), (INF, "+Inf"), (-INF, "-Inf"),
     (NAN, "NaN")],
)  # fmt: skip
def test_value_prints_as_go_prints_a_float64(value: float, text: str) -> None:
    assert render("{{ $value }}", value=value, labels={}) == text


def test_pipes_apply_their_function_to_the_value() -> None:
    text = "{{ $value | humanize }} {{ $value | humanizePercentage }} {{ $value|humanizeDuration }}"
    assert render(text, value=0.985, labels={}) == "985m 98.5% 985ms"


def test_printf_formats_the_value() -> None:
    assert render('{{ printf "%.2f" $value }}', value=0.7234, labels={}) == "0.72"


def test_labels_render_the_groups_values() -> None:
    text = "{{ $labels.route }} on {{ $labels.model }}"
    assert render(text, value=1.0, labels={"route": "chat", "model": "m1"}) == "chat on m1"


def test_a_missing_label_renders_empty_as_prometheus_does() -> None:
    # Prometheus expands alert templates with missingkey=zero.
    assert render("[{{ $labels.route }}]", value=1.0, labels={}) == "[]"


def test_a_missing_value_renders_as_go_renders_no_value() -> None:
    assert render("v={{ $value | humanize }}", value=None, labels={}) == "v=<no value>"


def test_text_outside_actions_is_kept_as_written() -> None:
    assert render("50% of {route} $value", value=1.0, labels={}) == "50% of {route} $value"


@pytest.mark.parametrize(
    "template",
    ["plain text", "{{ $value }}", "{{$value}}", "{{ $labels.route }}", "{{ $value | humanize }}",
     "{{ $value | humanizePercentage }}", "{{ $value | humanizeDuration }}",
     '{{ printf "%.2f" $value }}', '{{ printf "%e" $value }}'],
)  # fmt: skip
def test_check_accepts_the_supported_subset(template: str) -> None:
    assert check(template) is None


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{{ $value | humanizeBytes }}",
         "unknown function 'humanizeBytes' (known: humanize, humanizePercentage, humanizeDuration)"),
        ("{{ $value | toUpper }}",
         "unknown function 'toUpper' (known: humanize, humanizePercentage, humanizeDuration)"),
    ],
)  # fmt: skip
def test_check_rejects_unknown_functions(template: str, error: str) -> None:
    assert check(template) == error


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{{ range $labels }}x{{ end }}", "unsupported template action {{ range $labels }}"),
        ("{{ .Labels.route }}", "unsupported template action {{ .Labels.route }}"),
        ('{{ query "up" }}', 'unsupported template action {{ query "up" }}'),
        ("{{ $value | humanize | humanize }}",
         "unsupported template action {{ $value | humanize | humanize }}"),
        ('{{ printf "%s" $labels.route }}', 'unsupported template action {{ printf "%s" $labels.route }}'),
        ("{{ $externalLabels.cluster }}", "unsupported template action {{ $externalLabels.cluster }}"),
    ],
)  # fmt: skip
def test_check_rejects_unsupported_actions(template: str, error: str) -> None:
    assert check(template) == error


@pytest.mark.parametrize("template", ["{{ $value", "$value }}", "a {{ b"])
def test_check_rejects_unbalanced_braces(template: str) -> None:
    assert check(template) == "unbalanced {{ or }}"


@given(st.floats(allow_nan=False))
def test_value_prints_digits_that_read_back_as_the_same_float(value: float) -> None:
    assert float(render("{{ $value }}", value=value, labels={})) == value


@given(st.floats())
def test_every_supported_action_renders_any_float(value: float) -> None:
    text = (
        "{{ $value }} {{ $value | humanize }} {{ $value | humanizePercentage }}"
        ' {{ $value | humanizeDuration }} {{ printf "%.3g" $value }} {{ $labels.route }}'
    )
    assert "{{" not in render(text, value=value, labels={"route": "r"})


def test_trim_markers_drop_the_white_space_beside_them_as_go_does() -> None:
    text = "value:\n  {{- $value -}}  \n%"
    assert check(text) is None
    assert render(text, value=0.5, labels={}) == "value:0.5%"


def test_a_dash_without_white_space_is_not_a_trim_marker() -> None:
    assert check("{{-3}}") is not None


def test_printf_of_an_integer_verb_is_refused_with_the_float_verb_to_use() -> None:
    error = check('{{ printf "%d" $value }}')
    assert error is not None
    assert '"%.0f"' in error
