"""What a stage needs to register its own observable instruments on the meter it is given:
callbacks that read its plain counters at collection time (so its hot path only increments
ints), the one ``semhealth_dropped`` counter that every stage that sheds adds to, and a
meter that catalogues what is registered (``CatalogueMeter``).

Telemetry imports no stage: each stage's ``observe_*`` function takes the meter and calls
these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.metrics import (
    CallbackOptions,
    CallbackT,
    Counter,
    Histogram,
    NoOpMeter,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    Observation,
)

Callback = Callable[[CallbackOptions], Iterable[Observation]]


class Labelled:
    """A callback, and the label keys its observations carry: what the catalogue (and so
    the manual) says of a family whose values only its callback knows."""

    def __init__(self, callback: Callback, *labels: str) -> None:
        self.callback = callback
        self.labels = labels

    def __call__(self, options: CallbackOptions) -> Iterable[Observation]:
        return self.callback(options)


def observe(read: Callable[[], float]) -> Callback:
    """A callback that observes ``read()``, unlabelled."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(read())]

    return callback


def observe_by(label: str, read: Callable[[], dict[str, int]]) -> Callback:
    """A callback that observes each value of ``read()`` with its key as ``label``."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, {label: key}) for key, value in read().items()]

    return Labelled(callback, label)


def observe_counters(meter: Any, counters: dict[str, tuple[Callable[[], float], str]]) -> None:
    """Observable counters, each ``name: (read, description)``."""
    for name, (read, description) in counters.items():
        meter.create_observable_counter(name, [observe(read)], description=description)


class Shed:
    """``semhealth_dropped{stage}``: work each stage shed under load. A stage adds how it
    counts what it shed; the counter reads them all at collection time."""

    def __init__(self, meter: Any) -> None:
        self._stages: dict[str, Callable[[], int]] = {}
        meter.create_observable_counter(
            "semhealth_dropped",
            [observe_by("stage", self._read)],
            description="Work shed under load, by stage; the client's bytes are never dropped.",
        )

    def add(self, stage: str, read: Callable[[], int]) -> None:
        self._stages[stage] = read

    def _read(self) -> dict[str, int]:
        return {stage: read() for stage, read in self._stages.items()}


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as the agent registers it, and the name Prometheus shows it by."""

    name: str  # the instrument's name
    kind: str  # counter | histogram | gauge (observable gauges and up-down counters)
    unit: str
    description: str
    labels: tuple[str, ...] = ()  # where the registration says (a View's allow-list, Labelled)

    @property
    def prometheus_name(self) -> str:
        """What the OpenTelemetry Prometheus exporter names it: dots become underscores,
        the unit ``s`` appends ``_seconds`` and ``By`` ``_bytes`` (once), counters ``_total``."""
        text = self.name.replace(".", "_")
        suffix = _UNIT_SUFFIXES.get(self.unit)
        if suffix is not None and not text.endswith(suffix):
            text += suffix
        if self.kind == "counter":
            text += "_total"
        return text


_UNIT_SUFFIXES = {"s": "_seconds", "By": "_bytes"}


class CatalogueMeter(NoOpMeter):
    """A meter that only notes what is registered on it: handed to the same ``observe_*``
    functions as the real one, it lists the families the agent exports without running it
    (the manual's metrics reference is built from it). Its instruments take no values and
    its callbacks are never called."""

    def __init__(self) -> None:
        super().__init__("semhealth.catalogue")
        self.families: dict[str, Family] = {}

    def _note(
        self,
        kind: str,
        name: str,
        unit: str,
        description: str,
        callbacks: Sequence[CallbackT] | None = None,
    ) -> None:
        labels = tuple(
            label
            for callback in callbacks or ()
            for label in (callback.labels if isinstance(callback, Labelled) else ())
        )
        self.families[name] = Family(name, kind, unit, description, labels)

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        self._note("counter", name, unit, description)
        return super().create_counter(name, unit, description)

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> Histogram:
        self._note("histogram", name, unit, description)
        return super().create_histogram(name, unit, description)

    def create_observable_counter(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableCounter:
        self._note("counter", name, unit, description, callbacks)
        return super().create_observable_counter(name, callbacks, unit, description)

    def create_observable_gauge(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableGauge:
        self._note("gauge", name, unit, description, callbacks)
        return super().create_observable_gauge(name, callbacks, unit, description)

    def create_observable_up_down_counter(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableUpDownCounter:
        self._note("gauge", name, unit, description, callbacks)
        return super().create_observable_up_down_counter(name, callbacks, unit, description)
