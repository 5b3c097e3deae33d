"""The signals a rule can watch, and where each lives in Prometheus.

One table serves both evaluators: the agent feeds ``Sample``s named after a
``Signal`` into its windows, and the Prometheus export builds PromQL over the
series the agent exports for the same signal. A test pins every ``prometheus``
name here against the agent's instrument table, so the two cannot drift.

Rules use the rule-facing label names (``model``); ``prometheus_labels`` maps them
to the series' label names where the GenAI conventions spell them differently
(``gen_ai_response_model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["distribution", "ratio"]
Unit = Literal["", "s"]

# ``variant`` tells a canary's series from the stable ones' (and a shadow's from the primary's).
_SEMANTIC_LABELS = {
    "route": "route",
    "model": "model",
    "provider": "provider",
    "prompt_class": "prompt_class",
    "variant": "variant",
}
_GEN_AI_LABELS = {
    "route": "route",
    "model": "gen_ai_response_model",
    "provider": "gen_ai_provider_name",
    "prompt_class": "prompt_class",
    "variant": "variant",
}


@dataclass(frozen=True, slots=True)
class Signal:
    """A quantity rules can aggregate over a window.

    ``distribution`` signals are histograms in Prometheus (quantiles and means).
    ``ratio`` signals are the share of good events: samples are 1.0 (good) or 0.0, and
    Prometheus divides the rate of the counter's ``good`` series by the rate of all of it.
    """

    name: str
    kind: Kind
    unit: Unit
    prometheus: str  # histogram base name (without _bucket/_sum/_count) or counter name
    description: str
    prometheus_labels: Mapping[str, str] = field(default_factory=lambda: dict(_SEMANTIC_LABELS))
    good: Mapping[str, str] = field(default_factory=dict)  # ratio: the matcher for good events

    @property
    def labels(self) -> tuple[str, ...]:
        """The label names rules may group by or match on."""
        return tuple(self.prometheus_labels)

    @property
    def aggregations(self) -> tuple[str, ...]:
        if self.kind == "ratio":
            return ("ratio",)
        return ("p50", "p90", "p95", "p99", "mean")


SIGNALS: tuple[Signal, ...] = (
    Signal("context_relevance_score", "distribution", "",
           "semantic_health_context_relevance_score",
           "Calibrated relevance (0..1) of the context given to the model to the query."),
    Signal("answer_relevance_score", "distribution", "",
           "semantic_health_answer_relevance_score",
           "Calibrated relevance (0..1) of the answer to the query."),
    Signal("stream_continuity_index", "distribution", "s",
           "semantic_health_stream_continuity_index_seconds",
           "Per-stream std-dev of the intervals between content deltas."),
    Signal("stream_max_gap", "distribution", "s",
           "semantic_health_stream_max_gap_seconds",
           "Per-stream longest interval between two content deltas."),
    Signal("model_output_validity_rate", "ratio", "",
           "semantic_health_outputs_total",
           "Share of structured outputs that were valid JSON, valid against their schema "
           "and their route's contract.",
           good={"result": "valid"}),
    Signal("request_success_rate", "ratio", "",
           "semantic_health_requests_total",
           "Share of exchanges that ended without an error.",
           good={"error_type": ""}),
    Signal("operation_duration", "distribution", "s",
           "gen_ai_client_operation_duration_seconds",
           "GenAI operation duration, request sent to last byte.",
           prometheus_labels=_GEN_AI_LABELS),
    Signal("time_to_first_token", "distribution", "s",
           "gen_ai_server_time_to_first_token_seconds",
           "Time to the first content token of a successful streamed response.",
           prometheus_labels=_GEN_AI_LABELS),
    Signal("time_to_first_chunk", "distribution", "s",
           "gen_ai_client_operation_time_to_first_chunk_seconds",
           "Time to the first chunk of a successful streamed response.",
           prometheus_labels=_GEN_AI_LABELS),
    Signal("time_per_output_token", "distribution", "s",
           "gen_ai_server_time_per_output_token_seconds",
           "Mean time per output token after the first, per successful streamed response.",
           prometheus_labels=_GEN_AI_LABELS),
)  # fmt: skip


def signal_named(name: str) -> Signal | None:
    for signal in SIGNALS:
        if signal.name == name:
            return signal
    return None
