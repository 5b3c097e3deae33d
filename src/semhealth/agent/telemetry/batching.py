"""How the agent's measurements reach the OpenTelemetry SDK: in batches, not one call each.

An SDK ``Counter.add`` or ``Histogram.record`` costs about 10 µs: it validates and hashes the
attributes on every call. Two things follow.

A stream's chunk intervals, 50 or more a stream, reach the SDK as one ``StreamIntervals``
measurement, and every histogram's View aggregates with ``BatchedHistogramAggregation``: the
SDK's own explicit-bucket aggregation, fed each value in turn. The exported histogram is the
one recording each value would give, to the last bit of its sum
(``tests/agent/test_batched_histogram.py``).

And a stream's record still made about a dozen calls, most with the attributes of the stream
before it: at 50 streams, a fifth of the analysis process's CPU. So the agent's instruments
hold their measurements (``Held``), summed (counters) or listed in order (histograms) by
instrument and attributes, and hand each series to the SDK once, when a reader collects: the
flush is the callback of an observable instrument that reports nothing, and the SDK runs
those callbacks before it reads the synchronous instruments (``tests/agent/test_held.py``
holds every reader to that). What a reader exports is what recording each measurement at
once gives: a counter's sum is added in the order counted, a histogram's values reach the
aggregation in order. Two things differ, neither visible in Prometheus: a new series starts
(its OTLP start time) at the collection after its first measurement, and values the SDK
refuses (a negative count, a negative or non-finite histogram value) are dropped without the
SDK's warning. A histogram series that reaches ``MAX_HELD`` values between collections goes
to the SDK at once, so memory stays bounded when nothing collects.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, Observation
from opentelemetry.sdk.metrics._internal.aggregation import (
    _Aggregation,
    _ExplicitBucketHistogramAggregation,
)
from opentelemetry.sdk.metrics._internal.measurement import Measurement
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation
from opentelemetry.util.types import AttributeValue


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


Attributes = Mapping[str, AttributeValue] | None
_Key = tuple[tuple[str, AttributeValue], ...]

MAX_HELD = 4096  # values of one histogram series held between collections
FLUSH_INSTRUMENT = "semhealth.internal.flush"  # reports nothing; its callback is the flush


class Held:
    """The measurements of every deferred instrument of one meter, by series. A series is
    kept by its attributes' items, a snapshot: a caller may reuse its dict."""

    def __init__(self, meter: Meter) -> None:
        self._lock = threading.Lock()
        self._sums: dict[tuple[Counter, _Key], float] = {}
        self._values: dict[tuple[Histogram, _Key], list[float]] = {}
        meter.create_observable_gauge(FLUSH_INSTRUMENT, callbacks=[self._on_collect])

    def add(self, counter: Counter, amount: float, attributes: Attributes) -> None:
        if amount < 0:
            return  # the SDK refuses it too: a counter only goes up
        series = (counter, _key(attributes))
        try:
            with self._lock:
                self._sums[series] = self._sums.get(series, 0) + amount
        except TypeError:  # a sequence value: no key (rare), so it goes to the SDK at once
            counter.add(amount, attributes)

    def record(self, histogram: Histogram, amount: float, attributes: Attributes) -> None:
        key = _key(attributes)
        series = (histogram, key)
        try:
            with self._lock:
                values = self._values.get(series)
                if values is None:
                    values = self._values[series] = []
                if isinstance(amount, StreamIntervals):
                    values.extend(amount.values)
                else:
                    values.append(amount)
                if len(values) < MAX_HELD:
                    return
                del self._values[series]
        except TypeError:  # a sequence value: no key (rare), so it goes to the SDK at once
            histogram.record(amount, attributes)
            return
        histogram.record(StreamIntervals(values), dict(key))

    def flush(self) -> None:
        """Hand every held series to the SDK."""
        with self._lock:
            sums, self._sums = self._sums, {}
            values, self._values = self._values, {}
        for (counter, key), total in sums.items():
            counter.add(total, dict(key))
        for (histogram, key), held in values.items():
            batch = StreamIntervals(held)
            if batch.values:  # the SDK opens a series for every call, even an empty batch
                histogram.record(batch, dict(key))

    def _on_collect(self, options: CallbackOptions) -> Iterable[Observation]:
        self.flush()
        return ()


def _key(attributes: Attributes) -> _Key:
    """The attributes' items, the series' key. A sequence value makes it unhashable, which
    the first dict operation on it finds before anything is held."""
    return tuple(attributes.items()) if attributes else ()


class DeferredCounter:
    """A ``Counter``'s ``add``, held until the next collection."""

    __slots__ = ("_counter", "_held")

    def __init__(self, counter: Counter, held: Held) -> None:
        self._counter = counter
        self._held = held

    def add(self, amount: float, attributes: Attributes = None) -> None:
        self._held.add(self._counter, amount, attributes)


class DeferredHistogram:
    """A ``Histogram``'s ``record``, held until the next collection; takes ``StreamIntervals``."""

    __slots__ = ("_held", "_histogram")

    def __init__(self, histogram: Histogram, held: Held) -> None:
        self._histogram = histogram
        self._held = held

    def record(self, amount: float, attributes: Attributes = None) -> None:
        self._held.record(self._histogram, amount, attributes)
