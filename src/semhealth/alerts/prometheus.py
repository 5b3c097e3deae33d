"""The rules as Prometheus alerting rules, for fleet-wide evaluation over the exported series.

The same ``Rule`` the agent evaluates over its windows becomes PromQL over the
histograms and counters the agent exports (``Signal.prometheus``):

    pXX    histogram_quantile(q, sum by (le, G) (rate(<base>_bucket{M}[w])))
    mean   sum by (G) (rate(<base>_sum{M}[w])) / sum by (G) (rate(<base>_count{M}[w]))
    ratio  (sum by (G) (rate(<c>{GOOD, M}[w])) or (0 * sum by (G) (rate(<c>{M}[w]))))
             / sum by (G) (rate(<c>{M}[w]))

``G`` are the rule's group labels and ``M`` its matchers, both translated to the series'
label names. Where a series spells a label differently (GenAI: ``model`` is
``gen_ai_response_model``), each rate is wrapped in ``label_replace`` to copy it to the
rule's name and the ``sum by`` drops the series' name, so an alert from Prometheus carries
exactly the labels of the same alert from the agent.

``min_samples`` N > 1 adds ``and on (G) (sum by (G) (increase(<count>{M}[w])) >= N)``;
``increase`` extrapolates to the window's edges, so the count is approximate (a sample or
so either way) where the agent's windows count exactly. N = 1 needs no guard: a window with
no samples gives NaN (0 / 0), and NaN compares false. A relative rule compares
``(current / baseline - 1)``, the baseline being the same aggregation over
``[<baseline window>] offset <window>`` (or, for a peer baseline, over the same window with
the peer's matchers), and requires N samples in both.

A threshold per label value becomes one Prometheus rule per value (same ``alert``) with
the label's matcher added (and the value as a static label, which leaves the alert's labels
as they are but keeps ``promtool check rules`` from calling the variants duplicates), plus one
for the default, if any, excluding the listed values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import yaml

from semhealth.alerts.durations import format_duration
from semhealth.alerts.errors import RuleError, RuleIssue
from semhealth.alerts.model import QUANTILES, Rule, Thresholds
from semhealth.alerts.signals import Signal, signal_named

# RE2's metacharacters; escaping only these keeps the regex readable in the export.
_REGEX_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


@dataclass(frozen=True, slots=True)
class _Matcher:
    label: str  # the series' label name
    op: Literal["=", "!~"]
    value: str

    def __str__(self) -> str:
        # A JSON string is also a PromQL string literal: same escapes for \ " and controls.
        return f"{self.label}{self.op}{orjson.dumps(self.value).decode()}"


# A threshold, and the matchers that select the groups it applies to.
_Variant = tuple[float, tuple[_Matcher, ...]]


@dataclass(frozen=True, slots=True)
class _Query:
    """What one exported rule selects: its signal's series, matchers and group labels."""

    signal: Signal
    groups: tuple[str, ...]  # rule-facing label names
    matchers: tuple[_Matcher, ...]

    def series_label(self, label: str) -> str:
        return self.signal.prometheus_labels.get(label, label)

    @property
    def renames(self) -> tuple[tuple[str, str], ...]:
        """(rule label, series label) for each group label the series spells differently."""
        pairs = ((label, self.series_label(label)) for label in self.groups)
        return tuple((label, series) for label, series in pairs if label != series)


def _number(value: float) -> str:
    """A float as a PromQL number literal, as short as it reads."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)).removesuffix(".0")


def _regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(r"\\\1", value)


def _by(labels: Sequence[str]) -> str:
    return f"({', '.join(labels)})"


def _sum(expr: str, by: Sequence[str]) -> str:
    return f"sum by {_by(by)} ({expr})" if by else f"sum({expr})"


def _selector(metric: str, matchers: Iterable[_Matcher], window_s: float, offset_s: float) -> str:
    inner = ", ".join(str(matcher) for matcher in matchers)
    selector = f"{metric}{{{inner}}}" if inner else metric
    offset = f" offset {format_duration(offset_s)}" if offset_s else ""
    return f"{selector}[{format_duration(window_s)}]{offset}"


def _over_window(
    function: str,
    query: _Query,
    metric: str,
    by: Sequence[str],
    window: tuple[float, float],
    extra: Sequence[_Matcher] = (),
) -> str:
    """``sum by (by) (function(metric{...}[window]))``, renamed labels copied to the rule's."""
    expr = f"{function}({_selector(metric, (*extra, *query.matchers), *window)})"
    for label, series in query.renames:
        expr = f'label_replace({expr}, "{label}", "$1", "{series}", "(.*)")'
    return _sum(expr, by)


def _count_metric(signal: Signal) -> str:
    return signal.prometheus if signal.kind == "ratio" else f"{signal.prometheus}_count"


def _value(rule: Rule, query: _Query, window: tuple[float, float]) -> tuple[str, bool]:
    """The rule's aggregation over ``window`` (length, offset), and whether it is one term."""
    base, groups = query.signal.prometheus, query.groups
    if rule.aggregation in QUANTILES:
        rates = _over_window("rate", query, f"{base}_bucket", ("le", *groups), window)
        return f"histogram_quantile({_number(QUANTILES[rule.aggregation])}, {rates})", True
    if rule.aggregation == "mean":
        total = _over_window("rate", query, f"{base}_sum", groups, window)
        count = _over_window("rate", query, f"{base}_count", groups, window)
        return f"{total} / {count}", False
    good_matchers = tuple(_Matcher(label, "=", v) for label, v in query.signal.good.items())
    good = _over_window("rate", query, base, groups, window, good_matchers)
    every = _over_window("rate", query, base, groups, window)
    # `or`: a group with no good series at all has ratio 0, not no value.
    return f"({good} or (0 * {every})) / {every}", False


def _guard(rule: Rule, query: _Query, window: tuple[float, float]) -> str:
    count = _over_window("increase", query, _count_metric(query.signal), query.groups, window)
    return f"and on {_by(query.groups)} ({count} >= {rule.min_samples})"


def _expression(rule: Rule, query: _Query, threshold: float, peer: _Query | None) -> str:
    current = (rule.window_s, 0.0)
    measured = [(query, current)]
    value, single = _value(rule, query, current)
    if rule.baseline is not None:
        if peer is not None:
            baseline_of = (peer, current)
        else:
            assert rule.baseline.window_s is not None
            baseline_of = (query, (rule.baseline.window_s, rule.window_s))
        measured.append(baseline_of)
        baseline, baseline_single = _value(rule, *baseline_of)
        value = f"({_wrap(value, single)} / {_wrap(baseline, baseline_single)} - 1)"
    lines = [f"{value} {rule.op} {_number(threshold)}"]
    if rule.min_samples > 1:
        lines.extend(_guard(rule, q, window) for q, window in measured)
    return "\n".join(lines)


def _wrap(expr: str, single: bool) -> str:
    return expr if single else f"({expr})"


def _variants(rule: Rule) -> list[_Variant]:
    """(threshold, extra rule-label matchers) for each Prometheus rule ``rule`` becomes."""
    if not isinstance(rule.threshold, Thresholds):
        return [(rule.threshold, ())]
    return _threshold_variants(rule.threshold, rule.match.get(rule.threshold.label))


def _threshold_variants(thresholds: Thresholds, matched: str | None) -> list[_Variant]:
    label = thresholds.label
    # A rule that already matches one value of the label needs only that value's variant.
    out: list[_Variant] = [
        (threshold, (_Matcher(label, "=", value),))
        for value, threshold in thresholds.values.items()
        if matched in (None, value)
    ]
    if thresholds.default is not None and (matched is None or matched not in thresholds.values):
        listed = "|".join(_regex_escape(value) for value in thresholds.values)
        out.append((thresholds.default, (_Matcher(label, "!~", listed),) if listed else ()))
    return out


def _query(
    rule: Rule, signal: Signal, extra: Sequence[_Matcher], match: Mapping[str, str] | None = None
) -> _Query:
    """The series of the rule's samples (of a peer baseline's, given its ``match``)."""
    chosen = rule.match if match is None else match
    rule_matchers = [_Matcher(label, "=", value) for label, value in chosen.items()]
    matchers = tuple(  # dict.fromkeys: a matcher given twice is written once
        dict.fromkeys(
            _Matcher(signal.prometheus_labels.get(m.label, m.label), m.op, m.value)
            for m in (*rule_matchers, *extra)
        )
    )
    return _Query(signal=signal, groups=rule.group_labels, matchers=matchers)


def _alerting_rule(rule: Rule, expr: str, extra: Sequence[_Matcher]) -> dict[str, Any]:
    out: dict[str, Any] = {"alert": rule.name, "expr": expr, "for": format_duration(rule.for_s)}
    if rule.keep_firing_for_s:
        out["keep_firing_for"] = format_duration(rule.keep_firing_for_s)
    # A per-value variant also states its value as a label. The alert's labels do not change
    # (the expression already yields that value under that name), but the variants' label
    # sets differ, which Prometheus' duplicate-rule lint requires of rules sharing a name.
    pinned = {m.label: m.value for m in extra if m.op == "=" and m.label not in rule.labels}
    labels = {**rule.labels, **pinned}
    if labels:
        out["labels"] = labels
    if rule.annotations:
        out["annotations"] = dict(rule.annotations)
    return out


def _issues(index: int, rule: Rule) -> list[RuleIssue]:
    """What stops ``rule`` from being written as PromQL (the loader checks these too)."""
    path = f"rules[{index}]"
    signal = signal_named(rule.signal)
    if signal is None:
        return [RuleIssue(f"{path}.signal", f"unknown signal {rule.signal!r}",
                          "use a signal name from semhealth.alerts.signals")]  # fmt: skip
    issues = []
    if rule.aggregation not in signal.aggregations:
        issues.append(RuleIssue(f"{path}.aggregation",
                                f"{rule.signal} has no aggregation {rule.aggregation!r}",
                                f"use one of {', '.join(signal.aggregations)}"))  # fmt: skip
    return issues + _label_issues(path, rule, signal)


def _label_issues(path: str, rule: Rule, signal: Signal) -> list[RuleIssue]:
    threshold = [rule.threshold.label] if isinstance(rule.threshold, Thresholds) else []
    peer = tuple(rule.baseline.peer) if rule.baseline is not None else ()
    used = (
        ("group_by", rule.group_by),
        ("match", tuple(rule.match)),
        ("threshold", threshold),
        ("baseline.peer", peer),
    )
    fix = f"use labels from {', '.join(signal.labels)}"
    return [
        RuleIssue(f"{path}.{key}", f"{rule.signal} has no label {label!r}", fix)
        for key, labels in used
        for label in labels
        if label not in signal.labels
    ]


def _alerting_rules(rule: Rule, signal: Signal) -> list[dict[str, Any]]:
    out = []
    for threshold, extra in _variants(rule):
        peer = None
        if rule.baseline is not None and rule.baseline.is_peer:
            peer = _query(rule, signal, extra, rule.peer_match)
        expr = _expression(rule, _query(rule, signal, extra), threshold, peer)
        out.append(_alerting_rule(rule, expr, extra))
    return out


def rule_groups(
    rules: Iterable[Rule], *, group_name: str = "semhealth", interval_s: float | None = None
) -> dict[str, Any]:
    """The Prometheus rule file (``{"groups": [...]}``) that evaluates ``rules``.

    Raises ``RuleError`` listing every rule that cannot be written as PromQL.
    """
    rules = list(rules)
    issues = [issue for index, rule in enumerate(rules) for issue in _issues(index, rule)]
    if issues:
        raise RuleError(issues)
    group: dict[str, Any] = {"name": group_name}
    if interval_s is not None:
        group["interval"] = format_duration(interval_s)
    group["rules"] = [
        out
        for rule in rules
        if (signal := signal_named(rule.signal)) is not None
        for out in _alerting_rules(rule, signal)
    ]
    return {"groups": [group]}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the expressions) as literal blocks, so they read as written."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def render_rules(
    rules: Iterable[Rule],
    *,
    source: str = "the rules definitions",
    group_name: str = "semhealth",
    interval_s: float | None = None,
) -> str:
    """``rule_groups`` as YAML text: stable key order, same rules give the same bytes.

    ``source`` names the definitions the rules came from, for the header comment.
    """
    document = rule_groups(rules, group_name=group_name, interval_s=interval_s)
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1_000_000)
    header = (
        "# Generated by `semhealth rules export --format prometheus`"
        f" from {source.replace(chr(10), ' ')}.\n"
        "# Do not edit: change the definitions and export again (the agent evaluates the same).\n"
    )
    return header + body
