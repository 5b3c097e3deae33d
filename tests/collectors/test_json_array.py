from __future__ import annotations

import bisect
import itertools
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.frames import DecodeError, Frame
from semhealth.collectors.json_array import JSONArrayDecoder
from tests.collectors.decoding import bytewise, decode_all, split_at

BIG = 1 << 20

# The shape of a streamed POST /v1beta/models/gemini-2.0-flash:streamGenerateContent (no alt=sse).
GEMINI_STREAM = (
    b'[{\n  "candidates": [\n    {\n      "content": {\n        "parts": [\n          {\n'
    b'            "text": "The sky"\n          }\n        ],\n        "role": "model"\n'
    b'      }\n    }\n  ],\n  "usageMetadata": {\n    "promptTokenCount": 6,\n'
    b'    "totalTokenCount": 6\n  },\n  "modelVersion": "gemini-2.0-flash"\n}\n,\r\n'
    b'{\n  "candidates": [\n    {\n      "content": {\n        "parts": [\n          {\n'
    b'            "text": " is blue \\"[really]\\" \xe2\x98\x81\xef\xb8\x8f, {ok}"\n'
    b'          }\n        ],\n        "role": "model"\n      }\n    }\n  ],\n'
    b'  "modelVersion": "gemini-2.0-flash"\n}\n,\r\n'
    b'{\n  "candidates": [\n    {\n      "content": {\n        "parts": [\n          {\n'
    b'            "text": "."\n          }\n        ],\n        "role": "model"\n      },\n'
    b'      "finishReason": "STOP"\n    }\n  ],\n  "usageMetadata": {\n'
    b'    "promptTokenCount": 6,\n    "candidatesTokenCount": 9,\n    "totalTokenCount": 15\n'
    b'  },\n  "modelVersion": "gemini-2.0-flash"\n}\n]'
)

# Gemini's answer to a bad request, streamed or not: one object, no array.
GEMINI_ERROR = (
    b'{\n  "error": {\n    "code": 400,\n    "message": "API key not valid. Please pass a valid '
    b'API key.",\n    "status": "INVALID_ARGUMENT"\n  }\n}\n'
)


def decode(
    chunks: list[bytes], max_frame_bytes: int = BIG
) -> tuple[list[Frame], list[DecodeError]]:
    return decode_all(JSONArrayDecoder(max_frame_bytes), chunks)


def data_of(chunks: list[bytes], max_frame_bytes: int = BIG) -> list[str | bytes]:
    return [f.data for f in decode(chunks, max_frame_bytes)[0]]


def test_gemini_stream_gives_one_frame_per_element() -> None:
    frames, errors = decode([GEMINI_STREAM])
    assert errors == []
    texts = [orjson.loads(f.data)["candidates"][0]["content"]["parts"][0]["text"] for f in frames]
    assert texts == ["The sky", ' is blue "[really]" \u2601\ufe0f, {ok}', "."]


def test_gemini_stream_fed_byte_by_byte_gives_the_same_frames() -> None:
    assert data_of(bytewise(GEMINI_STREAM)) == data_of([GEMINI_STREAM])


def test_frame_data_is_the_element_bytes_without_separators() -> None:
    assert data_of([b'[ {"a": 1}\n,\r\n{ "b" :2 } ]']) == [b'{"a": 1}', b'{ "b" :2 }']


def test_element_is_a_frame_when_its_last_byte_arrives() -> None:
    decoder = JSONArrayDecoder(BIG)
    assert decoder.feed(b'[{"a":', 1) == []
    assert decoder.feed(b"1}", 2) == [Frame(data=b'{"a":1}', t=2)]
    assert decoder.feed(b'\n,\r\n{"b":2', 3) == []
    assert decoder.feed(b"}", 4) == [Frame(data=b'{"b":2}', t=4)]
    assert decoder.feed(b"\n]", 5) == []
    assert (decoder.close(6), decoder.errors) == ([], [])


def test_non_object_elements_are_framed_too() -> None:
    assert data_of([b'[1, -2.5e3, "s,]", [3, [4]], true, null, false]']) == [
        b"1",
        b"-2.5e3",
        b'"s,]"',
        b"[3, [4]]",
        b"true",
        b"null",
        b"false",
    ]


def test_scalar_element_keeps_the_time_of_its_last_byte() -> None:
    decoder = JSONArrayDecoder(BIG)
    assert decoder.feed(b"[12", 1) == []
    assert decoder.feed(b"3", 2) == []
    assert decoder.feed(b"\n,", 3) == [Frame(data=b"123", t=2)]


def test_brackets_and_quotes_inside_strings_do_not_end_an_element() -> None:
    element = rb'{"t":"]}, [{\"\\","u":"\\"}'
    assert data_of([b"[" + element + b"]"]) == [element]
    assert data_of(bytewise(b"[" + element + b"]")) == [element]


def test_backslash_at_the_end_of_a_chunk_escapes_the_next_chunks_quote() -> None:
    assert data_of([b'[{"a":"x\\', b'"]"}', b"]"]) == [b'{"a":"x\\"]"}']


def test_empty_array_gives_no_frame_and_no_error() -> None:
    assert decode([b" [ \r\n ] \n"]) == ([], [])


def test_empty_stream_gives_no_frame_and_no_error() -> None:
    assert decode([]) == ([], [])
    assert decode([b"", b" \r\n"]) == ([], [])


def test_top_level_object_is_one_frame_when_its_brace_arrives() -> None:
    decoder = JSONArrayDecoder(BIG)
    assert decoder.feed(GEMINI_ERROR[:40], 1) == []
    assert decoder.feed(GEMINI_ERROR[40:], 2) == [Frame(data=GEMINI_ERROR.rstrip(), t=2)]
    assert (decoder.close(3), decoder.errors) == ([], [])
    assert orjson.loads(GEMINI_ERROR)["error"]["code"] == 400


def test_top_level_object_fed_byte_by_byte_is_the_same_frame() -> None:
    assert data_of(bytewise(GEMINI_ERROR)) == [GEMINI_ERROR.rstrip()]


def test_other_body_is_one_frame_at_close_without_surrounding_whitespace() -> None:
    decoder = JSONArrayDecoder(BIG)
    assert decoder.feed(b"\n Internal ", 1) == []
    assert decoder.feed(b"error\r\n", 2) == []
    assert decoder.feed(b"  ", 3) == []
    assert decoder.close(4) == [Frame(data=b"Internal error", t=2)]
    assert decoder.errors == []


def test_other_body_over_limit_gives_error_and_no_frame() -> None:
    assert decode([b'  "0123456789"'], max_frame_bytes=11) == (
        [],
        [DecodeError("frame_too_large", 2)],
    )


def test_other_body_at_the_limit_with_trailing_whitespace_is_kept() -> None:
    stream = b'"012345678"' + b" " * 40
    for cut in range(len(stream) + 1):
        assert decode([stream[:cut], stream[cut:]], 11)[0] == [
            Frame(data=b'"012345678"', t=1 if cut < 11 else 0)
        ]


def test_oversized_element_is_skipped_and_next_element_decoded() -> None:
    stream = b'[{"a":1},{"big":"' + b"x" * 50 + b'"},{"b":2}]'
    frames, errors = decode([stream], max_frame_bytes=16)
    assert [f.data for f in frames] == [b'{"a":1}', b'{"b":2}']
    assert errors == [DecodeError("frame_too_large", 9)]


def test_oversized_element_in_small_chunks_gives_the_same_result() -> None:
    stream = b'[{"a":1},{"big":"' + b"x" * 50 + b'"},{"b":2}]'
    chunks = split_at(stream, list(range(0, len(stream), 3)))
    assert decode(chunks, 16)[1] == [DecodeError("frame_too_large", 9)]
    assert data_of(chunks, 16) == [b'{"a":1}', b'{"b":2}']


def test_element_at_exactly_the_limit_is_kept() -> None:
    assert data_of([b'[{"a":"1234567"}]'], max_frame_bytes=15) == [b'{"a":"1234567"}']
    assert data_of([b"[123456789012345]"], max_frame_bytes=15) == [b"123456789012345"]


def test_oversized_top_level_object_gives_error_and_no_frame() -> None:
    assert decode([b' {"a":', b'"0123456789"}'], max_frame_bytes=16) == (
        [],
        [DecodeError("frame_too_large", 1)],
    )


def test_oversized_element_is_not_buffered() -> None:
    decoder = JSONArrayDecoder(1024)
    decoder.feed(b'[{"a":"', 0)
    piece = b"z" * 65536
    tracemalloc.start()
    try:
        for _ in range(256):  # 16 MiB of one element
            decoder.feed(piece, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert [f.data for f in decoder.feed(b'"}\n,\r\n{}]', 1)] == [b"{}"]
    assert decoder.errors == [DecodeError("frame_too_large", 1)]


def test_truncated_element_gives_incomplete_at_its_start_and_no_frame() -> None:
    stream = b'[{"a":1},\n{"b":[2'
    for chunks in ([stream], bytewise(stream)):
        frames, errors = decode(chunks)
        assert [f.data for f in frames] == [b'{"a":1}']
        assert errors == [DecodeError("incomplete", 10)]


def test_stream_cut_between_elements_gives_incomplete_at_its_end() -> None:
    assert decode([b'[{"a":1},\n'])[1] == [DecodeError("incomplete", 10)]
    assert decode([b'[{"a":1} '])[1] == [DecodeError("incomplete", 9)]
    assert decode([b"["])[1] == [DecodeError("incomplete", 1)]


def test_truncated_scalar_element_is_not_a_frame() -> None:
    assert decode([b"[1, 23"]) == ([Frame(data=b"1", t=0)], [DecodeError("incomplete", 4)])


def test_truncated_top_level_object_gives_incomplete() -> None:
    assert decode([GEMINI_ERROR[:-5]]) == ([], [DecodeError("incomplete", 0)])


def test_garbage_between_elements_gives_bad_json_and_ends_framing() -> None:
    frames, errors = decode([b'[{"a":1} x,{"b":2}]'])
    assert [f.data for f in frames] == [b'{"a":1}']
    assert errors == [DecodeError("bad_json", 9)]


@pytest.mark.parametrize(
    ("stream", "offset"),
    [
        (b"[{},]", 4),  # trailing comma
        (b"[,{}]", 1),
        (b"[{},,{}]", 4),
        (b"[{}}", 3),
        (b"[{} {}]", 4),  # missing comma
        (b"[x]", 1),
    ],
)
def test_bytes_that_break_the_array_structure_give_bad_json(stream: bytes, offset: int) -> None:
    assert decode([stream])[1] == [DecodeError("bad_json", offset)]


def test_nothing_is_framed_after_bad_json() -> None:
    decoder = JSONArrayDecoder(BIG)
    decoder.feed(b'[{"a":1};', 1)
    assert decoder.feed(b'{"b":2}]', 2) == []
    assert decoder.close(3) == []
    assert decoder.errors == [DecodeError("bad_json", 8)]


def test_whitespace_after_the_array_is_fine() -> None:
    assert decode([b"[{}]", b" \r\n\t"]) == ([Frame(data=b"{}", t=0)], [])


def test_data_after_the_array_is_trailing_data() -> None:
    assert decode([b"[{}] \n", b"[{}]"]) == (
        [Frame(data=b"{}", t=0)],
        [DecodeError("trailing_data", 6)],
    )
    assert decode([b'{"a":1}{}'])[1] == [DecodeError("trailing_data", 7)]


def test_feed_after_close_is_ignored() -> None:
    decoder = JSONArrayDecoder(BIG)
    decoder.close(1)
    assert (decoder.feed(b"[{}]", 2), decoder.close(3)) == ([], [])


def test_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        JSONArrayDecoder(0)


_TEXT = st.text(
    st.sampled_from([*'],["\\{}:\n\r\t /u', "\u00e9", "\u2028", "\U0001f600", "\x00"]),
    max_size=10,
) | st.text(st.characters(exclude_categories=["Cs"]), max_size=10)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 63) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=8,
)
_OBJECTS = st.dictionaries(_TEXT, _VALUES, max_size=4)

_SERIALISERS: list[Callable[[Any], bytes]] = [
    orjson.dumps,
    lambda v: json.dumps(v, ensure_ascii=True, separators=(",", ":")).encode(),  # \uXXXX escapes
    lambda v: json.dumps(v, ensure_ascii=False, indent=2).encode(),
]
# (opening, separator, closing) of the array: Gemini's, compact, pretty-printed.
_SHAPES = [(b"[", b"\n,\r\n", b"]"), (b"[", b",", b"]"), (b"[\n", b",\n", b"\n]\n")]


def array_stream(
    elements: list[bytes], shape: tuple[bytes, bytes, bytes]
) -> tuple[bytes, list[int]]:
    """The array's bytes, and the offset of each element's last byte."""
    opening, separator, closing = shape
    stream = bytearray(opening)
    ends: list[int] = []
    for i, element in enumerate(elements):
        if i:
            stream += separator
        stream += element
        ends.append(len(stream) - 1)
    stream += closing
    return bytes(stream), ends


def draw_chunks(stream: bytes, data: st.DataObject) -> list[bytes]:
    if data.draw(st.booleans(), label="byte at a time"):
        return bytewise(stream)
    return split_at(stream, data.draw(st.lists(st.integers(0, len(stream)), max_size=30)))


@given(
    st.lists(_OBJECTS, max_size=6),
    st.sampled_from(_SERIALISERS),
    st.sampled_from(_SHAPES),
    st.data(),
)
def test_any_chunking_of_an_array_of_objects_gives_its_elements(
    objects: list[dict[str, Any]],
    serialise: Callable[[Any], bytes],
    shape: tuple[bytes, bytes, bytes],
    data: st.DataObject,
) -> None:
    elements = [serialise(o) for o in objects]
    stream, _ = array_stream(elements, shape)
    frames, errors = decode(draw_chunks(stream, data))
    assert [f.data for f in frames] == elements
    assert [orjson.loads(f.data) for f in frames] == objects
    assert errors == []


@given(
    st.lists(_VALUES, max_size=6),
    st.sampled_from(_SERIALISERS),
    st.sampled_from(_SHAPES),
    st.data(),
)
def test_each_frame_has_the_time_of_the_chunk_with_its_last_byte(
    values: list[Any],
    serialise: Callable[[Any], bytes],
    shape: tuple[bytes, bytes, bytes],
    data: st.DataObject,
) -> None:
    elements = [serialise(v) for v in values]
    stream, ends = array_stream(elements, shape)
    chunks = draw_chunks(stream, data)
    chunk_ends = list(itertools.accumulate(len(c) for c in chunks))  # offset past each chunk
    frames, errors = decode(chunks)
    assert [f.data for f in frames] == elements
    assert [f.t for f in frames] == [bisect.bisect_right(chunk_ends, end) for end in ends]
    assert errors == []


@given(_OBJECTS, st.sampled_from(_SERIALISERS), st.data())
def test_any_chunking_of_a_top_level_object_gives_one_frame(
    obj: dict[str, Any], serialise: Callable[[Any], bytes], data: st.DataObject
) -> None:
    body = serialise(obj)
    frames, errors = decode(draw_chunks(b"\n" + body + b"\r\n", data))
    assert [f.data for f in frames] == [body]
    assert orjson.loads(frames[0].data) == obj
    assert errors == []


@given(st.lists(_OBJECTS, min_size=2, max_size=4), st.data())
def test_any_oversized_element_is_skipped_and_the_others_come_out(
    objects: list[dict[str, Any]], data: st.DataObject
) -> None:
    big = data.draw(st.integers(0, len(objects) - 1), label="oversized element")
    elements = [orjson.dumps(o) for o in objects]
    limit = max([len(e) for i, e in enumerate(elements) if i != big] + [2])
    elements[big] = orjson.dumps({"big": "]" * limit})
    stream, ends = array_stream(elements, _SHAPES[0])
    frames, errors = decode(draw_chunks(stream, data), limit)
    assert [f.data for f in frames] == elements[:big] + elements[big + 1 :]
    assert errors == [DecodeError("frame_too_large", ends[big] - len(elements[big]) + 1)]


@given(st.lists(_OBJECTS, min_size=1, max_size=4), st.data())
def test_any_truncation_gives_incomplete_and_only_whole_elements(
    objects: list[dict[str, Any]], data: st.DataObject
) -> None:
    elements = [orjson.dumps(o) for o in objects]
    stream, ends = array_stream(elements, _SHAPES[0])
    cut = data.draw(st.integers(1, len(stream) - 1), label="cut")
    frames, errors = decode(draw_chunks(stream[:cut], data))
    assert [f.data for f in frames] == [
        e for e, end in zip(elements, ends, strict=True) if end < cut
    ]
    assert [e.reason for e in errors] == ["incomplete"]


@given(st.lists(_OBJECTS, min_size=1, max_size=4), st.binary(min_size=1, max_size=4), st.data())
def test_garbage_after_any_element_gives_bad_json_there(
    objects: list[dict[str, Any]], garbage: bytes, data: st.DataObject
) -> None:
    garbage = garbage.lstrip(b" \t\r\n,]") or b"x"
    at = data.draw(st.integers(0, len(objects) - 1), label="element before the garbage")
    elements = [orjson.dumps(o) for o in objects]
    stream, ends = array_stream(elements, _SHAPES[0])
    stream = stream[: ends[at] + 1] + garbage + stream[ends[at] + 1 :]
    frames, errors = decode(draw_chunks(stream, data))
    assert [f.data for f in frames] == elements[: at + 1]
    assert errors == [DecodeError("bad_json", ends[at] + 1)]


_GARBAGE = st.lists(
    st.sampled_from([b"[", b"]", b"{", b"}", b",", b'"', b"\\", b" ", b"\r\n", b"1", b"x" * 20])
    | st.binary(max_size=8),
    max_size=40,
).map(b"".join)


@given(_GARBAGE, st.integers(1, 32), st.data())
def test_garbage_in_any_chunking_never_raises_and_decodes_the_same(
    stream: bytes, max_frame_bytes: int, data: st.DataObject
) -> None:
    whole, whole_errors = decode([stream], max_frame_bytes)
    split, split_errors = decode(draw_chunks(stream, data), max_frame_bytes)
    assert [f.data for f in split] == [f.data for f in whole]
    assert split_errors == whole_errors
