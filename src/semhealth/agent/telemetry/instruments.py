"""The agent's instruments, declared as one table.

Each row names an instrument, its kind, unit, description, bucket family and
the attribute keys it may carry (enforced by an SDK View, so a stray attribute
can never raise cardinality). ``Instruments`` builds them in one loop.

Prometheus names follow from the OpenTelemetry names: dots become
underscores, the unit ``s`` appends ``_seconds``, counters get ``_total``
(``gen_ai.server.time_to_first_token`` -> ``gen_ai_server_time_to_first_token_seconds``).
Ratios are left to PromQL; the queries are in the README.

Every instrument goes through ``batching``: measurements are held by series and reach the
SDK once a collection, and every histogram takes ``StreamIntervals``, many values in one
measurement (a stream's chunk intervals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics.view import View

from semhealth.agent.telemetry import buckets
from semhealth.agent.telemetry.batching import (
    BatchedHistogramAggregation,
    DeferredCounter,
    DeferredHistogram,
    Held,
)

Kind = Literal["counter", "histogram"]

# Attribute keys. GenAI metrics use the semantic conventions' names; the
# semantic-health metrics use short label names a PromQL user types every day.
ROUTE = "route"
MODEL = "model"
PROVIDER = "provider"
TOOL_KIND = "tool_kind"
PROMPT_CLASS = "prompt_class"
STATUS_CLASS = "status_class"
ERROR_TYPE = "error_type"
RESULT = "result"
REASON = "reason"
OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
TOKEN_TYPE = "gen_ai.token.type"
ERROR = "error.type"
SOURCE = "source"  # proxy | otlp: which tap built the record
# primary | shadow while live shadowing runs (RecorderSettings.variant); else absent.
VARIANT = "variant"

_SEMANTIC = (ROUTE, MODEL, PROVIDER, PROMPT_CLASS, SOURCE, VARIANT)
# PROVIDER (the wire format, as on the semantic series) beside the conventions' provider name:
# one provider variable filters every dashboard panel, and it adds no series (one follows
# from the other).
_GEN_AI = (
    OPERATION, GEN_AI_PROVIDER, REQUEST_MODEL, RESPONSE_MODEL, ROUTE, PROMPT_CLASS, SOURCE,
    PROVIDER, VARIANT,
)  # fmt: skip
# Live shadowing's pair measures: a first divergence is a token position.
_FIRST_DIVERGENCE = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
# Most pairs of a good candidate sit near 0 (identical or one word apart).
_TOKEN_DISTANCE = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    kind: Kind
    unit: str
    description: str
    attributes: tuple[str, ...]
    buckets: tuple[float, ...] | None = None


SPECS = (
    # --- semantic health ------------------------------------------------------------------
    Spec("semantic_health_outputs", "counter", "",
         "Structured outputs checked, by result: valid, truncated, syntax, schema, contract, "
         "schema_error.", (*_SEMANTIC, RESULT)),
    Spec("semantic_health_output_failure_reasons", "counter", "",
         "Why structured outputs failed: the JSON Schema keyword that rejected them, or the "
         "syntax/truncation reason. Never a value from the output.",
         (*_SEMANTIC, RESULT, REASON)),
    Spec("semantic_health_stream_continuity_index", "histogram", "s",
         "Per-stream population std-dev of the intervals between content deltas.",
         _SEMANTIC, buckets.CONTINUITY_S),
    Spec("semantic_health_stream_max_gap", "histogram", "s",
         "Per-stream longest interval between two content deltas.", _SEMANTIC, buckets.MAX_GAP_S),
    Spec("semantic_health_stream_stalls", "counter", "",
         "Gaps between content deltas longer than analysis.stall_threshold_s.", _SEMANTIC),
    Spec("semantic_health_context_relevance_score", "histogram", "",
         "Calibrated relevance (0..1) of the context given to the model to the user's query.",
         _SEMANTIC, buckets.RELEVANCE),
    Spec("semantic_health_answer_relevance_score", "histogram", "",
         "Calibrated relevance (0..1) of the answer to the user's query.",
         _SEMANTIC, buckets.RELEVANCE),
    Spec("semantic_health_provider_tool_calls", "counter", "",
         "Tools the provider ran itself (web search and fetch, code execution, file search, "
         "image generation, remote MCP), by kind; never the caller's tool calls.",
         (*_SEMANTIC, TOOL_KIND)),
    Spec("semantic_health_requests", "counter", "",
         "Exchanges relayed, by status class and error type (429s split by X-RateLimit-Source).",
         (ROUTE, MODEL, PROVIDER, PROMPT_CLASS, SOURCE, STATUS_CLASS, ERROR_TYPE, VARIANT)),
    # --- live shadowing's pair measures (counters: semhealth.agent.shadow.metrics) ----------
    Spec("semantic_health_shadow_token_distance", "histogram", "",
         "Normalised token edit distance (0..1) between the primary's and the candidate's "
         "answers.", (ROUTE,), _TOKEN_DISTANCE),
    Spec("semantic_health_shadow_first_divergence_tokens", "histogram", "{token}",
         "Token position where the candidate's answer first differs from the primary's.",
         (ROUTE,), _FIRST_DIVERGENCE),
    Spec("semantic_health_shadow_answer_agreement", "histogram", "",
         "Semantic agreement (0..1, calibrated) of the candidate's answer with the primary's.",
         (ROUTE,), buckets.RELEVANCE),
    # --- OpenTelemetry GenAI semantic conventions -------------------------------------------
    Spec("gen_ai.client.operation.duration", "histogram", "s",
         "GenAI operation duration.", (*_GEN_AI, ERROR), buckets.GEN_AI_DURATION_S),
    Spec("gen_ai.client.token.usage", "histogram", "{token}",
         "Number of input and output tokens used.", (*_GEN_AI, TOKEN_TYPE), buckets.GEN_AI_TOKENS),
    # The conventions' token-usage histogram has two token types, input and output, and
    # output includes reasoning; their open change (semantic-conventions-genai, "inference
    # token metrics") gives reasoning an instrument of its own, so it is never counted twice.
    Spec("gen_ai.client.inference.usage.reasoning.output_tokens", "histogram", "{token}",
         "Number of output tokens the model spent reasoning, as its provider reported them.",
         _GEN_AI, buckets.GEN_AI_TOKENS),
    Spec("gen_ai.server.time_to_first_token", "histogram", "s",
         "Time to generate first token for successful responses.", _GEN_AI, buckets.GEN_AI_TTFT_S),
    Spec("gen_ai.server.time_per_output_token", "histogram", "s",
         "Time per output token generated after the first token for successful responses.",
         _GEN_AI, buckets.GEN_AI_TPOT_S),
    Spec("gen_ai.client.operation.time_to_first_chunk", "histogram", "s",
         "Time to receive the first chunk of a streamed response.", _GEN_AI,
         buckets.GEN_AI_DURATION_S),
    Spec("gen_ai.client.operation.time_per_output_chunk", "histogram", "s",
         "Time between consecutive chunks of a streamed response, for each chunk after the first.",
         _GEN_AI, buckets.GEN_AI_DURATION_S),
    # --- the agent itself -------------------------------------------------------------------
    Spec("semhealth_analysis_duration", "histogram", "s",
         "CPU time the agent spent analysing one stream.", (), buckets.ANALYSIS_S),
)  # fmt: skip


def views() -> list[View]:
    """Bucket boundaries and attribute allow-lists for every instrument in ``SPECS``."""
    out = []
    for spec in SPECS:
        keys = set(spec.attributes)
        if spec.buckets is None:
            out.append(View(instrument_name=spec.name, attribute_keys=keys))
        else:
            aggregation = BatchedHistogramAggregation(spec.buckets)
            out.append(
                View(instrument_name=spec.name, attribute_keys=keys, aggregation=aggregation)
            )
    return out


class Instruments:
    """The instruments of ``SPECS``, by name, their measurements held until collection."""

    def __init__(self, meter: Meter) -> None:
        self.held = held = Held(meter)
        self.counters: dict[str, DeferredCounter] = {}
        self.histograms: dict[str, DeferredHistogram] = {}
        for spec in SPECS:
            if spec.kind == "counter":
                counter = meter.create_counter(
                    spec.name, unit=spec.unit, description=spec.description
                )
                self.counters[spec.name] = DeferredCounter(counter, held)
            else:
                histogram = meter.create_histogram(
                    spec.name, unit=spec.unit, description=spec.description
                )
                self.histograms[spec.name] = DeferredHistogram(histogram, held)
