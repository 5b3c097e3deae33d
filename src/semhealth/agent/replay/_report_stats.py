"""The numbers the replay report shows, computed from a ``ReplayRun`` with numpy alone: the
routes in display order, a summary per route, validity failures by reason and the alert
timeline as bands. The plots and the HTML read these; nothing here draws or formats.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from semhealth.agent.replay.results import AlertTransition, RecordResult, ReplayRun

ALL_ROUTES = "all routes"


@dataclass(frozen=True, slots=True)
class RouteSummary:
    """One row of the summary table; ``None`` where the route gave no value to summarize."""

    route: str
    records: int
    errors: int
    outputs: int  # structured outputs checked
    valid_outputs: int
    relevance_p50: float | None
    relevance_p10: float | None
    answer_relevance_p50: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    continuity_p50_s: float | None
    stalls: int
    alerts_fired: int

    @property
    def validity_rate(self) -> float | None:
        return self.valid_outputs / self.outputs if self.outputs else None


@dataclass(frozen=True, slots=True)
class AlertBand:
    """A stretch of time one alert series spent in ``state`` (``pending`` or ``firing``).
    ``open_end`` is True when the replayed span ended before the alert left that state."""

    state: str
    start: float
    end: float
    open_end: bool


@dataclass(frozen=True, slots=True)
class AlertSeries:
    """One alert (a rule and its labels) over the replayed span."""

    rule: str
    labels: tuple[tuple[str, str], ...]
    bands: tuple[AlertBand, ...]
    resolved_at: tuple[float, ...]
    fired_value: float | None  # the value when it last started firing

    @property
    def name(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.labels)
        return f"{self.rule}{{{inner}}}" if inner else self.rule

    @property
    def fired(self) -> bool:
        return any(band.state == "firing" for band in self.bands)


def route_order(results: Iterable[RecordResult]) -> list[str]:
    """Routes by record count, busiest first, ties by name, so colours and rows are stable."""
    counts = Counter(result.route for result in results)
    return sorted(counts, key=lambda route: (-counts[route], route))


def span_of(run: ReplayRun) -> tuple[float, float] | None:
    """The replayed span: the run's own, or else the first and last times it holds."""
    times = [r.time for r in run.results] + [a.time for a in run.alerts]
    start = run.start if run.start is not None else min(times, default=None)
    end = run.end if run.end is not None else max(times, default=None)
    if start is None or end is None:
        return None
    return (start, max(start, end))


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.quantile(np.asarray(values, dtype=np.float64), q))


def _present(values: Iterable[float | None]) -> list[float]:
    """The values a record gave; a NaN or infinity would poison every percentile."""
    return [value for value in values if value is not None and math.isfinite(value)]


def fired_by_route(alerts: Iterable[AlertTransition]) -> Counter[str]:
    """How many times an alert started firing, by its ``route`` label (alerts without one
    count under ``ALL_ROUTES`` only)."""
    counts: Counter[str] = Counter()
    for alert in alerts:
        if alert.state == "firing":
            counts[alert.labels.get("route", ALL_ROUTES)] += 1
    return counts


def summarize(route: str, results: Sequence[RecordResult], fired: int) -> RouteSummary:
    outcomes = [kind for result in results for kind, _ in result.validity]
    relevance = _present(r.context_relevance for r in results)
    ttft = _present(r.ttft_s for r in results)
    return RouteSummary(
        route=route,
        records=len(results),
        errors=sum(1 for r in results if r.error_type),
        outputs=len(outcomes),
        valid_outputs=outcomes.count("valid"),
        relevance_p50=quantile(relevance, 0.5),
        relevance_p10=quantile(relevance, 0.1),
        answer_relevance_p50=quantile(_present(r.answer_relevance for r in results), 0.5),
        ttft_p50_s=quantile(ttft, 0.5),
        ttft_p95_s=quantile(ttft, 0.95),
        continuity_p50_s=quantile(_present(r.continuity_index_s for r in results), 0.5),
        stalls=sum(r.stalls for r in results),
        alerts_fired=fired,
    )


def route_summaries(run: ReplayRun) -> list[RouteSummary]:
    """One summary per route in ``route_order``, then one for all routes together."""
    by_route: dict[str, list[RecordResult]] = defaultdict(list)
    for result in run.results:
        by_route[result.route].append(result)
    fired = fired_by_route(run.alerts)
    rows = [summarize(route, by_route[route], fired[route]) for route in route_order(run.results)]
    total = sum(fired.values())
    rows.append(summarize(ALL_ROUTES, run.results, total))
    return rows


def validity_failures(results: Iterable[RecordResult]) -> dict[str, Counter[str]]:
    """Failed structured outputs by ``result: reason`` and then by route. An output failed
    for two reasons counts under both; one with no reason counts under its result alone."""
    failures: dict[str, Counter[str]] = defaultdict(Counter)
    for result in results:
        for kind, reasons in result.validity:
            if kind == "valid":
                continue
            for reason in reasons or ("",):
                key = f"{kind}: {reason}" if reason else kind
                failures[key][result.route] += 1
    return dict(failures)


def _series_key(alert: AlertTransition) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (alert.rule, tuple(sorted(alert.labels.items())))


def _bands(transitions: Sequence[AlertTransition], end: float) -> AlertSeries:
    """Walk one series' transitions in time order: each opens a band in its state (pending,
    firing) or closes the open one (resolved)."""
    bands: list[AlertBand] = []
    resolved: list[float] = []
    open_state: tuple[str, float] | None = None
    fired_value: float | None = None
    for step in transitions:
        if open_state is not None:
            bands.append(AlertBand(open_state[0], open_state[1], step.time, open_end=False))
            open_state = None
        if step.state == "resolved":
            resolved.append(step.time)
            continue
        open_state = (step.state, step.time)
        if step.state == "firing":
            fired_value = step.value
    if open_state is not None:
        bands.append(AlertBand(open_state[0], open_state[1], max(end, open_state[1]), True))
    first = transitions[0]
    return AlertSeries(
        rule=first.rule,
        labels=_series_key(first)[1],
        bands=tuple(bands),
        resolved_at=tuple(resolved),
        fired_value=fired_value,
    )


def alert_series(run: ReplayRun) -> list[AlertSeries]:
    """Every alert series, ordered by rule then labels; bands still open at the end of the
    replayed span run to its end."""
    grouped: dict[tuple[str, tuple[tuple[str, str], ...]], list[AlertTransition]] = defaultdict(
        list
    )
    for alert in run.alerts:
        grouped[_series_key(alert)].append(alert)
    span = span_of(run)
    end = span[1] if span else 0.0
    return [_bands(sorted(grouped[key], key=lambda a: a.time), end) for key in sorted(grouped)]
