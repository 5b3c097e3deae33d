"""What a rule is, and what evaluating one produces.

A ``Rule`` is the single definition both evaluators use: the agent's evaluator
over its in-memory windows, and the Prometheus export over the exported series.
Durations are seconds; thresholds are in the signal's base unit (seconds, or a
0..1 score or ratio). A relative rule (``baseline`` set) compares the window's
value with a baseline, and its threshold is a relative change: ``-0.05`` means
"5 % below the baseline". The baseline is the same group over a window just
before the rule's own, or, over the same window, a peer: the same group's samples
with other label values (the stable variant, for a rule on the canary).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Aggregation = Literal["p50", "p90", "p95", "p99", "mean", "ratio"]
Comparison = Literal["<", "<=", ">", ">="]
State = Literal["inactive", "pending", "firing", "resolved"]

QUANTILES: Mapping[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


def compare(value: float, op: Comparison, threshold: float) -> bool:
    match op:
        case "<":
            return value < threshold
        case "<=":
            return value <= threshold
        case ">":
            return value > threshold
        case ">=":
            return value >= threshold


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """What a relative rule compares against: the same group over ``window_s`` ending where
    the rule's own window begins, or (``peer``) over the rule's own window, the samples
    whose labels match the rule's ``match`` with ``peer``'s values instead. One of the two."""

    window_s: float | None = None
    peer: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_peer(self) -> bool:
        return bool(self.peer)


@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """A threshold per value of one label (``LatencySLO``: a budget per prompt class).

    Groups whose label value is not in ``values`` use ``default``; with no default they
    are not evaluated by this rule.
    """

    label: str
    values: Mapping[str, float]
    default: float | None = None

    def for_value(self, value: str | None) -> float | None:
        if value is not None and value in self.values:
            return self.values[value]
        return self.default


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    name: str  # the alertname
    signal: str  # a Signal.name
    aggregation: Aggregation
    window_s: float
    op: Comparison
    threshold: float | Thresholds
    min_samples: int = 1
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    group_by: tuple[str, ...] = ()
    match: Mapping[str, str] = field(default_factory=dict)  # only samples with these labels
    baseline: Baseline | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # severity, team, ...
    annotations: Mapping[str, str] = field(default_factory=dict)  # Prometheus templates
    description: str = ""  # why the rule exists and where its default comes from (docs only)

    @property
    def group_labels(self) -> tuple[str, ...]:
        """Labels that tell groups apart: ``group_by`` plus a per-label threshold's label."""
        if isinstance(self.threshold, Thresholds) and self.threshold.label not in self.group_by:
            return (*self.group_by, self.threshold.label)
        return self.group_by

    @property
    def peer_match(self) -> dict[str, str]:
        """The labels a peer baseline's samples have: the rule's match, peer values over it."""
        peer = self.baseline.peer if self.baseline is not None else {}
        return {**self.match, **peer}

    def threshold_for(self, group: Mapping[str, str]) -> float | None:
        if isinstance(self.threshold, Thresholds):
            return self.threshold.for_value(group.get(self.threshold.label))
        return self.threshold


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """One rule's alert for one group, as the evaluator sees it. Times are Unix seconds.

    ``labels`` are the identity Alertmanager sees: ``alertname``, the rule's labels and the
    group's label values. ``value`` is the measured value (the relative change for a
    relative rule) at the last evaluation; None while there were too few samples.
    ``ends_at`` is when Alertmanager should consider the alert over if it hears nothing
    more: the resolve time for resolved alerts, a few resend periods ahead for firing ones.
    """

    rule: str
    state: State
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    value: float | None
    active_at: float
    fired_at: float | None = None
    resolved_at: float | None = None
    ends_at: float | None = None
