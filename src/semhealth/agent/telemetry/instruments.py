"""The agent's instruments, declared as one table.

Each row names an instrument, its kind, unit, description, bucket family and
the attribute keys it may carry (enforced by an SDK View, so a stray attribute
can never raise cardinality). ``Instruments`` builds them in one loop.

Prometheus names follow from the OpenTelemetry names: dots become
underscores, the unit ``s`` appends ``_seconds``, counters get ``_total``
(``gen_ai.server.time_to_first_token`` -> ``gen_ai_server_time_to_first_token_seconds``).
Ratios are left to PromQL; the queries are in the README.

``gen_ai.client.operation.time_per_output_chunk`` takes one value per chunk interval, 50 or
more per stream. An SDK ``Histogram.record`` costs about 10 µs (it validates and hashes the
attributes on every call), more than the rest of a stream's analysis per chunk. So a stream's
intervals reach the SDK as one ``StreamIntervals`` measurement, and that instrument's View
aggregates with ``BatchedHistogramAggregation``: the SDK's own explicit-bucket aggregation,
fed each interval in turn. The exported histogram is the one recording each interval would
give, to the last bit of its sum (``tests/agent/test_batched_histogram.py``).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry.metrics import Counter, Histogram, Meter
from opentelemetry.sdk.metrics._internal.aggregation import (
    _Aggregation,
    _ExplicitBucketHistogramAggregation,
)
from opentelemetry.sdk.metrics._internal.measurement import Measurement
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from semhealth.agent.telemetry import buckets

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
    batched: bool = False  # takes StreamIntervals: many values in one record() call


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
         _GEN_AI, buckets.GEN_AI_DURATION_S, batched=True),
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
            aggregation = (
                BatchedHistogramAggregation(spec.buckets)
                if spec.batched
                else ExplicitBucketHistogramAggregation(spec.buckets)
            )
            out.append(
                View(instrument_name=spec.name, attribute_keys=keys, aggregation=aggregation)
            )
    return out


class StreamIntervals(float):
    """Many values of one histogram as one measurement: ``Histogram.record(StreamIntervals(...))``.

    Its float value is the values' sum, which is all the SDK's own checks (finite, not
    negative) and the exemplar filter look at; ``values`` are what the instrument's
    ``BatchedHistogramAggregation`` counts. Values the SDK would refuse one by one (negative,
    NaN, infinite) are left out here, as it would leave them out. Record a batch only when
    ``values`` is not empty: the SDK opens a series for the attributes of every call.
    """

    __slots__ = ("values",)
    values: tuple[float, ...]

    def __new__(cls, values: Iterable[float]) -> StreamIntervals:
        kept = tuple(values)
        total = sum(kept)
        # NaN makes the total NaN; infinity, infinite or NaN; a negative value, a negative min.
        if kept and not (math.isfinite(total) and min(kept) >= 0.0):
            kept = tuple(v for v in kept if 0.0 <= v < math.inf)
            total = sum(kept)
        batch = super().__new__(cls, total)
        batch.values = kept
        return batch


class BatchedHistogramAggregation(ExplicitBucketHistogramAggregation):
    """``ExplicitBucketHistogramAggregation`` that also takes ``StreamIntervals``.

    The SDK builds its own explicit-bucket aggregation (boundaries, temporality, min/max,
    exemplar reservoir, all as configured); only its class changes, so that a batch is
    handed to the SDK's ``aggregate`` one value at a time, in order: the buckets, count,
    sum, min and max are those the values give recorded one by one. A plain number is
    aggregated exactly as by the SDK.
    """

    def _create_aggregation(self, *args: Any, **kwargs: Any) -> _Aggregation[Any]:
        aggregation = super()._create_aggregation(*args, **kwargs)
        # Swapping the class keeps the SDK's constructor and its arguments, whatever they are
        # in this SDK version; _Batched adds no state, only a method.
        if type(aggregation) is _ExplicitBucketHistogramAggregation:
            aggregation.__class__ = _Batched
        return aggregation


class _Value:
    """One value of a batch for the exemplar reservoir, shaped like the SDK's ``Measurement``:
    building a real one would validate the attributes again, once per value."""

    __slots__ = ("attributes", "context", "instrument", "time_unix_nano", "value")

    def __init__(self, value: float, batch: Measurement) -> None:
        self.value = value
        self.time_unix_nano = batch.time_unix_nano
        self.instrument = batch.instrument
        self.context = batch.context
        self.attributes = batch.attributes


class _Batched(_ExplicitBucketHistogramAggregation):
    def aggregate(self, measurement: Measurement, should_sample_exemplar: bool = True) -> None:
        batch = measurement.value
        if not isinstance(batch, StreamIntervals):
            super().aggregate(measurement, should_sample_exemplar)
            return
        # The body of the SDK's aggregate, once per value in order, under one lock: calling
        # it per value costs ~1.5 µs a value, this ~0.2 µs. test_batched_histogram.py holds
        # the two to the same result, bit for bit.
        values = batch.values
        if not values:
            return
        boundaries = self._boundaries
        state: Any = self  # the SDK types its fields by their initial values (None, 0)
        with self._lock:
            if state._value is None:
                state._value = self._get_empty_bucket_counts()
            counts = state._value
            total = state._sum
            for value in values:
                total += value  # in order, as one call per value adds them
                counts[bisect_left(boundaries, value)] += 1
            state._sum = total
            if self._record_min_max:
                state._min = min(state._min, *values)
                state._max = max(state._max, *values)
        if should_sample_exemplar:
            for value in values:
                exemplar: Any = _Value(value, measurement)
                self._sample_exemplar(exemplar, should_sample_exemplar)


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
