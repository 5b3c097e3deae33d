"""Promises of the alert evaluator that mutation testing (bench/mutation.py) found untested:
each test pins one behaviour the README states and that a surviving mutant broke."""

from __future__ import annotations

from dataclasses import replace

import pytest

from semhealth.alerts.evaluator import Evaluator
from semhealth.alerts.model import Thresholds
from tests.alerts.test_evaluator import NOW, REGRESSION, RELEVANCE, Clock, Outbox, regression


def test_a_p50_rule_measures_the_median_not_the_mean() -> None:
    # Nine good scores and one zero: the mean (0.81) breaches 0.85, the median (0.9) does not.
    clock = Clock(replace(RELEVANCE, aggregation="p50", threshold=0.85))
    clock.feed(0.9, t=1.0, count=9)
    clock.feed(0.0, t=1.0)
    clock.at(15.0)
    group = clock.group()
    assert group.value == pytest.approx(0.9, rel=0.02)
    assert group.state == "inactive"
    assert clock.outbox.calls == []


def test_a_relative_p50_rule_compares_with_the_baselines_median() -> None:
    # Baseline median 0.9 (mean 0.81): 0.83 now is 7.8 % below the median, so it fires;
    # against the baseline's mean it would be a rise.
    clock = Clock(REGRESSION)
    clock.feed(0.9, t=1000.0, count=36)
    clock.feed(0.0, t=1000.0, count=4)
    clock.feed(0.83, t=3800.0, count=40)
    clock.at(NOW)
    group = clock.group()
    assert group.baseline == pytest.approx(0.9, rel=0.01)
    assert group.state == "firing"


def test_a_baseline_with_exactly_min_samples_is_enough() -> None:
    clock = regression(0.8, 0.1, baseline_count=REGRESSION.min_samples)
    assert clock.group().state == "firing"


def test_keep_firing_for_of_one_second_holds_the_alert_within_that_second() -> None:
    clock = Clock(replace(RELEVANCE, keep_firing_for_s=1.0, window_s=10.0))
    clock.feed(0.5, t=1.0)
    clock.at(5.0)
    assert clock.group().state == "firing"
    clock.feed(0.99, t=6.0, count=100)  # the mean recovers above 0.75
    clock.at(10.0)
    clock.at(10.5)
    assert clock.group().state == "firing"
    clock.at(11.0)
    assert clock.group().state == "resolved"


def test_every_failed_rule_evaluation_is_counted() -> None:
    armed: list[bool] = []

    class ExplodingLater(Thresholds):
        """Accepts the sample, then fails in every evaluation (a bug in a rule)."""

        def for_value(self, value: str | None) -> float | None:
            if armed:
                raise RuntimeError("a bug")
            return 0.75

    clock = Clock(replace(RELEVANCE, threshold=ExplodingLater(label="route", values={})))
    clock.feed(0.5, t=1.0)
    armed.append(True)
    clock.at(15.0)
    clock.at(30.0)
    clock.at(45.0)
    assert clock.evaluator.stats.rule_failures == 3


def test_every_late_sample_is_counted() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.9, t=1000.0)
    clock.feed(0.1, t=100.0, count=3)
    assert clock.evaluator.stats.samples_late == 3


def test_alerts_endpoint_shows_the_rules_definition() -> None:
    rule = replace(
        RELEVANCE, keep_firing_for_s=120.0, match={"route": "chat"}, description="context is off"
    )
    clock = Clock(rule)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    (status,) = clock.evaluator.snapshot(15.0)
    assert status.keep_firing_for_s == 120.0
    assert status.match == {"route": "chat"}
    assert status.description == "context is off"


def test_alerts_endpoint_shows_when_a_group_resolved() -> None:
    clock = Clock(RELEVANCE)
    clock.feed(0.5, t=1.0)
    clock.at(15.0)
    clock.feed(0.99, t=20.0, count=100)
    clock.at(30.0)
    group = clock.group()
    assert (group.state, group.fired_at, group.resolved_at) == ("resolved", 15.0, 30.0)


@pytest.mark.parametrize(
    "options",
    [
        {"resend_delay_s": 0.0},
        {"resolved_retention_s": 0.0},
        {"interval_s": 0.5},
        {"max_groups_per_rule": 1},
    ],
)
def test_boundary_settings_are_accepted(options: dict[str, float]) -> None:
    evaluator = Evaluator([RELEVANCE], notify=Outbox(), **options)  # type: ignore[arg-type]
    assert evaluator.rules == (RELEVANCE,)


def test_a_rule_holds_at_most_max_groups_and_counts_the_rest() -> None:
    clock = Clock(replace(RELEVANCE, group_by=("route",)), max_groups_per_rule=1)
    clock.feed(0.5, t=1.0, route="chat")
    clock.feed(0.5, t=1.0, route="search", count=2)
    stats = clock.evaluator.stats
    assert (stats.groups, stats.groups_dropped) == (1, 2)


def test_alerts_endpoint_says_when_rules_were_last_evaluated() -> None:
    clock = Clock(RELEVANCE)
    clock.at(15.0)
    clock.at(30.0)
    assert clock.evaluator.stats.last_evaluation_at == 30.0


def test_a_relative_rule_measures_a_one_percent_drop_within_its_finer_accuracy() -> None:
    # Relative rules use 0.2 % sketches: at the plain rules' 1 % this drop measures as 0.
    clock = Clock(REGRESSION)
    values = [0.5 + i / 40 for i in range(41)]
    for value in values:
        clock.feed(value, t=1000.0)
        clock.feed(value * 0.99, t=3800.0)
    clock.at(NOW)
    measured = clock.group().value
    assert measured is not None
    assert measured == pytest.approx(-0.01, abs=0.004)


def test_every_sample_a_broken_rule_fails_on_is_counted() -> None:
    class Exploding(Thresholds):
        def for_value(self, value: str | None) -> float | None:
            raise RuntimeError("a bug")

    clock = Clock(replace(RELEVANCE, threshold=Exploding(label="route", values={})))
    clock.feed(0.5, t=1.0, count=3)
    assert clock.evaluator.stats.rule_failures == 3
