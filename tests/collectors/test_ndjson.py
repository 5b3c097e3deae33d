from __future__ import annotations

import tracemalloc

import orjson
from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.frames import DecodeError, Frame
from semhealth.collectors.ndjson import NDJSONDecoder
from tests.collectors.decoding import decode_all, split_at

BIG = 1 << 20

# Recorded from a streamed POST /api/chat on Ollama (Content-Type: application/x-ndjson).
OLLAMA_CHAT = (
    b'{"model":"llama3.2","created_at":"2025-03-10T09:12:01.114307Z",'
    b'"message":{"role":"assistant","content":"The"},"done":false}\n'
    b'{"model":"llama3.2","created_at":"2025-03-10T09:12:01.132541Z",'
    b'"message":{"role":"assistant","content":" sky \xe2\x98\x81\xef\xb8\x8f"},"done":false}\n'
    b'{"model":"llama3.2","created_at":"2025-03-10T09:12:01.150820Z",'
    b'"message":{"role":"assistant","content":" \xe6\x98\xaf\xe8\x93\x9d\xe8\x89\xb2"},'
    b'"done":false}\n'
    b'{"model":"llama3.2","created_at":"2025-03-10T09:12:01.169215Z",'
    b'"message":{"role":"assistant","content":""},"done_reason":"stop","done":true,'
    b'"total_duration":4883583458,"load_duration":1334875,"prompt_eval_count":26,'
    b'"prompt_eval_duration":342546000,"eval_count":3,"eval_duration":4535599000}\n'
)


def decode(
    chunks: list[bytes], max_frame_bytes: int = BIG
) -> tuple[list[Frame], list[DecodeError]]:
    return decode_all(NDJSONDecoder(max_frame_bytes), chunks)


def data_of(chunks: list[bytes], max_frame_bytes: int = BIG) -> list[str | bytes]:
    return [f.data for f in decode(chunks, max_frame_bytes)[0]]


def test_ollama_stream_gives_one_frame_per_line() -> None:
    frames, errors = decode([OLLAMA_CHAT])
    assert errors == []
    assert [orjson.loads(f.data)["done"] for f in frames] == [False, False, False, True]
    assert orjson.loads(frames[2].data)["message"]["content"] == " \u662f\u84dd\u8272"


def test_ollama_stream_fed_byte_by_byte_gives_the_same_frames() -> None:
    single = [OLLAMA_CHAT[i : i + 1] for i in range(len(OLLAMA_CHAT))]
    assert data_of(single) == data_of([OLLAMA_CHAT])


def test_frame_data_is_the_line_bytes_unparsed() -> None:
    assert data_of([b'{"a": 1}\nnot json\n']) == [b'{"a": 1}', b"not json"]


def test_trailing_cr_is_stripped() -> None:
    assert data_of([b'{"a":1}\r\n{"b":2}\r\n']) == [b'{"a":1}', b'{"b":2}']


def test_cr_inside_a_line_is_kept() -> None:
    assert data_of([b"a\rb\n"]) == [b"a\rb"]


def test_blank_and_whitespace_lines_are_skipped() -> None:
    assert data_of([b"\n\r\n  \t\n{}\n\n"]) == [b"{}"]


def test_final_line_without_newline_is_emitted_at_close() -> None:
    decoder = NDJSONDecoder(BIG)
    assert [f.data for f in decoder.feed(b'{"a":1}\n{"b":', 10)] == [b'{"a":1}']
    assert decoder.feed(b"2}", 20) == []
    frames = decoder.close(99)
    assert [(f.data, f.t) for f in frames] == [(b'{"b":2}', 20)]
    assert decoder.errors == []


def test_frame_t_is_time_of_chunk_with_newline() -> None:
    decoder = NDJSONDecoder(BIG)
    decoder.feed(b'{"a"', 1)
    decoder.feed(b":1}", 2)
    assert [f.t for f in decoder.feed(b"\n{}\n", 3)] == [3, 3]


def test_oversized_line_is_skipped_and_next_line_decoded() -> None:
    frames, errors = decode([b"{}\n" + b"x" * 50 + b"\n[1]\n"], max_frame_bytes=16)
    assert [f.data for f in frames] == [b"{}", b"[1]"]
    assert errors == [DecodeError("frame_too_large", 3)]


def test_oversized_line_in_small_chunks_gives_the_same_result() -> None:
    stream = b"{}\n" + b"x" * 50 + b"\n[1]\n"
    assert decode(split_at(stream, list(range(0, len(stream), 3))), 16)[1] == [
        DecodeError("frame_too_large", 3)
    ]
    assert data_of(split_at(stream, list(range(0, len(stream), 3))), 16) == [b"{}", b"[1]"]


def test_offsets_after_a_skipped_line_count_its_bytes() -> None:
    stream = b"x" * 50 + b"\n" + b"y" * 50 + b"\n"
    _, errors = decode(split_at(stream, list(range(0, len(stream), 10))), 16)
    assert errors == [DecodeError("frame_too_large", 0), DecodeError("frame_too_large", 51)]


def test_line_at_limit_with_crlf_is_kept_in_any_split() -> None:
    stream = b"y" * 16 + b"\r\n"
    for cut in range(len(stream) + 1):
        assert decode([stream[:cut], stream[cut:]], 16) == (
            [Frame(data=b"y" * 16, t=1 if cut <= 17 else 0)],
            [],
        )


def test_oversized_unterminated_line_at_close_is_an_error() -> None:
    assert decode([b"{}\n" + b"z" * 17], 16) == (
        [Frame(data=b"{}", t=0)],
        [DecodeError("frame_too_large", 3)],
    )


def test_oversized_line_is_not_buffered() -> None:
    decoder = NDJSONDecoder(1024)
    piece = b"z" * 65536
    tracemalloc.start()
    try:
        for _ in range(256):  # 16 MiB of one line
            decoder.feed(piece, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert [f.data for f in decoder.feed(b"\n{}\n", 1)] == [b"{}"]


def test_feed_after_close_is_ignored() -> None:
    decoder = NDJSONDecoder(BIG)
    decoder.close(1)
    assert (decoder.feed(b"{}\n", 2), decoder.close(3)) == ([], [])


_LINES = st.lists(
    st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"")).filter(lambda b: b.strip(b" \t\r"))
    | st.text(max_size=12).map(lambda s: orjson.dumps({"content": s})),
    max_size=8,
)


@given(_LINES, st.sampled_from([b"\n", b"\r\n"]), st.booleans(), st.data())
def test_any_chunking_of_valid_stream_gives_the_same_frames_as_one_chunk(
    lines: list[bytes], ending: bytes, final_newline: bool, data: st.DataObject
) -> None:
    # A CR that ends a line is read as half of a CRLF ending, at the stream's end too.
    lines = [line.rstrip(b"\r") for line in lines]
    lines = [line for line in lines if line.strip(b" \t\r")]
    stream = ending.join(lines) + (ending if final_newline and lines else b"")
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    whole, whole_errors = decode([stream])
    split, split_errors = decode(split_at(stream, points))
    assert [f.data for f in whole] == lines
    assert [f.data for f in split] == lines
    assert whole_errors == split_errors == []


_GARBAGE = st.lists(
    st.sampled_from([b"\n", b"\r", b"\r\n", b" ", b"{}", b"x" * 20, b"\xff\xe4"])
    | st.binary(max_size=8),
    max_size=40,
).map(b"".join)


@given(_GARBAGE, st.integers(1, 32), st.data())
def test_garbage_in_any_chunking_never_raises_and_decodes_the_same(
    stream: bytes, max_frame_bytes: int, data: st.DataObject
) -> None:
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    whole, whole_errors = decode([stream], max_frame_bytes)
    split, split_errors = decode(split_at(stream, points), max_frame_bytes)
    assert [f.data for f in split] == [f.data for f in whole]
    assert split_errors == whole_errors
