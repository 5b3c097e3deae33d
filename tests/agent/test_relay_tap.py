"""What the relay hands the tap for each exchange (the facts analysis and live shadowing work
from), seen through a tap that keeps them, in front of a real loopback upstream."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from semhealth.collectors.exchange import Exchange
from tests.agent.test_relay import exchange_raw, raw_upstream
from tests.agent.test_relay_mutants import _Capture, bare_relay

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@contextlib.asynccontextmanager
async def tapped(**upstream: Any) -> AsyncIterator[tuple[_Capture, str, int]]:
    """A relay whose tap keeps what it is given, in front of an upstream answering ``OK``."""
    capture = _Capture()
    async with raw_upstream(lambda _: [OK]) as up:
        async with bare_relay(up.url, tap=capture, **upstream) as (_relay, host, port):
            yield capture, host, port


async def exchange_of(request: bytes, **upstream: Any) -> Exchange:
    """The one exchange the tap got for ``request`` (sent with ``Connection: close``)."""
    async with tapped(**upstream) as (capture, host, port):
        await exchange_raw(host, port, request)
    (exchange,) = capture.exchanges
    return exchange


# --------------------------------------------------------------------------- the request line


async def test_the_tap_gets_the_method_and_the_path_without_its_query() -> None:
    exchange = await exchange_of(
        b"POST /v1/chat/completions?api-version=1 HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    )
    assert (exchange.method, exchange.path) == ("POST", "/v1/chat/completions")


async def test_an_asterisk_form_request_reaches_the_tap_as_the_root_path() -> None:
    exchange = await exchange_of(b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (exchange.method, exchange.path) == ("OPTIONS", "/")


async def test_an_absolute_form_request_without_a_path_reaches_the_tap_as_the_root_path() -> None:
    exchange = await exchange_of(
        b"GET http://example.com HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n"
    )
    assert exchange.path == "/"


# --------------------------------------------------------------------------- headers


async def test_the_tap_gets_the_traceparent_header_as_sent_whatever_its_case() -> None:
    value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    exchange = await exchange_of(
        b"GET /x HTTP/1.1\r\nHost: x\r\nTraceParent: %s\r\nConnection: close\r\n\r\n"
        % value.encode()
    )
    assert exchange.traceparent == value


async def test_the_tap_gets_the_request_headers_less_the_denylist_and_the_hop_by_hop_ones() -> None:
    # Live shadowing resends what the tap gets: credentials (the denylist), the relay's own
    # framing and every hop-by-hop header, those the Connection header names included, stay.
    exchange = await exchange_of(
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nAUTHORIZATION: Bearer secret\r\n"
        b"X-Keep: caf\xe9\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n"
        b"Proxy-Authorization: Basic abc\r\nContent-Length: 2\r\nExpect: 100-continue\r\n"
        b"Content-Type: application/json\r\n\r\n{}",
        tap_headers_drop=frozenset({b"authorization"}),
    )
    assert exchange.request_headers == (
        ("X-Keep", "caf\xe9"),
        ("Content-Type", "application/json"),
    )


async def test_a_request_trailer_never_reaches_the_taps_request_headers() -> None:
    exchange = await exchange_of(
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: t\r\n\r\n",
        tap_headers_drop=frozenset(),
    )
    assert exchange.request_headers == ()


# --------------------------------------------------------------------------- the request body


async def test_a_request_within_max_request_bytes_reaches_the_tap_with_its_body_whole() -> None:
    exchange = await exchange_of(
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        max_request_bytes=11,
    )
    assert (exchange.request_body, exchange.request_skip, exchange.request_bytes) == (
        b"hello world",
        None,
        0,
    )


async def test_an_oversized_request_reaches_the_tap_without_its_body_but_with_its_size() -> None:
    body = b"x" * 50
    exchange = await exchange_of(
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\nConnection: close\r\n\r\n" + body,
        max_request_bytes=10,
    )
    assert (exchange.request_body, exchange.request_skip, exchange.request_bytes) == (
        None,
        "oversized",
        50,
    )


async def test_an_oversized_request_is_reported_to_the_tap_as_unanalysed_oversized() -> None:
    async with tapped(max_request_bytes=10) as (capture, host, port):
        await exchange_raw(
            host,
            port,
            b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\nConnection: close\r\n\r\n"
            + b"x" * 50,
        )
    assert capture.unanalysed_reasons == ["oversized"]


# --------------------------------------------------------------------------- the response


async def test_the_tap_gets_when_the_response_head_arrived() -> None:
    exchange = await exchange_of(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert exchange.response_ns is not None
    assert exchange.response_ns >= exchange.start_ns
