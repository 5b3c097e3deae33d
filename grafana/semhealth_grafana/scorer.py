"""The shared scorer's own panels on the "Scorer and agent" dashboard.

``semhealth scorer`` exports ``semhealth_scorer_*`` on ``--metrics-listen`` (port 9465, the
chart's ServiceMonitor scrapes it). They carry ``encoder`` (``unknown`` for calls naming no
encoder it serves) and, on failures and Embed latency, the gRPC status ``code``. They have no
route or model; their namespace is the scorer's, so it must be among the selected ones.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from semhealth.embeddings.config import Batching, Remote
from semhealth_grafana.common import (
    GREEN,
    NAMESPACE,
    ORANGE,
    RED,
    any_is_bad,
    quantile_query,
    rate_query,
    row,
    series,
    steps,
)

BY_ENCODER = "encoder"
# The defaults the lines are drawn from: past max_batch a batch is split; past 80 % of the
# queue a burst sheds; a sidecar gives up after its deadline (remote.timeout_s).
DEFAULTS = Batching()
DEADLINE_S = Remote().timeout_s


def _rate(metric: str, by: str = BY_ENCODER, selector: str = NAMESPACE) -> str:
    return rate_query(metric, selector, by)


def _quantile(q: float, metric: str, selector: str = NAMESPACE) -> str:
    return quantile_query(q, metric, selector, BY_ENCODER)


def add_scorer_row(board: dash.Dashboard) -> dash.Dashboard:
    """A row of the scorer's load: texts, overload, queue, batch sizes, latency, failures."""
    return (
        board.with_row(row("Shared scorer (semhealth scorer)"))
        .with_panel(
            series(
                "Scorer texts/s and overloaded/s",
                "Texts the scorer embedded per second, by encoder, and texts it refused with "
                "RESOURCE_EXHAUSTED because its queue was full (the sidecars shed that work).",
                [
                    (_rate("semhealth_scorer_texts_total"), "embedded {{encoder}}"),
                    (_rate("semhealth_scorer_overloaded_texts_total"), "overloaded {{encoder}}"),
                ],
                unit="short",
                thresholds=steps((None, GREEN)),
                red_series=r"overloaded .*",
                width=8,
            )
        )
        .with_panel(
            series(
                "Scorer queue depth vs capacity",
                "Texts waiting for the model in each encoder's queue, and the queue's capacity "
                "(batching.queue_size). A call whose texts do not fit is refused as overloaded; "
                f"the line is 80 % of the default queue_size ({DEFAULTS.queue_size}).",
                [
                    (
                        f"max by ({BY_ENCODER}) (semhealth_scorer_queue_texts{{{NAMESPACE}}})",
                        "queued {{encoder}}",
                    ),
                    (
                        f"max by ({BY_ENCODER}) "
                        f"(semhealth_scorer_queue_capacity_texts{{{NAMESPACE}}})",
                        "capacity {{encoder}}",
                    ),
                ],
                unit="short",
                thresholds=steps((None, GREEN), (0.8 * DEFAULTS.queue_size, ORANGE)),
                min_value=0,
                width=8,
            )
        )
        .with_panel(
            series(
                "Scorer batch size",
                "Texts per model call, P50 and P99 by encoder. Small batches under load mean "
                "the model is called often for little; the line is the default max_batch "
                f"({DEFAULTS.max_batch}).",
                [
                    (_quantile(0.5, "semhealth_scorer_batch_texts"), "P50 {{encoder}}"),
                    (_quantile(0.99, "semhealth_scorer_batch_texts"), "P99 {{encoder}}"),
                ],
                unit="short",
                thresholds=steps((None, GREEN), (DEFAULTS.max_batch, ORANGE)),
                min_value=0,
                width=8,
            )
        )
        .with_panel(
            series(
                "Scorer Embed latency P50 / P99",
                "Time an Embed call spent in the scorer, from receipt to answer, every outcome "
                "included (a call that waited out its deadline counts its wait). Past the line, "
                f"the sidecars' {DEADLINE_S:g} s deadline, they have given up: work done then is "
                "wasted.",
                [
                    (_quantile(0.5, "semhealth_scorer_embed_duration_seconds"), "P50 {{encoder}}"),
                    (_quantile(0.99, "semhealth_scorer_embed_duration_seconds"), "P99 {{encoder}}"),
                ],
                unit="s",
                thresholds=steps((None, GREEN), (DEADLINE_S, RED)),
                min_value=0,
            )
        )
        .with_panel(
            series(
                "Scorer calls failed, by status",
                "Embed calls per second that ended with a gRPC status other than OK, by encoder "
                "and status: RESOURCE_EXHAUSTED (queue full), DEADLINE_EXCEEDED and CANCELLED "
                "(the caller gave up), UNAVAILABLE and INTERNAL (model failures, loading, "
                "shutting down), NOT_FOUND and INVALID_ARGUMENT (a misconfigured sidecar).",
                [
                    (
                        _rate("semhealth_scorer_failed_requests_total", f"{BY_ENCODER}, code"),
                        "{{code}} {{encoder}}",
                    )
                ],
                unit="reqps",
                thresholds=any_is_bad(RED),
            )
        )
    )
