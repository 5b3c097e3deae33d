"""Pairs summarised per route: the measures with bootstrap intervals, the verdict against the
tolerances, and the exchange ids of the worst pairs (ids only, never text). The same summary
backs ``/shadow`` on the admin port and ``semhealth diff``'s table."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from semhealth.agent.config import Tolerances
from semhealth.agent.shadow.pairs import PairResult
from semhealth.agent.shadow.stats import Interval, Verdict, bootstrap_mean, judge

WORST = 5  # exchange ids of the most different pairs, per route


@dataclass(frozen=True, slots=True)
class RouteSummary:
    route: str
    pairs: int
    exact: int
    differs: int
    candidate_errors: int
    token_distance: Interval | None
    first_divergence_median: float | None
    answer_agreement: Interval | None
    ttft_ratio: Interval | None
    json_equal: Interval | None  # share of JSON answers equal as JSON
    verdict: Verdict
    worst: tuple[str, ...]  # exchange ids, most different first


def ttft_ratio(pair: PairResult) -> float | None:
    ours, theirs = pair.primary.ttft_s, pair.shadow.ttft_s
    if pair.result == "candidate_error" or not ours or theirs is None:
        return None
    return theirs / ours


def summarise(pairs: Iterable[PairResult], tolerances: Tolerances) -> list[RouteSummary]:
    by_route: dict[str, list[PairResult]] = {}
    for pair in pairs:
        by_route.setdefault(pair.route, []).append(pair)
    return [_route(route, found, tolerances) for route, found in sorted(by_route.items())]


def _route(route: str, pairs: Sequence[PairResult], tolerances: Tolerances) -> RouteSummary:
    distances = [p.tokens.distance for p in pairs if p.tokens is not None]
    divergences = [
        p.tokens.first_divergence
        for p in pairs
        if p.tokens is not None and p.tokens.first_divergence is not None
    ]
    agreements = [p.agreement for p in pairs if p.agreement is not None]
    ratios = [r for p in pairs if (r := ttft_ratio(p)) is not None]
    errors = [1.0 if p.result == "candidate_error" else 0.0 for p in pairs]
    json_equal = [float(bool(p.json.equal)) for p in pairs if p.json is not None]
    return RouteSummary(
        route=route,
        pairs=len(pairs),
        exact=sum(p.result == "exact" for p in pairs),
        differs=sum(p.result == "differs" for p in pairs),
        candidate_errors=int(sum(errors)),
        token_distance=bootstrap_mean(distances),
        first_divergence_median=statistics.median(divergences) if divergences else None,
        answer_agreement=bootstrap_mean(agreements),
        ttft_ratio=bootstrap_mean(ratios),
        json_equal=bootstrap_mean(json_equal),
        verdict=judge(
            token_distances=distances,
            agreements=agreements,
            ttft_ratios=ratios,
            candidate_errors=errors,
            tolerances=tolerances,
        ),
        worst=tuple(p.exchange_id for p in sorted(pairs, key=_badness, reverse=True)[:WORST]),
    )


def _badness(pair: PairResult) -> tuple[int, float]:
    """Failures first, then the least agreement, then the largest token distance."""
    if pair.result == "candidate_error":
        return (2, 0.0)
    if pair.agreement is not None:
        return (1, 1.0 - pair.agreement)
    return (0, pair.tokens.distance if pair.tokens is not None else 0.0)


def as_json(summaries: Sequence[RouteSummary], tolerances: Tolerances) -> dict[str, Any]:
    """The ``/shadow`` document."""
    return {"tolerances": asdict(tolerances), "routes": [asdict(s) for s in summaries]}


def _interval(value: Interval | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value.mean:.{digits}f} [{value.low:.{digits}f}, {value.high:.{digits}f}]"


def table(summaries: Sequence[RouteSummary]) -> str:
    """A plain-text table, one row per route."""
    header = (
        "route", "pairs", "exact", "errors", "token distance (95% CI)", "1st div p50",
        "agreement (95% CI)", "TTFT ratio (95% CI)", "JSON equal", "verdict",
    )  # fmt: skip
    rows = [header]
    for s in summaries:
        rows.append(
            (
                s.route,
                str(s.pairs),
                str(s.exact),
                str(s.candidate_errors),
                _interval(s.token_distance),
                "-" if s.first_divergence_median is None else f"{s.first_divergence_median:g}",
                _interval(s.answer_agreement),
                _interval(s.ttft_ratio, 2),
                "-" if s.json_equal is None else f"{s.json_equal.mean:.0%}",
                s.verdict.verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    )
