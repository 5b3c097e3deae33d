"""The signal table names series the agent really exports, with labels it really sets."""

from __future__ import annotations

import pytest

from semhealth.agent.telemetry import instruments as m
from semhealth.alerts.signals import SIGNALS, Signal, signal_named


def _prometheus_name(spec: m.Spec) -> str:
    name = spec.name.replace(".", "_")
    if spec.unit == "s":
        name += "_seconds"
    return name + "_total" if spec.kind == "counter" else name


EXPORTED = {_prometheus_name(spec): spec for spec in m.SPECS}


@pytest.mark.parametrize("signal", SIGNALS, ids=lambda s: s.name)
def test_each_signal_reads_a_series_the_agent_exports(signal: Signal) -> None:
    spec = EXPORTED[signal.prometheus]
    assert spec.kind == ("counter" if signal.kind == "ratio" else "histogram")
    assert spec.unit == signal.unit


@pytest.mark.parametrize("signal", SIGNALS, ids=lambda s: s.name)
def test_each_signal_label_is_a_label_of_its_series(signal: Signal) -> None:
    attributes = {key.replace(".", "_") for key in EXPORTED[signal.prometheus].attributes}
    assert set(signal.prometheus_labels.values()) <= attributes
    assert set(signal.good) <= attributes


def test_signals_are_found_by_name() -> None:
    found = signal_named("context_relevance_score")
    assert found is not None
    assert found.prometheus == "semantic_health_context_relevance_score"
    assert signal_named("no_such_signal") is None


def test_ratio_signals_allow_only_the_ratio_aggregation() -> None:
    ratios = [signal for signal in SIGNALS if signal.kind == "ratio"]
    assert ratios
    assert all(signal.aggregations == ("ratio",) for signal in ratios)
