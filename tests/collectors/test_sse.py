from __future__ import annotations

import tracemalloc
from dataclasses import dataclass

import orjson
from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.frames import DecodeError, Frame
from semhealth.collectors.sse import SSEDecoder
from tests.collectors.decoding import bytewise, decode_all, split_at

BIG = 1 << 20

# Recorded from a streamed POST /v1/chat/completions (ids shortened).
OPENAI_CHAT = (
    b'data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk",'
    b'"created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default",'
    b'"system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"role":"assistant",'
    b'"content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk",'
    b'"created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default",'
    b'"system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"content":"Bonjour"},'
    b'"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk",'
    b'"created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default",'
    b'"system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{"content":" \xe2\x80\x94 '
    b'\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8b"},"logprobs":null,"finish_reason":null}],'
    b'"usage":null}\n\n'
    b'data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk",'
    b'"created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default",'
    b'"system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":{},"logprobs":null,'
    b'"finish_reason":"stop"}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk",'
    b'"created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default",'
    b'"system_fingerprint":"fp_eb9dce56a8","choices":[],"usage":{"prompt_tokens":19,'
    b'"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,'
    b'"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,'
    b'"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}\n\n'
    b"data: [DONE]\n\n"
)

# Recorded from a streamed POST /v1/messages.
ANTHROPIC_MESSAGES = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL",'
    b'"type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-20250514",'
    b'"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,'
    b'"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b"event: ping\n"
    b'data: {"type": "ping"}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    b'"text":"Hello \xe4\xb8\x96\xe7\x95\x8c"}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    b'"text":"! \xf0\x9f\x8c\x8d"}}\n\n'
    b"event: content_block_stop\n"
    b'data: {"type":"content_block_stop","index":0}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
    b'"usage":{"output_tokens":15}}\n\n'
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n\n'
)

Summary = tuple[str | bytes, str, str | None, int | None]


def summarize(frames: list[Frame]) -> list[Summary]:
    return [(f.data, f.event, f.id, f.retry) for f in frames]


def decode(
    chunks: list[bytes], max_frame_bytes: int = BIG
) -> tuple[list[Frame], list[DecodeError]]:
    return decode_all(SSEDecoder(max_frame_bytes), chunks)


def data_of(chunks: list[bytes], max_frame_bytes: int = BIG) -> list[str | bytes]:
    return [f.data for f in decode(chunks, max_frame_bytes)[0]]


# --- recorded streams -------------------------------------------------------------------------


def test_openai_chat_stream_gives_one_frame_per_event() -> None:
    frames, errors = decode([OPENAI_CHAT])
    assert errors == []
    assert [f.event for f in frames] == [""] * 6
    assert frames[-1].data == "[DONE]"
    first = orjson.loads(frames[0].data)
    assert first["choices"][0]["delta"]["role"] == "assistant"


def test_openai_chat_stream_decodes_multibyte_text() -> None:
    frames, _ = decode([OPENAI_CHAT])
    delta = orjson.loads(frames[2].data)["choices"][0]["delta"]["content"]
    assert delta == " \u2014 \u4f60\u597d \U0001f44b"


def test_anthropic_stream_keeps_event_types() -> None:
    frames, errors = decode([ANTHROPIC_MESSAGES])
    assert errors == []
    assert [f.event for f in frames] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert orjson.loads(frames[3].data)["delta"]["text"] == "Hello \u4e16\u754c"


def test_recorded_streams_fed_byte_by_byte_give_the_same_frames() -> None:
    for stream in (OPENAI_CHAT, ANTHROPIC_MESSAGES):
        whole, _ = decode([stream])
        split, errors = decode(bytewise(stream))
        assert summarize(split) == summarize(whole)
        assert errors == []


def test_recorded_stream_with_crlf_line_endings_gives_the_same_frames() -> None:
    whole, _ = decode([ANTHROPIC_MESSAGES])
    crlf, _ = decode([ANTHROPIC_MESSAGES.replace(b"\n", b"\r\n")])
    assert summarize(crlf) == summarize(whole)


# --- line endings and BOM ---------------------------------------------------------------------


def test_lines_may_end_in_cr_lf_or_crlf_mixed() -> None:
    stream = b"data: a\rdata: b\r\ndata: c\n\r\n" + b"data: d\r\r" + b"data: e\n\n"
    assert data_of([stream]) == ["a\nb\nc", "d", "e"]


def test_cr_at_chunk_end_followed_by_lf_is_one_line_ending() -> None:
    # Were the LF a line ending of its own, the blank line would dispatch "a" early.
    assert data_of([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]) == ["a\nb"]


def test_cr_at_chunk_end_followed_by_cr_is_two_line_endings() -> None:
    assert data_of([b"data: a\r", b"\rdata: b\n\n"]) == ["a", "b"]


def test_event_ended_by_cr_dispatches_without_waiting_for_next_chunk() -> None:
    decoder = SSEDecoder(BIG)
    assert [f.data for f in decoder.feed(b"data: a\r\r", 7)] == ["a"]


def test_leading_bom_is_stripped() -> None:
    assert data_of([b"\xef\xbb\xbfdata: a\n\n"]) == ["a"]


def test_leading_bom_split_across_chunks_is_stripped() -> None:
    assert data_of([b"\xef", b"\xbb", b"\xbfdata: a\n\n"]) == ["a"]


def test_only_one_leading_bom_is_stripped_in_any_chunking() -> None:
    # The second BOM becomes part of the field name, so the field is unknown and ignored,
    # wherever the chunks break (a BOM alone in the first chunk included); the offsets of
    # what follows count both BOMs.
    bom = b"\xef\xbb\xbf"
    stream = bom + bom + b"data: a\n\ndata: b\n\ndata: c"
    chunkings = [split_at(stream, [cut]) for cut in range(1, len(stream))]
    chunkings += [split_at(stream, [3, 6]), bytewise(stream)]
    for chunks in chunkings:
        frames, errors = decode(chunks)
        assert [f.data for f in frames] == ["b"], chunks
        assert errors == [DecodeError("incomplete", len(stream) - len(b"data: c"))], chunks


def test_bom_after_stream_start_is_kept_as_text() -> None:
    assert data_of([b"data: \xef\xbb\xbfa\n\n"]) == ["\ufeffa"]


def test_bom_prefix_that_is_not_a_bom_is_kept() -> None:
    assert data_of([b"\xef\xbb", b"X\n\ndata: a\n\n"]) == ["a"]


# --- fields -----------------------------------------------------------------------------------


def test_comment_lines_are_ignored() -> None:
    stream = b": keep-alive\ndata: a\n:another comment\ndata: b\n\n:\n\n"
    assert data_of([stream]) == ["a\nb"]


def test_data_lines_are_joined_with_newlines() -> None:
    assert data_of([b"data: one\ndata:\ndata: three\n\n"]) == ["one\n\nthree"]


def test_field_without_colon_has_empty_value() -> None:
    frames, _ = decode([b"event\ndata\n\n"])
    assert summarize(frames) == [("", "", None, None)]


def test_two_empty_data_fields_give_one_newline() -> None:
    assert data_of([b"data\ndata\n\n"]) == ["\n"]


def test_only_one_leading_space_after_colon_is_stripped() -> None:
    assert data_of([b"data:  two\ndata:none\ndata:\tTab\n\n"]) == [" two\nnone\n\tTab"]


def test_colon_inside_value_is_kept() -> None:
    assert data_of([b"data: a: b:c\n\n"]) == ["a: b:c"]


def test_unknown_fields_are_ignored() -> None:
    frames, _ = decode([b"foo: bar\nDATA: x\ndata : y\ndata: z\n\n"])
    assert summarize(frames) == [("z", "", None, None)]


def test_event_type_is_empty_when_not_given() -> None:
    frames, _ = decode([b"event: first\ndata: a\n\ndata: b\n\n"])
    assert [f.event for f in frames] == ["first", ""]


def test_event_without_data_is_not_dispatched_and_resets_type() -> None:
    frames, _ = decode([b"event: lonely\n\ndata: a\n\n"])
    assert summarize(frames) == [("a", "", None, None)]


def test_id_persists_across_events() -> None:
    frames, _ = decode([b"id: 7\ndata: a\n\ndata: b\n\nid: 8\ndata: c\n\n"])
    assert [f.id for f in frames] == ["7", "7", "8"]


def test_id_is_none_until_the_stream_sends_one() -> None:
    frames, _ = decode([b"data: a\n\n"])
    assert frames[0].id is None


def test_empty_id_resets_last_event_id() -> None:
    frames, _ = decode([b"id: 7\ndata: a\n\nid\ndata: b\n\n"])
    assert [f.id for f in frames] == ["7", ""]


def test_id_in_event_without_data_applies_to_next_event() -> None:
    frames, _ = decode([b"id: 9\n\ndata: a\n\n"])
    assert frames[0].id == "9"


def test_id_containing_nul_is_ignored() -> None:
    frames, _ = decode([b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n"])
    assert [f.id for f in frames] == ["1", "1"]


def test_retry_of_ascii_digits_sets_reconnection_time() -> None:
    frames, _ = decode([b"retry: 3000\ndata: a\n\ndata: b\n\n"])
    assert [f.retry for f in frames] == [3000, 3000]


def test_retry_with_non_digit_is_ignored() -> None:
    stream = b"retry: 10\n\nretry: 12a\nretry: -5\nretry: \xd9\xa3\nretry\ndata: a\n\n"
    frames, _ = decode([stream])
    assert frames[0].retry == 10


def test_retry_with_too_many_digits_is_ignored() -> None:
    frames, errors = decode([b"retry: " + b"9" * 10_000 + b"\ndata: a\n\n"])
    assert (frames[0].retry, errors) == (None, [])


def test_invalid_utf8_is_replaced() -> None:
    assert data_of([b"data: a\xffb\xe4\xb8\n\n"]) == ["a\ufffdb\ufffd"]


def test_multibyte_character_split_across_chunks_is_decoded() -> None:
    assert data_of([b"data: \xe4", b"\xb8", b"\x96\xf0\x9f", b"\x98\x80\n\n"]) == [
        "\u4e16\U0001f600"
    ]


# --- timing -----------------------------------------------------------------------------------


def test_frame_t_is_time_of_chunk_with_blank_line() -> None:
    decoder = SSEDecoder(BIG)
    assert decoder.feed(b"data: a", 100) == []
    assert decoder.feed(b"\ndata: b\n", 200) == []
    frames = decoder.feed(b"\ndata: c\n\n", 300)
    assert [(f.data, f.t) for f in frames] == [("a\nb", 300), ("c", 300)]


# --- limits and end of stream -----------------------------------------------------------------


def test_oversized_line_drops_its_event_and_next_event_is_decoded() -> None:
    stream = b"data: ok\n\nevent: big\ndata: " + b"x" * 100 + b"\ndata: tail\n\ndata: next\n\n"
    frames, errors = decode([stream], max_frame_bytes=64)
    assert summarize(frames) == [("ok", "", None, None), ("next", "", None, None)]
    assert errors == [DecodeError("frame_too_large", 21)]


def test_oversized_line_fed_in_small_chunks_gives_the_same_result() -> None:
    stream = b"data: ok\n\nevent: big\ndata: " + b"x" * 100 + b"\ndata: tail\n\ndata: next\n\n"
    whole = decode([stream], max_frame_bytes=64)
    split = decode(split_at(stream, list(range(0, len(stream), 7))), max_frame_bytes=64)
    assert (summarize(split[0]), split[1]) == (summarize(whole[0]), whole[1])


def test_offsets_after_a_skipped_line_count_its_bytes() -> None:
    stream = b"data:" + b"x" * 50 + b"\r\n\r\n" + b"data:" + b"y" * 50 + b"\n\n"
    _, errors = decode(split_at(stream, list(range(0, len(stream), 10))), 16)
    assert errors == [DecodeError("frame_too_large", 0), DecodeError("frame_too_large", 59)]


def test_event_data_over_limit_across_lines_drops_the_event() -> None:
    stream = b"data: 0123456789\n" * 5 + b"\ndata: next\n\n"
    frames, errors = decode([stream], max_frame_bytes=40)
    assert [f.data for f in frames] == ["next"]
    assert errors == [DecodeError("frame_too_large", 51)]


def test_line_and_data_at_exactly_the_limit_are_kept() -> None:
    assert data_of([b"data:" + b"y" * 11 + b"\n\n"], max_frame_bytes=16) == ["y" * 11]


def test_oversized_line_is_not_buffered() -> None:
    decoder = SSEDecoder(1024)
    piece = b"z" * 65536
    tracemalloc.start()
    try:
        for _ in range(256):  # 16 MiB of one line
            decoder.feed(piece, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert decoder.feed(b"\n\ndata: after\n\n", 1)[0].data == "after"


def test_incomplete_event_at_close_is_discarded_with_error() -> None:
    frames, errors = decode([b"data: a\n\ndata: b\ndata: c"])
    assert [f.data for f in frames] == ["a"]
    assert errors == [DecodeError("incomplete", 9)]


def test_unterminated_line_at_close_is_reported_at_its_start() -> None:
    _, errors = decode([b"data: a\n\n: partial comment"])
    assert errors == [DecodeError("incomplete", 9)]


def test_error_offsets_count_both_bytes_of_crlf_and_the_bom() -> None:
    _, errors = decode([b"\xef\xbb\xbfdata: a\r\n\r\ndata: b\r"])
    assert errors == [DecodeError("incomplete", 14)]


def test_complete_stream_closes_without_errors() -> None:
    decoder = SSEDecoder(BIG)
    decoder.feed(b"data: a\n\n", 1)
    assert (decoder.close(2), decoder.errors) == ([], [])


def test_feed_after_close_is_ignored() -> None:
    decoder = SSEDecoder(BIG)
    decoder.close(1)
    assert decoder.feed(b"data: a\n\n", 2) == []


# --- properties -------------------------------------------------------------------------------

_TEXT = st.text(
    st.characters(codec="utf-8", exclude_characters="\r\n")
    | st.sampled_from(
        ["中", "文", "😀", "\U0001f1eb", "\U0001f1f7", "é", "\u2028", "\x00", ":", " "]
    ),
    max_size=12,
)


@dataclass(frozen=True)
class Stream:
    raw: bytes
    expected: list[Summary]


_EVENT_FIELDS = st.tuples(
    st.lists(_TEXT, max_size=2),  # comments
    st.none() | _TEXT,  # event type
    st.none() | _TEXT,  # id
    st.none() | st.integers(0, 999_999).map(str) | st.sampled_from(["12a", "-5", " 5", "1.5", ""]),
    st.lists(_TEXT, max_size=3),  # data lines
    st.integers(1, 2),  # blank lines after the event
)


@st.composite
def valid_streams(draw: st.DrawFn) -> Stream:
    lines: list[str] = []
    expected: list[Summary] = []
    last_id: str | None = None
    retry: int | None = None
    for comments, event, new_id, new_retry, data, blanks in draw(
        st.lists(_EVENT_FIELDS, max_size=5)
    ):
        lines += [":" + c for c in comments]
        if event is not None:
            lines.append("event: " + event)
        if new_id is not None:
            lines.append("id: " + new_id)
            last_id = new_id if "\x00" not in new_id else last_id
        if new_retry is not None:
            lines.append("retry: " + new_retry)
            retry = int(new_retry) if new_retry.isdigit() else retry
        lines += ["data: " + d for d in data]
        lines += [""] * blanks
        if data:
            expected.append(("\n".join(data), event or "", last_id, retry))
    endings = draw(
        st.lists(st.sampled_from(["\n", "\r", "\r\n"]), min_size=len(lines), max_size=len(lines))
    )
    raw = draw(st.sampled_from(["", "\ufeff"]))
    previous = ""
    for line, ending in zip(lines, endings, strict=True):
        if previous == "\r" and not line and ending == "\n":
            ending = "\r\n"  # "\r" then "\n" alone would read as one CRLF, merging two line endings
        raw += line + ending
        previous = ending
    return Stream(raw.encode("utf-8"), expected)


@given(valid_streams(), st.data())
def test_any_chunking_of_valid_stream_gives_the_same_events_as_one_chunk(
    stream: Stream, data: st.DataObject
) -> None:
    if data.draw(st.booleans()):
        chunks = bytewise(stream.raw)
    else:
        chunks = split_at(
            stream.raw, data.draw(st.lists(st.integers(0, len(stream.raw)), max_size=30))
        )
    whole, whole_errors = decode([stream.raw])
    split, split_errors = decode(chunks)
    assert summarize(whole) == stream.expected
    assert summarize(split) == summarize(whole)
    assert whole_errors == split_errors == []


_GARBAGE = st.lists(
    st.sampled_from(
        [
            *(b"data:", b"data: ", b"id:", b"event:", b"retry:", b":", b" "),
            *(b"\r", b"\n", b"\r\n", b"\x00", b"\xef\xbb\xbf", b"\xef", b"\xe4\xb8", b"\xff"),
            *(b"9", b"x" * 20),
        ]
    )
    | st.binary(max_size=8),
    max_size=40,
).map(b"".join)


@given(_GARBAGE, st.integers(1, 48), st.data())
def test_garbage_in_any_chunking_never_raises_and_decodes_the_same(
    stream: bytes, max_frame_bytes: int, data: st.DataObject
) -> None:
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    whole_frames, whole_errors = decode([stream], max_frame_bytes)
    frames, errors = decode(split_at(stream, points), max_frame_bytes)
    assert (summarize(frames), errors) == (summarize(whole_frames), whole_errors)


def _at_blank_lines(stream: bytes) -> list[bytes]:
    """``stream`` cut after every blank line: one whole event per chunk, as OpenAI-style
    servers write a token, which the decoder takes by its short path."""
    points, start = [], 0
    while (end := stream.find(b"\n\n", start)) >= 0:
        points.append(end + 2)
        start = end + 2
    return split_at(stream, points)


@given(valid_streams())
def test_one_whole_event_per_chunk_gives_the_same_events_as_one_chunk(stream: Stream) -> None:
    frames, errors = decode(_at_blank_lines(stream.raw))
    assert summarize(frames) == stream.expected
    assert errors == []


@given(_GARBAGE, st.integers(1, 48))
def test_garbage_cut_at_blank_lines_decodes_as_one_chunk(
    stream: bytes, max_frame_bytes: int
) -> None:
    whole = decode([stream], max_frame_bytes)
    frames, errors = decode(_at_blank_lines(stream), max_frame_bytes)
    assert (summarize(frames), errors) == (summarize(whole[0]), whole[1])


def test_a_whole_event_after_an_event_type_line_keeps_the_type() -> None:
    frames, _ = decode([b"data: a\n\n", b"event: delta\n", b"data: b\n\n"])
    assert [(f.data, f.event) for f in frames] == [("a", ""), ("b", "delta")]


def test_whole_events_count_their_bytes_in_error_offsets() -> None:
    _, errors = decode([b"data: a\n\n", b"data: bb\n\n", b"data: cc"])
    assert errors == [DecodeError("incomplete", 19)]
