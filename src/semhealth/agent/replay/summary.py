"""What ``semhealth replay`` prints and writes: results JSONL (one ``RecordResult`` per
line, numbers and bounded labels only) and a per-route summary table."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import IO

import orjson

from semhealth.agent.replay.results import AlertTransition, RecordResult, ReplayRun
from semhealth.collectors import quantile

_COLUMNS = (
    "route",
    "records",
    "validity",
    "ctx_rel p50",
    "ctx_rel p10",
    "ttft p50",
    "ttft p95",
    "continuity p50",
    "alerts fired",
)


def write_results(results: Iterable[RecordResult], out: IO[bytes]) -> None:
    for result in results:
        out.write(orjson.dumps(dataclasses.asdict(result)) + b"\n")


def _q(values: Sequence[float], q: float, scale: float = 1.0, digits: int = 3) -> str:
    if not values:
        return "-"
    return f"{quantile(sorted(values), q) * scale:.{digits}f}"


def _validity(results: Sequence[RecordResult]) -> str:
    verdicts = [verdict for result in results for verdict, _reasons in result.validity]
    if not verdicts:
        return "-"
    return f"{verdicts.count('valid') / len(verdicts):.1%} of {len(verdicts)}"


def _fired(alerts: Sequence[AlertTransition], route: str | None) -> int:
    """Alerts that started firing for ``route``; None: those of no single route."""
    return sum(
        1 for alert in alerts if alert.state == "firing" and alert.labels.get("route") == route
    )


def summary_rows(run: ReplayRun) -> list[tuple[str, ...]]:
    by_route: dict[str, list[RecordResult]] = {}
    for result in run.results:
        by_route.setdefault(result.route, []).append(result)
    rows: list[tuple[str, ...]] = []
    for route in sorted(by_route):
        results = by_route[route]
        relevance = [r.context_relevance for r in results if r.context_relevance is not None]
        ttft = [r.ttft_s for r in results if r.ttft_s is not None]
        continuity = [r.continuity_index_s for r in results if r.continuity_index_s is not None]
        rows.append(
            (
                route,
                str(len(results)),
                _validity(results),
                _q(relevance, 0.5),
                _q(relevance, 0.1),
                _q(ttft, 0.5, 1000, 0) + (" ms" if ttft else ""),
                _q(ttft, 0.95, 1000, 0) + (" ms" if ttft else ""),
                _q(continuity, 0.5, 1000, 1) + (" ms" if continuity else ""),
                str(_fired(run.alerts, route)),
            )
        )
    unrouted = _fired(run.alerts, None)
    if unrouted:
        rows.append(("(all routes)", "", "", "", "", "", "", "", str(unrouted)))
    return rows


def summary_table(run: ReplayRun) -> str:
    rows = [_COLUMNS, *summary_rows(run)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines) + "\n"
