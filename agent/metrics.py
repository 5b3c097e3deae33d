"""The agent's instruments, declared as one table.

Each row names an instrument, its kind, unit, description, bucket family and
the attribute keys it may carry (enforced by an SDK View, so a stray attribute
can never raise cardinality). ``Instruments`` builds them in one loop.

Prometheus names follow from the OpenTelemetry names: dots become
underscores, the unit ``s`` appends ``_seconds``, counters get ``_total``
(``gen_ai.server.time_to_first_token`` -> ``gen_ai_server_time_to_first_token_seconds``).
Ratios are left to PromQL; the queries are in the README.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opentelemetry.metrics import Counter, Histogram, Meter
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from semhealth.agent import buckets

Kind = Literal["counter", "histogram"]

# Attribute keys. GenAI metrics use the semantic conventions' names; the
# semantic-health metrics use short label names a PromQL user types every day.
ROUTE = "route"
MODEL = "model"
PROVIDER = "provider"
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

_SEMANTIC = (ROUTE, MODEL, PROVIDER, PROMPT_CLASS)
_GEN_AI = (OPERATION, GEN_AI_PROVIDER, REQUEST_MODEL, RESPONSE_MODEL, ROUTE, PROMPT_CLASS)


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
         "syntax/truncation reason. Never a value from the output.", (ROUTE, RESULT, REASON)),
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
    Spec("semantic_health_requests", "counter", "",
         "Exchanges relayed, by status class and error type (429s split by X-RateLimit-Source).",
         (ROUTE, MODEL, PROVIDER, PROMPT_CLASS, STATUS_CLASS, ERROR_TYPE)),
    # --- OpenTelemetry GenAI semantic conventions -------------------------------------------
    Spec("gen_ai.client.operation.duration", "histogram", "s",
         "GenAI operation duration.", (*_GEN_AI, ERROR), buckets.GEN_AI_DURATION_S),
    Spec("gen_ai.client.token.usage", "histogram", "{token}",
         "Number of input and output tokens used.", (*_GEN_AI, TOKEN_TYPE), buckets.GEN_AI_TOKENS),
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
            aggregation = ExplicitBucketHistogramAggregation(spec.buckets)
            out.append(
                View(instrument_name=spec.name, attribute_keys=keys, aggregation=aggregation)
            )
    return out


class Instruments:
    """The instruments of ``SPECS``, by name."""

    def __init__(self, meter: Meter) -> None:
        self.counters: dict[str, Counter] = {}
        self.histograms: dict[str, Histogram] = {}
        for spec in SPECS:
            if spec.kind == "counter":
                self.counters[spec.name] = meter.create_counter(
                    spec.name, unit=spec.unit, description=spec.description
                )
            else:
                self.histograms[spec.name] = meter.create_histogram(
                    spec.name, unit=spec.unit, description=spec.description
                )
