from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from semhealth.collectors.json_check import (
    CONTROL_CHARACTER,
    DEPTH_EXCEEDED,
    INVALID_ESCAPE,
    LONE_SURROGATE,
    NUMBER_OUT_OF_RANGE,
    TRAILING_DATA,
    UNEXPECTED_CHARACTER,
    JSONChecker,
    SyntaxVerdict,
)


def run(text: str, pieces: list[int] | None = None, **kwargs: Any) -> JSONChecker:
    """Feed ``text`` cut at the cumulative sizes ``pieces`` (whole when None), then finish."""
    checker = JSONChecker(**kwargs)
    for piece in cut(text, pieces or [len(text)]):
        checker.feed(piece)
    checker.finish()
    return checker


def cut(text: str, sizes: list[int]) -> list[str]:
    out: list[str] = []
    pos = 0
    for size in sizes:
        out.append(text[pos : pos + max(size, 1)])
        pos += max(size, 1)
    out.append(text[pos:])
    return [piece for piece in out if piece]


def verdict(text: str) -> SyntaxVerdict:
    checker = JSONChecker()
    checker.feed(text)
    return checker.finish()


def orjson_accepts(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


# -- a reference completion, to prove a prefix can still become a valid document ------------
#
# It follows a prefix assumed to be valid and returns a suffix that closes it; orjson then
# judges the result. A prefix that is not really extendable can never pass that judgement,
# so this proves "extendable" independently of the checker under test.

_CLOSE_LITERAL = {"t": "true", "f": "false", "n": "null"}


def completion(prefix: str) -> str | None:
    stack: list[str] = []
    mode, key, token = "value", False, ""
    i = 0
    while i < len(prefix):
        char = prefix[i]
        i += 1
        if mode in ("string", "escape", "literal", "number"):
            mode, key, token, consumed = _in_token(mode, key, token, char, stack)
            if not consumed:
                i -= 1
            continue
        if char in " \t\r\n":
            continue
        next_mode = _between_tokens(mode, char, stack)
        if next_mode is None:
            return None
        mode, key, token = next_mode
    closers = "".join("]" if opener == "[" else "}" for opener in reversed(stack))
    return _close_token(mode, key, token) + closers


def _in_token(
    mode: str, key: bool, token: str, char: str, stack: list[str]
) -> tuple[str, bool, str, bool]:
    after = "after" if stack else "done"
    if mode == "string":
        if char == '"':
            return ("colon" if key else after), key, "", True
        return ("escape" if char == "\\" else "string"), key, "\\" if char == "\\" else "", True
    if mode == "escape":
        token += char
        high = len(token) >= 6 and token[2] in "dD" and token[3] in "89abAB"
        if (len(token) == 2 and char != "u") or len(token) == 12 or (len(token) == 6 and not high):
            return "string", key, "", True
        return "escape", key, token, True
    if mode == "literal":
        token += char
        return (after if token in ("true", "false", "null") else "literal"), key, token, True
    if char in "0123456789+-.eE":
        return "number", key, token + char, True
    return after, key, "", False


def _between_tokens(mode: str, char: str, stack: list[str]) -> tuple[str, bool, str] | None:
    if mode == "colon":
        return ("value", False, "") if char == ":" else None
    if mode == "after":
        if char == ",":
            return ("key" if stack[-1] == "{" else "value"), False, ""
        if char in "]}":
            stack.pop()
            return ("after" if stack else "done"), False, ""
        return None
    if mode in ("array_first", "object_first") and char in "]}":
        stack.pop()
        return ("after" if stack else "done"), False, ""
    if mode in ("object_first", "key"):
        return ("string", True, "") if char == '"' else None
    if mode != "value" and mode != "array_first":
        return None
    if char == '"':
        return "string", False, ""
    if char in "[{":
        stack.append(char)
        return ("array_first" if char == "[" else "object_first"), False, ""
    if char in "-0123456789":
        return "number", False, char
    if char in _CLOSE_LITERAL:
        return "literal", False, char
    return None


def _close_token(mode: str, key: bool, token: str) -> str:
    colon = ":0" if key else ""
    closing = {"value": "0", "key": '"k":0', "colon": ":0", "string": '"' + colon}
    if mode in closing:
        return closing[mode]
    if mode == "escape":
        return _close_escape(token) + '"' + colon
    if mode == "literal":
        return _CLOSE_LITERAL[token[0]][len(token) :]
    if mode == "number":
        return _close_number(token)
    return ""  # array_first, object_first, after, done: the closers do it


def _close_escape(escape: str) -> str:
    if len(escape) == 1:
        return "n"
    if len(escape) >= 6:
        return "\\udc00"[len(escape) - 6 :]
    digits = escape[2:]
    full = digits + "0000"[len(digits) :]
    rest = full[len(digits) :]
    if full[0] in "dD" and full[1] in "89abAB":
        rest += "\\udc00"
    return rest


def _close_number(number: str) -> str:
    """Close a number so its value is finite, whatever its mantissa's size."""
    big = str(len(number) + 10)
    exp_at = max(number.find("e"), number.find("E"))
    last = number[-1]
    if last in "-." and exp_at < 0:
        return "0"
    if exp_at < 0:
        return "e-" + big
    if last in "eE":
        return "-" + big
    if last == "+":
        return "0"
    if number[exp_at + 1] == "-":
        return big if last == "-" else "1" + "0" * len(big)
    return ""


def extendable(prefix: str) -> bool:
    suffix = completion(prefix)
    return suffix is not None and orjson_accepts(prefix + suffix)


# -- strategies ----------------------------------------------------------------------------

json_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(json_text, children, max_size=5)
    ),
    max_leaves=15,
)
GAPS = ["", "", "", " ", "\n", "\t", "\r\n", "  "]


def serialise(value: Any, gaps: list[str], ascii_strings: bool) -> str:
    """JSON text with the given whitespace between tokens, in turn; strings escaped with
    \\uXXXX (surrogate pairs included) when ``ascii_strings``."""
    turns = itertools.cycle(gaps)

    def gap() -> str:
        return next(turns)

    def scalar(item: Any) -> str:
        if isinstance(item, str) and ascii_strings:
            return json.dumps(item, ensure_ascii=True)
        return orjson.dumps(item).decode()

    def walk(item: Any) -> str:
        if isinstance(item, list):
            inner = ",".join(gap() + walk(child) + gap() for child in item)
            return "[" + (inner or gap()) + "]"
        if isinstance(item, dict):
            pairs = (
                gap() + scalar(k) + gap() + ":" + gap() + walk(v) + gap() for k, v in item.items()
            )
            return "{" + (",".join(pairs) or gap()) + "}"
        return scalar(item)

    return gap() + walk(value) + gap()


@st.composite
def documents(draw: st.DrawFn) -> str:
    value = draw(json_values)
    gaps = draw(st.lists(st.sampled_from(GAPS), min_size=1, max_size=6))
    return serialise(value, gaps, draw(st.booleans()))


# Hypothesis fails an example slower than 200 ms by default; a test must never fail on speed.
no_deadline = settings(deadline=None)
splits = st.lists(st.integers(min_value=1, max_value=40), max_size=12)
CORRUPTING = [*'{}[]:,"\\ -+.eE0123456789tfnulrsaxdDcb8\n\t', "\x01", "\ud800", "\xa0"]


@st.composite
def corrupted(draw: st.DrawFn) -> tuple[str, int]:
    """A valid document with one insert, delete, replace or truncation at ``position``."""
    doc = draw(documents())
    position = draw(st.integers(min_value=0, max_value=len(doc)))
    op = draw(st.sampled_from(["insert", "delete", "replace", "truncate"]))
    char = draw(st.sampled_from(CORRUPTING) | st.characters())
    if op == "insert":
        return doc[:position] + char + doc[position:], position
    if op == "truncate" or position == len(doc):
        return doc[:position], position
    rest = doc[position + 1 :]
    return doc[:position] + ("" if op == "delete" else char) + rest, position


# -- properties ------------------------------------------------------------------------------


@no_deadline
@given(documents(), splits)
def test_valid_documents_are_valid_in_any_split(doc: str, pieces: list[int]) -> None:
    assert orjson_accepts(doc)
    checker = run(doc, pieces)
    assert checker.finish() == "valid"
    assert checker.error_offset is None


@no_deadline
@given(corrupted(), splits)
def test_corrupted_documents_get_orjsons_verdict(case: tuple[str, int], pieces: list[int]) -> None:
    text, _ = case
    result = run(text, pieces).finish()
    assert (result == "valid") == orjson_accepts(text)


@no_deadline
@given(corrupted(), splits)
def test_first_bad_offset_is_the_true_one(case: tuple[str, int], pieces: list[int]) -> None:
    text, position = case
    checker = run(text, pieces)
    offset = checker.error_offset
    if offset is None:
        return
    assert position <= offset <= len(text)  # text[:position] is part of a valid document
    assert extendable(text[:offset])  # never after the true offset: the prefix can go on
    if offset < len(text):
        assert not extendable(text[: offset + 1])  # nor before it: this character cannot


@no_deadline
@given(corrupted())
@example(case=("15965907498032014e+293", 1))  # a top-level number that overflows at the end
def test_prefix_before_the_offset_fed_alone_does_not_fail(case: tuple[str, int]) -> None:
    text, _ = case
    offset = run(text).error_offset
    if offset is None:
        return
    checker = JSONChecker()
    checker.feed(text[:offset])
    assert not checker.failed
    checker.feed(text[offset:])
    # An overflowing number is judged when it ends; at the end of the text that is finish().
    checker.finish()
    assert checker.error_offset == offset


@no_deadline
@given(documents(), st.data())
def test_truncated_valid_document_is_incomplete_not_syntax(doc: str, data: st.DataObject) -> None:
    end = data.draw(st.integers(min_value=0, max_value=len(doc)))
    prefix = doc[:end]
    result = verdict(prefix)
    assert result == ("valid" if orjson_accepts(prefix) else "incomplete")


@no_deadline
@given(corrupted(), splits)
def test_verdict_does_not_depend_on_the_split(case: tuple[str, int], pieces: list[int]) -> None:
    text, _ = case
    whole, split = run(text), run(text, pieces)
    assert (whole.finish(), whole.error_offset, whole.error_reason) == (
        split.finish(),
        split.error_offset,
        split.error_reason,
    )


# -- exact cases ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "0",
        "-0",
        "-0.0e+0",
        "1.5E-3",
        '""',
        '"\\u00e9\\ud83d\\ude00\\/\\b\\f\\n\\r\\t\\"\\\\"',
        '"\\u0000"',
        '"\x7f\u2028"',
        "true",
        "false",
        "null",
        " \t\r\n[ ] ",
        "{}",
        '{"a":{"b":[1,{"c":null}]},"d":[[],[{}]]}',
        '{"a":1,"a":2}',
        "18446744073709551616",
        "1" + "0" * 400 + "e-100",
        "1e-400",
        "0e999999",
        "1.7976931348623157e308",
    ],
)
def test_accepts_what_orjson_accepts(text: str) -> None:
    assert orjson_accepts(text)
    assert verdict(text) == "valid"


@pytest.mark.parametrize(
    ("text", "offset", "reason"),
    [
        ("01", 1, TRAILING_DATA),
        ("[01]", 2, UNEXPECTED_CHARACTER),
        ("+1", 0, UNEXPECTED_CHARACTER),
        (".5", 0, UNEXPECTED_CHARACTER),
        ("1.x", 2, UNEXPECTED_CHARACTER),
        ("[1.e5]", 3, UNEXPECTED_CHARACTER),
        ("1e+x", 3, UNEXPECTED_CHARACTER),
        ("-a", 1, UNEXPECTED_CHARACTER),
        ("[1,]", 3, UNEXPECTED_CHARACTER),
        ('{"a":1,}', 7, UNEXPECTED_CHARACTER),
        ('{"a" 1}', 5, UNEXPECTED_CHARACTER),
        ("{1:2}", 1, UNEXPECTED_CHARACTER),
        ("[1 2]", 3, UNEXPECTED_CHARACTER),
        ("nulx", 3, UNEXPECTED_CHARACTER),
        ("[tru]", 4, UNEXPECTED_CHARACTER),
        ("NaN", 0, UNEXPECTED_CHARACTER),
        ("\ufeff1", 0, UNEXPECTED_CHARACTER),
        ("[\xa01]", 1, UNEXPECTED_CHARACTER),
        ("truex", 4, TRAILING_DATA),
        ('{"a":1}{"b":2}', 7, TRAILING_DATA),
        ("1 2", 2, TRAILING_DATA),
        ('"a\x1fb"', 2, CONTROL_CHARACTER),
        ('"\\x"', 2, INVALID_ESCAPE),
        ('"\\u12G4"', 5, INVALID_ESCAPE),
        ('"\\ud800x"', 7, LONE_SURROGATE),
        ('"\\ud800\\u0041"', 9, LONE_SURROGATE),
        ('"\\ud800\\ud800"', 10, LONE_SURROGATE),
        ('"\\udc00"', 4, LONE_SURROGATE),
        ('"a\ud800"', 2, LONE_SURROGATE),
        ("1e400", 4, NUMBER_OUT_OF_RANGE),
        ("[1.8e308]", 7, NUMBER_OUT_OF_RANGE),
        ("-1e0400 ", 6, NUMBER_OUT_OF_RANGE),
        ("1" + "0" * 400, 401, NUMBER_OUT_OF_RANGE),
        ("[" + "1" * 400 + "]", 401, NUMBER_OUT_OF_RANGE),
        ("1" * 400 + "e+1", 401, NUMBER_OUT_OF_RANGE),
        ("1" * 400 + "e-1 ", 403, NUMBER_OUT_OF_RANGE),
    ],
)
def test_syntax_error_at_the_first_character_that_cannot_continue(
    text: str, offset: int, reason: str
) -> None:
    assert not orjson_accepts(text)
    checker = run(text)
    assert (checker.finish(), checker.error_offset, checker.error_reason) == (
        "syntax",
        offset,
        reason,
    )


@pytest.mark.parametrize(
    "text",
    ["", "  ", "[", '{"a"', '{"a":', '{"a":1,', '"ab', '"\\', '"\\u00', '"\\ud83d', "tr", "-"],
)
def test_input_that_ends_inside_a_value_is_incomplete(text: str) -> None:
    checker = run(text)
    assert checker.finish() == "incomplete"
    assert checker.error_offset is None
    assert not checker.complete


def test_offsets_count_characters_not_bytes() -> None:
    checker = run('["é😀", 1 2]')
    assert checker.error_offset == 9  # bytes would say 13


def test_fails_at_the_first_bad_character_before_the_end() -> None:
    checker = JSONChecker()
    checker.feed('{"a": [1, 2')
    assert not checker.failed
    checker.feed("}")
    assert checker.failed
    assert checker.error_offset == 11


def test_feeds_after_a_failure_are_ignored_but_counted() -> None:
    checker = JSONChecker()
    checker.feed("[1,,")
    checker.feed("2]")
    assert (checker.error_offset, checker.consumed, checker.finish()) == (3, 6, "syntax")


def test_feeds_after_finish_are_ignored() -> None:
    checker = JSONChecker()
    checker.feed("[1]")
    assert checker.finish() == "valid"
    checker.feed("x")
    assert checker.finish() == "valid"


def test_bare_top_level_number_completes_at_whitespace_or_finish() -> None:
    checker = JSONChecker()
    checker.feed("12")
    assert not checker.complete
    checker.feed(" ")
    assert checker.complete
    other = JSONChecker()
    other.feed("12")
    assert other.finish() == "valid"
    assert other.complete


def test_container_is_complete_at_its_closing_bracket() -> None:
    checker = JSONChecker()
    checker.feed('{"a": [1]}')
    assert checker.complete


def test_number_overflow_is_found_at_its_end() -> None:
    checker = JSONChecker()
    checker.feed("[1e40")
    checker.feed("0")
    assert not checker.failed  # more exponent digits are still possible
    checker.feed("]")
    assert checker.error_offset == 5


def test_orjsons_depth_limit_is_the_default() -> None:
    assert verdict("[" * 1024 + "]" * 1024) == "valid"
    checker = run("[" * 1025 + "]" * 1025)
    assert (checker.error_offset, checker.error_reason) == (1024, DEPTH_EXCEEDED)


@pytest.mark.parametrize("text", ["[[1]]", '[{"a": 1, "b": 2, "c": 3}]', "[[[]]]"])
def test_depth_beyond_max_depth_is_a_syntax_error(text: str) -> None:
    checker = run(text, max_depth=1)
    assert (checker.error_offset, checker.error_reason) == (1, DEPTH_EXCEEDED)


def test_max_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        JSONChecker(max_depth=0)


@pytest.mark.parametrize(
    "text",
    [
        '{"id": 7, "name": "a\\"b\\u00e9\\ud83d\\ude00", "tags": ["x", "y"], "ok": true}',
        '[1e5, -0.25E-3, 0, [], {}, null, false, "\\\\"]',
        '{"a":[1,{"b":"\\ud83d\\ude00"}],"c":1e40}x',
        "[1.8e308, 1]",
    ],
)
def test_every_two_way_split_gives_the_same_result(text: str) -> None:
    whole = run(text)
    expected = (whole.finish(), whole.error_offset, whole.error_reason)
    for at in range(1, len(text)):
        split = run(text, [at])
        assert (split.finish(), split.error_offset, split.error_reason) == expected
    single = JSONChecker()
    for char in text:
        single.feed(char)
    assert (single.finish(), single.error_offset, single.error_reason) == expected
