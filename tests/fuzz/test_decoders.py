"""Every framing decoder against a reference decoder of the whole stream, in any chunking.

Each reference below reads the whole stream at once, in the plainest way its format's rules
allow; the decoder under test is fed the same bytes cut anywhere (empty chunks included),
with each chunk's index as its arrival time. What must agree, exactly: the frames (data,
event type, id, retry), the time of each frame (the chunk where its end arrived), and
every error with its reason and byte offset. So one property checks three invariants:
split-anywhere equivalence, byte offsets, and the verdict of the reference.

tests/collectors/test_*.py hold the example-based tests and lighter chunking properties.
"""

from __future__ import annotations

import bisect
import contextlib
import re
import struct
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.frames import DecodeError, Decoder, Frame
from semhealth.collectors.framing import make_decoder
from tests.fuzz.budget import examples

# -- feeding ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cut:
    """A stream cut into chunks; chunk ``i`` arrives at time ``i``."""

    raw: bytes
    bounds: tuple[int, ...]  # the end offset of each chunk, ascending, the last is len(raw)

    def chunks(self) -> list[bytes]:
        starts = (0, *self.bounds[:-1])
        return [self.raw[a:b] for a, b in zip(starts, self.bounds, strict=True)]

    def time_of(self, offset: int) -> int:
        """The arrival time of the chunk holding byte ``offset``."""
        return bisect.bisect_right(self.bounds, offset)


Summary = tuple[str | bytes, int, str, str | None, int | None]


def summary(frame: Frame) -> Summary:
    return (frame.data, frame.t, frame.event, frame.id, frame.retry)


def run(decoder: Decoder, cut: Cut) -> tuple[list[Summary], list[DecodeError]]:
    frames: list[Frame] = []
    chunks = cut.chunks()
    for t, chunk in enumerate(chunks):
        frames += decoder.feed(chunk, t)
    end = len(chunks)
    frames += decoder.close(end)
    # Ended is ended: more input and a second close change nothing.
    assert decoder.feed(b"data: x\n\n{}\n", end) == [] and decoder.close(end) == []
    return [summary(f) for f in frames], decoder.errors


@st.composite
def cuts(draw: st.DrawFn, streams: st.SearchStrategy[bytes]) -> Cut:
    raw = draw(streams)
    style = draw(st.sampled_from(["whole", "bytes", "random"]))
    if style == "whole":
        points: list[int] = []
    elif style == "bytes":
        points = list(range(1, len(raw)))
    else:
        points = draw(st.lists(st.integers(0, len(raw)), max_size=24))
    # Repeated points give empty chunks, which must change nothing.
    return Cut(raw, (*sorted(points), len(raw)))


# Small limits make every overflow path common; large ones the plain paths.
limits = st.integers(1, 40) | st.just(1 << 20)


# -- SSE -------------------------------------------------------------------------------------

_BOM = b"\xef\xbb\xbf"
_LINE = re.compile(rb"\r\n|\r|\n")


def sse_reference(cut: Cut, limit: int) -> tuple[list[Summary], list[DecodeError]]:
    """The WHATWG event-stream interpretation over the whole stream, plus the documented
    limit: an event with a line or data over ``limit`` bytes is dropped, with one
    ``frame_too_large`` at the offending line; an unfinished event is ``incomplete``."""
    raw = cut.raw
    start = len(_BOM) if raw.startswith(_BOM) else 0
    frames: list[Summary] = []
    errors: list[DecodeError] = []
    data: list[str] = []
    size, event_type, event_start, discarding = 0, "", None, False
    last_id: str | None = None
    retry: int | None = None
    for match in _LINE.finditer(raw, start):
        line, line_start, end_at = raw[start : match.start()], start, match.start()
        start = match.end()
        if not line:
            if not discarding and data:
                frames.append(("\n".join(data), cut.time_of(end_at), event_type, last_id, retry))
            data, size, event_type, event_start, discarding = [], 0, "", None, False
            continue
        if discarding:
            continue
        # Field names are ASCII, so splitting the bytes splits the text the same way.
        raw_name, colon, raw_value = line.partition(b":")
        if colon and raw_value.startswith(b" "):
            raw_value = raw_value[1:]
        name, value = raw_name.decode("utf-8", "replace"), raw_value.decode("utf-8", "replace")
        over = len(line) > limit
        if not over and name == "data":
            size += len(raw_value) + (1 if data else 0)  # limits count bytes as sent
            over = size > limit
        if over:
            errors.append(DecodeError("frame_too_large", line_start))
            data, size, event_type, event_start, discarding = [], 0, "", None, True
        elif line.startswith(b":"):
            continue
        elif name == "data":
            data.append(value)
            event_start = line_start if event_start is None else event_start
        elif name == "event":
            event_type = value
        elif name == "id" and "\x00" not in value:
            last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            with contextlib.suppress(ValueError):  # more digits than int() converts: ignored
                retry = int(value)
    tail = raw[start:]
    # A stream that is only the start of a BOM is held as such, never judged as a line.
    held_as_bom = start == 0 and _BOM.startswith(tail)
    if not discarding and len(tail) > limit and not held_as_bom:
        errors.append(DecodeError("frame_too_large", start))
    elif not discarding and (tail or data):
        errors.append(DecodeError("incomplete", event_start if event_start is not None else start))
    return frames, errors


sse_streams = st.lists(
    st.sampled_from(
        [
            *(b"data:", b"data: ", b"data", b"id:", b"id: ", b"event:", b"event: x", b"retry:"),
            *(b":", b": comment", b" ", b"\r", b"\n", b"\r\n", b"\n\n", b"\r\r"),
            *(b"\x00", _BOM, b"\xef", b"\xbb", b"\xe4\xb8", b"\xad", b"\xff", b"\xf0\x9f\x98"),
            *(b"1", b"99", b"x" * 30, b"{}", b"[DONE]", "é中😀".encode()),
        ]
    )
    | st.binary(max_size=6),
    max_size=60,
).map(b"".join)


@examples(ci=300)
@given(cut=cuts(sse_streams), limit=limits)
def test_sse_decoder_agrees_with_the_whole_stream_reference(cut: Cut, limit: int) -> None:
    assert run(make_decoder("sse", limit), cut) == sse_reference(cut, limit)


@examples(ci=100)
@given(cut=cuts(st.binary(max_size=300)), limit=limits)
def test_sse_decoder_on_any_bytes_agrees_with_the_reference(cut: Cut, limit: int) -> None:
    assert run(make_decoder("sse", limit), cut) == sse_reference(cut, limit)


# -- NDJSON ----------------------------------------------------------------------------------


def ndjson_reference(cut: Cut, limit: int) -> tuple[list[Summary], list[DecodeError]]:
    """Lines split on LF, a CR before it dropped, blank lines skipped; an unterminated last
    line is still a line; a line over ``limit`` (without its CR) is ``frame_too_large``."""
    raw = cut.raw
    frames: list[Summary] = []
    errors: list[DecodeError] = []
    start = 0
    while start < len(raw):
        newline = raw.find(b"\n", start)
        end = len(raw) if newline < 0 else newline
        line = raw[start:end].removesuffix(b"\r")
        # A terminated line arrives with its LF; the last one with its last byte.
        t = cut.time_of(newline) if newline >= 0 else cut.time_of(end - 1)
        if len(line) > limit:
            errors.append(DecodeError("frame_too_large", start))
        elif line.strip(b" \t\r"):
            frames.append((line, t, "", None, None))
        start = end + 1
    return frames, errors


ndjson_streams = st.lists(
    st.sampled_from([b"\n", b"\r", b"\r\n", b" ", b"\t", b"{}", b'{"a":1}', b"x" * 25, b"\xff"])
    | st.binary(max_size=6),
    max_size=50,
).map(b"".join)


@examples(ci=300)
@given(cut=cuts(ndjson_streams | st.binary(max_size=200)), limit=limits)
def test_ndjson_decoder_agrees_with_the_whole_stream_reference(cut: Cut, limit: int) -> None:
    assert run(make_decoder("ndjson", limit), cut) == ndjson_reference(cut, limit)


# -- length-prefixed ------------------------------------------------------------------------


def length_prefixed_reference(cut: Cut, limit: int) -> tuple[list[Summary], list[DecodeError]]:
    """4-byte big-endian lengths; a length over ``limit`` ends the framing; a partial frame
    at the end is ``incomplete``."""
    raw = cut.raw
    frames: list[Summary] = []
    pos = 0
    while len(raw) - pos >= 4:
        (length,) = struct.unpack_from(">I", raw, pos)
        if length > limit:
            return frames, [DecodeError("frame_too_large", pos)]
        end = pos + 4 + length
        if end > len(raw):
            break
        frames.append((raw[pos + 4 : end], cut.time_of(end - 1), "", None, None))
        pos = end
    return frames, [DecodeError("incomplete", pos)] if pos < len(raw) else []


@st.composite
def length_prefixed_streams(draw: st.DrawFn) -> bytes:
    payloads = draw(st.lists(st.binary(max_size=50), max_size=8))
    raw = b"".join(struct.pack(">I", len(p)) + p for p in payloads)
    damage = draw(st.sampled_from(["none", "truncate", "garbage", "huge"]))
    if damage == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif damage == "garbage":
        raw += draw(st.binary(max_size=12))
    elif damage == "huge":
        raw += struct.pack(">I", draw(st.integers(0, 2**32 - 1)))
    return raw


@examples(ci=300)
@given(cut=cuts(length_prefixed_streams() | st.binary(max_size=80)), limit=limits)
def test_length_prefixed_decoder_agrees_with_the_reference(cut: Cut, limit: int) -> None:
    assert run(make_decoder("length_prefixed", limit), cut) == length_prefixed_reference(cut, limit)


# -- JSON body -------------------------------------------------------------------------------


def json_body_reference(cut: Cut, limit: int) -> tuple[list[Summary], list[DecodeError]]:
    """The whole body as one frame at the time of its last byte, unless over ``limit``."""
    raw = cut.raw
    if len(raw) > limit:
        return [], [DecodeError("frame_too_large", 0)]
    return ([(raw, cut.time_of(len(raw) - 1), "", None, None)] if raw else []), []


@examples(ci=200)
@given(cut=cuts(st.binary(max_size=120)), limit=limits)
def test_json_body_decoder_agrees_with_the_reference(cut: Cut, limit: int) -> None:
    assert run(make_decoder("json", limit), cut) == json_body_reference(cut, limit)


# -- the references themselves ---------------------------------------------------------------


def test_sse_reference_reads_a_known_stream() -> None:
    # The references are code too: one known answer each keeps them honest.
    raw = _BOM + b"event: e\r\nid: 7\rdata: a\ndata:b\n\n: c\ndata: \xff\n\ndata: cut"
    cut = Cut(raw, (10, len(raw)))
    frames, errors = sse_reference(cut, 1 << 20)
    assert frames == [("a\nb", 1, "e", "7", None), ("\ufffd", 1, "", "7", None)]
    assert errors == [DecodeError("incomplete", len(raw) - len(b"data: cut"))]


def test_ndjson_reference_reads_a_known_stream() -> None:
    raw = b'{"a":1}\r\n \n' + b"x" * 9 + b"\n{}"
    frames, errors = ndjson_reference(Cut(raw, (len(raw),)), 8)
    assert frames == [(b'{"a":1}', 0, "", None, None), (b"{}", 0, "", None, None)]
    assert errors == [DecodeError("frame_too_large", 11)]
