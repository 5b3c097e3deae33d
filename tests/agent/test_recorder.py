"""The recorder's own rules: cardinality guard, rolling validity window, error classes."""

from __future__ import annotations

import dataclasses

from semhealth.agent.recorder import OTHER, LabelGuard, RollingRatio, error_type
from semhealth.collectors.record import RequestFacts, StreamRecord


def _record(**fields: object) -> StreamRecord:
    base = StreamRecord(
        route="r", provider="openai_chat", model="m", prompt_class="short",
        request=RequestFacts(), status=200, start_ns=0, end_ns=1,
    )  # fmt: skip
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def test_label_values_past_the_limit_fold_into_other() -> None:
    guard = LabelGuard(max_values=2)
    assert [guard.fold("model", v) for v in ("a", "b", "c", "a", "d")] == [
        "a",
        "b",
        OTHER,
        "a",
        OTHER,
    ]
    assert guard.folded == 2


def test_label_guard_limits_each_key_separately() -> None:
    guard = LabelGuard(max_values=1)
    assert guard.fold("model", "a") == "a"
    assert guard.fold("route", "x") == "x"


def test_rolling_ratio_is_valid_over_checked_within_the_window() -> None:
    ratio = RollingRatio(window_s=60, slots=6)
    key = ("r", "m", "p")
    for ok in (True, True, False, True):
        ratio.add(key, ok, now=100.0)
    assert ratio.ratios(now=100.0) == {key: 0.75}


def test_rolling_ratio_forgets_outputs_older_than_the_window() -> None:
    ratio = RollingRatio(window_s=60, slots=6)
    key = ("r", "m", "p")
    ratio.add(key, False, now=0.0)
    ratio.add(key, True, now=65.0)
    assert ratio.ratios(now=65.0) == {key: 1.0}


def test_rolling_ratio_is_absent_once_the_window_is_empty() -> None:
    ratio = RollingRatio(window_s=60, slots=6)
    ratio.add(("r", "m", "p"), True, now=0.0)
    assert ratio.ratios(now=500.0) == {}


def test_rate_limits_are_split_by_who_throttled() -> None:
    assert (
        error_type(_record(status=429, error_type="429", ratelimit_source="upstream"))
        == "429_upstream"
    )
    assert (
        error_type(_record(status=429, error_type="429", ratelimit_source="Gateway"))
        == "429_gateway"
    )
    assert error_type(_record(status=429, error_type="429")) == "429"


def test_a_ratelimit_source_that_is_not_a_word_is_not_echoed_into_labels() -> None:
    assert error_type(_record(status=429, error_type="429", ratelimit_source="x y/../z")) == "429"


def test_success_has_no_error_type() -> None:
    assert error_type(_record()) == ""


def test_rolling_ratio_can_be_read_from_another_thread_while_written() -> None:
    # The OTLP reader collects on its own thread while the loop records outputs.
    import threading

    ratio = RollingRatio(window_s=60, slots=6)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                ratio.ratios(now=30.0)
            except BaseException as exc:
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(20_000):
        ratio.add((f"r{i % 50}", "m", "p"), i % 2 == 0, now=30.0)
    stop.set()
    reader.join()
    assert errors == []
    assert sum(1 for _ in ratio.ratios(now=30.0)) == 50
