from __future__ import annotations

import logging
import socket
import urllib.request
from dataclasses import replace
from typing import Any

import pytest

from semhealth.collectors.json_check import JSONChecker
from semhealth.collectors.record import (
    RequestFacts,
    StreamRecord,
    StructureRequest,
    ToolCall,
    ValidityResult,
)
from semhealth.collectors.validity import SchemaCache, check_output, schema_key, validate_record

DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"
DRAFT2020 = "https://json-schema.org/draft/2020-12/schema"

INVOICE = {
    "type": "object",
    "required": ["amount", "risk_level"],
    "properties": {
        "amount": {"type": "number"},
        "risk_level": {"enum": ["low", "medium", "high"]},
    },
}
# "risk_level is high exactly when amount > 1,000,000", as the route's contract.
RISK_CONTRACT = {
    "if": {"properties": {"amount": {"exclusiveMinimum": 1_000_000}}},
    "then": {"properties": {"risk_level": {"const": "high"}}},
    "else": {"properties": {"risk_level": {"not": {"const": "high"}}}},
}
WEATHER_TOOL = {
    "type": "object",
    "required": ["city"],
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "additionalProperties": False,
}


def check(
    text: str,
    schema: dict[str, Any] | None = None,
    *,
    contract: dict[str, Any] | None = None,
    finish_reason: str | None = "stop",
    done: bool = True,
    cache: SchemaCache | None = None,
    route: str = "chat",
) -> ValidityResult:
    return check_output(
        text,
        schema=schema,
        finish_reason=finish_reason,
        done=done,
        contract=contract,
        cache=cache if cache is not None else SchemaCache(),
        route=route,
    )


def record(
    *structure: StructureRequest,
    text: str = "",
    tools: tuple[ToolCall, ...] = (),
    **changes: Any,
) -> StreamRecord:
    base = StreamRecord(
        route="chat",
        provider="openai_chat",
        model="gpt-4o",
        prompt_class="short",
        request=RequestFacts(structure=structure, analysed=True),
        status=200,
        start_ns=0,
        end_ns=1_000_000,
        output_text=text,
        tool_calls=tools,
        finish_reason="stop",
        done=True,
        streamed=True,
    )
    return replace(base, **changes)


def call(name: str | None, arguments: str, index: int = 0) -> ToolCall:
    return ToolCall(index=index, id=f"call_{index}", name=name, arguments=arguments)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Any attempt to reach the network is recorded and refused."""
    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(repr(args[:2]))
        raise OSError("network access attempted in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    return attempts


# -- check_output: one result kind each -------------------------------------------------


def test_document_that_meets_schema_and_contract_is_valid() -> None:
    text = '{"amount": 2500000, "risk_level": "high"}'
    assert check(text, INVOICE, contract=RISK_CONTRACT) == ValidityResult("valid")


def test_incomplete_json_cut_by_length_is_truncated() -> None:
    result = check('{"amount": 25', INVOICE, finish_reason="length")
    assert result == ValidityResult("truncated", reasons=("length",))


def test_incomplete_json_cut_by_max_tokens_is_truncated() -> None:
    result = check('{"amount": 25', INVOICE, finish_reason="max_tokens")
    assert result.result == "truncated"


def test_incomplete_json_of_a_stream_that_ended_early_is_truncated() -> None:
    result = check('{"amount": 25', INVOICE, finish_reason=None, done=False)
    assert result == ValidityResult("truncated", reasons=("ended_early",))


def test_incomplete_json_of_a_finished_stream_is_syntax_at_its_end() -> None:
    result = check('{"amount": 25', INVOICE, finish_reason="stop", done=True)
    assert result == ValidityResult("syntax", reasons=("unexpected_end",), offset=13)


def test_bad_character_is_syntax_with_its_offset() -> None:
    result = check('{"amount": 25,, "risk_level": "low"}', INVOICE)
    assert result == ValidityResult("syntax", reasons=("unexpected_character",), offset=14)


def test_syntax_error_before_a_cut_is_syntax_not_truncated() -> None:
    result = check('{"amount": 25,, "risk', INVOICE, finish_reason="length", done=False)
    assert (result.result, result.offset) == ("syntax", 14)


def test_complete_json_with_finish_reason_length_is_still_validated() -> None:
    assert check('{"amount": 1}', INVOICE, finish_reason="length").result == "schema"


def test_prose_instead_of_json_is_syntax() -> None:
    result = check("Sure! Here is the JSON you asked for:", INVOICE)
    assert (result.result, result.offset) == ("syntax", 0)


def test_schema_failures_are_reported_by_keyword_sorted_and_deduplicated() -> None:
    result = check('{"amount": "lots", "extra": {"amount": "more"}}', INVOICE)
    assert result == ValidityResult("schema", reasons=("required", "type"))


def test_reasons_never_carry_instance_values() -> None:
    result = check('{"amount": "secret-value-123", "risk_level": "pii@example.com"}', INVOICE)
    assert result.result == "schema"
    assert all("secret" not in r and "pii" not in r for r in result.reasons)
    assert result.reasons == ("enum", "type")


def test_false_subschema_is_reported_as_false() -> None:
    schema = {"properties": {"forbidden": False}}
    assert check('{"forbidden": 1}', schema).reasons == ("false",)


def test_many_failing_items_still_name_the_keyword() -> None:
    text = "[" + ",".join(['"x"'] * 1000) + "]"
    assert check(text, {"items": {"type": "integer"}}).reasons == ("type",)


def test_without_schema_or_contract_only_syntax_is_checked() -> None:
    assert check('{"anything": [1, 2]}').result == "valid"


# -- contracts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"amount": 2500000, "risk_level": "low"}',
        '{"amount": 1000000, "risk_level": "high"}',
        '{"amount": 12.5, "risk_level": "high"}',
    ],
)
def test_contract_rule_violation_is_contract(text: str) -> None:
    result = check(text, INVOICE, contract=RISK_CONTRACT)
    assert result.result == "contract"
    assert result.reasons in (("const",), ("not",))


@pytest.mark.parametrize(
    "text",
    ['{"amount": 1000000.01, "risk_level": "high"}', '{"amount": 1000000, "risk_level": "low"}'],
)
def test_contract_rule_kept_is_valid(text: str) -> None:
    assert check(text, INVOICE, contract=RISK_CONTRACT).result == "valid"


def test_schema_failure_is_reported_before_the_contract() -> None:
    result = check('{"amount": 2500000, "risk_level": "urgent"}', INVOICE, contract=RISK_CONTRACT)
    assert result == ValidityResult("schema", reasons=("enum",))


def test_contract_with_dependent_schemas_is_checked() -> None:
    contract = {
        "dependentSchemas": {"refund": {"required": ["refund_reason"]}},
    }
    assert check('{"refund": 10}', contract=contract).reasons == ("required",)
    assert check('{"refund": 10, "refund_reason": "damaged"}', contract=contract).result == "valid"


def test_contract_alone_makes_an_output_checked() -> None:
    result = check('{"amount": 2000000, "risk_level": "low"}', contract=RISK_CONTRACT)
    assert result.result == "contract"


def test_unusable_contract_is_schema_error() -> None:
    result = check("{}", contract={"type": 12})
    assert result == ValidityResult("schema_error", reasons=("invalid_schema",))


# -- dialects ---------------------------------------------------------------------------------


def test_draft7_is_chosen_from_schema() -> None:
    # Draft 7's array form of ``items`` validates by position; 2020-12 forbids that form.
    schema = {"$schema": DRAFT7, "items": [{"type": "integer"}]}
    assert check('["x"]', schema).reasons == ("type",)
    assert check("[1, 2]", schema).result == "valid"


def test_draft7_dependencies_keyword_is_enforced() -> None:
    schema = {"$schema": DRAFT7, "dependencies": {"a": ["b"]}}
    assert check('{"a": 1}', schema).reasons == ("dependencies",)


def test_draft2019_09_is_chosen_from_schema() -> None:
    schema = {"$schema": DRAFT2019, "dependentRequired": {"a": ["b"]}}
    assert check('{"a": 1}', schema).reasons == ("dependentRequired",)


def test_draft2019_09_ignores_prefix_items() -> None:
    schema = {"$schema": DRAFT2019, "prefixItems": [{"type": "integer"}]}
    assert check('["x"]', schema).result == "valid"


def test_draft2020_12_is_chosen_from_schema() -> None:
    schema = {"$schema": DRAFT2020, "prefixItems": [{"type": "integer"}], "items": False}
    assert check('["x"]', schema).reasons == ("type",)
    assert check("[1, 2]", schema).reasons == ("items",)


def test_draft2020_12_is_the_default() -> None:
    schema = {"prefixItems": [{"type": "integer"}]}
    assert check('["x"]', schema).reasons == ("type",)


def test_array_form_of_items_is_invalid_under_the_default_draft() -> None:
    result = check('["x"]', {"items": [{"type": "integer"}]})
    assert result == ValidityResult("schema_error", reasons=("invalid_schema",))


@pytest.mark.parametrize(
    "declared",
    [
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft-07/schema#",
        "http://json-schema.org/draft/2020-12/schema#",
    ],
)
def test_schema_uri_spellings_are_recognised(declared: str) -> None:
    schema = {"$schema": declared, "type": "object"}
    assert check("[]", schema).reasons == ("type",)


def test_unsupported_dialect_is_schema_error() -> None:
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}
    assert check("{}", schema) == ValidityResult("schema_error", reasons=("unsupported_dialect",))


def test_schema_its_meta_schema_rejects_is_schema_error() -> None:
    result = check("{}", {"type": "objekt"})
    assert result == ValidityResult("schema_error", reasons=("invalid_schema",))


def test_format_is_not_asserted_by_default() -> None:
    assert check('"not an email"', {"format": "email"}).result == "valid"


def test_format_is_asserted_when_asked() -> None:
    cache = SchemaCache(check_formats=True)
    assert check('"not an email"', {"format": "email"}, cache=cache).reasons == ("format",)


# -- references --------------------------------------------------------------------------------


def test_local_refs_and_defs_resolve() -> None:
    schema = {
        "$defs": {"money": {"type": "number", "minimum": 0}},
        "properties": {"amount": {"$ref": "#/$defs/money"}},
    }
    assert check('{"amount": 5}', schema).result == "valid"
    assert check('{"amount": -5}', schema).reasons == ("minimum",)


def test_draft7_definitions_ref_resolves() -> None:
    schema = {
        "$schema": DRAFT7,
        "definitions": {"id": {"type": "integer"}},
        "items": {"$ref": "#/definitions/id"},
    }
    assert check('[1, "two"]', schema).reasons == ("type",)


def test_ref_to_an_embedded_id_resolves() -> None:
    schema = {
        "$id": "https://example.com/root.json",
        "$defs": {"name": {"$id": "name.json", "type": "string"}},
        "properties": {"name": {"$ref": "name.json"}},
    }
    assert check('{"name": 3}', schema).reasons == ("type",)


def test_ref_to_the_meta_schema_resolves_without_fetching(no_network: list[str]) -> None:
    schema = {"$ref": "https://json-schema.org/draft/2020-12/schema"}
    assert check('{"type": "object"}', schema).result == "valid"
    assert check('{"type": 5}', schema).result == "schema"
    assert no_network == []


def test_remote_ref_is_schema_error_and_never_fetched(no_network: list[str]) -> None:
    schema = {"properties": {"x": {"$ref": "https://schemas.example.com/x.json"}}}
    # The instance never reaches the reference: the schema is still unusable.
    result = check("{}", schema)
    assert result == ValidityResult("schema_error", reasons=("remote_ref",))
    assert no_network == []


def test_relative_ref_to_another_document_is_a_remote_ref(no_network: list[str]) -> None:
    result = check("{}", {"$ref": "other.json#/$defs/x"})
    assert result.reasons == ("remote_ref",)
    assert no_network == []


def test_ref_pointing_nowhere_is_schema_error() -> None:
    result = check("{}", {"properties": {"x": {"$ref": "#/$defs/missing"}}})
    assert result == ValidityResult("schema_error", reasons=("unresolvable_ref",))


def test_schema_error_is_logged_once_per_route_naming_route_and_reason(
    caplog: pytest.LogCaptureFixture, no_network: list[str]
) -> None:
    cache = SchemaCache()
    schema = {"$ref": "https://schemas.example.com/invoice.json"}
    secret = '{"card": "4111-1111-1111-1111"}'
    with caplog.at_level(logging.WARNING, logger="semhealth.collectors.validity"):
        for _ in range(3):
            check(secret, schema, cache=cache, route="invoices")
        check(secret, schema, cache=cache, route="refunds")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "'invoices'" in messages[0] and "'refunds'" in messages[1]
    assert all("remote_ref" in m and "never fetches" in m for m in messages)
    assert all("4111" not in m for m in messages)


# -- the cache ---------------------------------------------------------------------------------


def test_equal_schemas_in_another_key_order_share_one_validator() -> None:
    cache = SchemaCache()
    first = cache.get({"type": "object", "required": ["a"], "properties": {"a": {}}})
    second = cache.get({"properties": {"a": {}}, "required": ["a"], "type": "object"})
    assert second.validator is first.validator
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)


def test_schema_key_is_sha256_of_sorted_keys_json() -> None:
    assert schema_key({"b": 1, "a": 2}) == schema_key({"a": 2, "b": 1})
    assert len(schema_key({}) or "") == 64


def test_cache_evicts_the_least_recently_used_schema() -> None:
    cache = SchemaCache(size=2)
    a, b, c = ({"minimum": n} for n in range(3))
    kept = cache.get(a)
    cache.get(b)
    cache.get(a)  # a is now the most recent
    cache.get(c)  # evicts b
    assert cache.get(a) is kept
    misses = cache.misses
    cache.get(b)
    assert cache.misses == misses + 1
    assert len(cache) == 2


def test_unusable_schemas_are_cached_too() -> None:
    cache = SchemaCache()
    cache.get({"type": "objekt"})
    assert cache.get({"type": "objekt"}).problem == "invalid_schema"
    assert cache.hits == 1


def test_schema_that_is_not_json_is_schema_error() -> None:
    result = check("{}", {"properties": {1: {"type": "string"}}})
    assert result == ValidityResult("schema_error", reasons=("unserialisable_schema",))


def test_cache_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="size"):
        SchemaCache(size=0)


# -- the incremental checker ----------------------------------------------------------------


def test_checker_fed_while_streaming_is_used() -> None:
    text = '{"amount": 1, "risk_level": "high"} trailing'
    checker = JSONChecker()
    for start in range(0, len(text), 5):
        checker.feed(text[start : start + 5])
    result = check_output(
        text,
        schema=INVOICE,
        finish_reason="stop",
        done=True,
        contract=None,
        cache=SchemaCache(),
        checker=checker,
    )
    assert result == ValidityResult("syntax", reasons=("trailing_data",), offset=36)


def test_checker_that_saw_other_text_is_not_trusted() -> None:
    checker = JSONChecker()
    checker.feed("[1,,")
    result = check_output(
        '{"amount": 1, "risk_level": "low"}',
        schema=INVOICE,
        finish_reason="stop",
        done=True,
        contract=None,
        cache=SchemaCache(),
        checker=checker,
    )
    assert result.result == "valid"


def test_number_orjson_cannot_hold_is_syntax() -> None:
    result = check('{"amount": 1e400, "risk_level": "high"}', INVOICE)
    assert (result.result, result.reasons, result.offset) == (
        "syntax",
        ("number_out_of_range",),
        15,
    )


# -- validate_record ------------------------------------------------------------------------


def test_record_with_nothing_structured_has_no_results() -> None:
    assert validate_record(record(text="Hello!"), contract=None, cache=SchemaCache()) == []


def test_record_in_json_mode_is_checked_for_syntax() -> None:
    rec = record(StructureRequest(kind="json_object"), text='{"ok": tru}')
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [ValidityResult("syntax", reasons=("unexpected_character",), offset=10)]


def test_record_with_json_schema_is_checked_against_it() -> None:
    rec = record(StructureRequest(kind="json_schema", schema=INVOICE, name="invoice"), text="{}")
    assert validate_record(rec, contract=None, cache=SchemaCache()) == [
        ValidityResult("schema", reasons=("required",))
    ]


def test_record_content_is_checked_against_the_route_contract() -> None:
    rec = record(text='{"amount": 5000000, "risk_level": "low"}')
    results = validate_record(rec, contract=RISK_CONTRACT, cache=SchemaCache())
    assert [r.result for r in results] == ["contract"]


def test_record_cut_by_the_upstream_is_truncated() -> None:
    rec = record(
        StructureRequest(kind="json_object"),
        text='{"a": [1, 2',
        done=False,
        finish_reason=None,
        upstream_aborted=True,
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [ValidityResult("truncated", reasons=("ended_early",))]


def test_tool_call_arguments_are_checked_against_the_tools_input_schema() -> None:
    rec = record(
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        tools=(
            call("get_weather", '{"city": "Paris"}', 0),
            call("get_weather", '{"city": "Paris", "unit": "k", "when": 1}', 1),
        ),
        finish_reason="tool_calls",
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [
        ValidityResult("valid", target="tool:get_weather"),
        ValidityResult(
            "schema", target="tool:get_weather", reasons=("additionalProperties", "enum")
        ),
    ]


def test_each_tool_call_meets_its_own_tools_schema() -> None:
    lookup = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}
    rec = record(
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        StructureRequest(kind="tool_input", schema=lookup, name="lookup"),
        tools=(call("lookup", '{"id": "7"}', 0), call("get_weather", '{"city": "Oslo"}', 1)),
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [
        ValidityResult("schema", target="tool:lookup", reasons=("type",)),
        ValidityResult("valid", target="tool:get_weather"),
    ]


def test_call_to_an_undeclared_tool_is_schema_unknown_tool() -> None:
    rec = record(
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        tools=(call("rm_rf_everything", '{"path": "/"}'),),
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [ValidityResult("schema", target="tool", reasons=("unknown_tool",))]


def test_call_to_an_undeclared_tool_with_broken_arguments_is_syntax() -> None:
    rec = record(
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        tools=(call("other", '{"path": }'),),
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert [(r.result, r.target) for r in results] == [("syntax", "tool")]


def test_tool_arguments_cut_by_max_tokens_are_truncated() -> None:
    rec = record(
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        tools=(call("get_weather", '{"city": "Par'),),
        finish_reason="length",
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [ValidityResult("truncated", target="tool:get_weather", reasons=("length",))]


def test_empty_arguments_of_a_finished_call_are_an_empty_object() -> None:
    rec = record(
        StructureRequest(kind="tool_input", schema={"type": "object"}, name="now"),
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        tools=(call("now", "", 0), call("get_weather", "", 1)),
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [
        ValidityResult("valid", target="tool:now"),
        ValidityResult("schema", target="tool:get_weather", reasons=("required",)),
    ]


def test_tool_declared_without_schema_is_checked_for_syntax_only() -> None:
    rec = record(
        StructureRequest(kind="tool_input", schema=None, name="ping"),
        tools=(call("ping", '{"anything": [1]}'),),
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [ValidityResult("valid", target="tool:ping")]


def test_content_answered_by_tool_calls_alone_is_not_checked() -> None:
    rec = record(
        StructureRequest(kind="json_schema", schema=INVOICE, name="invoice"),
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        tools=(call("get_weather", '{"city": "Rome"}'),),
    )
    results = validate_record(rec, contract=RISK_CONTRACT, cache=SchemaCache())
    assert results == [ValidityResult("valid", target="tool:get_weather")]


def test_content_and_tool_calls_each_get_a_result() -> None:
    rec = record(
        StructureRequest(kind="json_schema", schema=INVOICE, name="invoice"),
        StructureRequest(kind="tool_input", schema=WEATHER_TOOL, name="get_weather"),
        text='{"amount": 3, "risk_level": "low"}',
        tools=(call("get_weather", '{"city": 3}'),),
    )
    results = validate_record(rec, contract=None, cache=SchemaCache())
    assert [(r.result, r.target) for r in results] == [
        ("valid", "content"),
        ("schema", "tool:get_weather"),
    ]


def test_tool_calls_are_skipped_when_the_request_was_not_analysed() -> None:
    rec = record(
        tools=(call("get_weather", '{"city": "Rome"}'),),
        request=RequestFacts(analysed=False, skip_reason="oversized"),
    )
    assert validate_record(rec, contract=None, cache=SchemaCache()) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"status": 429},
        {"status": 500},
        {"client_aborted": True},
        {"shed": True},
        {"truncated": True},
    ],
    ids=["rate_limited", "server_error", "client_left", "shed", "analysis_limit"],
)
def test_records_without_the_whole_model_output_are_left_out(changes: dict[str, Any]) -> None:
    rec = record(StructureRequest(kind="json_object"), text='{"a": ', **changes)
    assert validate_record(rec, contract=RISK_CONTRACT, cache=SchemaCache()) == []


def test_schema_error_from_a_record_names_its_route(caplog: pytest.LogCaptureFixture) -> None:
    rec = record(
        StructureRequest(kind="json_schema", schema={"$ref": "#/nowhere"}, name="x"),
        text="{}",
        route="invoices",
    )
    with caplog.at_level(logging.WARNING, logger="semhealth.collectors.validity"):
        results = validate_record(rec, contract=None, cache=SchemaCache())
    assert results == [ValidityResult("schema_error", reasons=("unresolvable_ref",))]
    assert "'invoices'" in caplog.records[0].getMessage()


def test_one_schema_cache_serves_many_threads() -> None:
    # Collectors share one cache per process unless given their own.
    import threading

    cache = SchemaCache(size=4)
    schemas = [{"type": "object", "required": [f"k{i}"]} for i in range(12)]
    errors: list[BaseException] = []

    def check(offset: int) -> None:
        try:
            for i in range(300):
                schema = schemas[(i + offset) % len(schemas)]
                result = check_output(
                    "{}", schema=schema, finish_reason="stop", done=True, contract=None, cache=cache
                )
                assert result.result == "schema"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=check, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(cache) == 4
