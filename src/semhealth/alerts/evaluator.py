"""The rule evaluator: samples into bounded windows, windows through rules, rules through
Prometheus' alert state machine, and the alerts that need sending out through ``notify``.

A pure state machine: no IO, no clock (``evaluate(now)`` takes wall-clock Unix seconds), no
asyncio, no locks. It is single-threaded by contract: call ``observe``, ``evaluate`` and
``snapshot`` from one thread (the agent runs them on a worker thread of its own); none of
them awaits or blocks.

The states follow Prometheus' ``rules/alerting.go``:

- inactive -> pending when the condition holds (``active_at`` is that evaluation's time);
- pending -> firing once it has held for ``for`` (at once when ``for`` is 0);
- pending -> inactive as soon as it stops holding (a pending alert is never sent);
- firing stays firing for ``keep_firing_for`` after the condition stops, then resolves;
- a resolved alert is kept ``resolved_retention_s`` (15 min) and re-sent every
  ``resend_delay_s``, so that a lost "resolved" reaches Alertmanager in the end. If the
  condition holds again meanwhile, a new alert starts pending.

An alert is sent (Prometheus' ``needsSending``) when it is firing or resolved and its last
send is more than ``resend_delay_s`` old, and always on the evaluation that resolves it. A
firing alert goes out with ``ends_at = now + 4 * max(resend_delay_s, interval_s)``, so
Alertmanager resolves it by itself if we stop; a resolved one with ``ends_at = resolved_at``.

Each group keeps its samples in a ``Window`` of 30 slots over the rule's window, so the window's
edges move in steps of window/30, and a relative rule's group keeps a second one of 30 coarser
slots over the baseline, which ends where the window's first slot begins, give or take one
coarse slot; a peer-relative rule's group keeps its peer's samples in a second window shaped
as its own, over the same span. Memory per group is bounded by those slots, whatever the
traffic. Quantiles come from sketches within 1 % relative error (0.2 % for relative rules,
whose value divides two of them); means and ratios are exact.

Too few samples (fewer than ``min_samples``; for a relative rule, in either window) counts as
"condition false". An alert's ``value`` and annotations follow each evaluation while it is
pending or firing (``value`` None and ``<no value>`` in the text while there were too few
samples) and freeze when it resolves. Alert labels are Prometheus': the group's non-empty
label values, then the rule's labels (which win), then ``alertname``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from semhealth.alerts import templates
from semhealth.alerts.model import (
    QUANTILES,
    Aggregation,
    Alert,
    Comparison,
    Rule,
    State,
    Thresholds,
    compare,
)
from semhealth.alerts.sample import Sample
from semhealth.alerts.window import DEFAULT_ALPHA, DEFAULT_MAX_BUCKETS, Sketch, Window

Notify = Callable[[Sequence[Alert]], None]

DEFAULT_RESEND_DELAY_S = 60.0  # Prometheus' --rules.alert.resend-delay
DEFAULT_INTERVAL_S = 15.0
DEFAULT_RESOLVED_RETENTION_S = 900.0  # Prometheus' resolvedRetention
DEFAULT_MAX_GROUPS_PER_RULE = 1000
# A window, and a baseline window, is cut into this many slots: its edges move in steps of
# window/30. A baseline keeps its own, coarser slots, so an hour's baseline behind a 5 min
# window costs 30 slots per group, not 360.
SLOTS_PER_WINDOW = 30
MIN_SLOT_S = 0.001
# Relative rules' sketches: see _RuleState.alpha.
DEFAULT_RELATIVE_ALPHA = 0.002


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    """Counters since the evaluator was built, and the groups it holds now.

    ``groups_dropped`` counts samples refused because their group would have been new
    and the rule already held ``max_groups_per_rule`` groups (remembering which groups
    were refused would itself be unbounded).
    """

    samples_observed: int
    samples_unmatched: int  # no rule's signal, match and threshold fitted the sample
    samples_invalid: int  # value or time NaN or infinite
    samples_late: int  # older than a rule's window (and baseline) already kept
    evaluations: int
    groups: int
    groups_dropped: int
    rule_failures: int  # a rule's evaluation raised (a bug); the other rules still ran
    last_evaluation_at: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupStatus:
    """One group of one rule. ``value``, ``samples`` and the baseline are measured at the
    snapshot's time; ``state`` and the alert times are those of the last evaluation."""

    labels: dict[str, str]
    value: float | None
    samples: int
    baseline: float | None  # relative rules: the aggregate over the baseline window
    baseline_samples: int
    threshold: float | None
    state: State
    active_at: float | None
    fired_at: float | None
    resolved_at: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleStatus:
    """A rule as the agent's ``/alerts`` shows it: its definition, then its groups."""

    name: str
    signal: str
    aggregation: Aggregation
    window_s: float
    op: Comparison
    threshold: float | Thresholds
    min_samples: int
    for_s: float
    keep_firing_for_s: float
    group_by: tuple[str, ...]
    match: dict[str, str]
    baseline_window_s: float | None
    baseline_peer: dict[str, str]  # a peer baseline's labels; {} for none or a time baseline
    labels: dict[str, str]
    description: str
    groups: tuple[GroupStatus, ...]


@dataclass(frozen=True, slots=True)
class _Measure:
    value: float | None
    samples: int
    baseline: float | None = None
    baseline_samples: int = 0


class _Active:
    """The mutable state of one group's alert (Prometheus' ``Alert``)."""

    __slots__ = (
        "active_at",
        "annotations",
        "fired_at",
        "keep_firing_since",
        "last_sent_at",
        "resolved_at",
        "state",
        "value",
    )

    def __init__(self, active_at: float) -> None:
        self.state: State = "pending"
        self.active_at = active_at
        self.fired_at: float | None = None
        self.resolved_at: float | None = None
        self.keep_firing_since: float | None = None
        self.last_sent_at: float | None = None
        self.value: float | None = None
        self.annotations: dict[str, str] = {}


class _Group:
    __slots__ = (
        "alert",
        "alert_labels",
        "baseline",
        "labels",
        "last_sample_t",
        "measured",
        "peer_baseline",
        "window",
    )

    def __init__(
        self,
        labels: dict[str, str],
        alert_labels: dict[str, str],
        window: Window,
        baseline: Window | None,
        peer_baseline: bool = False,
    ) -> None:
        self.labels = labels
        self.alert_labels = alert_labels
        self.window = window
        self.baseline = baseline
        self.peer_baseline = peer_baseline
        self.last_sample_t = -math.inf
        self.alert: _Active | None = None
        # The last evaluation's time and measure: a snapshot at that time reuses it rather
        # than merging every slot again (the merge is most of an evaluation's cost).
        self.measured: tuple[float, _Measure] | None = None

    def add(self, value: float, t: float, *, peer: bool = False) -> bool:
        """Count the sample in the group's windows (a peer's sample: in its baseline only);
        False when all refuse it as too old."""
        if peer:
            assert self.baseline is not None
            added = self.baseline.add(value, t)
        else:
            added = self.window.add(value, t)
            if self.baseline is not None and not self.peer_baseline:
                added = self.baseline.add(value, t) or added
        if added:
            self.last_sample_t = max(self.last_sample_t, t)
            self.measured = None  # a snapshot must see this sample
        return added

    def prune(self, now: float, rule: Rule, baseline_slot_s: float) -> None:
        self.window.prune(now - rule.window_s)
        if self.baseline is None or rule.baseline is None:
            return
        if self.peer_baseline or rule.baseline.window_s is None:
            self.baseline.prune(now - rule.window_s)
        else:
            self.baseline.prune(now - rule.window_s - rule.baseline.window_s - baseline_slot_s)


class _RuleState:
    """A rule with what evaluating it needs precomputed, and its groups."""

    __slots__ = (
        "alpha",
        "baseline_slot_s",
        "baseline_slots",
        "group_labels",
        "groups",
        "match",
        "max_buckets",
        "peer_match",
        "quantiles",
        "rule",
        "slot_s",
        "span_s",
    )

    def __init__(self, rule: Rule, *, alpha: float, relative_alpha: float, max_buckets: int):
        if not rule.window_s > 0 or not math.isfinite(rule.window_s):
            raise ValueError(f"rule {rule.name}: window must be positive, got {rule.window_s}")
        peer = rule.baseline is not None and rule.baseline.is_peer
        baseline_s = 0.0
        if rule.baseline is not None and not peer:
            baseline_s = rule.baseline.window_s or 0.0
            if not baseline_s > 0 or not math.isfinite(baseline_s):
                raise ValueError(f"rule {rule.name}: baseline window must be positive")
        if peer and rule.peer_match == dict(rule.match):
            raise ValueError(f"rule {rule.name}: a peer baseline must differ from the match")
        self.rule = rule
        self.slot_s = max(rule.window_s / SLOTS_PER_WINDOW, MIN_SLOT_S)
        self.baseline_slot_s = max(baseline_s / SLOTS_PER_WINDOW, MIN_SLOT_S)
        self.baseline_slots = max(round(baseline_s / self.baseline_slot_s), 1)
        # How far back a sample can still count: the baseline may end a coarse slot early.
        self.span_s = rule.window_s + (baseline_s + self.baseline_slot_s if baseline_s else 0.0)
        self.quantiles = rule.aggregation in QUANTILES
        # A relative change divides two estimates, adding their errors: a finer sketch keeps
        # "5 % below the baseline" meaning 5 %, give or take 0.4 %, not 3 % to 7 %.
        self.alpha = alpha if rule.baseline is None else relative_alpha
        # ... and as many more buckets, so the finer sketch spans the same range of values.
        self.max_buckets = math.ceil(max_buckets * alpha / self.alpha)
        self.group_labels = rule.group_labels
        self.match = tuple(rule.match.items())
        # A peer-relative rule's baseline samples: the match with the peer's values over it.
        self.peer_match = tuple(rule.peer_match.items()) if peer else ()
        self.groups: dict[tuple[str, ...], _Group] = {}

    def window_shape(self) -> tuple[object, ...]:
        """What a group's windows depend on: rules that agree on it can share groups."""
        rule = self.rule
        return (
            rule.signal,
            self.match,
            self.peer_match,
            self.group_labels,
            self.slot_s,
            self.baseline_slot_s,
            self.span_s,
            self.quantiles,
            self.alpha,
            self.max_buckets,
        )

    def take_groups(self, old: _RuleState) -> None:
        """Carry ``old``'s groups, windows and alerts over to this changed version of the
        same rule; alert labels follow this version's labels."""
        for key, group in old.groups.items():
            group.alert_labels = self.new_group(key).alert_labels
            group.measured = None
            self.groups[key] = group

    def accepts(self, labels: Mapping[str, str]) -> bool:
        return self.side(labels) is not None

    def side(self, labels: Mapping[str, str]) -> bool | None:
        """None when the rule takes no part in a sample with ``labels``; else whether it is
        a peer's (baseline) sample."""
        if _matches(labels, self.match):
            peer = False
        elif self.peer_match and _matches(labels, self.peer_match):
            peer = True
        else:
            return None
        threshold = self.rule.threshold
        # A per-label threshold without a value for this group: the rule ignores the group.
        if isinstance(threshold, Thresholds) and (
            threshold.for_value(labels.get(threshold.label)) is None
        ):
            return None
        return peer

    def new_group(self, key: tuple[str, ...]) -> _Group:
        labels = dict(zip(self.group_labels, key, strict=True))
        # As Prometheus' label builder: an empty value is no label; the rule's labels win.
        alert_labels = {name: value for name, value in labels.items() if value}
        alert_labels.update(self.rule.labels)
        alert_labels["alertname"] = self.rule.name
        window = self._window(self.slot_s, self.rule.window_s)
        baseline = None
        if self.peer_match:
            baseline = self._window(self.slot_s, self.rule.window_s)
        elif self.rule.baseline is not None:
            baseline = self._window(self.baseline_slot_s, self.span_s)
        return _Group(labels, alert_labels, window, baseline, peer_baseline=bool(self.peer_match))

    def _window(self, slot_s: float, span_s: float) -> Window:
        return Window(
            slot_s=slot_s,
            span_s=span_s,
            quantiles=self.quantiles,
            alpha=self.alpha,
            max_buckets=self.max_buckets,
        )

    def measure(self, group: _Group, now: float) -> _Measure:
        rule = self.rule
        window = group.window
        current = window.summary(now - rule.window_s, now)
        value = _aggregate(current, rule.aggregation) if current.count >= rule.min_samples else None
        if rule.baseline is None or group.baseline is None:
            return _Measure(value, current.count)
        if group.peer_baseline:
            past = group.baseline.summary(now - rule.window_s, now)
            return _relative(rule, value, current.count, past)
        # The baseline's coarse slots end at or before the first slot of the window, so no
        # sample counts in both; the gap between them is under one coarse slot.
        begins = window.first_slot_from(now - rule.window_s) * window.slot_s
        stop = group.baseline.slot_of(begins)
        past = group.baseline.summary_of_slots(stop - self.baseline_slots, stop)
        return _relative(rule, value, current.count, past)


def _relative(rule: Rule, value: float | None, count: int, past: Sketch) -> _Measure:
    """The window's value against the baseline's, each with enough samples."""
    baseline = _aggregate(past, rule.aggregation) if past.count >= rule.min_samples else None
    relative = None
    if value is not None and baseline is not None and baseline != 0:
        relative = value / baseline - 1.0
    return _Measure(relative, count, baseline, past.count)


def _matches(labels: Mapping[str, str], wanted: tuple[tuple[str, str], ...]) -> bool:
    return all(labels.get(name) == value for name, value in wanted)


def _no_pause() -> None:
    """The default ``pause``: nothing to hand over."""


def _aggregate(sketch: Sketch, aggregation: Aggregation) -> float | None:
    quantile = QUANTILES.get(aggregation)
    if quantile is not None:
        return sketch.quantile(quantile)
    # "ratio": samples are 1.0 (good) or 0.0, so the mean is the good share.
    return sketch.mean


def _update(alert: _Active, rule: Rule, group: _Group, value: float | None) -> None:
    alert.value = value
    alert.annotations = {
        name: templates.render(text, value=value, labels=group.labels)
        for name, text in rule.annotations.items()
    }


def _needs_sending(alert: _Active, now: float, resend_delay_s: float) -> bool:
    if alert.state == "pending":
        return False
    if alert.last_sent_at is None:
        return True
    if alert.resolved_at is not None and alert.resolved_at > alert.last_sent_at:
        return True
    return alert.last_sent_at + resend_delay_s < now


class Evaluator:
    """Evaluates ``rules`` over the samples ``observe`` is given; see the module docstring."""

    def __init__(
        self,
        rules: Iterable[Rule],
        *,
        notify: Notify,
        resend_delay_s: float = DEFAULT_RESEND_DELAY_S,
        interval_s: float = DEFAULT_INTERVAL_S,
        resolved_retention_s: float = DEFAULT_RESOLVED_RETENTION_S,
        max_groups_per_rule: int = DEFAULT_MAX_GROUPS_PER_RULE,
        alpha: float = DEFAULT_ALPHA,
        relative_alpha: float = DEFAULT_RELATIVE_ALPHA,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
        pause: Callable[[], None] | None = None,
    ) -> None:
        if resend_delay_s < 0 or interval_s <= 0 or resolved_retention_s < 0:
            raise ValueError("resend_delay_s and resolved_retention_s must be >= 0, interval_s > 0")
        if max_groups_per_rule < 1:
            raise ValueError(f"max_groups_per_rule must be at least 1, got {max_groups_per_rule}")
        for accuracy in (alpha, relative_alpha):
            Sketch(alpha=accuracy, max_buckets=max_buckets)  # fail at start-up, not on a sample
        self._accuracy = (alpha, relative_alpha, max_buckets)
        self._rules: tuple[_RuleState, ...] = ()
        self._by_signal: dict[str, list[_RuleState]] = {}
        self.replace_rules(rules)
        self._notify = notify
        # Called after each group is evaluated: a caller on a worker thread hands the GIL
        # to its event loop there (see semhealth.agent.analysis.alerting).
        self._pause = pause or _no_pause
        self._resend_delay_s = resend_delay_s
        self._valid_for_s = 4 * max(resend_delay_s, interval_s)
        self._retention_s = resolved_retention_s
        self._max_groups = max_groups_per_rule
        self._observed = 0
        self._unmatched = 0
        self._invalid = 0
        self._late = 0
        self._evaluations = 0
        self._dropped = 0
        self._rule_failures = 0
        self._last_evaluation: float | None = None

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(state.rule for state in self._rules)

    def replace_rules(self, rules: Iterable[Rule]) -> None:
        """Evaluate ``rules`` from now on, carrying state over by rule name, as a Prometheus
        reload carries active alerts over.

        A rule whose windows keep their shape (a new threshold, ``for``, labels, annotations
        or description) keeps its groups, windows and alerts. One whose windows change shape
        (signal, aggregation, window, baseline, ``match``, ``group_by``) starts empty, and
        so does a new rule. A removed rule's alerts are no longer sent, so Alertmanager ends
        them at their ``ends_at``.
        """
        alpha, relative_alpha, max_buckets = self._accuracy
        running = list(self._rules)
        states = []
        for rule in rules:
            old = next((state for state in running if state.rule.name == rule.name), None)
            if old is not None:
                running.remove(old)
            if old is not None and old.rule == rule:
                states.append(old)
                continue
            state = _RuleState(
                rule, alpha=alpha, relative_alpha=relative_alpha, max_buckets=max_buckets
            )
            if old is not None and old.window_shape() == state.window_shape():
                state.take_groups(old)
            states.append(state)
        self._rules = tuple(states)
        self._by_signal = {}
        for state in self._rules:
            self._by_signal.setdefault(state.rule.signal, []).append(state)

    @property
    def stats(self) -> Stats:
        return Stats(
            samples_observed=self._observed,
            samples_unmatched=self._unmatched,
            samples_invalid=self._invalid,
            samples_late=self._late,
            evaluations=self._evaluations,
            groups=sum(len(state.groups) for state in self._rules),
            groups_dropped=self._dropped,
            rule_failures=self._rule_failures,
            last_evaluation_at=self._last_evaluation,
        )

    def observe(self, sample: Sample) -> None:
        """Add ``sample`` to the window of its group in every rule it fits. Never raises."""
        self._observed += 1
        if not (math.isfinite(sample.value) and math.isfinite(sample.t)):
            self._invalid += 1
            return
        matched = False
        for state in self._by_signal.get(sample.name, ()):
            try:
                peer = state.side(sample.labels)
                if peer is not None:
                    matched = True
                    self._add(state, sample, peer)
            except Exception:  # a bug in one rule; the sample still reaches the others
                self._rule_failures += 1
        if not matched:
            self._unmatched += 1

    def _add(self, state: _RuleState, sample: Sample, peer: bool) -> None:
        labels = sample.labels
        key = tuple([labels.get(name, "") for name in state.group_labels])
        group = state.groups.get(key)
        if group is None:
            if len(state.groups) >= self._max_groups:
                self._dropped += 1
                return
            group = state.new_group(key)
            state.groups[key] = group
        if not group.add(sample.value, sample.t, peer=peer):
            self._late += 1

    def evaluate(self, now: float) -> None:
        """Evaluate every rule at ``now`` and call ``notify`` once with the alerts that need
        sending; not at all when none do. State is complete before ``notify`` runs."""
        self._evaluations += 1
        self._last_evaluation = now
        outgoing: list[Alert] = []
        for state in self._rules:
            # One rule's bug must not cost the other rules' alerts: those already marked
            # as sent in ``outgoing`` would otherwise wait a whole resend delay.
            try:
                self._evaluate_rule(state, now, outgoing)
            except Exception:
                self._rule_failures += 1
        if outgoing:
            self._notify(outgoing)

    def _evaluate_rule(self, state: _RuleState, now: float, outgoing: list[Alert]) -> None:
        rule = state.rule
        for key, group in list(state.groups.items()):
            group.prune(now, rule, state.baseline_slot_s)
            measure = state.measure(group, now)
            group.measured = (now, measure)
            threshold = rule.threshold_for(group.labels)
            condition = (
                measure.value is not None
                and threshold is not None
                and compare(measure.value, rule.op, threshold)
            )
            self._step(state, group, condition, measure.value, now)
            alert = group.alert
            if alert is not None and _needs_sending(alert, now, self._resend_delay_s):
                outgoing.append(self._send(state, group, alert, now))
            if alert is None and now - group.last_sample_t > state.span_s:
                del state.groups[key]  # nothing left to measure or to tell
            self._pause()

    def _step(
        self, state: _RuleState, group: _Group, condition: bool, value: float | None, now: float
    ) -> None:
        rule = state.rule
        alert = group.alert
        if condition:
            if alert is None or alert.state == "resolved":
                alert = _Active(now)
                group.alert = alert
            alert.keep_firing_since = None
            _update(alert, rule, group, value)
            if alert.state == "pending" and now - alert.active_at >= rule.for_s:
                alert.state = "firing"
                alert.fired_at = now
            return
        if alert is None:
            return
        if alert.state == "pending":
            group.alert = None
        elif alert.state == "resolved":
            if alert.resolved_at is not None and now - alert.resolved_at > self._retention_s:
                group.alert = None
        elif not self._keeps_firing(alert, rule, now):
            # Value and annotations stay those of the last evaluation that breached, as in
            # Prometheus: the page says what fired, not the healthy number that ended it.
            alert.state = "resolved"
            alert.resolved_at = now

    @staticmethod
    def _keeps_firing(alert: _Active, rule: Rule, now: float) -> bool:
        if rule.keep_firing_for_s <= 0:
            return False
        if alert.keep_firing_since is None:
            alert.keep_firing_since = now
        return now - alert.keep_firing_since < rule.keep_firing_for_s

    def _send(self, state: _RuleState, group: _Group, alert: _Active, now: float) -> Alert:
        alert.last_sent_at = now
        ends_at = alert.resolved_at if alert.state == "resolved" else now + self._valid_for_s
        return Alert(
            rule=state.rule.name,
            state=alert.state,
            labels=dict(group.alert_labels),
            annotations=dict(alert.annotations),
            value=alert.value,
            active_at=alert.active_at,
            fired_at=alert.fired_at,
            resolved_at=alert.resolved_at,
            ends_at=ends_at,
        )

    def snapshot(self, now: float) -> list[RuleStatus]:
        """Every rule and its groups, with values measured at ``now``; changes nothing.

        A rule whose groups cannot be measured (a bug, already counted by ``evaluate``) is
        listed without groups rather than costing the other rules their status."""
        statuses = []
        for state in self._rules:
            try:
                statuses.append(self._rule_status(state, now))
            except Exception:
                statuses.append(self._rule_status(state, now, with_groups=False))
        return statuses

    def _rule_status(self, state: _RuleState, now: float, with_groups: bool = True) -> RuleStatus:
        rule = state.rule
        ordered = sorted(state.groups.values(), key=lambda group: tuple(group.labels.values()))
        statuses = []
        for group in ordered if with_groups else ():
            statuses.append(self._group_status(state, group, now))
            self._pause()
        groups = tuple(statuses)
        return RuleStatus(
            name=rule.name,
            signal=rule.signal,
            aggregation=rule.aggregation,
            window_s=rule.window_s,
            op=rule.op,
            threshold=rule.threshold,
            min_samples=rule.min_samples,
            for_s=rule.for_s,
            keep_firing_for_s=rule.keep_firing_for_s,
            group_by=rule.group_by,
            match=dict(rule.match),
            baseline_window_s=rule.baseline.window_s if rule.baseline is not None else None,
            baseline_peer=dict(rule.baseline.peer) if rule.baseline is not None else {},
            labels=dict(rule.labels),
            description=rule.description,
            groups=groups,
        )

    @staticmethod
    def _group_status(state: _RuleState, group: _Group, now: float) -> GroupStatus:
        last = group.measured
        measure = last[1] if last is not None and last[0] == now else state.measure(group, now)
        alert = group.alert
        return GroupStatus(
            labels=dict(group.labels),
            value=measure.value,
            samples=measure.samples,
            baseline=measure.baseline,
            baseline_samples=measure.baseline_samples,
            threshold=state.rule.threshold_for(group.labels),
            state=alert.state if alert is not None else "inactive",
            active_at=alert.active_at if alert is not None else None,
            fired_at=alert.fired_at if alert is not None else None,
            resolved_at=alert.resolved_at if alert is not None else None,
        )
