"""The agent's instruments hold their measurements by series and hand them to the SDK when a
reader collects: every reader, collecting in any order, exports what one SDK call a
measurement exports."""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricsData,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.telemetry import batching
from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.batching import Held, StreamIntervals

REQUESTS = "semantic_health_requests"
DURATION = "gen_ai.client.operation.duration"
A = {m.ROUTE: "chat", m.MODEL: "gpt", m.PROVIDER: "openai"}
B = {m.ROUTE: "embed", m.MODEL: "gpt", m.PROVIDER: "openai"}


class _Readers:
    """The agent's views and instruments under an in-memory reader and a Prometheus one."""

    def __init__(self, temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE):
        self.memory = InMemoryMetricReader(
            preferred_temporality={Counter: temporality, Histogram: temporality}
        )
        self.registry = CollectorRegistry(auto_describe=True)
        prometheus = PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)
        provider = MeterProvider(metric_readers=[self.memory, prometheus], views=m.views())
        self.instruments = m.Instruments(provider.get_meter("test"))

    def points(self, data: MetricsData | None = None) -> dict[tuple[str, str], Any]:
        """(instrument, route) -> the counter's value or the histogram's (count, sum)."""
        data = data if data is not None else self.memory.get_metrics_data()
        out: dict[tuple[str, str], Any] = {}
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        route = str(point.attributes.get(m.ROUTE))
                        value = getattr(point, "value", None)
                        if value is None:
                            value = (point.count, point.sum)
                        out[(metric.name, route)] = value
        return out

    def prometheus(self, family: str, route: str) -> float:
        for metric in text_string_to_metric_families(generate_latest(self.registry).decode()):
            for sample in metric.samples:
                if sample.name == family and sample.labels.get(m.ROUTE) == route:
                    return float(sample.value)
        raise AssertionError(f"{family} for {route} not exported")


def test_a_collection_right_after_a_measurement_exports_it() -> None:
    readers = _Readers()
    readers.instruments.counters[REQUESTS].add(1, A)
    readers.instruments.histograms[DURATION].record(0.5, A)
    assert readers.points() == {(REQUESTS, "chat"): 1, (DURATION, "chat"): (1, 0.5)}


def test_measurements_of_one_series_are_summed_into_one() -> None:
    readers = _Readers()
    for _ in range(5):
        readers.instruments.counters[REQUESTS].add(2, A)
        readers.instruments.histograms[DURATION].record(0.25, A)
    readers.instruments.counters[REQUESTS].add(1, B)
    assert readers.points() == {
        (REQUESTS, "chat"): 10,
        (REQUESTS, "embed"): 1,
        (DURATION, "chat"): (5, 1.25),
    }


def test_every_reader_sees_the_measurements_whichever_collects_first() -> None:
    readers = _Readers()
    readers.instruments.counters[REQUESTS].add(3, A)
    assert readers.prometheus("semantic_health_requests_total", "chat") == 3.0
    assert readers.points()[(REQUESTS, "chat")] == 3
    readers.instruments.counters[REQUESTS].add(4, A)
    assert readers.points()[(REQUESTS, "chat")] == 7
    assert readers.prometheus("semantic_health_requests_total", "chat") == 7.0


def test_a_delta_reader_gets_each_measurement_in_one_collection_only() -> None:
    readers = _Readers(AggregationTemporality.DELTA)
    readers.instruments.counters[REQUESTS].add(3, A)
    assert readers.points()[(REQUESTS, "chat")] == 3
    readers.instruments.counters[REQUESTS].add(4, A)
    assert readers.points()[(REQUESTS, "chat")] == 4
    assert readers.points() == {}


def test_a_batch_and_plain_values_of_one_series_are_counted_together() -> None:
    readers = _Readers()
    histogram = readers.instruments.histograms[DURATION]
    histogram.record(StreamIntervals([0.1, 0.2]), A)
    histogram.record(0.3, A)
    count, total = readers.points()[(DURATION, "chat")]
    assert (count, round(total, 9)) == (3, 0.6)


def test_values_the_sdk_refuses_are_dropped() -> None:
    readers = _Readers()
    readers.instruments.counters[REQUESTS].add(-1, A)
    readers.instruments.counters[REQUESTS].add(2, A)
    readers.instruments.histograms[DURATION].record(-0.5, A)
    readers.instruments.histograms[DURATION].record(float("nan"), A)
    assert readers.points() == {(REQUESTS, "chat"): 2}


def test_a_sequence_attribute_goes_to_the_sdk_at_once() -> None:
    readers = _Readers()
    readers.instruments.counters[REQUESTS].add(1, {m.ROUTE: "chat", m.MODEL: ["a", "b"]})  # type: ignore[dict-item]
    assert readers.points()[(REQUESTS, "chat")] == 1


class _Calls:
    """An SDK instrument's stand-in that counts what reaches it."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, ...]] = []

    def record(self, amount: float, attributes: Any = None) -> None:
        self.batches.append(amount.values if isinstance(amount, StreamIntervals) else (amount,))


def test_a_series_that_fills_up_goes_to_the_sdk_without_a_collection() -> None:
    held = Held(MeterProvider().get_meter("test"))
    sdk = _Calls()
    for i in range(batching.MAX_HELD + 10):
        held.record(sdk, float(i), A)  # type: ignore[arg-type]
    assert [len(batch) for batch in sdk.batches] == [batching.MAX_HELD]
    assert sdk.batches[0][:3] == (0.0, 1.0, 2.0)  # in the order recorded
    held.flush()
    assert [len(batch) for batch in sdk.batches] == [batching.MAX_HELD, 10]


def test_counts_from_other_threads_during_collections_are_all_exported() -> None:
    readers = _Readers()
    counter = readers.instruments.counters[REQUESTS]
    adds = 20_000
    done = threading.Event()

    def count() -> None:
        for _ in range(adds):
            counter.add(1, A)
        done.set()

    thread = threading.Thread(target=count)
    thread.start()
    while not done.is_set():
        readers.points()
    thread.join()
    assert readers.points()[(REQUESTS, "chat")] == adds


def test_a_dict_changed_after_its_measurement_changes_nothing_held() -> None:
    readers = _Readers()
    attributes = dict(A)
    readers.instruments.counters[REQUESTS].add(1, attributes)
    attributes[m.ROUTE] = "embed"
    assert readers.points() == {(REQUESTS, "chat"): 1}
