"""What a rule means, checked once its entries are merged: signal, aggregation, durations,
thresholds, labels and annotation templates; and the ``Rule`` it becomes.

Every check looks only at the fields that are present and well-shaped (the schema has
already reported the others), so one pass reports every issue at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, cast

from semhealth.alerts import templates
from semhealth.alerts._rule_shape import Finding, Where, dotted, one_of
from semhealth.alerts.durations import parse_duration
from semhealth.alerts.model import Aggregation, Baseline, Comparison, Rule, Thresholds
from semhealth.alerts.signals import SIGNALS, Signal, signal_named
from semhealth.common.words import show

REQUIRED = ("name", "signal", "aggregation", "window", "op", "threshold")
DURATION_FIX = (
    "write a Prometheus duration such as 5m, 90s or 1h30m (whole numbers, largest unit first)"
)
TEMPLATE_FIX = (
    "use {{ $value }}, {{ $value | humanize }} (or humanizePercentage, humanizeDuration),"
    ' {{ printf "%.2f" $value }} or {{ $labels.NAME }}'
)

_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PERCENT = re.compile(r"([+-]?[0-9]+(?:\.[0-9]+)?)\s*%")
_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)
_LABEL_ACTION = re.compile(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)")


# -- meaning --------------------------------------------------------------------------------


def check_rule(entry: Mapping[str, Any], *, buildable: bool) -> tuple[Rule | None, list[Finding]]:
    """The rule an entry of well-shaped fields describes, or None, with every issue found.

    ``buildable`` is False when fields are missing or had shape errors: the remaining
    fields are still checked, so every issue is reported at once.
    """
    signal, findings = _signal(entry)
    durations, more = _durations(entry)
    findings += more
    threshold: float | Thresholds | None = None
    if signal is not None:
        findings += _aggregation(entry, signal) + _signal_labels(entry, signal)
        threshold, more = _threshold(entry, signal, relative="baseline" in entry)
        findings += more
    group_labels = _group_labels(entry)
    findings += _rule_labels(entry, group_labels) + _annotations(entry, group_labels)
    if findings or not buildable or signal is None or threshold is None:
        return None, findings
    return _rule(entry, signal, threshold, durations), []


def _rule(
    entry: Mapping[str, Any],
    signal: Signal,
    threshold: float | Thresholds,
    durations: Mapping[str, float],
) -> Rule:
    baseline = None
    if "baseline" in durations:
        baseline = Baseline(window_s=durations["baseline"])
    elif entry.get("baseline", {}).get("peer"):
        baseline = Baseline(peer=dict(entry["baseline"]["peer"]))
    return Rule(
        name=entry["name"],
        signal=signal.name,
        aggregation=cast(Aggregation, entry["aggregation"]),
        window_s=durations["window"],
        op=cast(Comparison, entry["op"]),
        threshold=threshold,
        min_samples=int(entry.get("min_samples", 1)),
        for_s=durations.get("for", 0.0),
        keep_firing_for_s=durations.get("keep_firing_for", 0.0),
        group_by=tuple(entry.get("group_by", ())),
        match=dict(entry.get("match", {})),
        baseline=baseline,
        labels=dict(entry.get("labels", {})),
        annotations=dict(entry.get("annotations", {})),
        description=entry.get("description", ""),
    )


def _signal(entry: Mapping[str, Any]) -> tuple[Signal | None, list[Finding]]:
    name = entry.get("signal")
    if name is None:
        return None, []
    signal = signal_named(name)
    if signal is None:
        fix = one_of(name, (s.name for s in SIGNALS))
        return None, [Finding(("signal",), f"unknown signal {show(name)}", fix)]
    return signal, []


def _durations(entry: Mapping[str, Any]) -> tuple[dict[str, float], list[Finding]]:
    raw = {key: entry[key] for key in ("window", "for", "keep_firing_for") if key in entry}
    if "window" in entry.get("baseline", {}):
        raw["baseline"] = entry["baseline"]["window"]
    seconds: dict[str, float] = {}
    findings = []
    for key, text in raw.items():
        where: Where = ("baseline", "window") if key == "baseline" else (key,)
        parsed = parse_duration(text)
        if parsed is None:
            findings.append(Finding(where, f"{show(text)} is not a duration", DURATION_FIX))
        elif parsed == 0 and key in ("window", "baseline"):
            findings.append(
                Finding(
                    where, f"{dotted(where)[1:]} must be longer than 0s", "use a window such as 5m"
                )
            )
        else:
            seconds[key] = parsed
    return seconds, findings


def _aggregation(entry: Mapping[str, Any], signal: Signal) -> list[Finding]:
    aggregation = entry.get("aggregation")
    if aggregation is None or aggregation in signal.aggregations:
        return []
    message = (
        f"aggregation {show(aggregation)} does not apply to {signal.kind} signal {signal.name}"
    )
    return [Finding(("aggregation",), message, f"use one of: {', '.join(signal.aggregations)}")]


def _signal_labels(entry: Mapping[str, Any], signal: Signal) -> list[Finding]:
    used: list[tuple[Where, str]] = [
        (("group_by", i), v) for i, v in enumerate(entry.get("group_by", []))
    ]
    used += [(("match", key), key) for key in entry.get("match", {})]
    peer = entry.get("baseline", {}).get("peer", {})
    used += [(("baseline", "peer", key), key) for key in peer]
    threshold = entry.get("threshold")
    if isinstance(threshold, dict) and "by" in threshold:
        used.append((("threshold", "by"), threshold["by"]))
    findings = [
        Finding(where, f"{signal.name} has no label {show(label)}", one_of(label, signal.labels))
        for where, label in used
        if label not in signal.labels
    ]
    match = entry.get("match", {})
    if peer and "window" in entry.get("baseline", {}):
        findings.append(
            Finding(
                ("baseline",),
                "a baseline is the time before (window) or another variant (peer), not both",
                "keep window: for a change over time, or peer: to compare with a variant",
            )
        )
    elif peer and all(match.get(key) == value for key, value in peer.items()):
        findings.append(
            Finding(
                ("baseline", "peer"),
                "the peer picks the rule's own samples, so the rule would compare them with "
                "themselves",
                "give the peer a label value the match does not have, e.g. match "
                "{variant: canary} with peer {variant: stable}",
            )
        )
    return findings


def _group_labels(entry: Mapping[str, Any]) -> tuple[str, ...]:
    labels = tuple(entry.get("group_by", ()))
    threshold = entry.get("threshold")
    if isinstance(threshold, dict) and isinstance(threshold.get("by"), str):
        labels += (threshold["by"],)
    return labels


# -- thresholds -----------------------------------------------------------------------------


def _threshold(
    entry: Mapping[str, Any], signal: Signal, *, relative: bool
) -> tuple[float | Thresholds | None, list[Finding]]:
    raw = entry.get("threshold")
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return _scalar(raw, ("threshold",), signal, relative=relative)
    findings: list[Finding] = []
    values: dict[str, float] = {}
    for key, text in raw.get("values", {}).items():
        value, more = _scalar(text, ("threshold", "values", key), signal, relative=relative)
        findings += more
        if value is not None:
            values[key] = value
    default = None
    if "default" in raw:
        default, more = _scalar(raw["default"], ("threshold", "default"), signal, relative=relative)
        findings += more
    if findings or "by" not in raw or not values:
        return None, findings
    return Thresholds(label=raw["by"], values=values, default=default), []


def _scalar(
    raw: float | str, where: Where, signal: Signal, *, relative: bool
) -> tuple[float | None, list[Finding]]:
    if isinstance(raw, str):
        parsed, message, fix = _text_threshold(raw, signal, relative=relative)
        return parsed, [] if parsed is not None else [Finding(where, message, fix)]
    value = float(raw)
    if not math.isfinite(value):
        return None, [
            Finding(
                where,
                f"threshold must be a finite number, got {show(value)}",
                _example_for(signal, relative=relative),
            )
        ]
    if not relative and signal.unit == "" and not 0 <= value <= 1:
        return None, [_out_of_range(where, value, signal)]
    return value, []


def _text_threshold(raw: str, signal: Signal, *, relative: bool) -> tuple[float | None, str, str]:
    """A threshold written as text: a percentage (relative rules) or a duration (time signals)."""
    percent = _PERCENT.fullmatch(raw.strip())
    if relative:
        if percent:
            return float(percent.group(1)) / 100, "", ""
        message = f"a relative rule's threshold is a change against its baseline, not {show(raw)}"
        return None, message, _example_for(signal, relative=True)
    if raw.strip().endswith("%"):
        message = f"a percentage threshold ({show(raw)}) needs a baseline to be relative to"
        absolute = _example_for(signal, relative=False)
        fix = f"add baseline: {{window: 1h}} for a relative rule, or {absolute}"
        return None, message, fix
    if signal.unit != "s":
        message = f"{_what(signal)}, so its threshold is a number, not {show(raw)}"
        return None, message, _example_for(signal, relative=False)
    seconds = parse_duration(raw)
    if seconds is None:
        return (
            None,
            f"{show(raw)} is not a duration",
            "write it like 15ms, 2s or 1m30s (or a number of seconds)",
        )
    return seconds, "", ""


def _out_of_range(where: Where, value: float, signal: Signal) -> Finding:
    message = f"{_what(signal)}, so threshold {show(value)} can never be crossed"
    if 1 < value <= 100:
        return Finding(where, message, f"write it as a fraction: {value / 100:g} for {value:g} %")
    return Finding(where, message, "use a number between 0 and 1")


def _what(signal: Signal) -> str:
    noun = "a ratio" if signal.kind == "ratio" else "a score"
    return f"{signal.name} is {noun} between 0 and 1"


def _example_for(signal: Signal, *, relative: bool) -> str:
    if relative:
        return "write the relative change, e.g. -5% (5 % below the baseline) or -0.05"
    if signal.unit == "s":
        return "write a duration, e.g. 50ms, or a number of seconds"
    return (
        "write a number between 0 and 1, e.g. 0.99"
        if signal.kind == "ratio"
        else "write a number between 0 and 1, e.g. 0.75"
    )


# -- labels and annotations -----------------------------------------------------------------


def _rule_labels(entry: Mapping[str, Any], group_labels: tuple[str, ...]) -> list[Finding]:
    findings = []
    for key, value in entry.get("labels", {}).items():
        where: Where = ("labels", key)
        problem = _name_problem(key, "label")
        if problem is None and key in group_labels:
            problem = (
                f"label {key!r} would replace the group's own {key} label",
                f"rename the label, or stop grouping by {key}",
            )
        if problem is None and "{{" in value:
            problem = (
                "label values are fixed text, not templates",
                "move the template to an annotation; labels identify the alert and must not change",
            )
        if problem is not None:
            findings.append(Finding(where, *problem))
    return findings


def _annotations(entry: Mapping[str, Any], group_labels: tuple[str, ...]) -> list[Finding]:
    findings = []
    for key, text in entry.get("annotations", {}).items():
        where: Where = ("annotations", key)
        problem = _name_problem(key, "annotation")
        error = templates.check(text)
        if problem is None and error is not None:
            problem = (f"template error: {error}", TEMPLATE_FIX)
        if problem is None:
            problem = _ungrouped_label(text, group_labels)
        if problem is not None:
            findings.append(Finding(where, *problem))
    return findings


def _name_problem(key: str, kind: str) -> tuple[str, str] | None:
    if not _LABEL_NAME.fullmatch(key) or key.startswith("__"):
        return (
            f"{key!r} is not a valid {kind} name",
            "use letters, digits and underscores, not starting with a digit or __",
        )
    if key == "alertname" and kind == "label":
        return "alertname is the rule's name and cannot be set here", "rename the rule instead"
    return None


def _ungrouped_label(text: str, group_labels: tuple[str, ...]) -> tuple[str, str] | None:
    for action in _ACTION.finditer(text):
        used = _LABEL_ACTION.fullmatch(action.group(1))
        if used and used.group(1) not in group_labels:
            label = used.group(1)
            return (
                f"{{{{ $labels.{label} }}}} would always be empty: {label} is not a group label",
                f"add {label} to group_by, or remove it from the annotation",
            )
    return None
