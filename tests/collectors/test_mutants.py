"""Promises of the validity collector that mutation testing (bench/mutation.py) found untested:
each test pins one behaviour the README states and that a surviving mutant broke."""

from __future__ import annotations

import logging

import pytest

from semhealth.collectors.record import StructureRequest, ValidityResult
from semhealth.collectors.validity import SchemaCache, validate_record
from tests.collectors.test_validity import INVOICE, WEATHER_TOOL, call, check, record


def test_an_error_response_of_exactly_400_is_left_out() -> None:
    rec = record(StructureRequest(kind="json_object"), text='{"a": ', status=400)
    assert validate_record(rec, contract=None, cache=SchemaCache()) == []


def test_a_record_whose_stream_finished_with_broken_json_is_syntax_not_truncated() -> None:
    rec = record(StructureRequest(kind="json_object"), text='{"a": ')
    (result,) = validate_record(rec, contract=None, cache=SchemaCache())
    assert (result.result, result.target) == ("syntax", "content")


def test_tool_arguments_broken_in_a_finished_stream_are_syntax_not_truncated() -> None:
    rec = record(
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        tools=(call("get_weather", '{"city": '),),
        finish_reason="tool_calls",
    )
    (result,) = validate_record(rec, contract=None, cache=SchemaCache())
    assert (result.result, result.target) == ("syntax", "tool:get_weather")


def test_a_response_schema_is_not_a_tool_a_call_can_name() -> None:
    # The response_format schema is named "lookup"; only a declared tool of that name counts.
    rec = record(
        StructureRequest(kind="json_schema", schema=INVOICE, name="lookup"),
        text='{"amount": 1, "risk_level": "low"}',
        tools=(call("lookup", '{"id": 7}'),),
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results[-1] == ValidityResult("schema", target="tool", reasons=("unknown_tool",))


def test_an_unusable_tool_schema_is_logged_naming_the_route_and_the_tool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = record(
        StructureRequest(kind="tool_input", schema={"$ref": "#/nowhere"}, name="get_weather"),
        tools=(call("get_weather", '{"city": "Oslo"}'),),
        route="invoices",
        finish_reason="tool_calls",
    )
    with caplog.at_level(logging.WARNING, logger="semhealth.collectors.validity"):
        results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [
        ValidityResult("schema_error", target="tool:get_weather", reasons=("unresolvable_ref",))
    ]
    message = caplog.records[0].getMessage()
    assert "'invoices'" in message
    assert "tool:get_weather" in message


def test_a_schema_that_fails_while_validating_is_schema_error_and_never_raises() -> None:
    # A recursive schema over an instance nested deeper than the validator can recurse.
    depth = 400
    result = check("[" * depth + "]" * depth, {"items": {"$ref": "#"}})
    assert (result.result, result.reasons) == ("schema_error", ("validation_failed",))


def test_a_record_cut_by_the_token_limit_is_truncated_not_syntax() -> None:
    rec = record(StructureRequest(kind="json_object"), text='{"a": ', finish_reason="length")
    (result,) = validate_record(rec, contract=None, cache=SchemaCache())
    assert (result.result, result.target) == ("truncated", "content")
