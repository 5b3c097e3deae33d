"""A request's ``traceparent`` on its way to the record: parsed by the W3C rules, copied by the
relay, carried by the tap wire, and absent (never guessed) when it is not a valid one."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.agent.demo.simulator import Script, ScriptRequest
from semhealth.agent.wire import (
    _META,
    HEADER,
    OPEN,
    WireDecoder,
    decode_open,
    encode_open,
)
from semhealth.collectors.collector import parse_traceparent
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import TraceRef
from tests.agent.conftest import running_stack

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
VALID = f"00-{TRACE_ID}-{SPAN_ID}-01"


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "value",
    [
        VALID,
        f"00-{TRACE_ID}-{SPAN_ID}-00",  # not sampled: still names the span
        f"  {VALID}\t",  # optional whitespace around a header value
        f"01-{TRACE_ID}-{SPAN_ID}-01",  # a later version, no more fields
        f"cc-{TRACE_ID}-{SPAN_ID}-01-what-a-later-version-adds",  # later versions may add fields
    ],
)
def test_a_valid_traceparent_names_its_span(value: str) -> None:
    assert parse_traceparent(value) == TraceRef(trace_id=TRACE_ID, span_id=SPAN_ID)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        f"ff-{TRACE_ID}-{SPAN_ID}-01",  # version ff is invalid
        f"00-{'0' * 32}-{SPAN_ID}-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE_ID[:-1]}-{SPAN_ID}-01",  # trace id one digit short
        f"00-{TRACE_ID}0-{SPAN_ID}-01",  # trace id one digit long
        f"00-{TRACE_ID}-{SPAN_ID[:-1]}-01",  # parent id short
        f"00-{TRACE_ID}-{SPAN_ID}-1",  # flags short
        f"0-{TRACE_ID}-{SPAN_ID}-01",  # version short
        f"00-{TRACE_ID.upper()}-{SPAN_ID}-01",  # uppercase hex
        f"00-{TRACE_ID}-{SPAN_ID.upper()}-01",
        f"0A-{TRACE_ID}-{SPAN_ID}-01",
        f"00-{TRACE_ID}-{SPAN_ID}-01-extra",  # version 00 has exactly four fields
        f"01-{TRACE_ID}-{SPAN_ID}-01extra",  # a later version's extra fields follow a "-"
        f"00_{TRACE_ID}_{SPAN_ID}_01",
        f"00-{'g' * 32}-{SPAN_ID}-01",  # not hex
        f"00-{TRACE_ID}-{SPAN_ID}-01\n",  # a line break is no header whitespace
        f"01-{TRACE_ID}-{SPAN_ID}-01-" + "x" * 600,  # far longer than any real header
    ],
)
def test_an_invalid_traceparent_names_no_span(value: str | None) -> None:
    assert parse_traceparent(value) is None


@given(st.text(max_size=80) | st.from_regex(r"[0-9a-fA-F\- ]{40,70}", fullmatch=True))
def test_parsing_never_raises(value: str) -> None:
    ref = parse_traceparent(value)
    if ref is not None:  # whatever it accepts is well formed
        assert len(ref.trace_id) == 32 and len(ref.span_id) == 16
        assert ref.trace_id != "0" * 32 and ref.span_id != "0" * 16
        assert ref.trace_id == ref.trace_id.lower()


@given(
    trace_id=st.from_regex(r"[0-9a-f]{32}", fullmatch=True).filter(lambda v: v != "0" * 32),
    span_id=st.from_regex(r"[0-9a-f]{16}", fullmatch=True).filter(lambda v: v != "0" * 16),
    flags=st.from_regex(r"[0-9a-f]{2}", fullmatch=True),
)
def test_every_well_formed_version_00_header_is_parsed(
    trace_id: str, span_id: str, flags: str
) -> None:
    parsed = parse_traceparent(f"00-{trace_id}-{span_id}-{flags}")
    assert parsed == TraceRef(trace_id=trace_id, span_id=span_id)


# --------------------------------------------------------------------------- the tap wire


def exchange(traceparent: str | None) -> Exchange:
    return Exchange(
        method="POST",
        path="/v1/chat/completions",
        start_ns=7,
        status=200,
        content_type="text/event-stream",
        content_encoding=None,
        response_ns=9,
        request_body=b"{}",
        traceparent=traceparent,
    )


@pytest.mark.parametrize("traceparent", [VALID, "anything the client sent", None])
def test_the_open_frame_carries_the_header_as_sent(traceparent: str | None) -> None:
    ((kind, _sid, t, payload),) = WireDecoder().feed(encode_open(3, exchange(traceparent)))
    assert kind == OPEN
    assert decode_open(t, payload) == exchange(traceparent)


def test_an_open_frame_without_the_key_reads_as_no_header() -> None:
    # An OPEN frame as a forwarder of the version before this key writes it.
    meta = orjson.dumps(
        {
            "method": "POST",
            "path": "/v1/chat/completions",
            "status": 200,
            "content_type": "text/event-stream",
            "content_encoding": None,
            "response_ns": 9,
            "request_skip": None,
            "ratelimit_source": None,
            "has_body": True,
        }
    )
    payload = _META.pack(len(meta)) + meta + b"{}"
    frame = HEADER.pack(OPEN, 3, 7, len(payload)) + payload
    ((_kind, _sid, t, body),) = WireDecoder().feed(frame)
    assert decode_open(t, body) == exchange(None)


def test_no_header_adds_no_bytes_to_the_open_frame() -> None:
    meta_len = _META.unpack_from(encode_open(3, exchange(None)), HEADER.size)[0]
    meta = orjson.loads(encode_open(3, exchange(None))[HEADER.size + _META.size :][:meta_len])
    assert "traceparent" not in meta


# --------------------------------------------------------------------------- through the relay


async def test_the_relay_copies_the_header_to_the_record_and_forwards_it_unchanged() -> None:
    seen: list[ScriptRequest] = []

    def answer(request: ScriptRequest) -> Script:
        seen.append(request)
        return Script(pieces=("ok",))

    headers = [{"traceparent": VALID}, {}, {"traceparent": f"00-{'0' * 32}-{SPAN_ID}-01"}]
    async with running_stack(answer) as stack, aiohttp.ClientSession() as client:
        for extra in headers:
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            url = stack.agent.proxy_url + "/v1/chat/completions"
            async with client.post(url, json=body, headers=extra) as response:
                assert response.status == 200
                await response.read()
        records = await stack.wait_records(3)
    assert [record.trace for record in records] == [
        TraceRef(trace_id=TRACE_ID, span_id=SPAN_ID),
        None,
        None,
    ]
    # The proxy only reads it: the upstream gets the header as the client sent it.
    assert [request.headers.get("traceparent") for request in seen] == [
        VALID,
        None,
        headers[2]["traceparent"],
    ]
