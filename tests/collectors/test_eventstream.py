from __future__ import annotations

import itertools
import struct
import tracemalloc
import uuid
import zlib

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.eventstream import (
    EventStreamDecoder,
    encode_event_message,
    event_message,
    exception_message,
)
from semhealth.collectors.frames import DecodeError, Decoder, Frame
from tests.collectors.decoding import bytewise, decode_all, split_at

BIG = 1 << 20

# A ConverseStream response in Bedrock's shape: each event's JSON carries a "p" field of
# random padding, which Bedrock adds so that sizes do not reveal the text.
CONVERSE_EVENTS = [
    ("messageStart", b'{"p":"abcdefghijklmnopqrstu","role":"assistant"}'),
    ("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"The"},"p":"abcd"}'),
    ("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":" sky \xe6\x98\xaf"},"p":"a"}'),
    ("contentBlockStop", b'{"contentBlockIndex":0,"p":"abcdefghijklmnopqrstuvwxyzABCDEF"}'),
    ("messageStop", b'{"p":"abcdefghijklmnop","stopReason":"end_turn"}'),
    (
        "metadata",
        b'{"metrics":{"latencyMs":412},"p":"abc",'
        b'"usage":{"inputTokens":12,"outputTokens":3,"totalTokens":15}}',
    ),
]
CONVERSE_STREAM = b"".join(event_message(name, payload) for name, payload in CONVERSE_EVENTS)


def decode(
    chunks: list[bytes], max_frame_bytes: int = BIG
) -> tuple[list[Frame], list[DecodeError]]:
    return decode_all(EventStreamDecoder(max_frame_bytes), chunks)


def pairs(frames: list[Frame]) -> list[tuple[str, str | bytes]]:
    return [(f.event, f.data) for f in frames]


def offsets(messages: list[bytes]) -> list[int]:
    return [0, *itertools.accumulate(len(m) for m in messages)][:-1]


def header(name: str, kind: int, value: bytes) -> bytes:
    raw = name.encode()
    return struct.pack(">B", len(raw)) + raw + struct.pack(">B", kind) + value


def string_header(name: str, value: str) -> bytes:
    raw = value.encode()
    return header(name, 7, struct.pack(">H", len(raw)) + raw)


def raw_message(headers: bytes, payload: bytes) -> bytes:
    """A message built by hand from the wire format, for headers the encoder does not write."""
    lengths = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    body = lengths + struct.pack(">I", zlib.crc32(lengths)) + headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


def flip(stream: bytes, at: int, mask: int = 0xFF) -> bytes:
    return stream[:at] + bytes((stream[at] ^ mask,)) + stream[at + 1 :]


def botocore_messages(stream: bytes) -> list[tuple[dict[str, object], bytes]]:
    """The messages botocore, AWS's own SDK (a test dependency through boto3), reads from
    ``stream``."""
    buffer = EventStreamBuffer()
    buffer.add_data(stream)
    return [(message.headers, message.payload) for message in buffer]


def test_converse_stream_gives_one_frame_per_event() -> None:
    frames, errors = decode([CONVERSE_STREAM])
    assert errors == []
    assert pairs(frames) == CONVERSE_EVENTS
    assert orjson.loads(frames[2].data)["delta"]["text"] == " sky \u662f"


def test_converse_stream_fed_byte_by_byte_gives_the_same_frames() -> None:
    frames, errors = decode(bytewise(CONVERSE_STREAM))
    assert (pairs(frames), errors) == (CONVERSE_EVENTS, [])


def test_invoke_model_chunk_event_is_named_chunk() -> None:
    payload = b'{"bytes":"eyJ0eXBlIjoibWVzc2FnZV9zdGFydCJ9","p":"abcdefgh"}'
    assert decode([event_message("chunk", payload)]) == ([Frame(payload, 0, "chunk")], [])


def test_exception_is_named_for_its_exception_type() -> None:
    stream = exception_message("throttlingException", b'{"message":"Too many requests"}')
    frames, errors = decode([stream])
    assert (pairs(frames), errors) == (
        [("exception:throttlingException", b'{"message":"Too many requests"}')],
        [],
    )


def test_error_is_named_for_its_error_code() -> None:
    stream = encode_event_message(
        {
            ":message-type": "error",
            ":error-code": "InternalFailure",
            ":error-message": "An internal error occurred",
        },
        b"",
    )
    assert pairs(decode([stream])[0]) == [("error:InternalFailure", b"")]


def test_message_without_message_type_is_an_event() -> None:
    stream = encode_event_message({":event-type": "contentBlockStop"}, b"{}")
    assert pairs(decode([stream])[0]) == [("contentBlockStop", b"{}")]


def test_event_without_event_type_has_an_empty_name() -> None:
    stream = encode_event_message({":message-type": "event"}, b"{}")
    assert pairs(decode([stream])[0]) == [("", b"{}")]


def test_unknown_message_type_names_the_frame() -> None:
    stream = encode_event_message({":message-type": "initial-response"}, b"{}")
    assert pairs(decode([stream])[0]) == [("initial-response", b"{}")]


def test_message_without_headers_or_payload_is_an_empty_frame() -> None:
    stream = encode_event_message({}, b"")
    assert len(stream) == 16
    assert decode([stream]) == ([Frame(b"", 0, "")], [])


def test_several_messages_in_one_chunk_share_its_t() -> None:
    decoder = EventStreamDecoder(BIG)
    frames = decoder.feed(event_message("a", b"1") + event_message("b", b"2"), 7)
    assert frames == [Frame(b"1", 7, "a"), Frame(b"2", 7, "b")]


def test_one_message_over_many_chunks_has_t_of_last_chunk() -> None:
    decoder = EventStreamDecoder(BIG)
    stream = event_message("contentBlockDelta", b"0123456789" * 10)
    head = stream[:-1]
    for t, i in enumerate(range(0, len(head), 3)):
        assert decoder.feed(head[i : i + 3], t) == []
    assert decoder.feed(stream[-1:], 1000) == [Frame(b"0123456789" * 10, 1000, "contentBlockDelta")]


def test_botocore_reads_what_the_encoder_writes() -> None:
    stream = (
        event_message("contentBlockDelta", b'{"delta":{"text":"hi"}}')
        + exception_message("validationException", b'{"message":"bad"}')
        + encode_event_message({"\u540d\u524d": "\u5024 \u2601", ":message-type": "event"}, b"")
    )
    assert botocore_messages(stream) == [
        (
            {
                ":event-type": "contentBlockDelta",
                ":content-type": "application/json",
                ":message-type": "event",
            },
            b'{"delta":{"text":"hi"}}',
        ),
        (
            {
                ":exception-type": "validationException",
                ":content-type": "application/json",
                ":message-type": "exception",
            },
            b'{"message":"bad"}',
        ),
        ({"\u540d\u524d": "\u5024 \u2601", ":message-type": "event"}, b""),
    ]


def test_headers_of_every_type_are_parsed_past() -> None:
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    headers = b"".join(
        [
            string_header(":event-type", "chunk"),
            header("yes", 0, b""),
            header("no", 1, b""),
            header("byte", 2, struct.pack(">b", -3)),
            header("short", 3, struct.pack(">h", -300)),
            header("int", 4, struct.pack(">i", 70000)),
            header("long", 5, struct.pack(">q", 1 << 40)),
            header("blob", 6, struct.pack(">H", 3) + b"\x00\xff\x07"),
            header("time", 8, struct.pack(">q", 1_700_000_000_123)),
            header("id", 9, ident.bytes),
            string_header(":message-type", "event"),
        ]
    )
    stream = raw_message(headers, b'{"ok":true}')
    # botocore agrees that the hand-built message is well formed, value by value.
    [(parsed, _)] = botocore_messages(stream)
    assert parsed["yes"] is True
    assert parsed["no"] is False
    assert (parsed["byte"], parsed["short"], parsed["int"]) == (-3, -300, 70000)
    assert (parsed["long"], parsed["blob"], parsed["time"]) == (
        1 << 40,
        b"\x00\xff\x07",
        1_700_000_000_123,
    )
    assert parsed["id"] == ident.bytes
    assert decode([stream]) == ([Frame(b'{"ok":true}', 0, "chunk")], [])


def test_header_type_other_than_string_does_not_name_the_frame() -> None:
    headers = header(":event-type", 4, struct.pack(">i", 1)) + string_header(
        ":message-type", "event"
    )
    assert pairs(decode([raw_message(headers, b"x")])[0]) == [("", b"x")]


def test_unknown_header_type_is_bad_headers_and_only_that_message_is_lost() -> None:
    bad = raw_message(header(":event-type", 10, b""), b"x")
    frames, errors = decode([bad + event_message("after", b"y")])
    assert (pairs(frames), errors) == ([("after", b"y")], [DecodeError("bad_headers", 0)])


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(string_header(":event-type", "chunk")[:-2], id="string value cut short"),
        pytest.param(header("id", 9, b"\x00" * 15), id="uuid cut short"),
        pytest.param(header("blob", 6, b"\x00"), id="length cut short"),
        pytest.param(b"\x05:even", id="name cut short"),
        pytest.param(b"\x04name", id="no type byte"),
        pytest.param(header("\u00e9", 7, b"\x00\x01\xff"), id="value not utf-8"),
        pytest.param(b"\x01\xff\x00", id="name not utf-8"),
    ],
)
def test_malformed_headers_are_bad_headers(headers: bytes) -> None:
    assert decode([raw_message(headers, b"{}")]) == ([], [DecodeError("bad_headers", 0)])


def test_bad_message_crc_drops_only_that_message() -> None:
    first, second, third = (event_message(n, b"{}") for n in ("a", "b", "c"))
    frames, errors = decode([first + flip(second, len(second) - 1) + third])
    assert pairs(frames) == [("a", b"{}"), ("c", b"{}")]
    assert errors == [DecodeError("bad_message_crc", len(first))]


def test_bad_prelude_crc_stops_the_decoder() -> None:
    first = event_message("a", b"{}")
    decoder = EventStreamDecoder(BIG)
    frames = decoder.feed(first + flip(event_message("b", b"{}"), 9) + first, 0)
    assert pairs(frames) == [("a", b"{}")]
    assert decoder.feed(first, 1) == []
    assert (decoder.close(2), decoder.errors) == ([], [DecodeError("bad_prelude_crc", len(first))])


def with_lengths(total: int, headers_length: int) -> bytes:
    lengths = struct.pack(">II", total, headers_length)
    return lengths + struct.pack(">I", zlib.crc32(lengths)) + b"\x00" * 64


def test_total_length_under_16_is_bad_length_and_stops_the_decoder() -> None:
    decoder = EventStreamDecoder(BIG)
    assert decoder.feed(with_lengths(15, 0), 0) == []
    assert decoder.feed(event_message("a", b"{}"), 1) == []
    assert decoder.errors == [DecodeError("bad_length", 0)]


def test_headers_longer_than_the_message_is_bad_length() -> None:
    assert decode([with_lengths(20, 5)]) == ([], [DecodeError("bad_length", 0)])


def test_headers_filling_the_message_are_not_bad_length() -> None:
    stream = encode_event_message({":event-type": "a"}, b"")
    assert decode([stream]) == ([Frame(b"", 0, "a")], [])


def test_oversized_message_is_skipped_and_the_next_one_decodes() -> None:
    big = event_message("a", b"x" * 100)
    frames, errors = decode([big + event_message("b", b"{}")], max_frame_bytes=100)
    assert (pairs(frames), errors) == ([("b", b"{}")], [DecodeError("frame_too_large", 0)])


def test_offsets_after_a_skipped_message_count_its_bytes() -> None:
    big = event_message("a", b"x" * 100)
    good = event_message("b", b"{}")
    bad = flip(good, len(good) - 1)
    errors = decode(bytewise(big + bad + b"\x00"), max_frame_bytes=100)[1]
    assert errors == [
        DecodeError("frame_too_large", 0),
        DecodeError("bad_message_crc", len(big)),
        DecodeError("incomplete", len(big) + len(bad)),
    ]


def test_oversized_message_is_detected_from_its_prelude_alone() -> None:
    decoder = EventStreamDecoder(100)
    decoder.feed(event_message("a", b"x" * 100)[:12], 0)
    assert decoder.errors == [DecodeError("frame_too_large", 0)]


def test_message_at_exactly_the_limit_is_kept() -> None:
    stream = encode_event_message({}, b"x" * 100)
    assert decode([stream], max_frame_bytes=100) == ([Frame(b"x" * 100, 0, "")], [])


def test_headers_count_toward_the_limit() -> None:
    stream = encode_event_message({"h": ""}, b"x" * 100)
    assert decode([stream], max_frame_bytes=100)[1] == [DecodeError("frame_too_large", 0)]


def test_oversized_message_is_not_buffered() -> None:
    decoder = EventStreamDecoder(1024)
    lengths = struct.pack(">II", 1 << 30, 0)
    decoder.feed(lengths + struct.pack(">I", zlib.crc32(lengths)), 0)
    piece = b"p" * 65536
    tracemalloc.start()
    try:
        for _ in range(256):
            assert decoder.feed(piece, 1) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert decoder.errors == [DecodeError("frame_too_large", 0)]


def test_partial_message_at_close_is_incomplete() -> None:
    first = event_message("a", b"{}")
    frames, errors = decode([first + event_message("b", b"{}")[:-1]])
    assert (pairs(frames), errors) == ([("a", b"{}")], [DecodeError("incomplete", len(first))])


def test_partial_prelude_at_close_is_incomplete() -> None:
    first = event_message("a", b"{}")
    assert decode([first + b"\x00\x00"])[1] == [DecodeError("incomplete", len(first))]


def test_stream_ending_inside_an_oversized_message_is_also_incomplete() -> None:
    stream = event_message("a", b"{}") + event_message("b", b"x" * 100)[:-1]
    start = len(event_message("a", b"{}"))
    assert decode(bytewise(stream), max_frame_bytes=80)[1] == [
        DecodeError("frame_too_large", start),
        DecodeError("incomplete", start),
    ]


def test_feed_after_close_is_ignored() -> None:
    decoder = EventStreamDecoder(BIG)
    decoder.close(1)
    assert (decoder.feed(event_message("a", b"{}"), 2), decoder.errors) == ([], [])


def test_second_close_adds_nothing() -> None:
    decoder = EventStreamDecoder(BIG)
    decoder.feed(b"\x00", 0)
    decoder.close(1)
    assert (decoder.close(2), decoder.errors) == ([], [DecodeError("incomplete", 0)])


def test_max_frame_bytes_under_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        EventStreamDecoder(0)


def test_decoder_follows_the_decoder_protocol() -> None:
    decoder: Decoder = EventStreamDecoder(BIG)
    assert decoder.errors == []


def test_encoder_refuses_a_header_name_over_255_bytes() -> None:
    with pytest.raises(ValueError, match="255"):
        encode_event_message({"n" * 256: "v"}, b"")


def test_encoder_refuses_a_header_value_over_65535_bytes() -> None:
    with pytest.raises(ValueError, match="65535"):
        encode_event_message({"n": "v" * 65536}, b"")


kinds = st.sampled_from(["event", "exception"])
names = st.text(min_size=1, max_size=24)
payloads = st.binary(max_size=64)
messages = st.lists(st.tuples(kinds, names, payloads), min_size=1, max_size=8)


def encode(kind: str, name: str, payload: bytes) -> bytes:
    return event_message(name, payload) if kind == "event" else exception_message(name, payload)


def expected(kind: str, name: str, payload: bytes) -> tuple[str, bytes]:
    return (name if kind == "event" else f"exception:{name}", payload)


@given(messages, st.data())
def test_any_chunking_gives_every_message_in_order(
    sent: list[tuple[str, str, bytes]], data: st.DataObject
) -> None:
    stream = b"".join(encode(*m) for m in sent)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    frames, errors = decode(split_at(stream, points))
    assert (pairs(frames), errors) == ([expected(*m) for m in sent], [])


@given(messages)
def test_byte_at_a_time_gives_every_message_in_order(sent: list[tuple[str, str, bytes]]) -> None:
    frames, errors = decode(bytewise(b"".join(encode(*m) for m in sent)))
    assert (pairs(frames), errors) == ([expected(*m) for m in sent], [])
    # Each frame arrives with the chunk holding its message's last byte.
    ends = itertools.accumulate(len(encode(*m)) for m in sent)
    assert [f.t for f in frames] == [end - 1 for end in ends]


@given(messages, st.data())
def test_flipped_byte_after_the_prelude_drops_only_that_message(
    sent: list[tuple[str, str, bytes]], data: st.DataObject
) -> None:
    encoded = [encode(*m) for m in sent]
    victim = data.draw(st.integers(0, len(encoded) - 1))
    at = data.draw(st.integers(12, len(encoded[victim]) - 1))
    encoded[victim] = flip(encoded[victim], at, data.draw(st.integers(1, 255)))
    stream = b"".join(encoded)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    frames, errors = decode(split_at(stream, points))
    assert pairs(frames) == [expected(*m) for i, m in enumerate(sent) if i != victim]
    assert errors == [DecodeError("bad_message_crc", offsets(encoded)[victim])]


@given(messages, st.data())
def test_flipped_prelude_byte_stops_decoding_at_that_message(
    sent: list[tuple[str, str, bytes]], data: st.DataObject
) -> None:
    encoded = [encode(*m) for m in sent]
    victim = data.draw(st.integers(0, len(encoded) - 1))
    at = data.draw(st.integers(0, 11))
    encoded[victim] = flip(encoded[victim], at, data.draw(st.integers(1, 255)))
    stream = b"".join(encoded)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    frames, errors = decode(split_at(stream, points))
    assert pairs(frames) == [expected(*m) for m in sent[:victim]]
    assert errors == [DecodeError("bad_prelude_crc", offsets(encoded)[victim])]


@given(messages, st.data())
def test_oversized_message_is_skipped_in_any_chunking(
    sent: list[tuple[str, str, bytes]], data: st.DataObject
) -> None:
    limit = 512  # more than any drawn message's headers (at most 174 bytes) and payload
    encoded = [encode(*m) for m in sent]
    victim = data.draw(st.integers(0, len(encoded)))
    oversized = event_message("big", data.draw(st.binary(min_size=limit, max_size=4 * limit)))
    encoded.insert(victim, oversized)
    stream = b"".join(encoded)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    frames, errors = decode(split_at(stream, points), max_frame_bytes=limit)
    assert pairs(frames) == [expected(*m) for m in sent]
    assert errors == [DecodeError("frame_too_large", offsets(encoded)[victim])]


@given(messages, st.data())
def test_stream_cut_inside_the_last_message_is_incomplete(
    sent: list[tuple[str, str, bytes]], data: st.DataObject
) -> None:
    encoded = [encode(*m) for m in sent]
    cut = data.draw(st.integers(1, len(encoded[-1]) - 1))
    stream = b"".join(encoded)[: len(b"".join(encoded)) - cut]
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    frames, errors = decode(split_at(stream, points))
    assert pairs(frames) == [expected(*m) for m in sent[:-1]]
    assert errors == [DecodeError("incomplete", offsets(encoded)[-1])]


@given(st.binary(max_size=300), st.integers(1, 64), st.data())
def test_garbage_in_any_chunking_never_raises_and_decodes_the_same(
    stream: bytes, max_frame_bytes: int, data: st.DataObject
) -> None:
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    whole, whole_errors = decode([stream], max_frame_bytes)
    split, split_errors = decode(split_at(stream, points), max_frame_bytes)
    assert pairs(split) == pairs(whole)
    assert split_errors == whole_errors
