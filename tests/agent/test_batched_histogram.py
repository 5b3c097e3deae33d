"""A stream's chunk intervals recorded as one ``StreamIntervals`` measurement, through the
agent's instruments (held until collection, then one batch a series), export exactly the
histogram that recording each interval straight into the SDK gives: bucket counts, count,
sum (bit for bit), min and max, in every temporality, through the SDK's own readers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry, generate_latest

from semhealth.agent.telemetry import buckets
from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.batching import BatchedHistogramAggregation, StreamIntervals

NAME = "gen_ai.client.operation.time_per_output_chunk"
SPEC = next(spec for spec in m.SPECS if spec.name == NAME)
ATTRS = [
    {m.OPERATION: "chat", m.GEN_AI_PROVIDER: "openai", m.REQUEST_MODEL: "a", m.RESPONSE_MODEL: "a",
     m.ROUTE: "chat", m.PROMPT_CLASS: "short"},
    {m.OPERATION: "chat", m.GEN_AI_PROVIDER: "anthropic", m.REQUEST_MODEL: "b",
     m.RESPONSE_MODEL: "b", m.ROUTE: "messages", m.PROMPT_CLASS: "long_context"},
]  # fmt: skip

Temporality = AggregationTemporality


def _per_value_views() -> list[View]:
    """The agent's views, with the SDK's plain aggregation for the per-chunk histogram."""
    plain = View(
        instrument_name=NAME,
        attribute_keys=set(SPEC.attributes),
        aggregation=ExplicitBucketHistogramAggregation(SPEC.buckets),
    )
    return [plain if view._instrument_name == NAME else view for view in m.views()]


class _Pipeline:
    """The agent's instruments and views, or (``agent=False``) the SDK's own histogram under
    the SDK's plain aggregation, each value its own ``record()``."""

    def __init__(self, temporality: Temporality, *, agent: bool = True) -> None:
        self.reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality})
        views = m.views() if agent else _per_value_views()
        self.provider = MeterProvider(metric_readers=[self.reader], views=views)
        meter = self.provider.get_meter("test")
        self.histogram: Any = (
            m.Instruments(meter).histograms[NAME]
            if agent
            else meter.create_histogram(NAME, unit=SPEC.unit, description=SPEC.description)
        )

    def points(self) -> list[tuple[Any, ...]]:
        """Every data point of the instrument, without its timestamps."""
        data = self.reader.get_metrics_data()
        out = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    assert metric.name == NAME
                    for p in metric.data.data_points:
                        out.append(
                            (
                                sorted(p.attributes.items()),
                                p.bucket_counts,
                                p.explicit_bounds,
                                p.count,
                                p.sum,
                                p.min,
                                p.max,
                            )
                        )
        return sorted(out, key=repr)


def _interval() -> st.SearchStrategy[float]:
    boundaries = buckets.GEN_AI_DURATION_S
    return st.one_of(
        st.sampled_from(boundaries),  # a boundary falls into the bucket it closes
        st.sampled_from([math.nextafter(b, math.inf) for b in boundaries]),
        st.integers(min_value=0, max_value=120 * 10**9).map(lambda ns: ns / 1e9),
        st.floats(min_value=0.0, max_value=200.0, allow_nan=False),
    )


# One step: a stream's intervals under one of the attribute sets, or a collection.
_STEP = st.one_of(
    st.tuples(st.sampled_from([0, 1]), st.lists(_interval(), max_size=80)),
    st.just(None),
)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(_STEP, min_size=1, max_size=12),
    temporality=st.sampled_from([Temporality.CUMULATIVE, Temporality.DELTA]),
)
def test_one_batch_per_stream_exports_what_one_value_per_interval_exports(
    steps: list[tuple[int, list[float]] | None], temporality: Temporality
) -> None:
    batched = _Pipeline(temporality)
    per_value = _Pipeline(temporality, agent=False)
    for step in [*steps, None]:
        if step is None:
            assert batched.points() == per_value.points()
            continue
        which, values = step
        batched.histogram.record(StreamIntervals(values), ATTRS[which])
        for value in values:
            per_value.histogram.record(value, ATTRS[which])


def test_the_prometheus_text_is_the_same_either_way() -> None:
    texts = []
    for views, batch in ((m.views(), True), (_per_value_views(), False)):
        registry = CollectorRegistry(auto_describe=True)
        reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
        provider = MeterProvider(metric_readers=[reader], views=views)
        meter = provider.get_meter("test")
        histogram: Any = (
            m.Instruments(meter).histograms[NAME]
            if batch
            else meter.create_histogram(NAME, unit=SPEC.unit, description=SPEC.description)
        )
        for stream in range(20):
            values = [(stream * 7 + i * 13) % 97 / 1000 for i in range(64)]
            if not batch or stream % 2:
                for value in values:
                    histogram.record(value, ATTRS[stream % 2])
            else:
                histogram.record(StreamIntervals(values), ATTRS[stream % 2])
        texts.append(generate_latest(registry))
    assert b"gen_ai_client_operation_time_per_output_chunk_seconds_bucket" in texts[0]
    assert texts[0] == texts[1]


@pytest.mark.parametrize(
    "values",
    [[0.02, -0.01, 0.03], [0.02, math.nan, 0.03], [math.inf, 0.02], [-math.inf, 0.04]],
    ids=["negative", "nan", "inf", "minus-inf"],
)
def test_values_the_sdk_refuses_one_by_one_are_left_out_of_a_batch(values: Sequence[float]) -> None:
    batched = _Pipeline(Temporality.CUMULATIVE)
    per_value = _Pipeline(Temporality.CUMULATIVE, agent=False)
    batched.histogram.record(StreamIntervals(values), ATTRS[0])
    for value in values:
        per_value.histogram.record(value, ATTRS[0])
    assert batched.points() == per_value.points()
    assert batched.points()[0][3] == sum(1 for v in values if 0 <= v < math.inf)


def test_an_empty_batch_opens_no_series() -> None:
    # The SDK opens a series for the attributes of every record() call before it aggregates:
    # an empty batch must not reach it, or a zero-count series would be exported that no
    # interval ever opened.
    batched = _Pipeline(Temporality.CUMULATIVE)
    batched.histogram.record(StreamIntervals([]), ATTRS[0])
    assert batched.points() == []


def test_a_plain_value_is_aggregated_as_by_the_sdk() -> None:
    batched = _Pipeline(Temporality.CUMULATIVE)
    per_value = _Pipeline(Temporality.CUMULATIVE, agent=False)
    batched.histogram.record(0.05, ATTRS[0])
    batched.histogram.record(StreamIntervals([0.01]), ATTRS[0])
    per_value.histogram.record(0.05, ATTRS[0])
    per_value.histogram.record(0.01, ATTRS[0])
    assert batched.points() == per_value.points()


def test_every_histogram_takes_batches() -> None:
    # Held measurements reach every histogram as one batch a series: an instrument whose
    # aggregation took a batch as one value (its sum) would count it wrong.
    histograms = {spec.name for spec in m.SPECS if spec.kind == "histogram"}
    kinds = {view._instrument_name: type(view._aggregation) for view in m.views()}
    assert {name: kinds[name] for name in histograms} == dict.fromkeys(
        histograms, BatchedHistogramAggregation
    )
