"""Streams: time to first token, per-chunk latency, continuity, gaps, stalls and throttling,
by prompt class."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import dashboard as model

from semhealth_grafana.common import (
    GEN_AI,
    GREEN,
    ORANGE,
    RATE,
    RED,
    SEMANTIC,
    STALL_THRESHOLD_S,
    above_is_bad,
    alert,
    any_is_bad,
    dashboard,
    quantile_query,
    row,
    runbook,
    scalar_threshold,
    series,
    steps,
    variables,
)

UID = "semhealth-streams"


def _quantiles(metric: str, selector: str, window: str, *qs: float) -> list[tuple[str, str]]:
    return [
        (
            quantile_query(q, metric, selector, "prompt_class", window),
            f"P{round(q * 100)} {{{{prompt_class}}}}",
        )
        for q in qs
    ]


def build() -> dash.Dashboard:
    ttft = alert("SlowFirstToken")
    choppy = alert("StreamChoppy")
    latency = alert("LatencySLO")
    ttft_ceiling = scalar_threshold("SlowFirstToken")
    choppy_ceiling = scalar_threshold("StreamChoppy")
    budgets = latency.threshold
    assert isinstance(budgets, dict)
    stall_ms = f"{STALL_THRESHOLD_S * 1000:g} ms"

    board = dashboard(
        UID,
        "semhealth / Streams",
        "How streamed responses arrive, by prompt class: time to first token, time between "
        "chunks, the continuity index, the longest gap, stalls, overall latency against each "
        "prompt class's budget, and who throttled (upstream or gateway).",
    ).variables(variables(route_and_model=True))

    duration = series(
        "Operation duration P95 by prompt class",
        "Whole operations against the LatencySLO budget of their prompt class: "
        + ", ".join(f"{name} {value * 1000:g} ms" for name, value in sorted(budgets.items()))
        + ". Each class draws its own budget as a dashed line (the panel's default is the "
        "smallest).",
        _quantiles("gen_ai_client_operation_duration_seconds", GEN_AI, latency.window, 0.95),
        unit="s",
        thresholds=above_is_bad(min(budgets.values())),
        links=[runbook(latency)],
        min_value=0,
    )
    for name, budget in sorted(budgets.items()):
        duration = duration.override_by_regexp(
            f".* {name}$",
            [
                model.DynamicConfigValue(
                    id_val="thresholds",
                    value=steps((None, GREEN), (budget, RED)).build(),
                )
            ],
        )

    board = (
        board.with_row(row("Latency"))
        .with_panel(
            series(
                "Time to first token P50 / P95 by prompt class",
                "From the request to the first content delta of a streamed response "
                f"(gen_ai_server_time_to_first_token_seconds); SlowFirstToken fires on P95 "
                f"above {ttft_ceiling * 1000:g} ms.",
                _quantiles(
                    "gen_ai_server_time_to_first_token_seconds", GEN_AI, ttft.window, 0.5, 0.95
                ),
                unit="s",
                thresholds=above_is_bad(ttft_ceiling),
                links=[runbook(ttft)],
                min_value=0,
            )
        )
        .with_panel(duration)
        .with_panel(
            series(
                "Time per output chunk P50 / P95 by prompt class",
                "The interval between consecutive chunks of a streamed response, one value per "
                "chunk after the first. The line is the stall threshold "
                f"(analysis.stall_threshold_s, {stall_ms} by default).",
                _quantiles(
                    "gen_ai_client_operation_time_per_output_chunk_seconds",
                    GEN_AI,
                    RATE,
                    0.5,
                    0.95,
                ),
                unit="s",
                thresholds=steps((None, GREEN), (STALL_THRESHOLD_S, ORANGE)),
                min_value=0,
            )
        )
        .with_panel(
            series(
                "Time per output token P95 by prompt class",
                "Server time per output token after the first (the GenAI conventions' "
                "gen_ai_server_time_per_output_token_seconds). The line is the StreamChoppy "
                "threshold: a token slower than that is as long as the spread the alert allows.",
                _quantiles("gen_ai_server_time_per_output_token_seconds", GEN_AI, RATE, 0.95),
                unit="s",
                thresholds=steps((None, GREEN), (choppy_ceiling, ORANGE)),
                min_value=0,
            )
        )
    )

    board = board.with_panel(
        series(
            "Tokens per second by type and prompt class",
            "Input and output tokens from the usage each stream reports "
            "(gen_ai_client_token_usage; OpenAI streams report it with "
            "stream_options.include_usage). Throughput, so no threshold line.",
            [
                (
                    "sum by (gen_ai_token_type, prompt_class) "
                    f"(rate(gen_ai_client_token_usage_sum{{{GEN_AI}}}[{RATE}]))",
                    "{{gen_ai_token_type}} {{prompt_class}}",
                )
            ],
            unit="short",
            thresholds=steps((None, GREEN)),
            stacked=True,
            width=24,
        )
    )

    board = (
        board.with_row(row("Continuity"))
        .with_panel(
            series(
                "Stream continuity index P50 / P95 by prompt class",
                "Per stream, the population standard deviation of the intervals between "
                f"content deltas; StreamChoppy fires on P95 above {choppy_ceiling * 1000:g} ms.",
                _quantiles(
                    "semantic_health_stream_continuity_index_seconds",
                    SEMANTIC,
                    choppy.window,
                    0.5,
                    0.95,
                ),
                unit="s",
                thresholds=above_is_bad(choppy_ceiling),
                links=[runbook(choppy)],
                min_value=0,
            )
        )
        .with_panel(
            series(
                "Longest gap per stream P95 by prompt class",
                "Each stream's longest interval between two content deltas; past the stall "
                f"threshold ({stall_ms}) the gap is also counted as a stall.",
                _quantiles("semantic_health_stream_max_gap_seconds", SEMANTIC, RATE, 0.95),
                unit="s",
                thresholds=above_is_bad(STALL_THRESHOLD_S),
                links=[runbook(choppy)],
                min_value=0,
            )
        )
        .with_panel(
            series(
                "Stalls by prompt class",
                f"Gaps between content deltas longer than {stall_ms} "
                "(analysis.stall_threshold_s), per second.",
                [
                    (
                        "sum by (prompt_class) (rate("
                        f"semantic_health_stream_stalls_total{{{SEMANTIC}}}[{RATE}]))",
                        "{{prompt_class}}",
                    )
                ],
                unit="ops",
                thresholds=any_is_bad(),
                links=[runbook(choppy)],
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Throttling: upstream vs gateway",
                "429 answers split by X-RateLimit-Source: 429_upstream (the model server or "
                "provider throttled) and 429_gateway (a gateway in front of it did); 429 when "
                "the header is absent.",
                [
                    (
                        "sum by (error_type, prompt_class) (rate(semantic_health_requests_total"
                        f'{{{SEMANTIC}, error_type=~"429.*"}}[{RATE}]))',
                        "{{error_type}} {{prompt_class}}",
                    )
                ],
                unit="reqps",
                thresholds=any_is_bad(),
                stacked=True,
            )
        )
    )
    return board
