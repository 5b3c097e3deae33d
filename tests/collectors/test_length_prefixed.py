from __future__ import annotations

import struct
import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.frames import DecodeError, Frame
from semhealth.collectors.length_prefixed import LengthPrefixedDecoder
from tests.collectors.decoding import decode_all, split_at

BIG = 1 << 20


def framed(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def decode(
    chunks: list[bytes], max_frame_bytes: int = BIG
) -> tuple[list[Frame], list[DecodeError]]:
    return decode_all(LengthPrefixedDecoder(max_frame_bytes), chunks)


def test_several_frames_in_one_chunk() -> None:
    decoder = LengthPrefixedDecoder(BIG)
    frames = decoder.feed(framed(b'{"a":1}', b"", "\u4f60\u597d".encode()), 5)
    assert frames == [
        Frame(data=b'{"a":1}', t=5),
        Frame(data=b"", t=5),
        Frame(data="\u4f60\u597d".encode(), t=5),
    ]


def test_one_frame_over_many_chunks_has_t_of_last_chunk() -> None:
    decoder = LengthPrefixedDecoder(BIG)
    stream = framed(b"0123456789" * 10)
    head = stream[:-1]
    for t, i in enumerate(range(0, len(head), 3)):
        assert decoder.feed(head[i : i + 3], t) == []
    assert decoder.feed(stream[-1:], 1000) == [Frame(data=b"0123456789" * 10, t=1000)]


def test_prefix_split_across_chunks_is_read() -> None:
    assert decode([b"\x00\x00", b"\x00\x02ok"]) == ([Frame(data=b"ok", t=1)], [])


def test_length_over_limit_stops_the_decoder() -> None:
    decoder = LengthPrefixedDecoder(8)
    frames = decoder.feed(framed(b"fine", b"far too large", b"after"), 0)
    assert frames == [Frame(data=b"fine", t=0)]
    assert decoder.errors == [DecodeError("frame_too_large", 8)]
    assert decoder.feed(framed(b"more"), 1) == []
    assert (decoder.close(2), decoder.errors) == ([], [DecodeError("frame_too_large", 8)])


def test_length_over_limit_is_detected_from_the_prefix_alone() -> None:
    decoder = LengthPrefixedDecoder(8)
    decoder.feed(struct.pack(">I", 0xFFFFFFFF), 0)
    assert decoder.errors == [DecodeError("frame_too_large", 0)]


def test_nothing_is_buffered_after_the_framing_is_lost() -> None:
    decoder = LengthPrefixedDecoder(1024)
    decoder.feed(struct.pack(">I", 1 << 30), 0)
    piece = b"p" * 65536
    tracemalloc.start()
    try:
        for _ in range(256):
            decoder.feed(piece, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_partial_frame_at_close_is_incomplete() -> None:
    stream = framed(b"one", b"two")[:-1]
    assert decode([stream]) == ([Frame(data=b"one", t=0)], [DecodeError("incomplete", 7)])


def test_partial_prefix_at_close_is_incomplete() -> None:
    assert decode([framed(b"one") + b"\x00"])[1] == [DecodeError("incomplete", 7)]


def test_frame_at_exactly_the_limit_is_kept() -> None:
    assert decode([framed(b"12345678")], 8) == ([Frame(data=b"12345678", t=0)], [])


def test_feed_after_close_is_ignored() -> None:
    decoder = LengthPrefixedDecoder(BIG)
    decoder.close(1)
    assert (decoder.feed(framed(b"x"), 2), decoder.errors) == ([], [])


@given(st.lists(st.binary(max_size=40), max_size=8), st.data())
def test_any_chunking_of_valid_stream_gives_the_same_frames_as_one_chunk(
    payloads: list[bytes], data: st.DataObject
) -> None:
    stream = framed(*payloads)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    whole, whole_errors = decode([stream])
    split, split_errors = decode(split_at(stream, points))
    assert [f.data for f in whole] == payloads
    assert [f.data for f in split] == payloads
    assert whole_errors == split_errors == []


@given(st.binary(max_size=200), st.integers(1, 64), st.data())
def test_garbage_in_any_chunking_never_raises_and_decodes_the_same(
    stream: bytes, max_frame_bytes: int, data: st.DataObject
) -> None:
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    whole, whole_errors = decode([stream], max_frame_bytes)
    split, split_errors = decode(split_at(stream, points), max_frame_bytes)
    assert [f.data for f in split] == [f.data for f in whole]
    assert split_errors == whole_errors
