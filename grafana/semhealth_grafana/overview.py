"""Overview: the three signals by route and model, validity failures, requests, alert states."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from semhealth_grafana.common import (
    ALERTS,
    GREEN,
    NAMESPACE,
    ORANGE,
    RATE,
    RED,
    SEMANTIC,
    above_is_bad,
    alert,
    any_is_bad,
    below_is_bad,
    dashboard,
    quantile_query,
    row,
    runbook,
    scalar_threshold,
    series,
    single,
    steps,
    variables,
)

UID = "semhealth-overview"


def _quantile(q: float, metric: str, window: str, by: str = "route, model") -> str:
    return quantile_query(q, metric, SEMANTIC, by, window)


def _validity(window: str, by: str = "") -> str:
    group = f"sum by ({by}) " if by else "sum"
    return (
        f'{group}(rate(semantic_health_outputs_total{{{SEMANTIC}, result="valid"}}[{window}]))'
        f"\n/\n{group}(rate(semantic_health_outputs_total{{{SEMANTIC}}}[{window}]))"
    )


def _canary(board: dash.Dashboard) -> dash.Dashboard:
    """Each variant's signals side by side: what CanaryRelevanceDrop, CanaryValidityDrop and
    CanaryAnswerRelevanceDrop compare, and what a rollout controller's analysis reads."""
    relevance = alert("CanaryRelevanceDrop")
    validity = alert("CanaryValidityDrop")
    answers = alert("CanaryAnswerRelevanceDrop")
    return (
        board.with_row(row("Canary against stable (series with a variant label)"))
        .with_panel(
            series(
                "Context relevance P50 by variant",
                "Each variant's median context relevance over the canary rules' window; "
                "CanaryRelevanceDrop fires when the canary's is more than 5 % below the "
                "stable variant's on a route.",
                [
                    (
                        _quantile(
                            0.5,
                            "semantic_health_context_relevance_score",
                            relevance.window,
                            by="route, variant",
                        ),
                        "{{route}} {{variant}}",
                    )
                ],
                unit="none",
                thresholds=steps((None, GREEN)),
                links=[runbook(relevance)],
                width=8,
                min_value=0,
                max_value=1,
            )
        )
        .with_panel(
            series(
                "Structured-output validity by variant",
                "Each variant's share of valid structured outputs; CanaryValidityDrop fires "
                "when the canary's is more than 5 % below the stable variant's.",
                [(_validity(validity.window, by="route, variant"), "{{route}} {{variant}}")],
                unit="percentunit",
                thresholds=steps((None, GREEN)),
                links=[runbook(validity)],
                width=8,
            )
        )
        .with_panel(
            series(
                "Answer relevance P50 by variant",
                "Each variant's median answer relevance; CanaryAnswerRelevanceDrop fires when "
                "the canary's is more than 5 % below the stable variant's.",
                [
                    (
                        _quantile(
                            0.5,
                            "semantic_health_answer_relevance_score",
                            answers.window,
                            by="route, variant",
                        ),
                        "{{route}} {{variant}}",
                    )
                ],
                unit="none",
                thresholds=steps((None, GREEN)),
                links=[runbook(answers)],
                width=8,
                min_value=0,
                max_value=1,
            )
        )
    )


def build() -> dash.Dashboard:
    relevance = alert("ContextRelevanceLow")
    validity = alert("OutputValidityLow")
    choppy = alert("StreamChoppy")
    relevance_floor = scalar_threshold("ContextRelevanceLow")
    validity_floor = scalar_threshold("OutputValidityLow")
    choppy_ceiling = scalar_threshold("StreamChoppy")
    relevance_metric = "semantic_health_context_relevance_score"
    continuity_metric = "semantic_health_stream_continuity_index_seconds"

    board = dashboard(
        UID,
        "semhealth / Overview",
        "What users experience, measured from the traffic by the semhealth sidecar: structured "
        "output validity, context relevance and stream continuity by route and model, why "
        "outputs fail, how requests end, and the alerts the agents evaluate.",
    ).variables(variables(route_and_model=True))

    board = (
        board.with_row(row("Signals now (over each default alert's window)"))
        .with_panel(
            single(
                "Structured-output validity",
                f"Valid / structured outputs over {validity.window}, the OutputValidityLow "
                f"signal (red below {validity_floor:.0%}).",
                [(_validity(validity.window), "validity")],
                unit="percentunit",
                thresholds=below_is_bad(validity_floor),
                links=[runbook(validity)],
                decimals=2,
            )
        )
        .with_panel(
            single(
                "Context relevance P50",
                f"Median calibrated context relevance over {relevance.window}, the "
                f"ContextRelevanceLow signal (red below {relevance_floor:g}).",
                [(_quantile(0.5, relevance_metric, relevance.window, by=""), "P50")],
                unit="none",
                thresholds=below_is_bad(relevance_floor),
                links=[runbook(relevance)],
                decimals=2,
            )
        )
        .with_panel(
            single(
                "Stream continuity index P95",
                f"95th percentile of the per-stream spread of the gaps between content deltas "
                f"over {choppy.window}, the StreamChoppy signal (red above "
                f"{choppy_ceiling * 1000:g} ms).",
                [(_quantile(0.95, continuity_metric, choppy.window, by=""), "P95")],
                unit="s",
                thresholds=above_is_bad(choppy_ceiling),
                links=[runbook(choppy)],
            )
        )
        .with_panel(
            single(
                "Alerts firing",
                "Alerts the agents hold in the firing state now (semhealth_alerts), summed "
                "over the selected namespaces.",
                [(f'sum(semhealth_alerts{{{NAMESPACE}, state="firing"}})', "firing")],
                unit="short",
                thresholds=steps((None, GREEN), (1, RED)),
            )
        )
    )

    board = (
        board.with_row(row("Signals by route and model"))
        .with_panel(
            series(
                "Structured-output validity by route and model",
                "Valid / structured outputs: the ratio of counter rates over the alert's "
                "window (fleet-wide, what the exported Prometheus rule evaluates), and each "
                "agent's own rolling-window gauge semantic_health_model_output_validity_rate, "
                "averaged over pods.",
                [
                    (_validity(validity.window, "route, model"), "{{route}} {{model}}"),
                    (
                        "avg by (route, model) "
                        f"(semantic_health_model_output_validity_rate{{{SEMANTIC}}})",
                        "{{route}} {{model}} (agent window)",
                    ),
                ],
                unit="percentunit",
                thresholds=below_is_bad(validity_floor),
                links=[runbook(validity)],
                max_value=1,
            )
        )
        .with_panel(
            series(
                "Context relevance P50 / P95 by route and model",
                "Calibrated relevance (0..1) of the context to the query. 0.75 is where the "
                "calibration puts even odds of relevant context; ContextRelevanceLow "
                "fires on the median below it.",
                [
                    (_quantile(0.5, relevance_metric, relevance.window), "P50 {{route}} {{model}}"),
                    (
                        _quantile(0.95, relevance_metric, relevance.window),
                        "P95 {{route}} {{model}}",
                    ),
                ],
                unit="none",
                thresholds=below_is_bad(relevance_floor),
                links=[runbook(relevance), runbook(ALERTS["RelevanceRegression"])],
                min_value=0,
                max_value=1,
            )
        )
        .with_panel(
            series(
                "Stream continuity index P95 by route and model",
                "Per stream, the population standard deviation of the intervals between "
                "content deltas; StreamChoppy fires on its P95 above the threshold line.",
                [(_quantile(0.95, continuity_metric, choppy.window), "{{route}} {{model}}")],
                unit="s",
                thresholds=above_is_bad(choppy_ceiling),
                links=[runbook(choppy)],
                min_value=0,
            )
        )
        .with_panel(
            series(
                "Answer relevance P50 by route and model",
                "Calibrated relevance of the answer to the query, scored next to context "
                "relevance (no default alert; the line is context relevance's 0.75).",
                [
                    (
                        _quantile(0.5, "semantic_health_answer_relevance_score", relevance.window),
                        "{{route}} {{model}}",
                    )
                ],
                unit="none",
                thresholds=below_is_bad(relevance_floor),
                min_value=0,
                max_value=1,
            )
        )
    )

    board = (
        board.with_row(row("Why outputs fail"))
        .with_panel(
            series(
                "Structured outputs that failed, by result",
                "truncated (max tokens, aborted streams), syntax (not JSON), schema / contract "
                "(JSON off its schema), schema_error (the schema itself is broken).",
                [
                    (
                        "sum by (result) (rate(semantic_health_outputs_total"
                        f'{{{SEMANTIC}, result!="valid"}}[{RATE}]))',
                        "{{result}}",
                    )
                ],
                unit="ops",
                thresholds=any_is_bad(),
                links=[runbook(validity)],
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Validity failure reasons",
                "The JSON Schema keyword or the syntax/truncation reason of each failure, never "
                "a value. This counter carries route but not model: the model selection does "
                "not apply.",
                [
                    (
                        "sum by (result, reason) (rate("
                        f"semantic_health_output_failure_reasons_total{{{SEMANTIC}}}[{RATE}]))",
                        "{{result}}: {{reason}}",
                    )
                ],
                unit="ops",
                thresholds=any_is_bad(),
                links=[runbook(validity)],
                stacked=True,
            )
        )
    )

    board = (
        board.with_row(row("Requests"))
        .with_panel(
            series(
                "Requests by status class",
                "Exchanges relayed, by HTTP status class; 499 (client gone before any "
                "response) counts in 4xx.",
                [
                    (
                        "sum by (status_class) (rate("
                        f"semantic_health_requests_total{{{SEMANTIC}}}[{RATE}]))",
                        "{{status_class}}",
                    )
                ],
                unit="reqps",
                thresholds=steps((None, GREEN)),
                stacked=True,
                colors={"2xx": GREEN, "4xx": ORANGE, "5xx": RED},
            )
        )
        .with_panel(
            series(
                "Failed requests by error type",
                "error_type is the HTTP status or the stream's error type; 429s are split by "
                "X-RateLimit-Source (429_upstream, 429_gateway); the proxy's own answers are "
                "upstream_unreachable, upstream_timeout, upstream_invalid_response, and "
                "client_aborted for a client gone mid-stream.",
                [
                    (
                        "sum by (status_class, error_type) (rate(semantic_health_requests_total"
                        f'{{{SEMANTIC}, error_type!=""}}[{RATE}]))',
                        "{{status_class}} {{error_type}}",
                    )
                ],
                unit="reqps",
                thresholds=any_is_bad(),
                stacked=True,
            )
        )
    )

    board = _canary(board)
    names = "|".join(sorted(ALERTS))
    return (
        board.with_row(row("Alerts"))
        .with_panel(
            series(
                "Agent alert states",
                "Alerts each agent evaluates over its own traffic, pending and firing now "
                "(semhealth_alerts), summed over pods.",
                [
                    (
                        f"sum by (state) (semhealth_alerts{{{NAMESPACE}}})",
                        "{{state}}",
                    )
                ],
                unit="short",
                thresholds=steps((None, GREEN), (1, RED)),
                links=[runbook(ref) for ref in ALERTS.values()],
            )
        )
        .with_panel(
            series(
                "Fleet alerts (PrometheusRule)",
                "The same default rules evaluated by Prometheus over the fleet's series (the "
                "chart's PrometheusRule, from `semhealth rules export`), by alert and state.",
                [
                    (
                        f'sum by (alertname, alertstate) (ALERTS{{alertname=~"{names}"}})',
                        "{{alertname}} {{alertstate}}",
                    )
                ],
                unit="short",
                thresholds=steps((None, GREEN), (1, RED)),
                links=[runbook(ref) for ref in ALERTS.values()],
            )
        )
    )
