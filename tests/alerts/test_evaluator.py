"""The evaluator's state machine, stepped like Prometheus' TestKeepFiringFor: the clock is an
argument, every evaluation 15 s apart, no sleeps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import orjson
import pytest

from semhealth.alerts.evaluator import Evaluator, GroupStatus
from semhealth.alerts.model import Alert, Baseline, Rule, Thresholds
from semhealth.alerts.sample import Sample

INTERVAL = 15.0
RESEND = 60.0
LABELS = {"route": "chat", "model": "m1", "provider": "openai", "prompt_class": "short"}

RELEVANCE = Rule(
    name="ContextRelevanceLow",
    signal="context_relevance_score",
    aggregation="mean",  # exact, so values and rendered text are predictable
    window_s=300.0,
    op="<",
    threshold=0.75,
    labels={"severity": "warning"},
)


class Outbox:
    """``notify``: what each call handed over, with the evaluation time it came at."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[tuple[float, list[Alert]]] = []

    def __call__(self, alerts: Sequence[Alert]) -> None:
        self.calls.append((self.now, list(alerts)))

    @property
    def times(self) -> list[float]:
        return [now for now, _ in self.calls]

    @property
    def last(self) -> Alert:
        (alert,) = self.calls[-1][1]
        return alert


class Clock:
    """An evaluator with its outbox, stepped through evaluation times."""

    def __init__(self, *rules: Rule, **options: float) -> None:
        self.outbox = Outbox()
        self.evaluator = Evaluator(rules, notify=self.outbox, **options)  # type: ignore[arg-type]

    def feed(
        self,
        value: float,
        t: float,
        count: int = 1,
        signal: str = "context_relevance_score",
        **labels: str,
    ) -> None:
        for _ in range(count):
            self.evaluator.observe(Sample(signal, value, {**LABELS, **labels}, t))

    def at(self, now: float) -> None:
        self.outbox.now = now
        self.evaluator.evaluate(now)

    def run(self, start: float, end: float) -> None:
        """Evaluate every INTERVAL from ``start`` through ``end``."""
        now = start
        while now <= end:
            self.at(now)
            now += INTERVAL

    def group(self) -> GroupStatus:
        """The first group of the first rule, as of the last evaluation's time."""
        return self.evaluator.snapshot(self.outbox.now)[0].groups[0]


def test_condition_true_goes_pending_then_fires_after_for() -> None:
    clock = Clock(replace(RELEVANCE, for_s=120.0))
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    assert clock.group().state == "pending"
    clock.run(30.0, 120.0)
    assert clock.outbox.calls == []  # pending is never sent
    clock.at(135.0)
    assert clock.group().state == "firing"
    alert = clock.outbox.last
    assert (alert.state, alert.active_at, alert.fired_at) == ("firing", 15.0, 135.0)


def test_for_zero_fires_at_the_first_evaluation() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    assert clock.outbox.times == [15.0]
    assert clock.outbox.last.state == "firing"
    assert clock.outbox.last.fired_at == 15.0


def test_pending_that_clears_never_notifies_and_goes_inactive() -> None:
    clock = Clock(replace(RELEVANCE, for_s=120.0))
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(1.0, t=20.0, count=3)  # mean 0.875: condition false
    clock.at(30.0)
    assert clock.group().state == "inactive"
    clock.run(45.0, 600.0)
    assert clock.outbox.calls == []


def test_pending_restarts_with_a_new_active_at_after_clearing() -> None:
    clock = Clock(replace(RELEVANCE, for_s=120.0))
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(1.0, t=20.0, count=3)
    clock.at(30.0)
    clock.feed(0.1, t=40.0, count=10)
    clock.at(45.0)
    assert (clock.group().state, clock.group().active_at) == ("pending", 45.0)


def test_keep_firing_for_holds_the_alert_then_resolves_it() -> None:
    clock = Clock(replace(RELEVANCE, keep_firing_for_s=60.0))
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(1.0, t=20.0, count=3)  # condition false from 30 on
    clock.run(30.0, 75.0)
    assert clock.group().state == "firing"  # 75 - 30 < 60
    assert clock.outbox.times == [15.0]  # and not re-sent before resend_delay
    clock.at(90.0)
    alert = clock.outbox.last
    assert (alert.state, alert.resolved_at, alert.ends_at) == ("resolved", 90.0, 90.0)


def test_keep_firing_for_restarts_when_the_condition_returns() -> None:
    clock = Clock(replace(RELEVANCE, keep_firing_for_s=60.0))
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(1.0, t=20.0, count=3)
    clock.run(30.0, 60.0)  # keeping since 30
    clock.feed(0.0, t=62.0, count=10)
    clock.at(75.0)  # condition true again
    clock.feed(1.0, t=80.0, count=100)
    clock.run(90.0, 135.0)  # keeping since 90 again: 135 - 90 < 60
    assert clock.group().state == "firing"
    clock.at(150.0)
    assert clock.group().state == "resolved"


def test_without_keep_firing_for_an_alert_resolves_at_the_first_false_evaluation() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(1.0, t=20.0, count=3)
    clock.at(30.0)
    assert clock.outbox.times == [15.0, 30.0]  # the resolution goes out at once
    assert clock.outbox.last.state == "resolved"


def test_firing_alert_is_resent_every_resend_delay_not_every_evaluation() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.run(15.0, 240.0)  # the t=1 sample stays in the 300 s window throughout
    # Prometheus resends once the last send is strictly more than resend_delay ago.
    assert clock.outbox.times == [15.0, 90.0, 165.0, 240.0]
    assert all(alert.state == "firing" for _, alerts in clock.outbox.calls for alert in alerts)


def test_firing_ends_at_is_four_resend_periods_ahead() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    assert clock.outbox.last.ends_at == 15.0 + 4 * RESEND


def test_firing_ends_at_uses_the_interval_when_it_is_longer_than_resend_delay() -> None:
    clock = Clock(RELEVANCE, interval_s=120.0)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    assert clock.outbox.last.ends_at == 15.0 + 4 * 120.0


def test_resolved_alert_is_resent_until_retention_ends_then_forgotten() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.run(15.0, 300.0)
    clock.at(315.0)  # the sample has left the window: no value, so resolved
    assert clock.outbox.last.state == "resolved"
    sent_before = len(clock.outbox.calls)
    clock.run(330.0, 315.0 + 900.0 + 60.0)
    resends = clock.outbox.times[sent_before:]
    assert resends == [315.0 + 75.0 * k for k in range(1, 13)]  # 390 ... 1215 (= 315 + 900)
    assert all(
        alert.state == "resolved" and alert.ends_at == 315.0
        for _, a in clock.outbox.calls[sent_before:]
        for alert in a
    )
    assert clock.evaluator.snapshot(1275.0)[0].groups == ()
    assert clock.evaluator.stats.groups == 0


def test_condition_returning_during_retention_starts_a_new_alert() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(1.0, t=20.0, count=3)
    clock.at(30.0)  # resolved
    clock.feed(0.0, t=40.0, count=10)
    clock.at(45.0)
    alert = clock.outbox.last
    assert (alert.state, alert.active_at, alert.resolved_at) == ("firing", 45.0, None)


def test_too_few_samples_is_condition_false() -> None:
    clock = Clock(replace(RELEVANCE, min_samples=20))
    clock.feed(0.5, t=1.0, count=19)
    clock.at(15.0)
    assert clock.outbox.calls == []
    assert clock.group().value is None
    assert clock.group().samples == 19
    clock.feed(0.5, t=16.0)
    clock.at(30.0)
    assert clock.outbox.last.state == "firing"


def test_an_alert_kept_firing_without_samples_carries_the_value_that_fired() -> None:
    rule = replace(RELEVANCE, keep_firing_for_s=3600.0, annotations={"summary": "at {{ $value }}"})
    clock = Clock(rule)
    clock.feed(0.5, t=1.0)
    clock.run(15.0, 300.0)
    clock.run(315.0, 390.0)  # window empty; kept firing and re-sent at 390
    alert = clock.outbox.last
    assert (alert.state, alert.value, alert.annotations) == ("firing", 0.5, {"summary": "at 0.5"})


def test_group_by_splits_groups_and_labels_alerts_with_them() -> None:
    clock = Clock(replace(RELEVANCE, group_by=("route",)))
    clock.feed(0.5, t=1.0, route="chat")
    clock.feed(0.9, t=1.0, route="search")
    clock.at(15.0)
    alert = clock.outbox.last
    assert alert.labels == {
        "alertname": "ContextRelevanceLow",
        "severity": "warning",
        "route": "chat",
    }
    assert [group.labels for group in clock.evaluator.snapshot(15.0)[0].groups] == [
        {"route": "chat"},
        {"route": "search"},
    ]


def test_one_notify_call_carries_every_alert_of_an_evaluation() -> None:
    other = replace(RELEVANCE, name="AnswerRelevanceLow", signal="answer_relevance_score")
    clock = Clock(replace(RELEVANCE, group_by=("route",)), other)
    clock.feed(0.5, t=1.0, route="chat")
    clock.feed(0.5, t=1.0, route="search")
    clock.feed(0.5, t=1.0, signal="answer_relevance_score")
    clock.at(15.0)
    ((_, alerts),) = clock.outbox.calls
    assert sorted((a.rule, a.labels.get("route")) for a in alerts) == [
        ("AnswerRelevanceLow", None),
        ("ContextRelevanceLow", "chat"),
        ("ContextRelevanceLow", "search"),
    ]


def test_missing_group_label_groups_as_empty_and_is_left_off_the_alert() -> None:
    clock = Clock(replace(RELEVANCE, group_by=("route",)))
    clock.evaluator.observe(Sample("context_relevance_score", 0.5, {}, 1.0))
    clock.at(15.0)
    assert clock.group().labels == {"route": ""}
    assert clock.outbox.last.labels == {"alertname": "ContextRelevanceLow", "severity": "warning"}


def test_rule_labels_win_over_group_labels_and_alertname_over_both() -> None:
    rule = replace(RELEVANCE, group_by=("route",), labels={"route": "fixed", "alertname": "x"})
    clock = Clock(rule)
    clock.feed(0.5, t=1.0, route="chat")
    clock.at(15.0)
    assert clock.outbox.last.labels == {"route": "fixed", "alertname": "ContextRelevanceLow"}


def test_match_filters_samples() -> None:
    clock = Clock(replace(RELEVANCE, match={"provider": "anthropic"}))
    clock.feed(0.1, t=1.0, provider="openai")
    clock.at(15.0)
    assert clock.outbox.calls == []
    assert clock.evaluator.stats.samples_unmatched == 1
    clock.feed(0.1, t=16.0, provider="anthropic")
    clock.at(30.0)
    assert clock.outbox.last.state == "firing"


LATENCY = Rule(
    name="LatencySLO",
    signal="operation_duration",
    aggregation="p95",
    window_s=300.0,
    op=">",
    threshold=Thresholds(label="prompt_class", values={"short": 0.05, "long_context": 0.18}),
)


def test_thresholds_per_prompt_class_apply_to_their_own_group() -> None:
    clock = Clock(LATENCY)
    clock.feed(0.1, t=1.0, count=20, signal="operation_duration", prompt_class="short")
    clock.feed(0.1, t=1.0, count=20, signal="operation_duration", prompt_class="long_context")
    clock.at(15.0)
    assert clock.outbox.last.labels["prompt_class"] == "short"
    thresholds = {
        g.labels["prompt_class"]: g.threshold for g in clock.evaluator.snapshot(15.0)[0].groups
    }
    assert thresholds == {"long_context": 0.18, "short": 0.05}


def test_prompt_class_without_a_threshold_or_default_is_not_evaluated() -> None:
    clock = Clock(LATENCY)
    clock.feed(9.0, t=1.0, signal="operation_duration", prompt_class="medium")
    clock.at(15.0)
    assert clock.outbox.calls == []
    assert clock.evaluator.stats.groups == 0
    assert clock.evaluator.stats.samples_unmatched == 1


def test_thresholds_default_covers_other_prompt_classes() -> None:
    threshold = Thresholds(label="prompt_class", values={"short": 0.05}, default=1.0)
    clock = Clock(replace(LATENCY, threshold=threshold))
    clock.feed(2.0, t=1.0, signal="operation_duration", prompt_class="medium")
    clock.at(15.0)
    assert clock.outbox.last.labels["prompt_class"] == "medium"


REGRESSION = Rule(
    name="RelevanceRegression",
    signal="context_relevance_score",
    aggregation="p50",
    window_s=300.0,
    op="<",
    threshold=-0.05,
    min_samples=20,
    baseline=Baseline(window_s=3600.0),
)
NOW = 4000.0  # current window [3700, 4000), baseline [100, 3700)


def regression(baseline: float, current: float, *, baseline_count: int = 40) -> Clock:
    clock = Clock(REGRESSION)
    clock.feed(baseline, t=1000.0, count=baseline_count)
    clock.feed(current, t=3800.0, count=40)
    clock.at(NOW)
    return clock


def test_relative_rule_fires_on_a_drop_of_more_than_five_percent() -> None:
    clock = regression(0.8, 0.75)  # -6.25 %
    assert clock.outbox.last.state == "firing"
    assert clock.outbox.last.value == pytest.approx(-0.0625, abs=0.002)


def test_relative_rule_holds_on_a_three_percent_drop() -> None:
    clock = regression(0.8, 0.776)
    assert clock.outbox.calls == []
    assert clock.group().value == pytest.approx(-0.03, abs=0.002)


def test_relative_rule_tells_a_drop_just_past_five_percent_from_one_just_short() -> None:
    assert regression(0.8, 0.8 * 0.945).outbox.calls != []
    assert regression(0.8, 0.8 * 0.955).outbox.calls == []


def test_relative_rule_without_baseline_samples_has_no_value() -> None:
    clock = regression(0.8, 0.1, baseline_count=19)
    assert clock.outbox.calls == []
    group = clock.group()
    assert (group.value, group.baseline, group.baseline_samples, group.samples) == (
        None,
        None,
        19,
        40,
    )


def test_relative_rule_baseline_does_not_count_the_current_window() -> None:
    clock = Clock(REGRESSION)
    clock.feed(0.8, t=3750.0, count=40)
    clock.feed(0.8, t=3999.0, count=40)
    clock.at(NOW)
    assert (clock.group().samples, clock.group().baseline_samples) == (80, 0)


def test_relative_rule_baseline_slides_with_the_clock() -> None:
    clock = Clock(REGRESSION)
    clock.feed(0.8, t=1000.0, count=40)
    clock.feed(0.7, t=3800.0, count=40)
    clock.at(NOW)
    clock.at(5100.0)  # 1000 has left the baseline [1200, 4800); 3800 has moved into it
    states = [alert.state for _, alerts in clock.outbox.calls for alert in alerts]
    assert states == ["firing", "resolved"]
    group = clock.group()
    assert (group.samples, group.baseline_samples) == (0, 40)
    assert group.baseline == pytest.approx(0.7, rel=0.003)


CANARY = Rule(
    name="CanaryRelevanceDrop",
    signal="context_relevance_score",
    aggregation="p50",
    window_s=600.0,
    op="<",
    threshold=-0.05,
    min_samples=20,
    group_by=("route",),
    match={"variant": "canary"},
    baseline=Baseline(peer={"variant": "stable"}),
    labels={"action": "rollback"},
)


def canary(stable: float, candidate: float, *, canary_count: int = 40) -> Clock:
    clock = Clock(CANARY)
    clock.feed(stable, t=900.0, count=40, variant="stable")
    clock.feed(candidate, t=950.0, count=canary_count, variant="canary")
    clock.at(1000.0)
    return clock


def test_canary_ten_percent_below_the_stable_variant_fires_with_rollback() -> None:
    clock = canary(0.85, 0.765)
    alert = clock.outbox.last
    assert (alert.state, alert.labels["action"], alert.labels["route"]) == (
        "firing",
        "rollback",
        "chat",
    )
    assert "variant" not in alert.labels  # one alert per route, over both variants
    assert alert.value == pytest.approx(-0.10, abs=0.003)


def test_canary_two_percent_below_the_stable_variant_stays_quiet() -> None:
    clock = canary(0.85, 0.833)
    assert clock.outbox.calls == []
    assert clock.group().value == pytest.approx(-0.02, abs=0.003)


def test_canary_with_too_few_samples_is_not_judged() -> None:
    clock = canary(0.85, 0.5, canary_count=19)
    assert clock.outbox.calls == []
    assert clock.group().value is None


def test_peer_samples_count_only_in_the_baseline_and_others_not_at_all() -> None:
    clock = Clock(CANARY)
    clock.feed(0.8, t=900.0, count=30, variant="stable")
    clock.feed(0.8, t=900.0, count=25, variant="canary")
    clock.feed(0.1, t=900.0, count=50, variant="shadow")  # neither side
    clock.at(1000.0)
    group = clock.group()
    assert (group.samples, group.baseline_samples) == (25, 30)
    assert clock.evaluator.stats.samples_unmatched == 50


def test_peer_baseline_covers_the_same_window_as_the_rule() -> None:
    clock = Clock(CANARY)
    clock.feed(0.85, t=100.0, count=40, variant="stable")  # leaves the window by 1000
    clock.feed(0.7, t=950.0, count=40, variant="canary")
    clock.at(1000.0)
    assert clock.group().baseline_samples == 0
    assert clock.outbox.calls == []


def test_relative_rule_with_a_zero_baseline_has_no_value() -> None:
    clock = Clock(replace(REGRESSION, aggregation="mean"))
    clock.feed(0.0, t=1000.0, count=40)
    clock.feed(0.5, t=3800.0, count=40)
    clock.at(NOW)
    assert clock.group().value is None
    assert clock.group().baseline == 0.0


def test_validity_ratio_rule_fires_below_its_threshold() -> None:
    rule = Rule(
        name="OutputValidityLow",
        signal="model_output_validity_rate",
        aggregation="ratio",
        window_s=300.0,
        op="<",
        threshold=0.99,
    )
    clock = Clock(rule)
    clock.feed(1.0, t=1.0, count=97, signal="model_output_validity_rate")
    clock.feed(0.0, t=1.0, count=3, signal="model_output_validity_rate")
    clock.at(15.0)
    assert clock.outbox.last.value == pytest.approx(0.97)


def test_group_with_no_recent_samples_and_no_alert_is_forgotten() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.9, t=1.0)
    clock.at(15.0)
    assert clock.evaluator.stats.groups == 1
    clock.at(300.0)  # 299 s since the sample: kept
    assert clock.evaluator.stats.groups == 1
    clock.at(302.0)
    assert clock.evaluator.stats.groups == 0


def test_groups_past_the_limit_are_not_created_and_are_counted() -> None:
    clock = Clock(replace(RELEVANCE, group_by=("route",)), max_groups_per_rule=2)
    for route in ("a", "b", "c", "c"):
        clock.feed(0.5, t=1.0, route=route)
    clock.at(15.0)
    stats = clock.evaluator.stats
    assert (stats.groups, stats.groups_dropped) == (2, 2)
    assert sorted(alert.labels["route"] for alert in clock.outbox.calls[0][1]) == ["a", "b"]


def test_annotations_render_the_value_and_group_labels() -> None:
    rule = replace(
        RELEVANCE,
        group_by=("route",),
        annotations={
            "summary": "relevance {{ $value | humanizePercentage }} on {{ $labels.route }}",
            "runbook_url": "https://runbooks.example/relevance",
        },
    )
    clock = Clock(rule)
    clock.feed(0.5, t=1.0, route="chat")
    clock.at(15.0)
    assert clock.outbox.last.annotations == {
        "summary": "relevance 50% on chat",
        "runbook_url": "https://runbooks.example/relevance",
    }


def test_annotations_follow_the_value_while_breaching_and_keep_it_after() -> None:
    rule = replace(RELEVANCE, keep_firing_for_s=30.0, annotations={"summary": "{{ $value }}"})
    clock = Clock(rule)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(0.7, t=20.0)  # mean 0.6, still below
    clock.run(30.0, 90.0)
    assert clock.outbox.last.annotations == {"summary": "0.6"}
    clock.feed(1.0, t=91.0, count=6)  # mean 0.9: keep firing until 135, then resolve
    clock.run(105.0, 300.0)
    # As Prometheus: the resolve carries the last breaching value, not the healthy one.
    alert = clock.outbox.last
    assert (alert.state, alert.annotations, alert.value) == ("resolved", {"summary": "0.6"}, 0.6)


def test_notify_is_not_called_when_nothing_needs_sending() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.9, t=1.0)
    clock.run(15.0, 120.0)
    assert clock.outbox.calls == []
    assert clock.evaluator.stats.evaluations == 8


def test_samples_of_no_rule_signal_count_as_unmatched() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.1, t=1.0, signal="stream_max_gap")
    clock.feed(0.1, t=1.0)
    stats = clock.evaluator.stats
    assert (stats.samples_observed, stats.samples_unmatched) == (2, 1)


def test_non_finite_samples_are_counted_and_ignored() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(math.nan, t=1.0)
    clock.feed(0.5, t=math.inf)
    clock.at(15.0)
    stats = clock.evaluator.stats
    assert (stats.samples_invalid, stats.groups) == (2, 0)
    assert clock.outbox.calls == []


def test_samples_older_than_the_window_kept_are_counted_late() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.9, t=1000.0)
    clock.feed(0.1, t=100.0)
    assert clock.evaluator.stats.samples_late == 1


def test_snapshot_describes_rules_and_groups() -> None:
    rule = replace(REGRESSION, group_by=("route",), labels={"severity": "page"}, for_s=60.0)
    clock = Clock(rule)
    clock.feed(0.8, t=1000.0, count=40)
    clock.feed(0.7, t=3800.0, count=40)
    clock.at(NOW)
    (status,) = clock.evaluator.snapshot(NOW)
    assert (status.name, status.signal, status.aggregation, status.op) == (
        "RelevanceRegression", "context_relevance_score", "p50", "<",
    )  # fmt: skip
    assert (status.window_s, status.baseline_window_s, status.for_s, status.min_samples) == (
        300.0, 3600.0, 60.0, 20,
    )  # fmt: skip
    assert (status.threshold, status.group_by, status.labels) == (
        -0.05,
        ("route",),
        {"severity": "page"},
    )
    (group,) = status.groups
    assert group.labels == {"route": "chat"}
    assert group.value == pytest.approx(-0.125, abs=0.002)
    assert group.baseline == pytest.approx(0.8, rel=0.001)
    assert (group.samples, group.baseline_samples, group.threshold) == (40, 40, -0.05)
    assert (group.state, group.active_at, group.fired_at, group.resolved_at) == (
        "pending",
        NOW,
        None,
        None,
    )


def test_snapshot_serializes_to_json() -> None:
    clock = Clock(LATENCY)
    clock.feed(0.1, t=1.0, signal="operation_duration")
    clock.at(15.0)
    document = orjson.loads(orjson.dumps(clock.evaluator.snapshot(15.0)))
    assert document[0]["threshold"] == {
        "label": "prompt_class",
        "values": {"short": 0.05, "long_context": 0.18},
        "default": None,
    }
    assert document[0]["groups"][0]["state"] == "firing"


def test_snapshot_changes_nothing() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.evaluator.snapshot(15.0)
    assert clock.evaluator.stats.evaluations == 0
    assert clock.outbox.calls == []


@pytest.mark.parametrize(
    "options",
    [{"interval_s": 0.0}, {"resend_delay_s": -1.0}, {"max_groups_per_rule": 0}, {"alpha": 1.5}],
)
def test_nonsense_settings_are_refused_at_construction(options: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Evaluator([RELEVANCE], notify=Outbox(), **options)  # type: ignore[arg-type]


def test_rule_with_a_zero_window_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="ContextRelevanceLow"):
        Evaluator([replace(RELEVANCE, window_s=0.0)], notify=Outbox())


def test_a_rule_that_fails_is_counted_and_the_others_still_notify() -> None:
    class Exploding(Thresholds):
        def for_value(self, value: str | None) -> float | None:
            raise RuntimeError("a bug")

    broken = replace(RELEVANCE, name="Broken", threshold=Exploding(label="route", values={}))
    clock = Clock(broken, RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    assert clock.evaluator.stats.rule_failures == 1
    assert clock.outbox.last.rule == "ContextRelevanceLow"


def test_replacing_rules_keeps_the_state_of_a_rule_that_did_not_change() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    assert clock.group().state == "firing"
    clock.evaluator.replace_rules([RELEVANCE, replace(RELEVANCE, name="Other")])
    clock.at(30.0)
    statuses = clock.evaluator.snapshot(30.0)
    assert [status.name for status in statuses] == ["ContextRelevanceLow", "Other"]
    (kept,) = statuses[0].groups
    assert (kept.state, kept.fired_at) == ("firing", 15.0)
    assert statuses[1].groups == ()  # a new rule starts with empty windows


def test_a_new_threshold_keeps_the_groups_and_resolves_what_no_longer_breaches() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.evaluator.replace_rules([replace(RELEVANCE, threshold=0.4)])
    clock.at(30.0)
    alert = clock.outbox.last
    assert (alert.state, alert.fired_at, alert.resolved_at) == ("resolved", 15.0, 30.0)


def test_a_changed_description_keeps_a_firing_alert_firing() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.evaluator.replace_rules([replace(RELEVANCE, description="reworded")])
    clock.at(30.0)
    assert (clock.group().state, clock.group().fired_at) == ("firing", 15.0)


def test_a_rule_whose_windows_change_shape_starts_over() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.evaluator.replace_rules([replace(RELEVANCE, window_s=600.0)])
    assert clock.evaluator.snapshot(30.0)[0].groups == ()


def test_a_removed_rule_is_no_longer_evaluated_or_sent() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    sent = len(clock.outbox.calls)
    clock.evaluator.replace_rules([])
    clock.run(30.0, 300.0)
    assert clock.evaluator.snapshot(300.0) == []
    assert len(clock.outbox.calls) == sent


def test_a_rule_that_cannot_be_measured_is_listed_without_groups_and_the_others_still_are() -> None:
    class Exploding(Thresholds):
        def for_value(self, value: str | None) -> float | None:
            if value == "boom":
                raise RuntimeError("a bug")
            return 0.75

    broken = replace(
        RELEVANCE, name="Broken", threshold=Exploding(label="route", values={}), group_by=()
    )
    clock = Clock(broken, RELEVANCE)
    clock.feed(0.5, t=1.0)  # both rules take it (route "chat")
    broken_state = clock.evaluator._rules[0]
    (group,) = broken_state.groups.values()
    group.labels["route"] = "boom"  # from now on, measuring this group's threshold fails
    clock.at(15.0)
    statuses = clock.evaluator.snapshot(15.0)
    assert [(s.name, len(s.groups)) for s in statuses] == [
        ("Broken", 0),
        ("ContextRelevanceLow", 1),
    ]
    assert statuses[1].groups[0].state == "firing"


def test_a_sample_after_an_evaluation_shows_in_a_snapshot_at_the_same_time() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(1.0, t=14.0, count=9)
    assert clock.evaluator.snapshot(15.0)[0].groups[0].samples == 10
