"""Scorer and agent: relevance scoring work, shed work, the tap, analysis, the embedding cache,
restarts and rejected requests.

The relevance rows show what every sidecar exports about scoring, whichever backend (local
model or shared scorer) it uses; the scorer's row (``scorer.py``) shows what the shared
``semhealth scorer`` exports about itself: its queue, batches, latency and overload.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from semhealth.agent.config import load_config
from semhealth_grafana.common import (
    GREEN,
    NAMESPACE,
    ORANGE,
    RATE,
    RED,
    alert,
    any_is_bad,
    dashboard,
    quantile_query,
    rate_query,
    row,
    runbook,
    series,
    single,
    steps,
    variables,
)
from semhealth_grafana.scorer import add_scorer_row

UID = "semhealth-agent"
BY_POD = "namespace, pod"

# Defaults of the settings some lines are drawn from (a URL is the one required key).
_DEFAULTS = load_config(None, {}, {"upstream.url": "http://upstream.invalid"})
TAP_QUEUE_SIZE = _DEFAULTS.collectors.limits.tap_queue_size
TAP_QUEUE_BYTES = _DEFAULTS.collectors.limits.tap_queue_bytes
ANALYSIS_BUDGET_S = 0.01  # CPU per stream; bench/record_cost.py: ~0.6 ms for 60 chunks


def _rate(metric: str, by: str = "", selector: str = NAMESPACE) -> str:
    return rate_query(metric, selector, by)


def build() -> dash.Dashboard:
    relevance = alert("ContextRelevanceLow")
    board = dashboard(
        UID,
        "semhealth / Scorer and agent",
        "The sidecar at work: relevance scoring (scored, skipped, failed), the shared "
        "scorer's queue, batches, latency and overload, work shed under load, the tap queue, "
        "analysis time, the embedding cache, analysis restarts and requests the proxy "
        "rejected. These metrics carry no route or model.",
    ).variables(variables(route_and_model=False))

    cache_ratio = (
        f"{_rate('semhealth_embedding_cache_hits_total')}\n/\n"
        f"({_rate('semhealth_embedding_cache_hits_total')}"
        f" + {_rate('semhealth_embedding_cache_misses_total')})"
    )

    board = (
        board.with_row(row("Relevance scoring"))
        .with_panel(
            series(
                "Records scored, skipped and failed",
                "Records whose relevance was scored; skipped by reason (sampled_out, no_query, "
                "nothing_to_compare, incomplete, error_response); encoder failures.",
                [
                    (_rate("semhealth_relevance_scored_total"), "scored"),
                    (_rate("semhealth_relevance_skipped_total", "reason"), "skipped {{reason}}"),
                    (_rate("semhealth_relevance_errors_total"), "errors"),
                ],
                unit="ops",
                thresholds=steps((None, GREEN)),
                links=[runbook(relevance)],
                colors={"scored": GREEN, "errors": RED},
            )
        )
        .with_panel(
            series(
                "Embedding cache",
                "Hits and misses of the embedding cache per second.",
                [
                    (_rate("semhealth_embedding_cache_hits_total"), "hits"),
                    (_rate("semhealth_embedding_cache_misses_total"), "misses"),
                ],
                unit="ops",
                thresholds=steps((None, GREEN)),
                colors={"hits": GREEN, "misses": ORANGE},
            )
        )
        .with_panel(
            single(
                "Embedding cache hit ratio",
                "Hits / (hits + misses) of the embedding cache: repeated contexts (system "
                "prompts, documents) are embedded once.",
                [(cache_ratio, "hit ratio")],
                unit="percentunit",
                thresholds=steps((None, ORANGE), (0.2, GREEN)),
                width=8,
            )
        )
        .with_panel(
            single(
                "Scoring errors",
                "Encoder failures per second (local model or remote scorer).",
                [(_rate("semhealth_relevance_errors_total"), "errors")],
                unit="ops",
                thresholds=any_is_bad(RED),
                width=8,
            )
        )
        .with_panel(
            single(
                "Relevance work shed",
                'Records not scored because scoring fell behind (stage="relevance").',
                [
                    (
                        _rate(
                            "semhealth_dropped_total", selector=f'{NAMESPACE}, stage="relevance"'
                        ),
                        "shed",
                    )
                ],
                unit="ops",
                thresholds=any_is_bad(),
                width=8,
            )
        )
    )

    board = add_scorer_row(board)
    board = (
        board.with_row(row("Load and shed work"))
        .with_panel(
            series(
                "Work shed, by stage",
                "Analysis work dropped under load, never the client's bytes: tap (per chunk), "
                "relevance (per record), alerts (per sample).",
                [(_rate("semhealth_dropped_total", "stage"), "{{stage}}")],
                unit="ops",
                thresholds=any_is_bad(),
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Tap queue depth",
                "Response chunks waiting for analysis, per pod; the line is 80 % of the "
                f"default limits.tap_queue_size ({TAP_QUEUE_SIZE}), past which chunks are shed.",
                [(f"max by ({BY_POD}) (semhealth_tap_queue_depth{{{NAMESPACE}}})", "{{pod}}")],
                unit="short",
                thresholds=steps((None, GREEN), (0.8 * TAP_QUEUE_SIZE, ORANGE)),
                min_value=0,
            )
        )
        .with_panel(
            series(
                "Tap queue bytes",
                "Bytes of the response chunks waiting for analysis, per pod; the line is 80 % of "
                f"the default limits.tap_queue_bytes ({TAP_QUEUE_BYTES}), past which chunks are "
                "shed.",
                [(f"max by ({BY_POD}) (semhealth_tap_queue_bytes{{{NAMESPACE}}})", "{{pod}}")],
                unit="bytes",
                thresholds=steps((None, GREEN), (0.8 * TAP_QUEUE_BYTES, ORANGE)),
                min_value=0,
            )
        )
        .with_panel(
            series(
                "Streams shed and tap wire resets",
                "Exchanges whose analysis was incomplete because chunks were shed, and times a "
                "forwarder dropped its tap wire because analysis stopped reading.",
                [
                    (_rate("semhealth_streams_shed_total"), "streams shed"),
                    (_rate("semhealth_tap_wire_resets_total"), "tap wire resets"),
                ],
                unit="ops",
                thresholds=any_is_bad(),
            )
        )
        .with_panel(
            series(
                "Streams in flight and records",
                "Exchanges being relayed now per pod, and records analysed per second.",
                [
                    (
                        f"sum by ({BY_POD}) (semhealth_streams_active{{{NAMESPACE}}})",
                        "active {{pod}}",
                    ),
                    (_rate("semhealth_records_total"), "records/s"),
                ],
                unit="short",
                thresholds=steps((None, GREEN)),
            )
        )
    )

    analysis_quantiles = [
        (
            quantile_query(q, "semhealth_analysis_duration_seconds", NAMESPACE),
            f"P{round(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    ]
    return (
        board.with_row(row("Analysis process"))
        .with_panel(
            series(
                "Analysis time per stream",
                "CPU time the agent spent analysing one stream (framing, adapters, continuity, "
                f"validity). The line at {ANALYSIS_BUDGET_S * 1000:g} ms is a guide: "
                "bench/record_cost.py measures about 0.6 ms for a 60-chunk stream.",
                analysis_quantiles,
                unit="s",
                thresholds=steps((None, GREEN), (ANALYSIS_BUDGET_S, ORANGE)),
                min_value=0,
            )
        )
        .with_panel(
            series(
                "Analysis restarts",
                "Times the analysis process died and was started again (forwarding went on); "
                "each one is a bug to report.",
                [
                    (
                        f"sum by ({BY_POD}) (increase(semhealth_analysis_restarts_total"
                        f"{{{NAMESPACE}}}[{RATE}]))",
                        "{{pod}}",
                    )
                ],
                unit="short",
                thresholds=steps((None, GREEN), (1, RED)),
            )
        )
        .with_panel(
            series(
                "Requests rejected and forwarded unanalysed",
                "Requests the proxy answered itself and never forwarded, by reason (malformed, "
                "header_timeout, head_too_large, method_not_allowed), and requests forwarded "
                "without analysing their body (oversized).",
                [
                    (_rate("semhealth_requests_rejected_total", "reason"), "rejected {{reason}}"),
                    (
                        _rate("semhealth_requests_unanalysed_total", "reason"),
                        "unanalysed {{reason}}",
                    ),
                ],
                unit="reqps",
                thresholds=any_is_bad(),
            )
        )
        .with_panel(
            series(
                "Alertmanager delivery",
                "Alerts each agent sent to each Alertmanager, by outcome: sent (accepted), "
                "failed (given up after failed POSTs; resent while firing), dropped (queue "
                "full, shutdown); and the alerts waiting in each queue.",
                [
                    (
                        _rate("semhealth_alertmanager_alerts_total", "alertmanager, outcome"),
                        "{{outcome}} {{alertmanager}}",
                    ),
                    (
                        "max by (alertmanager) "
                        f"(semhealth_alertmanager_queue_length{{{NAMESPACE}}})",
                        "queued {{alertmanager}}",
                    ),
                ],
                unit="short",
                thresholds=steps((None, GREEN)),
                red_series=r"(failed|dropped) .*",
            )
        )
        .with_panel(
            series(
                "Failures inside semhealth",
                "Should stay at zero: analysis errors and alert evaluation failures (bugs, "
                "please report), failed OTLP pushes, and label values folded into other.",
                [
                    (_rate("semhealth_analysis_errors_total"), "analysis errors"),
                    (_rate("semhealth_alert_evaluation_failures_total"), "alert evaluation"),
                    (_rate("semhealth_otlp_export_failures_total"), "OTLP export"),
                    (_rate("semhealth_label_values_folded_total"), "label values folded"),
                ],
                unit="ops",
                thresholds=any_is_bad(RED),
            )
        )
    )
