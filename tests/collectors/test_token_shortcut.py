"""The collector's token shortcut (a chunk that is one whole SSE event holding one content
token goes from the decoder to the adapter as bytes, with no frame or event in between) is an
optimisation only: a stream fed one event a chunk, where the shortcut can take each chunk,
gives the record of the same stream fed one byte a chunk, where it can take none."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.collectors.collector import StreamCollector
from semhealth.collectors.config import Config
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import StreamRecord
from semhealth.collectors.sse import SSEDecoder
from tests.collectors.adapters.chat_chunks import CHUNK, TOKEN

T0 = 1_000_000_000
CONFIG = Config()

# Event data that is no chat chunk, or no JSON at all, or not even UTF-8.
_ODD_DATA = st.sampled_from(
    [b"[DONE]", b"not json", b"", b" ", b"[1, 2]", b'"text"', b"{", b"{\xff}", b'{"a": "\xe2\x82"}']
)
_DATA = st.one_of(CHUNK.map(orjson.dumps), _ODD_DATA)


@st.composite
def _event(draw: st.DrawFn) -> bytes:
    """One SSE event: mostly ``data: <chunk>`` and its blank line, the shape the shortcut
    takes; sometimes with another field, a comment, CRLF endings or two data lines."""
    data = draw(_DATA)
    lines = [b"data: " + data]
    shape = draw(st.sampled_from(["plain"] * 6 + ["event", "comment", "crlf", "two", "id"]))
    if shape == "event":
        lines.insert(0, b"event: message")
    elif shape == "comment":
        lines.insert(0, b": keep-alive")
    elif shape == "two":
        lines.append(b"data: " + data)
    elif shape == "id":
        lines.append(b"id: 7")
    end = b"\r\n" if shape == "crlf" else b"\n"
    return end.join(lines) + end + end


def _exchange(path: str) -> Exchange:
    return Exchange(
        method="POST",
        path=path,
        start_ns=T0,
        status=200,
        content_type="text/event-stream",
        content_encoding=None,
        response_ns=T0 + 1,
        request_body=b'{"model": "m", "stream": true, "messages": []}',
    )


def _record(path: str, chunks: list[tuple[bytes, int]]) -> StreamRecord:
    collector = StreamCollector(_exchange(path), CONFIG)
    for chunk, t in chunks:
        collector.feed(chunk, t)
    return collector.finish(T0 + 10_000_000_000)


def _by_event(events: list[bytes]) -> list[tuple[bytes, int]]:
    return [(event, T0 + 1000 * (i + 1)) for i, event in enumerate(events)]


def _by_byte(events: list[bytes]) -> list[tuple[bytes, int]]:
    """The same bytes, a byte a chunk; each byte arrives when its event's chunk did."""
    return [(bytes([byte]), t) for event, t in _by_event(events) for byte in event]


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_event(), min_size=1, max_size=6),
    bom=st.booleans(),
    path=st.sampled_from(["/v1/chat/completions", "/somewhere/else"]),  # chat, or sniffed
)
def test_a_stream_fed_event_by_event_gives_the_record_it_gives_fed_byte_by_byte(
    events: list[bytes], bom: bool, path: str
) -> None:
    if bom:
        events = [b"\xef\xbb\xbf" + events[0], *events[1:]]
    assert _record(path, _by_event(events)) == _record(path, _by_byte(events))


def _token(text: str, **changes: Any) -> bytes:
    choice = {**TOKEN["choices"][0], "delta": {"content": text}}
    return b"data: " + orjson.dumps({**TOKEN, "choices": [choice], **changes}) + b"\n\n"


def test_a_token_stream_is_read_whole_by_the_shortcut() -> None:
    # The stream the property above is mostly about: each chunk one whole event. The first
    # is read line by line, as it may start with a byte-order mark.
    events = [_token("Hello"), _token(","), _token(" world")]
    decoder = SSEDecoder(1 << 20)
    assert decoder.whole_event(events[0]) is None
    assert len(decoder.feed(events[0], 1)) == 1
    assert [decoder.whole_event(event) for event in events[1:]] == [e[6:-2] for e in events[1:]]
    record = _record("/v1/chat/completions", _by_event(events))
    assert record.output_text == "Hello, world"
    assert record.delta_ns == (T0 + 1000, T0 + 2000, T0 + 3000)
    assert record == _record("/v1/chat/completions", _by_byte(events))


def test_a_chunk_after_a_partial_line_is_not_read_whole() -> None:
    decoder = SSEDecoder(1 << 20)
    assert decoder.feed(b"data: {", 1) == []
    assert decoder.whole_event(_token("Hi")) is None
