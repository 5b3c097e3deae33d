"""What a stage needs to register its own observable instruments on the meter it is given:
callbacks that read its plain counters at collection time (so its hot path only increments
ints), and the one ``semhealth_dropped`` counter that every stage that sheds adds to.

Telemetry imports no stage: each stage's ``observe_*`` function takes the meter and calls
these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def observe(read: Callable[[], float]) -> Callback:
    """A callback that observes ``read()``, unlabelled."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(read())]

    return callback


def observe_by(label: str, read: Callable[[], dict[str, int]]) -> Callback:
    """A callback that observes each value of ``read()`` with its key as ``label``."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, {label: key}) for key, value in read().items()]

    return callback


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
