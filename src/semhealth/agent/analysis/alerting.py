"""Alerting in the agent: samples in, rules evaluated on an interval, pages out.

The recorder hands every signal value to ``observe``, on the event loop; that only
appends to a bounded buffer. Evaluation runs on a worker thread of its own, which
drains the buffer into the evaluator and evaluates: a relative rule over many groups
merges sketches for milliseconds, and the proxy's loop must not spend them in one piece.
The worker is pure Python and shares the GIL with the loop, so it also hands the GIL over
every half millisecond of work (``GILYield``); without that the loop waits for the GIL in
steps of the 5 ms switch interval for as long as an evaluation runs. Every
touch of the evaluator happens on that one thread, so it needs no lock. Alerts that
need sending cross back to the loop, where the notifier queues them for each
Alertmanager. Nothing here can block or fail the proxy: a full buffer sheds samples
and counts them, a failed evaluation is logged and counted, and delivery problems
stay inside the notifier.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson
from opentelemetry.metrics import CallbackOptions, Observation

from semhealth.agent.telemetry.observe import Labelled
from semhealth.alerts.alertmanager import DeliveryStats, Notifier
from semhealth.alerts.alertmanager import Settings as NotifierSettings
from semhealth.alerts.evaluator import Evaluator, RuleStatus
from semhealth.alerts.evaluator import Stats as EvaluatorStats
from semhealth.alerts.model import Alert, Rule
from semhealth.alerts.sample import Sample

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What the agent hands the alerting stage (built from the ``alerts:`` section)."""

    rules: tuple[Rule, ...]
    alertmanagers: tuple[str, ...] = ()
    interval_s: float = 15.0
    resend_delay_s: float = 60.0
    timeout_s: float = 10.0  # per POST to an Alertmanager
    external_labels: dict[str, str] = field(default_factory=dict)  # pod, namespace
    max_pending_samples: int = 100_000  # samples waiting for the worker; more are shed


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertingStats:
    """What the stage has done, for the agent's self-metrics."""

    evaluator: EvaluatorStats
    samples_shed: int
    evaluation_failures: int
    evaluation_seconds: float  # the latest evaluation's duration
    pending: int  # alerts pending now
    firing: int  # alerts firing now
    deliveries: tuple[DeliveryStats, ...]


@dataclass(frozen=True, slots=True)
class ActiveAlert:
    rule: str
    labels: dict[str, str]  # the group's labels
    state: str  # pending | firing
    value: float | None


class GILYield:
    """Called between pieces of pure-Python work on a worker thread: every ``every_s`` of
    work, ``time.sleep(0)`` releases the GIL so a waiting event loop takes it at once.

    Measured with ``bench/alert_evaluation.py``: while 1,000 groups were evaluated, a 1 ms
    timer on the loop woke 5.4 ms late at p50 without this (the switch interval), and a
    fraction of a millisecond with it.
    """

    def __init__(self, every_s: float = 0.0005) -> None:
        self._every_s = every_s
        self._last = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self._last >= self._every_s:
            time.sleep(0)
            self._last = time.perf_counter()


class AlertingStage:
    """Evaluates the rules over the samples it observes; pages every Alertmanager configured.

    Without Alertmanagers the rules still run: ``/alerts`` shows them, and each alert
    that starts firing or resolves is logged with its labels and value.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        on_task_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._settings = settings
        self._on_task_failure = on_task_failure
        self._clock = clock
        self._samples: deque[Sample] = deque()
        self._yield = GILYield()
        self._evaluator = Evaluator(
            settings.rules,
            notify=self._notify_from_worker,
            resend_delay_s=settings.resend_delay_s,
            interval_s=settings.interval_s,
            pause=self._yield,
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semhealth-alerts")
        self._notifier: Notifier | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._snapshot: list[RuleStatus] = []  # as of the latest evaluation
        self._samples_shed = 0
        self._failures = 0
        self._evaluation_s = 0.0
        self._closed = False
        self._logged: dict[tuple[tuple[str, str], ...], str] = {}  # firing alerts, by labels

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._settings.rules

    def observe(self, sample: Sample) -> None:
        """The recorder's sample sink: O(1) on the loop, shed and counted when full."""
        if len(self._samples) >= self._settings.max_pending_samples:
            self._samples_shed += 1
            return
        self._samples.append(sample)

    async def start(self, generator_url: str) -> None:
        """Start delivery and the evaluation loop; ``generator_url`` is this agent's
        ``/alerts`` URL, which every alert links back to."""
        if self._closed:
            raise RuntimeError("an AlertingStage cannot start again after shutdown")
        self._loop = asyncio.get_running_loop()
        if self._settings.alertmanagers:
            self._notifier = Notifier(
                self._settings.alertmanagers,
                settings=NotifierSettings(
                    timeout_s=self._settings.timeout_s,
                    # Retries end well before the next resend carries the alert anyway.
                    retry_window_s=min(30.0, self._settings.resend_delay_s / 2),
                    external_labels=self._settings.external_labels,
                    generator_url=generator_url,
                ),
            )
            await self._notifier.start()
        await self.evaluate_now()  # /alerts shows every rule from the start
        self._task = asyncio.create_task(self._run(), name="semhealth-alert-evaluation")
        self._task.add_done_callback(self._evaluation_done)

    def _evaluation_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._on_task_failure:
            self._on_task_failure(task.exception())  # type: ignore[arg-type]

    async def _run(self) -> None:
        interval = self._settings.interval_s
        next_at = time.monotonic()
        while True:
            # A slow evaluation delays the next one instead of queueing a burst behind it.
            next_at = max(next_at + interval, time.monotonic())
            await asyncio.sleep(next_at - time.monotonic())
            await self.evaluate_now()

    async def evaluate_now(self) -> None:
        """One evaluation on the worker thread; a failure is logged and counted, never raised."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._worker, self._evaluate, self._clock())
        except Exception as exc:
            self._failures += 1
            log.error("alert evaluation failed (a bug: please report): %r", exc)

    def _evaluate(self, now: float) -> None:
        """Worker thread only."""
        started = time.perf_counter()
        samples, observe = self._samples, self._evaluator.observe
        # Only what is there now: under a steady stream of samples, evaluation still happens.
        for count in range(len(samples)):
            observe(samples.popleft())
            if count % 64 == 63:
                self._yield()
        self._evaluator.evaluate(now)
        self._snapshot = self._evaluator.snapshot(now)
        self._evaluation_s = time.perf_counter() - started

    async def reload(self, rules: Sequence[Rule]) -> None:
        """Evaluate ``rules`` from now on (``Evaluator.replace_rules``: unchanged rules keep
        their windows and alerts). Runs on the worker, between evaluations."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._worker, self._replace_rules, tuple(rules))
        # On the loop, where _deliver keeps it: an alert of a changed rule that fires again
        # is logged again.
        self._logged.clear()

    def _replace_rules(self, rules: tuple[Rule, ...]) -> None:
        """Worker thread only."""
        self._evaluator.replace_rules(rules)
        self._settings = replace(self._settings, rules=rules)
        self._snapshot = self._evaluator.snapshot(self._clock())

    def _notify_from_worker(self, alerts: Sequence[Alert]) -> None:
        """The evaluator's ``notify``, on the worker thread: hand over to the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, tuple(alerts))

    def _deliver(self, alerts: Sequence[Alert]) -> None:
        self._log_transitions(alerts)
        if self._notifier is not None:
            self._notifier.send(alerts)

    def _log_transitions(self, alerts: Sequence[Alert]) -> None:
        """One line when an alert starts firing and one when it resolves, not per resend."""
        for alert in alerts:
            key = tuple(sorted(alert.labels.items()))
            if self._logged.get(key) == alert.state:
                continue  # a resend; resolved alerts are resent for 15 minutes too
            # Bounded: one entry per rule and group, and groups are bounded by the label guard.
            self._logged[key] = alert.state
            labels = " ".join(f"{k}={v}" for k, v in key if k != "alertname")
            log.warning(
                "alert %s %s: %s value=%s", alert.rule, alert.state, labels, _number(alert.value)
            )

    def active(self) -> list[ActiveAlert]:
        """Alerts pending or firing as of the latest evaluation, firing first."""
        found = [
            ActiveAlert(rule.name, group.labels, group.state, group.value)
            for rule in self._snapshot
            for group in rule.groups
            if group.state in ("pending", "firing")
        ]
        return sorted(found, key=lambda alert: (alert.state != "firing", alert.rule))

    def stats(self) -> AlertingStats:
        states = [group.state for rule in self._snapshot for group in rule.groups]
        return AlertingStats(
            evaluator=self._evaluator.stats,
            samples_shed=self._samples_shed,
            evaluation_failures=self._failures,
            evaluation_seconds=self._evaluation_s,
            pending=states.count("pending"),
            firing=states.count("firing"),
            deliveries=self._notifier.stats() if self._notifier is not None else (),
        )

    def status_json(self) -> bytes:
        """The ``/alerts`` document: rules, groups, values and states as of the latest
        evaluation, and each Alertmanager's delivery counters."""
        stats = self.stats()
        document: dict[str, Any] = {
            "evaluated_at": stats.evaluator.last_evaluation_at,
            "interval_s": self._settings.interval_s,
            "rules": [asdict(rule) for rule in self._snapshot],
            "alertmanagers": [asdict(delivery) for delivery in stats.deliveries],
            "stats": {
                "samples_observed": stats.evaluator.samples_observed,
                "samples_shed": stats.samples_shed,
                "groups": stats.evaluator.groups,
                "groups_dropped": stats.evaluator.groups_dropped,
                "evaluations": stats.evaluator.evaluations,
                "evaluation_failures": stats.evaluation_failures,
                "rule_failures": stats.evaluator.rule_failures,
                "evaluation_seconds": stats.evaluation_seconds,
            },
        }
        return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop evaluating, deliver what is queued within the deadline. Safe twice."""
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._notifier is not None:
            await self._notifier.shutdown(timeout_s)
        self._worker.shutdown(wait=False, cancel_futures=True)


def _number(value: float | None) -> str:
    return "none" if value is None else f"{value:.6g}"


def observe_alerting(meter: Any, alerting: Callable[[], AlertingStats | None]) -> None:
    """Alert states and delivery; absent while alerting is off."""

    def alerts(_options: CallbackOptions) -> Sequence[Observation]:
        stats = alerting()
        if stats is None:
            return []
        return [
            Observation(stats.pending, {"state": "pending"}),
            Observation(stats.firing, {"state": "firing"}),
        ]

    def delivered(_options: CallbackOptions) -> Sequence[Observation]:
        stats = alerting()
        out = []
        for target in stats.deliveries if stats else ():
            outcomes = {
                "sent": target.sent,
                "failed": target.errors,
                "dropped": target.dropped - target.errors,
            }
            out += [
                Observation(count, {"alertmanager": target.url, "outcome": outcome})
                for outcome, count in outcomes.items()
            ]
        return out

    def queued(_options: CallbackOptions) -> Sequence[Observation]:
        stats = alerting()
        return [
            Observation(target.queue_length, {"alertmanager": target.url})
            for target in (stats.deliveries if stats else ())
        ]

    def failures(_options: CallbackOptions) -> Sequence[Observation]:
        stats = alerting()
        if stats is None:
            return []
        return [Observation(stats.evaluation_failures + stats.evaluator.rule_failures)]

    meter.create_observable_up_down_counter(
        "semhealth_alerts",
        [Labelled(alerts, "state")],
        description="Alerts pending and firing now, by state.",
    )
    meter.create_observable_counter(
        "semhealth_alertmanager_alerts",
        [Labelled(delivered, "alertmanager", "outcome")],
        description="Alerts for each Alertmanager by outcome: sent (accepted), failed "
        "(given up after failed POSTs; resent later while firing), dropped (queue full, "
        "shutdown).",
    )
    meter.create_observable_up_down_counter(
        "semhealth_alertmanager_queue_length",
        [Labelled(queued, "alertmanager")],
        description="Alerts waiting to be sent to each Alertmanager.",
    )
    meter.create_observable_counter(
        "semhealth_alert_evaluation_failures",
        [failures],
        description="Rule evaluations that failed inside semhealth (a bug: please report).",
    )
