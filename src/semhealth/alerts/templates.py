"""Annotation templates: the part of Prometheus' template language that rules here use.

Annotations are written once, in Prometheus' Go-template syntax, and serve both
evaluators: the Prometheus export copies them verbatim and the agent renders them
with this module. So this renders exactly a small, checked subset and rejects the
rest at load time, rather than guessing at Go's semantics:

    {{ $value }}                       the measured value, printed as Go's %v does
    {{ $labels.route }}                a label of the alert's group ("" when absent)
    {{ $value | humanize }}            also humanizePercentage, humanizeDuration
    {{ printf "%.2f" $value }}         printf with one float verb (e, f, g) and $value
    {{- ... -}}                        Go's trim markers: drop the white space before / after

Prometheus' ``humanize*`` functions are re-implemented from their documented
behaviour: four significant digits and SI or time-unit prefixes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal

# Go's trim markers are "{{- " and " -}}": the dash needs white space beside it.
_ACTION = re.compile(r"\{\{(?P<left>-\s)?\s*(?P<action>.*?)\s*(?P<right>\s-)?\}\}", re.DOTALL)
_VALUE = re.compile(r"\$value$")
_LABEL = re.compile(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)$")
_PIPE = re.compile(r"\$value\s*\|\s*([A-Za-z]+)$")
_PRINTF = re.compile(r'printf\s+"(%[-+ 0#]?\d*(?:\.\d+)?[efg])"\s+\$value$')
_PRINTF_INT = re.compile(r'printf\s+"%[-+ 0#]?\d*d"\s+\$value$')


def _go_float(value: float) -> str:
    """Go's ``%v`` for a float64: shortest digits; exponent form below 1e-4 or from 1e6
    (strconv's ``'g'`` with the shortest precision decides at exponent 6)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    # repr gives the shortest digits that round-trip, as Go's shortest formatting does.
    shortest = Decimal(repr(value)).normalize()
    _, digits, exponent = shortest.as_tuple()
    text = "".join(map(str, digits))
    point = len(text) + int(exponent) - 1  # exponent of the first digit; finite, so an int
    if -4 <= point < 6:
        return format(shortest, "f")
    minus = "-" if value < 0 else ""
    mantissa = text[0] + (f".{text[1:]}" if len(text) > 1 else "")
    return f"{minus}{mantissa}e{'-' if point < 0 else '+'}{abs(point):02d}"


def _g4(value: float) -> str:
    text = f"{value:.4g}"
    # Go prints the sign of an infinity even without a + flag.
    return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}.get(text, text)


def _scale_down(value: float) -> tuple[float, str]:
    prefix = ""
    for candidate in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix = candidate
        value *= 1000
    return value, prefix


def humanize(value: float) -> str:
    if value == 0 or math.isnan(value) or math.isinf(value):
        return _g4(value)
    if abs(value) >= 1:
        prefix = ""
        for candidate in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(value) < 1000:
                break
            prefix = candidate
            value /= 1000
        return f"{_g4(value)}{prefix}"
    value, prefix = _scale_down(value)
    return f"{_g4(value)}{prefix}"


def humanize_percentage(value: float) -> str:
    return f"{_g4(value * 100)}%"


def humanize_duration(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return _g4(value)
    if value == 0:
        return f"{_g4(value)}s"
    if abs(value) >= 1:
        sign = "-" if value < 0 else ""
        value = abs(value)
        whole = int(value)
        days, rest = divmod(whole, 86400)
        hours, rest = divmod(rest, 3600)
        minutes, seconds = divmod(rest, 60)
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_g4(value)}s"
    value, prefix = _scale_down(value)
    return f"{_g4(value)}{prefix}s"


FUNCTIONS: Mapping[str, Callable[[float], str]] = {
    "humanize": humanize,
    "humanizePercentage": humanize_percentage,
    "humanizeDuration": humanize_duration,
}


def _action_error(action: str) -> str | None:
    if _VALUE.match(action) or _LABEL.match(action) or _PRINTF.match(action):
        return None
    pipe = _PIPE.match(action)
    if pipe and pipe.group(1) in FUNCTIONS:
        return None
    if pipe:
        return f"unknown function {pipe.group(1)!r} (known: {', '.join(FUNCTIONS)})"
    if _PRINTF_INT.match(action):
        # Go prints "%!d(float64=0.5)" for a float: $value is always one.
        return 'printf "%d" needs an integer and $value is a float: use "%.0f"'
    return f"unsupported template action {{{{ {action} }}}}"


def check(template: str) -> str | None:
    """Why ``template`` cannot be rendered here, or None when it can."""
    for match in _ACTION.finditer(template):
        error = _action_error(match.group("action"))
        if error is not None:
            return error
    stripped = _ACTION.sub("", template)
    if "{{" in stripped or "}}" in stripped:
        return "unbalanced {{ or }}"
    return None


def render(template: str, *, value: float | None, labels: Mapping[str, str]) -> str:
    """``template`` with its actions filled in; call ``check`` first (at load time).

    ``value`` None (too few samples) renders as Go renders a missing value: ``<no value>``.
    """

    def fill(action: str) -> str:
        label = _LABEL.match(action)
        if label:
            return labels.get(label.group(1), "")
        if value is None:
            return "<no value>"
        if _VALUE.match(action):
            return _go_float(value)
        printf = _PRINTF.match(action)
        if printf:
            return printf.group(1) % value
        pipe = _PIPE.match(action)
        if pipe:
            return FUNCTIONS[pipe.group(1)](value)
        return f"{{{{ {action} }}}}"

    out: list[str] = []
    position = 0
    trim_next = False
    for match in _ACTION.finditer(template):
        text = template[position : match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group("left"):
            text = text.rstrip()
        out += (text, fill(match.group("action")))
        trim_next = match.group("right") is not None
        position = match.end()
    tail = template[position:]
    out.append(tail.lstrip() if trim_next else tail)
    return "".join(out)
