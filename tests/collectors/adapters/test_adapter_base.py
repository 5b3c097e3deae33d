"""Shared adapter helpers: guarded JSON field access and error classes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from semhealth.collectors.adapters.base import (
    FrameError,
    JsonObject,
    dump_json,
    error_type,
    load_json,
    load_object,
    opt_bool,
    opt_int,
    opt_list,
    opt_object,
    opt_str,
    usage_report,
)
from semhealth.collectors.events import UsageReport


def reason_of(exc: pytest.ExceptionInfo[FrameError]) -> str:
    return exc.value.reason


def test_load_json_rejects_garbage_as_json() -> None:
    with pytest.raises(FrameError) as exc:
        load_json(b"\x00garbage")
    assert reason_of(exc) == "json"


def test_load_object_rejects_non_object_as_shape() -> None:
    with pytest.raises(FrameError) as exc:
        load_object("[1]")
    assert reason_of(exc) == "shape"


@pytest.mark.parametrize(
    ("getter", "good", "bad"),
    [
        (opt_str, "x", 1),
        (opt_int, 3, "3"),
        (opt_bool, True, 0),
        (opt_object, {"a": 1}, [1]),
        (opt_list, [1], {"a": 1}),
    ],
)
def test_optional_getters_accept_their_type_and_null(
    getter: Callable[[JsonObject, str], object], good: object, bad: object
) -> None:
    assert getter({"k": good}, "k") == good
    assert getter({"k": None}, "k") is None
    assert getter({}, "k") is None
    with pytest.raises(FrameError):
        getter({"k": bad}, "k")


@pytest.mark.parametrize("bad", [True, -1, 1.5])
def test_opt_int_rejects_booleans_negatives_and_floats(bad: object) -> None:
    with pytest.raises(FrameError):
        opt_int({"k": bad}, "k")


def test_dump_json_rejects_nesting_deeper_than_it_can_write() -> None:
    deep = load_json("[" * 500 + "]" * 500)
    with pytest.raises(FrameError) as exc:
        dump_json(deep)
    assert reason_of(exc) == "shape"


def test_usage_report_is_omitted_when_nothing_is_known() -> None:
    assert usage_report(None, None) == []
    assert usage_report(None, 4) == [UsageReport(input_tokens=None, output_tokens=4)]


def test_error_type_prefers_type_then_code_and_never_reads_the_message() -> None:
    assert error_type({"type": "a", "code": "b", "message": "m"}) == "a"
    assert error_type({"type": "", "code": 429, "message": "m"}) == "429"
    assert error_type({"message": "m"}) == "error"
    assert error_type("free text message", default="failed") == "failed"


def test_error_type_is_bounded_in_length() -> None:
    assert len(error_type({"type": "x" * 1000})) == 64
