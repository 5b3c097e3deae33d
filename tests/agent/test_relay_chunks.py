"""A chunked body through the relay: a read of whole chunks is taken without the parser, any
other read goes through it, and either way the client gets the upstream's bytes as sent and
the tap the body they carry, read by read."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.agent.test_relay import exchange_raw, raw_upstream
from tests.agent.test_relay_mutants import _Capture, bare_relay

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_LAST = b"0\r\n\r\n"
_GET = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
_PAUSE = 0.02  # between the upstream's writes: each is a read of its own


async def _relay(reads: list[bytes], request: bytes = _GET) -> tuple[bytes, _Capture]:
    """What the client got after the head, and what the tap got, for a chunked body the
    upstream writes as ``reads``."""
    steps: list[bytes | float | None] = [_HEAD]
    for read in reads:
        steps += [_PAUSE, read]
    async with raw_upstream(lambda _: steps) as up:
        capture = _Capture()
        async with bare_relay(up.url, tap=capture) as (_relay, host, port):
            reply = await exchange_raw(host, port, request)
            for _ in range(200):
                if capture.outcomes:
                    break
                await asyncio.sleep(0.01)
    return reply.partition(b"\r\n\r\n")[2], capture


def _offered(capture: _Capture) -> list[bytes]:
    return [chunk for chunk, _ in capture.offers]


async def test_a_read_of_whole_chunks_reaches_the_client_as_sent_and_the_tap_as_its_body() -> None:
    reads = [b"5\r\nhello\r\n", b"00006\r\n world\r\nA\r\n0123456789\r\n", _LAST]
    body, capture = await _relay(reads)
    assert body == b"".join(reads)
    assert _offered(capture) == [b"hello", b" world0123456789"]  # one copy a read
    (outcome,) = capture.outcomes
    assert outcome.error_type is None


async def test_an_http_1_0_client_gets_reads_of_whole_chunks_without_their_framing() -> None:
    reads = [b"5\r\nhello\r\n", b"6\r\n world\r\n", b"1\r\n!\r\n", _LAST]
    body, capture = await _relay(reads, b"GET /x HTTP/1.0\r\nHost: x\r\n\r\n")
    assert body == b"hello world!"
    assert _offered(capture) == [b"hello", b" world", b"!"]


@pytest.mark.parametrize("size", [b"0x5", b" 5", b"+5", b"5 ", b"-5", b"5_", b"5\t"])
async def test_a_chunk_size_llhttp_refuses_is_refused_in_a_read_of_whole_chunks_too(
    size: bytes,
) -> None:
    reads = [b"1\r\n!\r\n", size + b"\r\nhello\r\n", _LAST]
    body, capture = await _relay(reads)
    assert body == b"".join(reads[:2])  # up to the fault, as going direct; then the end
    assert _offered(capture) == [b"!"]
    (outcome,) = capture.outcomes
    assert outcome.error_type == "upstream_invalid_response"


async def test_a_chunk_with_an_extension_goes_through_the_parser_and_its_body_to_the_tap() -> None:
    reads = [b"5;name=value\r\nhello\r\n", _LAST]
    body, capture = await _relay(reads)
    assert body == b"".join(reads)
    assert _offered(capture) == [b"hello"]


# A 34-byte chunk whose data, read after its size line's first digit, looks like whole chunks
# of its own: "2", then "2\r\nab\r\n1a\r\nzz...\r\n" reads as a 2-byte and a 26-byte chunk.
_INNER = b"ab\r\n1a\r\n" + b"z" * 26


async def test_a_read_that_ends_inside_a_chunk_size_line_leaves_the_next_to_the_parser() -> None:
    reads = [b"2", b"2\r\n" + _INNER + b"\r\n", _LAST]
    body, capture = await _relay(reads)
    assert body == b"".join(reads)
    assert b"".join(_offered(capture)) == _INNER


async def test_a_read_that_ends_on_a_crlf_inside_a_chunks_data_leaves_the_next_to_the_parser() -> (
    None
):
    reads = [b"22\r\nab\r\n", b"1a\r\n" + b"z" * 26 + b"\r\n", _LAST]
    body, capture = await _relay(reads)
    assert body == b"".join(reads)
    assert b"".join(_offered(capture)) == _INNER


# --------------------------------------------------------------------------- any chunking, any cut

_chunks = st.lists(
    st.tuples(
        st.binary(min_size=1, max_size=60),
        st.sampled_from(["{:x}", "{:X}", "{:03x}"]),
        st.sampled_from([b"", b";a=b"]),
    ),
    min_size=1,
    max_size=8,
)


def _encode(chunks: list[tuple[bytes, str, bytes]], trailer: bool) -> bytes:
    framed = b"".join(
        fmt.format(len(data)).encode() + ext + b"\r\n" + data + b"\r\n" for data, fmt, ext in chunks
    )
    return framed + (b"0\r\nX-Trailer: 1\r\n\r\n" if trailer else _LAST)


@settings(max_examples=40, deadline=None)
@given(
    chunks=_chunks,
    trailer=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=1000), max_size=6),
    on_chunks=st.booleans(),
)
def test_any_chunked_body_cut_anywhere_reaches_the_client_as_sent_and_the_tap_decoded(
    chunks: list[tuple[bytes, str, bytes]], trailer: bool, cuts: list[int], on_chunks: bool
) -> None:
    raw = _encode(chunks, trailer)
    if on_chunks:  # reads of whole chunks, as an SSE upstream writes them
        ends = list(itertools.accumulate(len(_encode([c], False)) - len(_LAST) for c in chunks))
    else:
        ends = [c % len(raw) for c in cuts]
    points = sorted({0, len(raw), *ends})
    reads = [raw[a:b] for a, b in itertools.pairwise(points) if b > a]
    body, capture = asyncio.run(_relay(reads))
    assert body == raw
    assert b"".join(_offered(capture)) == b"".join(data for data, _, _ in chunks)
    (outcome,) = capture.outcomes
    assert outcome.error_type is None
