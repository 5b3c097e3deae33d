"""Promises the README makes about the proxy, each pinned by a test that fails when the
promise is broken: hop-by-hop headers go no further in either direction, redirects reach the
client instead of being followed, and every error the proxy makes is marked as its own.

An audit found these stated more strongly than tested: removing a name from the hop-by-hop
list, or following redirects, left the suite green.
"""

from __future__ import annotations

import pytest

from semhealth.agent.demo.simulator import RawScript
from tests.agent.conftest import running_stack
from tests.agent.test_relay import _hostport, exchange_raw, raw_upstream

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

# RFC 9110 §7.6.1 and the names proxies have always treated as hop-by-hop.
REQUEST_HOP_BY_HOP = (
    b"Keep-Alive: timeout=5",
    b"Proxy-Connection: keep-alive",
    b"TE: trailers",
    b"Upgrade: websocket",
    b"Proxy-Authorization: Basic c2VjcmV0OnNlY3JldA==",
    b"Trailer: X-Digest",
)
RESPONSE_HOP_BY_HOP = (
    b"Keep-Alive: timeout=5",
    b"Proxy-Connection: keep-alive",
    b"Upgrade: h2c",
    b"Proxy-Authenticate: Basic realm=upstream",
)


def _names(head: bytes) -> list[bytes]:
    return [line.split(b":", 1)[0].lower() for line in head.split(b"\r\n")[1:] if b":" in line]


@pytest.mark.parametrize("header", REQUEST_HOP_BY_HOP, ids=lambda h: h.split(b":")[0].decode())
async def test_request_hop_by_hop_header_never_reaches_the_upstream(header: bytes) -> None:
    async with raw_upstream(lambda _: [_OK]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            request = (
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n"
                b"X-End-To-End: kept\r\nConnection: close\r\n\r\n"
            )
            reply = await exchange_raw(*stack.agent.proxy_address, request)
    assert reply.startswith(b"HTTP/1.1 200 OK")
    (sent,) = up.requests
    names = _names(sent.split(b"\r\n\r\n", 1)[0])
    assert header.split(b":")[0].lower() not in names
    assert b"x-end-to-end" in names


async def test_headers_the_connection_header_names_never_reach_the_upstream() -> None:
    async with raw_upstream(lambda _: [_OK]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            request = (
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close, X-Hop\r\n"
                b"X-Hop: private\r\nX-Kept: yes\r\n\r\n"
            )
            await exchange_raw(*stack.agent.proxy_address, request)
    (sent,) = up.requests
    names = _names(sent.split(b"\r\n\r\n", 1)[0])
    assert b"x-hop" not in names
    assert b"x-kept" in names


@pytest.mark.parametrize("header", RESPONSE_HOP_BY_HOP, ids=lambda h: h.split(b":")[0].decode())
async def test_response_hop_by_hop_header_never_reaches_the_client(header: bytes) -> None:
    response = (
        b"HTTP/1.1 200 OK\r\n" + header + b"\r\nX-End-To-End: kept\r\nContent-Length: 2\r\n\r\nok"
    )
    async with raw_upstream(lambda _: [response]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            reply = await exchange_raw(*stack.agent.proxy_address, request)
    head, body = reply.split(b"\r\n\r\n", 1)
    assert body == b"ok"
    names = _names(head)
    assert header.split(b":")[0].lower() not in names
    assert b"x-end-to-end" in names


@pytest.mark.parametrize(
    "status", [b"301 Moved Permanently", b"302 Found", b"307 Temporary Redirect"]
)
async def test_a_redirect_reaches_the_client_and_is_never_followed(status: bytes) -> None:
    """Following it would let the upstream choose where semhealth connects."""
    response = (
        b"HTTP/1.1 " + status + b"\r\nLocation: http://127.0.0.1:9/elsewhere\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    async with raw_upstream(lambda _: [response]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
            direct = await exchange_raw(*_hostport(up.url), request, until=b"\r\n\r\n")
            through = await exchange_raw(*stack.agent.proxy_address, request)
    assert through == direct.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    assert len(up.requests) == 2  # one direct, one through the proxy: nothing followed


async def test_a_timed_out_upstream_gives_a_504_marked_as_the_proxy_s() -> None:
    async with raw_upstream(lambda _: [30.0]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()),
            **{"upstream.url": up.url, "upstream.timeouts.read_s": 0.3},
        ) as stack:
            request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            reply = await exchange_raw(*stack.agent.proxy_address, request)
    head = reply.split(b"\r\n\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 504 ")
    assert b"X-Semhealth-Error: upstream_timeout" in head.split(b"\r\n")


async def test_an_unreachable_upstream_gives_a_502_marked_as_the_proxy_s() -> None:
    async with raw_upstream(lambda _: [None]) as up:
        url = up.url
    # The server is closed now: nothing listens on its port.
    async with running_stack(lambda r: RawScript(chunks=()), **{"upstream.url": url}) as stack:
        request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        reply = await exchange_raw(*stack.agent.proxy_address, request)
    head = reply.split(b"\r\n\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 502 ")
    assert any(line.startswith(b"X-Semhealth-Error: ") for line in head.split(b"\r\n"))
