"""The incremental JSON checker and the validity verdict against orjson's and jsonschema's.

tests/collectors/test_json_check.py corrupts valid documents one character at a time; here
the input is token soup (JSON's punctuation, literals cut anywhere, escapes, numbers at the
edge of a double, random characters), so most inputs are broken in several places at once.
The checker, fed in any pieces, must say ``valid`` exactly when orjson parses the whole,
``incomplete`` only for text that some suffix makes valid, and for ``syntax`` name the true
first offset: the text before it can still become valid, the text through it cannot.

``check_output`` (what a record's validity comes from) must agree with jsonschema itself
on whether a parsed output meets a schema, for random outputs and random schemas.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from semhealth.collectors.validity import SchemaCache, check_output
from tests.collectors.test_json_check import extendable, json_values, orjson_accepts, run
from tests.fuzz.budget import examples

TOKENS = (
    *'{}[]:,"\\ \t\r\n-+.eE0123456789',
    "true", "false", "null", "tru", "nul", "fals",
    '"a"', '"\\u00e9"', '"\\ud83d\\ude00"', '"\\ud83d"', "\\u", "\\n", "\\x",
    "1e309", "1e308", "-0", "0.5e-400", "01", "1.", "\ufeff", "\x00", "\u2028", "\xa0", "é",
)  # fmt: skip

soup = st.lists(st.sampled_from(TOKENS) | st.characters(codec="utf-8"), max_size=40).map("".join)
# Mostly valid documents with a tail of soup: deep in the grammar before it breaks.
near_valid = st.tuples(json_values, soup, st.booleans()).map(
    lambda v: orjson.dumps(v[0]).decode() + (v[1] if v[2] else "")
)
pieces = st.lists(st.integers(1, 12), max_size=10)


@examples(ci=300)
@given(text=soup | near_valid, sizes=pieces)
def test_checker_verdict_is_orjsons_on_token_soup(text: str, sizes: list[int]) -> None:
    checker = run(text, sizes)
    verdict = checker.finish()
    assert (verdict == "valid") == orjson_accepts(text)
    if verdict == "incomplete":
        assert extendable(text)
    offset = checker.error_offset
    assert (verdict == "syntax") == (offset is not None)
    if offset is not None:
        assert 0 <= offset <= len(text)
        assert extendable(text[:offset])
        if offset < len(text):
            assert not extendable(text[: offset + 1])
    # Pieces never matter: the same text whole gives the same answer.
    whole = run(text)
    assert (whole.finish(), whole.error_offset, whole.error_reason) == (
        verdict,
        offset,
        checker.error_reason,
    )


# -- check_output against jsonschema ------------------------------------------------------------

LEAF_SCHEMAS: tuple[dict[str, Any], ...] = (
    {}, {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
    {"type": "null"}, {"type": ["string", "null"]}, {"minimum": 0}, {"maximum": 1.5},
    {"exclusiveMinimum": 0}, {"multipleOf": 2}, {"maxLength": 3}, {"minLength": 1},
    {"pattern": "^a"}, {"enum": [1, "a", None, True]}, {"const": 0}, {"uniqueItems": True},
    {"minItems": 1}, {"maxProperties": 1}, {"required": ["a"]}, {"not": {"type": "null"}},
)  # fmt: skip
KEYS = ("a", "b", "c")
schemas = st.recursive(
    st.sampled_from(LEAF_SCHEMAS),
    lambda inner: st.one_of(
        st.builds(
            lambda props, required, extra: {
                "type": "object",
                "properties": props,
                "required": required,
                "additionalProperties": extra,
            },
            st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
            st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
            st.booleans() | inner,
        ),
        st.builds(
            lambda items, n: {"type": "array", "items": items, "maxItems": n},
            inner,
            st.integers(0, 4),
        ),
        st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
        st.builds(lambda a, b: {"oneOf": [a, b]}, inner, inner),
        st.builds(lambda a, b, c: {"if": a, "then": b, "else": c}, inner, inner, inner),
        st.builds(lambda a, b: {"allOf": [a, b]}, inner, inner),
    ),
    max_leaves=8,
)
instances = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-4, 4) | st.sampled_from(["", "a", "ab", "abcd", "b"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
    max_leaves=10,
)  # fmt: skip


@examples(ci=200)
@given(schema=schemas, instance=instances)
def test_check_output_agrees_with_jsonschema(schema: dict[str, Any], instance: Any) -> None:
    text = orjson.dumps(instance).decode()
    result = check_output(
        text, schema=schema, finish_reason="stop", done=True, contract=None, cache=SchemaCache()
    )
    expected = "valid" if Draft202012Validator(schema).is_valid(instance) else "schema"
    assert result.result == expected
    assert (result.reasons == ()) == (expected == "valid")


@examples(ci=100)
@given(schema=schemas, instance=instances, cut=st.integers(0, 200), done=st.booleans())
def test_an_output_cut_short_is_never_valid(
    schema: dict[str, Any], instance: Any, cut: int, done: bool
) -> None:
    text = orjson.dumps(instance).decode()
    prefix = text[: min(cut, len(text) - 1)]
    result = check_output(
        prefix, schema=schema, finish_reason=None, done=done, contract=None, cache=SchemaCache()
    )
    if orjson_accepts(prefix):  # "12" cut from "123" is still a number
        return
    # Without its end marker the stream ended early: truncated; with it, the text is broken.
    assert result.result == ("syntax" if done else "truncated")
