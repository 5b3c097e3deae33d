"""Live shadowing's metrics, on the agent's meter.

The pair measures are histograms declared with the agent's other instruments
(``semhealth.agent.telemetry.instruments.SPECS``, where their buckets are);
``PairMetrics.observe`` records one pair into them. The counters are observable and read
``ShadowStats`` at collection time:

- ``semantic_health_shadow_pairs_total{route,result}``: exact, differs, candidate_error, shed;
- ``semhealth_shadow_shed_total{route,reason}``: why a sampled exchange was not compared
  (body_not_kept, body_too_large, max_concurrent, max_per_minute, waiting_full, expired,
  primary_incomplete, duplicate, closed, error);
- ``semhealth_shadow_skipped_total{reason}``: exchanges that were never meant to be shadowed
  (method, route, sampled_out);
- ``semhealth_shadow_errors_total``, ``semhealth_shadow_scoring_skipped_total``,
  ``semhealth_shadow_diff_log_lines_total``, ``semhealth_shadow_diff_log_dropped_total``;
- gauges ``semhealth_shadow_in_flight`` and ``semhealth_shadow_waiting``.

The candidate's own records go through a ``Recorder`` with ``variant="shadow"``, so every
semantic and GenAI series exists for it beside the primary's (``variant="primary"`` while
shadowing runs, unless a configured variant, a canary's say, is the primary's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from semhealth.agent.shadow.live import ShadowStats
from semhealth.agent.shadow.pairs import PairResult
from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.observe import Labelled, observe, observe_by

Callback = Callable[[CallbackOptions], Iterable[Observation]]


class PairMetrics:
    """Records one compared pair into the shadow histograms."""

    def __init__(self, instruments: m.Instruments) -> None:
        histograms = instruments.histograms
        self._distance = histograms["semantic_health_shadow_token_distance"]
        self._divergence = histograms["semantic_health_shadow_first_divergence_tokens"]
        self._agreement = histograms["semantic_health_shadow_answer_agreement"]

    def observe(self, pair: PairResult) -> None:
        attrs = {m.ROUTE: pair.route}
        if pair.tokens is not None:
            self._distance.record(pair.tokens.distance, attrs)
            if pair.tokens.first_divergence is not None:
                self._divergence.record(pair.tokens.first_divergence, attrs)
        if pair.agreement is not None:
            self._agreement.record(pair.agreement, attrs)


def _by_route(read: Callable[[], dict[tuple[str, str], int]], second: str) -> Callback:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        # A C-level copy under the GIL: the loop thread may be adding keys meanwhile.
        return [
            Observation(value, {m.ROUTE: route, second: name})
            for (route, name), value in dict(read()).items()
        ]

    return Labelled(callback, m.ROUTE, second)


def observe_shadow(meter: Meter, stats: ShadowStats) -> None:
    """Register the shadow counters and gauges, read from ``stats`` at collection."""
    meter.create_observable_counter(
        "semantic_health_shadow_pairs",
        [_by_route(lambda: stats.pairs, m.RESULT)],
        description="Shadowed requests by outcome: exact, differs, candidate_error, shed.",
    )
    meter.create_observable_counter(
        "semhealth_shadow_shed",
        [_by_route(lambda: stats.shed, m.REASON)],
        description="Sampled requests not compared, by reason (over budget, body not kept, "
        "partner late, ...).",
    )
    meter.create_observable_counter(
        "semhealth_shadow_skipped",
        [observe_by(m.REASON, lambda: dict(stats.skipped))],
        description="Requests never meant to be shadowed: method, route not configured, "
        "sampled out.",
    )
    singles = {
        "semhealth_shadow_errors": ("Failures inside live shadowing (a bug: please report).",
                                    lambda: stats.errors),
        "semhealth_shadow_scoring_skipped": (
            "Shadow pairs or records left unscored: the relevance scorer was busy or failed.",
            lambda: stats.scoring_skipped),
        "semhealth_shadow_diff_log_lines": ("Pairs written to the opt-in diff log.",
                                            lambda: stats.diff_log_lines),
        "semhealth_shadow_diff_log_dropped": (
            "Pairs not written to the diff log: full (max_bytes) or unwritable.",
            lambda: stats.diff_log_dropped),
    }  # fmt: skip
    for name, (description, read) in singles.items():
        meter.create_observable_counter(name, [observe(read)], description=description)
    meter.create_observable_gauge(
        "semhealth_shadow_in_flight",
        [observe(lambda: stats.in_flight)],
        description="Candidate requests open now.",
    )
    meter.create_observable_gauge(
        "semhealth_shadow_waiting",
        [observe(lambda: stats.waiting)],
        description="Shadowed exchanges waiting for their pair to complete.",
    )
