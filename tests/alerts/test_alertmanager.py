"""Delivery to Alertmanager: a real one paging a loopback webhook; scripted loopback
stand-ins that refuse, fail, or hang (Prometheus' notifier tests, TestHangingNotifier)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime
from random import Random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.alerts.alertmanager import DeliveryStats, Notifier, Settings, format_time
from semhealth.alerts.model import Alert, State
from tests.alerts.alertmanager_server import (
    HANG,
    AlertmanagerServer,
    ScriptedAlertmanager,
    ScriptedFactory,
    WebhookReceiver,
    alert_in,
    always,
    dead_url,
    failing_first,
    page,
)

# Short enough to keep the file fast, long enough for a loopback POST on a busy machine.
FAST = Settings(
    timeout_s=2.0,
    max_attempts=3,
    backoff_base_s=0.01,
    backoff_cap_s=0.02,
    retry_window_s=2.0,
    external_labels={"pod": "semhealth-0", "namespace": "ml"},
    generator_url="http://semhealth-0:9464/alerts",
    random=Random(7),
)
OK = 200


def firing(name: str, now: float | None = None, **labels: str) -> Alert:
    now = time.time() if now is None else now
    return Alert(
        rule=name,
        state="firing",
        labels={"alertname": name, "severity": "warning", **labels},
        annotations={"summary": f"{name} on route chat", "runbook_url": "https://runbooks/x"},
        value=0.61,
        active_at=now - 180,
        fired_at=now - 60,
        ends_at=now + 240,
    )


def resolved(alert: Alert, now: float | None = None) -> Alert:
    now = time.time() if now is None else now
    return replace(alert, state="resolved", resolved_at=now, ends_at=now)


def in_state(alert: Alert, state: State) -> Alert:
    return replace(alert, state=state)


@asynccontextmanager
async def running(urls: Sequence[str], **overrides: Any) -> AsyncIterator[Notifier]:
    notifier = Notifier(urls, settings=replace(FAST, **overrides))
    await notifier.start()
    try:
        yield notifier
    finally:
        await notifier.shutdown(0.5)  # cancels a POST to a hanging stand-in


async def eventually(
    notifier: Notifier, check: Callable[[tuple[DeliveryStats, ...]], bool], timeout_s: float = 5.0
) -> tuple[DeliveryStats, ...]:
    """The notifier's stats once ``check`` holds for them."""
    deadline = time.monotonic() + timeout_s
    while not check(stats := notifier.stats()):
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout_s:g} s the stats are still {stats}")
        await asyncio.sleep(0.01)
    return stats


def sent(count: int) -> Callable[[tuple[DeliveryStats, ...]], bool]:
    return lambda stats: stats[0].sent >= count


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# -- a real Alertmanager ----------------------------------------------------------------------


async def test_firing_alert_pages_with_external_labels_and_annotations(
    alertmanager: AlertmanagerServer, webhook: WebhookReceiver
) -> None:
    async with running([alertmanager.url]) as notifier:
        notifier.send([firing("ContextRelevanceLow", route="chat")])
        hook = await webhook.wait_for(page("ContextRelevanceLow"))
    alert = alert_in(hook, "ContextRelevanceLow")
    assert alert["labels"] == {
        "alertname": "ContextRelevanceLow",
        "severity": "warning",
        "route": "chat",
        "pod": "semhealth-0",
        "namespace": "ml",
    }
    assert alert["annotations"] == {
        "summary": "ContextRelevanceLow on route chat",
        "runbook_url": "https://runbooks/x",
    }
    assert alert["generatorURL"] == "http://semhealth-0:9464/alerts"


async def test_alertmanager_holds_a_firing_alert_until_its_future_ends_at(
    alertmanager: AlertmanagerServer,
) -> None:
    now = time.time()
    async with running([alertmanager.url]) as notifier:
        notifier.send([firing("StreamChoppy", now)])
        held = await alertmanager.wait_for_alert("StreamChoppy")
    # The webhook hides endsAt of firing alerts; the API shows what Alertmanager stored.
    assert parse_time(held["endsAt"]) == pytest.approx(now + 240, abs=0.001)
    assert parse_time(held["startsAt"]) == pytest.approx(now - 60, abs=0.001)
    assert held["status"]["state"] == "active"


async def test_resolved_alert_makes_alertmanager_page_resolved(
    alertmanager: AlertmanagerServer, webhook: WebhookReceiver
) -> None:
    alert = firing("OutputValidityLow")
    async with running([alertmanager.url]) as notifier:
        notifier.send([alert])
        await webhook.wait_for(page("OutputValidityLow"))
        notifier.send([resolved(alert)])
        hook = await webhook.wait_for(page("OutputValidityLow", status="resolved"))
    assert alert_in(hook, "OutputValidityLow")["status"] == "resolved"


async def test_live_alertmanager_pages_while_the_other_is_dead(
    alertmanager: AlertmanagerServer, webhook: WebhookReceiver
) -> None:
    dead = dead_url()
    async with running([dead, alertmanager.url]) as notifier:
        notifier.send([firing("SlowFirstToken")])
        await webhook.wait_for(page("SlowFirstToken"))
        stats = await eventually(notifier, lambda s: s[0].errors == 1 and s[1].sent == 1)
    assert stats[0].url == dead
    assert stats[0].sent == 0
    assert stats[0].last_error.startswith("connection failed")
    assert stats[1].errors == 0


async def test_send_to_a_stopped_alertmanager_returns_and_counts_errors(
    alertmanager: AlertmanagerServer,
) -> None:
    await alertmanager.stop()
    async with running([alertmanager.url]) as notifier:
        notifier.send([firing("LatencySLO")])
        assert notifier.stats()[0].queue_length == 1  # returned before any POST was tried
        stats = await eventually(notifier, lambda s: s[0].errors == 1)
    assert stats[0].dropped == 1
    assert stats[0].retries == FAST.max_attempts - 1


async def test_alert_fired_during_an_outage_pages_once_alertmanager_is_back(
    alertmanager: AlertmanagerServer, webhook: WebhookReceiver
) -> None:
    alert = firing("RelevanceRegression", route="chat")
    async with running([alertmanager.url]) as notifier:
        await alertmanager.stop()
        notifier.send([alert])
        await eventually(notifier, lambda s: s[0].errors == 1)
        await alertmanager.start()
        notifier.send([alert])  # the evaluator's resend
        hook = await webhook.wait_for(page("RelevanceRegression"))
        stats = await eventually(notifier, sent(1))
    assert alert_in(hook, "RelevanceRegression")["labels"]["route"] == "chat"
    assert stats[0].last_success is not None


# -- failure modes, on scripted loopback stand-ins ----------------------------------------------


async def test_hanging_alertmanager_times_out_and_counts_an_error(
    scripted: ScriptedFactory,
) -> None:
    hanging = await scripted(always(HANG))
    async with running([hanging.base_url], timeout_s=0.2, max_attempts=1) as notifier:
        notifier.send([firing("StreamChoppy")])
        stats = await eventually(notifier, lambda s: s[0].errors == 1)
    assert stats[0].last_error == "timed out after 0.2 s"


async def test_hanging_alertmanager_does_not_delay_the_other(scripted: ScriptedFactory) -> None:
    hanging = await scripted(always(HANG))
    healthy = await scripted(always(OK))
    async with running([hanging.base_url, healthy.base_url], timeout_s=60.0) as notifier:
        notifier.send([firing("StreamChoppy")])
        stats = await eventually(notifier, lambda s: s[1].sent == 1)
    assert stats[0].sent == 0


async def test_shutdown_keeps_its_deadline_with_a_hanging_alertmanager(
    scripted: ScriptedFactory,
) -> None:
    hanging = await scripted(always(HANG))
    notifier = Notifier([hanging.base_url], settings=replace(FAST, timeout_s=60.0))
    await notifier.start()
    notifier.send([firing("StreamChoppy")])
    await hanging.wait_for_requests(1)
    began = time.monotonic()
    await notifier.shutdown(timeout_s=0.2)
    # Well under the 60 s POST timeout: shutdown cancelled the POST at its deadline.
    assert time.monotonic() - began < 30.0
    stats = notifier.stats()[0]
    assert (stats.sent, stats.dropped, stats.queue_length) == (0, 1, 0)


async def test_shutdown_delivers_what_is_queued(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    notifier = Notifier([server.base_url], settings=FAST)
    await notifier.start()
    notifier.send([firing("A"), firing("B")])
    await notifier.shutdown(timeout_s=5.0)
    assert [a["labels"]["alertname"] for a in server.alerts] == ["A", "B"]
    assert notifier.stats()[0].sent == 2
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


async def test_full_queue_drops_the_oldest_and_counts_them(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    notifier = Notifier([server.base_url], settings=replace(FAST, queue_size=3))
    notifier.send([firing(f"A{i}") for i in range(2)])
    notifier.send([firing(f"A{i}") for i in range(2, 5)])
    assert (notifier.stats()[0].dropped, notifier.stats()[0].queue_length) == (2, 3)
    await notifier.start()
    await eventually(notifier, sent(3))
    await notifier.shutdown(2.0)
    assert [a["labels"]["alertname"] for a in server.alerts] == ["A2", "A3", "A4"]
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


async def test_send_larger_than_the_queue_keeps_the_newest() -> None:
    notifier = Notifier([dead_url()], settings=replace(FAST, queue_size=2))
    notifier.send([firing(f"A{i}") for i in range(5)])
    assert (notifier.stats()[0].dropped, notifier.stats()[0].queue_length) == (3, 2)
    await notifier.shutdown(0.0)


async def test_client_error_is_permanent_and_not_retried(
    scripted: ScriptedFactory, caplog: pytest.LogCaptureFixture
) -> None:
    server = await scripted(always(400))
    caplog.set_level(logging.WARNING, logger="semhealth.alerts.alertmanager")
    async with running([server.base_url], max_attempts=5) as notifier:
        notifier.send([firing("OutputValidityLow")])
        stats = await eventually(notifier, lambda s: s[0].errors == 1)
        await asyncio.sleep(0.1)  # room for a retry that must not come
    assert len(server.received) == 1
    assert (stats[0].dropped, stats[0].retries, stats[0].last_error) == (1, 0, "HTTP 400")
    [record] = caplog.records
    assert "HTTP 400" in record.getMessage()
    assert "scripted answer 400" in record.getMessage()
    assert "OutputValidityLow" in record.getMessage()


async def test_too_many_requests_is_retried(scripted: ScriptedFactory) -> None:
    server = await scripted(failing_first(1, 429))
    async with running([server.base_url]) as notifier:
        notifier.send([firing("StreamChoppy")])
        stats = await eventually(notifier, sent(1))
    assert (len(server.received), stats[0].retries) == (2, 1)


async def test_server_error_is_retried_with_backoff_until_it_passes(
    scripted: ScriptedFactory,
) -> None:
    server = await scripted(failing_first(2, 503))
    async with running([server.base_url]) as notifier:
        notifier.send([firing("StreamChoppy")])
        stats = await eventually(notifier, sent(1))
    assert len(server.received) == 3
    assert (stats[0].retries, stats[0].errors, stats[0].dropped) == (2, 0, 0)
    assert server.received[0].alerts == server.received[2].alerts


async def test_retries_stop_after_max_attempts(scripted: ScriptedFactory) -> None:
    server = await scripted(always(503))
    async with running([server.base_url], max_attempts=3) as notifier:
        notifier.send([firing("StreamChoppy")])
        stats = await eventually(notifier, lambda s: s[0].errors == 1)
    assert len(server.received) == 3
    assert (stats[0].dropped, stats[0].last_error) == (1, "HTTP 503")


async def test_no_retry_starts_after_the_retry_window(scripted: ScriptedFactory) -> None:
    server = await scripted(always(503))
    async with running([server.base_url], max_attempts=10, retry_window_s=0.0) as notifier:
        notifier.send([firing("StreamChoppy")])
        await eventually(notifier, lambda s: s[0].errors == 1)
    assert len(server.received) == 1


async def test_batches_hold_at_most_max_batch_alerts(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    async with running([server.base_url], max_batch=2) as notifier:
        notifier.send([firing(f"A{i}") for i in range(5)])
        await eventually(notifier, sent(5))
    assert [len(request.alerts) for request in server.received] == [2, 2, 1]
    assert [a["labels"]["alertname"] for a in server.alerts] == [f"A{i}" for i in range(5)]
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


# -- the wire form, as a real Alertmanager accepts it (a recording stand-in in front) -------


async def test_alert_labels_win_over_external_labels(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    async with running([server.base_url]) as notifier:
        notifier.send([firing("A", namespace="from-rule")])
        await eventually(notifier, sent(1))
    labels = server.alerts[0]["labels"]
    assert (labels["namespace"], labels["pod"]) == ("from-rule", "semhealth-0")
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


async def test_empty_external_labels_are_left_out(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    async with running([server.base_url], external_labels={"pod": "", "namespace": "ml"}) as n:
        n.send([firing("A")])
        await eventually(n, sent(1))
    assert "pod" not in server.alerts[0]["labels"]
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


async def test_wire_times_are_rfc3339_utc_with_milliseconds(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    alert = replace(firing("A"), fired_at=1_700_000_000.25, ends_at=1_700_000_240.5)
    async with running([server.base_url]) as notifier:
        notifier.send([alert])
        await eventually(notifier, sent(1))
    wire = server.alerts[0]
    assert (wire["startsAt"], wire["endsAt"]) == (
        "2023-11-14T22:13:20.250Z",
        "2023-11-14T22:17:20.500Z",
    )
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


async def test_alert_without_fired_at_starts_at_active_at(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    alert = replace(firing("A"), active_at=1_700_000_000.0, fired_at=None, ends_at=None)
    async with running([server.base_url], generator_url="") as notifier:
        notifier.send([alert])
        await eventually(notifier, sent(1))
    wire = server.alerts[0]
    assert wire["startsAt"] == "2023-11-14T22:13:20.000Z"
    assert "endsAt" not in wire
    assert "generatorURL" not in wire
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


async def test_alertname_defaults_to_the_rule(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    async with running([server.base_url]) as notifier:
        notifier.send([replace(firing("A"), labels={"severity": "page"})])
        await eventually(notifier, sent(1))
    assert server.alerts[0]["labels"]["alertname"] == "A"
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


async def test_pending_and_inactive_alerts_are_not_sent(relayed: ScriptedAlertmanager) -> None:
    server = relayed
    async with running([server.base_url]) as notifier:
        notifier.send(
            [in_state(firing("P"), "pending"), in_state(firing("I"), "inactive"), firing("F")]
        )
        await eventually(notifier, sent(1))
    assert [a["labels"]["alertname"] for a in server.alerts] == ["F"]
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


async def test_alert_with_an_unwritable_time_is_dropped_and_counted(
    relayed: ScriptedAlertmanager,
) -> None:
    server = relayed
    async with running([server.base_url]) as notifier:
        notifier.send([replace(firing("Bad"), ends_at=float("inf")), firing("Good")])
        stats = await eventually(notifier, sent(1))
    assert stats[0].dropped == 1
    assert [a["labels"]["alertname"] for a in server.alerts] == ["Good"]
    assert server.answers and {status for status, _ in server.answers} == {200}, server.answers


@given(st.floats(min_value=0, max_value=253_402_300_799, allow_nan=False))
def test_format_time_is_utc_and_truncates_to_the_millisecond(t: float) -> None:
    text = format_time(t)
    assert text.endswith("Z")
    assert len(text.split(".")[1]) == 4  # three digits and the Z
    # Truncated to the millisecond: up to 1 ms early, give or take float and µs rounding.
    assert abs(t - parse_time(text) - 0.0005) <= 0.0005 + 1e-4


# -- URLs --------------------------------------------------------------------------------------


async def test_url_path_prefix_is_kept(scripted: ScriptedFactory) -> None:
    server = await scripted(always(OK), "/alertmanager")
    async with running([server.base_url + "/"]) as notifier:
        notifier.send([firing("A")])
        await eventually(notifier, sent(1))
    assert server.received[0].path == "/alertmanager/api/v2/alerts"


async def test_credentials_in_the_url_become_basic_auth_and_stay_out_of_stats(
    scripted: ScriptedFactory,
) -> None:
    server = await scripted(always(OK))
    url = server.base_url.replace("http://", "http://am-user:s3cret@")
    async with running([url]) as notifier:
        notifier.send([firing("A")])
        stats = await eventually(notifier, sent(1))
    # base64("am-user:s3cret")
    assert server.received[0].headers["Authorization"] == "Basic YW0tdXNlcjpzM2NyZXQ="
    assert stats[0].url == server.base_url
    assert "s3cret" not in repr(stats)


async def test_requests_are_json_posts_named_semhealth(scripted: ScriptedFactory) -> None:
    server = await scripted(always(OK))
    async with running([server.base_url]) as notifier:
        notifier.send([firing("A")])
        await eventually(notifier, sent(1))
    headers = server.received[0].headers
    assert (headers["Content-Type"], headers["User-Agent"]) == ("application/json", "semhealth")


# -- lifecycle and settings ---------------------------------------------------------------------


async def test_shutdown_without_start_drops_and_counts_what_was_queued() -> None:
    notifier = Notifier([dead_url()], settings=FAST)
    notifier.send([firing("A")])
    await notifier.shutdown()
    await notifier.shutdown()
    assert (notifier.stats()[0].dropped, notifier.stats()[0].queue_length) == (1, 0)


async def test_send_after_shutdown_is_dropped_and_counted(scripted: ScriptedFactory) -> None:
    server = await scripted(always(OK))
    notifier = Notifier([server.base_url], settings=FAST)
    await notifier.start()
    await notifier.shutdown()
    notifier.send([firing("A")])
    assert notifier.stats()[0].dropped == 1
    assert server.received == []


async def test_start_shutdown_then_a_fresh_notifier_on_the_same_urls_delivers(
    scripted: ScriptedFactory,
) -> None:
    server = await scripted(always(OK))
    first = Notifier([server.base_url], settings=FAST)
    await first.start()
    await first.start()  # a second start is a no-op
    await first.shutdown()
    second = Notifier([server.base_url], settings=FAST)
    await second.start()
    second.send([firing("A")])
    await eventually(second, sent(1))
    await second.shutdown()


async def test_start_after_shutdown_is_refused() -> None:
    notifier = Notifier([dead_url()], settings=FAST)
    await notifier.shutdown()
    with pytest.raises(RuntimeError, match="build a new one"):
        await notifier.start()


def test_settings_problems_name_each_field() -> None:
    settings = Settings(timeout_s=0, queue_size=0, max_batch=0, max_attempts=0, retry_window_s=-1)
    assert settings.validate() == [
        "timeout_s must be more than 0, not 0",
        "retry_window_s must be 0 or more, not -1",
        "queue_size must be at least 1, not 0",
        "max_batch must be at least 1, not 0",
        "max_attempts must be at least 1, not 0",
    ]


def test_default_settings_are_valid() -> None:
    assert Settings().validate() == []


@pytest.mark.parametrize("url", ["localhost:9093", "ftp://host", "http://", ""])
def test_bad_url_is_refused_at_construction(url: str) -> None:
    with pytest.raises(ValueError, match="alertmanager URL #2"):
        Notifier(["http://127.0.0.1:9093", url])


def test_bad_settings_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        Notifier(["http://127.0.0.1:9093"], settings=Settings(max_batch=0))
