"""The agent's alerting stage: a bounded hand-off from the loop, evaluation off the loop."""

from __future__ import annotations

import asyncio
import logging
import threading

import orjson
import pytest

from semhealth.agent.analysis.alerting import AlertingStage, Settings
from semhealth.alerts.model import Rule
from semhealth.alerts.sample import Sample

LOW_RELEVANCE = Rule(
    name="ContextRelevanceLow",
    signal="context_relevance_score",
    aggregation="p50",
    window_s=60,
    op="<",
    threshold=0.75,
    group_by=("route",),
    labels={"severity": "warning"},
    annotations={"summary": "relevance {{ $value }} on {{ $labels.route }}"},
)
NOW = 1_700_000_000.0


def _stage(**settings: object) -> AlertingStage:
    return AlertingStage(
        Settings(rules=(LOW_RELEVANCE,), **settings),  # type: ignore[arg-type]
        clock=lambda: NOW,
    )


def _sample(value: float, route: str = "chat") -> Sample:
    return Sample("context_relevance_score", value, {"route": route, "model": "m"}, NOW - 1)


async def test_a_low_score_fires_at_the_next_evaluation() -> None:
    stage = _stage()
    await stage.start(generator_url="http://127.0.0.1:9464/alerts")
    try:
        stage.observe(_sample(0.2))
        await stage.evaluate_now()
        assert stage.stats().firing == 1
        (rule,) = orjson.loads(stage.status_json())["rules"]
        (group,) = rule["groups"]
        assert group["labels"] == {"route": "chat"}
        assert group["state"] == "firing"
        assert group["value"] == pytest.approx(0.2, rel=0.01)
    finally:
        await stage.shutdown()


async def test_alerts_shows_every_rule_before_any_sample() -> None:
    stage = _stage()
    await stage.start(generator_url="http://127.0.0.1:9464/alerts")
    try:
        document = orjson.loads(stage.status_json())
        assert [rule["name"] for rule in document["rules"]] == ["ContextRelevanceLow"]
        assert document["rules"][0]["groups"] == []
        assert document["stats"]["evaluations"] == 1
    finally:
        await stage.shutdown()


async def test_a_full_buffer_sheds_samples_and_counts_them() -> None:
    stage = _stage(max_pending_samples=3)
    for _ in range(5):
        stage.observe(_sample(0.9))
    assert stage.stats().samples_shed == 2
    await stage.shutdown()


async def test_the_evaluator_runs_on_its_own_thread() -> None:
    stage = _stage()
    seen: list[str] = []
    real = stage._evaluator.evaluate

    def evaluate(now: float) -> None:
        seen.append(threading.current_thread().name)
        real(now)

    stage._evaluator.evaluate = evaluate  # type: ignore[method-assign]
    await stage.evaluate_now()
    assert seen and seen[0].startswith("semhealth-alerts")
    assert seen[0] != threading.current_thread().name
    await stage.shutdown()


async def test_a_failing_evaluation_is_counted_and_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stage = _stage()

    def broken(now: float) -> None:
        raise RuntimeError("boom")

    stage._evaluator.evaluate = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        await stage.evaluate_now()
    assert stage.stats().evaluation_failures == 1
    assert "alert evaluation failed" in caplog.text
    await stage.shutdown()


async def test_firing_and_resolving_are_logged_once_each_with_numbers_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stage = _stage(resend_delay_s=0.0)
    await stage.start(generator_url="http://127.0.0.1:9464/alerts")
    try:
        with caplog.at_level(logging.WARNING, logger="semhealth.agent.analysis.alerting"):
            stage.observe(_sample(0.2))
            for _ in range(3):  # resends are not logged again
                await stage.evaluate_now()
                await asyncio.sleep(0)
            stage._clock = lambda: NOW + 120  # the low sample left the window
            stage.observe(Sample("context_relevance_score", 0.95, {"route": "chat"}, NOW + 119))
            for _ in range(3):  # the resolved alert is resent too; logged once
                await stage.evaluate_now()
                await asyncio.sleep(0)
        lines = [
            r.getMessage() for r in caplog.records if r.name == "semhealth.agent.analysis.alerting"
        ]
        assert len(lines) == 2
        assert lines[0].startswith("alert ContextRelevanceLow firing: route=chat")
        assert lines[1].startswith("alert ContextRelevanceLow resolved: route=chat")
    finally:
        await stage.shutdown()


async def test_shutdown_is_safe_without_start_and_twice_and_then_final() -> None:
    stage = _stage()
    stage.observe(_sample(0.1))
    await stage.shutdown()
    await stage.shutdown()
    assert stage.active() == []  # nothing was evaluated, so nothing fires
    with pytest.raises(RuntimeError, match="cannot start again"):
        await stage.start(generator_url="http://127.0.0.1:9464/alerts")


async def test_a_stage_that_shut_down_refuses_to_start_and_a_fresh_one_starts() -> None:
    stage = _stage()
    await stage.start(generator_url="http://127.0.0.1:9464/alerts")
    await stage.shutdown()
    with pytest.raises(RuntimeError, match="cannot start again"):
        await stage.start(generator_url="http://127.0.0.1:9464/alerts")
    fresh = _stage()
    await fresh.start(generator_url="http://127.0.0.1:9464/alerts")
    await fresh.shutdown()


async def test_evaluation_keeps_its_interval_on_its_own() -> None:
    stage = _stage(interval_s=0.05)
    await stage.start(generator_url="http://127.0.0.1:9464/alerts")
    try:
        # One evaluation at start, then more without being asked (generous: a noisy machine).
        deadline = asyncio.get_running_loop().time() + 5
        while stage.stats().evaluator.evaluations < 3:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
    finally:
        await stage.shutdown()


async def test_reload_swaps_the_rules_and_keeps_an_unchanged_rules_alert() -> None:
    stage = _stage()
    await stage.start(generator_url="http://127.0.0.1:9464/alerts")
    try:
        stage.observe(_sample(0.2))
        await stage.evaluate_now()
        extra = Rule(
            name="AnswerRelevanceLow", signal="answer_relevance_score", aggregation="p50",
            window_s=60, op="<", threshold=0.5,
        )  # fmt: skip
        await stage.reload([LOW_RELEVANCE, extra])
        document = orjson.loads(stage.status_json())
        assert [rule["name"] for rule in document["rules"]] == [
            "ContextRelevanceLow",
            "AnswerRelevanceLow",
        ]
        assert document["rules"][0]["groups"][0]["state"] == "firing"
        assert stage.rules == (LOW_RELEVANCE, extra)
    finally:
        await stage.shutdown()
