"""Promises of the relay that mutation testing (bench/mutation.py) found untested: each test
pins one behaviour the README states and that a surviving mutant broke."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from semhealth.agent.dataplane.relay import ListenSettings, Relay, UpstreamSettings
from semhealth.agent.demo.simulator import RawScript
from semhealth.agent.wire import Outcome, TapSink
from semhealth.collectors.exchange import Exchange
from tests.agent.conftest import Stack, running_stack
from tests.agent.test_relay import RawUpstream, exchange_raw, raw_upstream

UNREACHABLE = "http://127.0.0.1:9"  # nothing listens on the discard port: connection refused


@contextlib.asynccontextmanager
async def relay_before(
    respond: Callable[[bytes], list[bytes | float | None]],
) -> AsyncIterator[tuple[RawUpstream, Stack, str, int]]:
    """A raw upstream answering with ``respond``, the agent in front of it, and the proxy's
    host and port."""
    async with raw_upstream(respond) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            address = stack.agent.proxy_address
            assert address is not None
            host, port = address
            yield up, stack, host, port


def reset(writer: asyncio.StreamWriter) -> None:
    """Hang up with a reset, not a FIN: a FIN is a half-close, and the response still comes."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_a_close_delimited_body_reaches_the_client_whole_and_is_not_an_abort() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
    async with relay_before(lambda _: [head, b"hello ", 0.05, b"world", None]) as (
        _up,
        stack,
        host,
        port,
    ):
        request = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        reply = await exchange_raw(host, port, request)
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        assert reply.endswith(b"\r\n\r\nhello world")
        (record,) = await stack.wait_records(1)
        assert not record.upstream_aborted
        assert record.error_type is None


async def test_an_upstream_gone_mid_body_is_marked_upstream_aborted() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
    async with relay_before(lambda _: [head, b"hello", 0.05, None]) as (_up, stack, host, port):
        request = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        reply = await exchange_raw(host, port, request)
        assert reply.endswith(b"hello")
        (record,) = await stack.wait_records(1)
        assert record.upstream_aborted
        assert record.error_type == "upstream_aborted"


async def test_a_client_gone_before_any_response_counts_with_status_499() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    arrived = asyncio.Event()

    def respond(_: bytes) -> list[bytes | float | None]:
        arrived.set()  # the request reached the upstream: the exchange is open
        return [1.0, head]

    async with relay_before(respond) as (_up, stack, host, port):
        _, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.wait_for(arrived.wait(), 5.0)
        reset(writer)
        (record,) = await stack.wait_records(1)
        assert record.status == 499
        assert record.client_aborted


def _chat_body(size: int) -> bytes:
    """A chat request body of exactly ``size`` bytes."""
    empty = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": ""}]})
    return orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x" * (size - len(empty))}]}
    )


async def _post_in_pieces(host: str, port: int, body: bytes, pieces: int) -> bytes:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head)
        step = -(-len(body) // pieces)
        for start in range(0, len(body), step):
            writer.write(body[start : start + step])
            await writer.drain()
            await asyncio.sleep(0.05)  # separate reads on the proxy's side
        return await asyncio.wait_for(reader.read(), 5.0)
    finally:
        writer.close()


async def test_a_request_body_of_exactly_max_request_bytes_is_analysed() -> None:
    body = _chat_body(1000)
    async with running_stack(
        lambda r: RawScript(chunks=(b"{}",), content_type="application/json"),
        **{"limits.max_request_bytes": len(body)},
    ) as stack:
        address = stack.agent.proxy_address
        assert address is not None
        host, port = address
        reply = await _post_in_pieces(host, port, body, pieces=1)
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        (record,) = await stack.wait_records(1)
        assert record.request.analysed


async def test_a_request_body_over_max_request_bytes_in_small_pieces_is_not_analysed() -> None:
    body = _chat_body(3000)  # three reads of 1,000 bytes, each at the limit, 3,000 in all
    async with running_stack(
        lambda r: RawScript(chunks=(b"{}",), content_type="application/json"),
        **{"limits.max_request_bytes": 1000},
    ) as stack:
        address = stack.agent.proxy_address
        assert address is not None
        host, port = address
        reply = await _post_in_pieces(host, port, body, pieces=3)
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        assert stack.upstream.received[-1].body == body  # forwarded untouched
        (record,) = await stack.wait_records(1)
        assert not record.request.analysed
        assert record.request.skip_reason == "oversized"


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
async def test_a_bodiless_status_ends_at_its_head_and_the_connection_stays_usable(
    status: bytes,
) -> None:
    def respond(head: bytes) -> list[bytes | float | None]:
        if head.startswith(b"GET /first "):
            return [b"HTTP/1.1 " + status + b'\r\nETag: "v1"\r\n\r\n']
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]

    async with raw_upstream(respond) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            address = stack.agent.proxy_address
            assert address is not None
            reader, writer = await asyncio.open_connection(*address)
            try:
                writer.write(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
                first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
                assert first.startswith(b"HTTP/1.1 " + status + b"\r\n")
                assert b"connection: close" not in first.lower()
                writer.write(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
                second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\nok"), 5.0)
                assert second.startswith(b"HTTP/1.1 200 OK\r\n")
            finally:
                writer.close()


async def test_a_client_gone_mid_body_never_hands_its_upstream_connection_to_the_next_request() -> (
    None
):
    # The first response is half-sent when its client resets; the rest ("world") is still on
    # its way on that upstream connection. Pooled, the connection would give "world" to
    # the next request as the start of its response.
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond"

    def respond(head: bytes) -> list[bytes | float | None]:
        if head.startswith(b"GET /first"):
            return [first, b"hello", 0.5, b"world"]
        return [second]

    async with relay_before(respond) as (up, stack, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.wait_for(reader.readuntil(b"hello"), 5.0)
        reset(writer)
        (aborted,) = await stack.wait_records(1)
        reply = await exchange_raw(
            host, port, b"GET /second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert aborted.client_aborted
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b"\r\n\r\nsecond")
    # Each request reached the upstream once, the second on a connection of its own.
    assert [r.split(b" ")[1] for r in up.requests] == [b"/first", b"/second"]


class _NoStream:
    def offer(self, chunk: bytes, t: int) -> None:
        return None

    def close(self, outcome: Outcome) -> None:
        return None


class _NoTap:
    def open_stream(self, exchange: Exchange) -> _NoStream:
        return _NoStream()

    def unanalysed(self, reason: str) -> None:
        return None


@contextlib.asynccontextmanager
async def bare_relay(
    url: str,
    local: Callable[[bytes, bytes], bytes | None] | None = None,
    *,
    tap: TapSink | None = None,
    listen: ListenSettings | None = None,
    **upstream: Any,
) -> AsyncIterator[tuple[Relay, str, int]]:
    """The relay alone in front of ``url``, its counters at hand; ``upstream``: more of its
    UpstreamSettings."""
    relay = Relay(
        UpstreamSettings(url=url, **upstream), tap or _NoTap(), local=local, listen=listen
    )
    host, port = await relay.start("127.0.0.1", 0)
    try:
        yield relay, host, port
    finally:
        await relay.shutdown(1.0)


def _marked(status: bytes, kind: bytes, message: bytes, *, close: bool) -> bytes:
    """The relay's own answer, byte for byte."""
    body = b'{"error":{"type":"%s","message":"%s","source":"semhealth"}}' % (kind, message)
    return (
        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"X-Semhealth-Error: %s\r\n%s\r\n%s"
        % (status, len(body), kind, b"Connection: close\r\n" if close else b"", body)
    )


# --------------------------------------------------------------------------- the relay's own answers


async def test_the_relays_own_502_is_its_marked_head_and_json_error_body_exactly() -> None:
    async with bare_relay(UNREACHABLE) as (_relay, host, port):
        reply = await exchange_raw(
            host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert reply == _marked(
        b"502 Bad Gateway",
        b"upstream_unreachable",
        b"semhealth could not reach the upstream",
        close=True,
    )


async def test_a_malformed_request_gets_the_relays_marked_400_exactly() -> None:
    async with bare_relay(UNREACHABLE) as (_relay, host, port):
        reply = await exchange_raw(host, port, b"NOT HTTP AT ALL\r\n\r\n")
    assert reply == _marked(b"400 Bad Request", b"malformed", b"bad request", close=True)


async def test_each_relay_error_is_counted_once_under_its_kind() -> None:
    async with bare_relay(UNREACHABLE) as (relay, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for _ in range(2):  # one keep-alive connection, two 502s
                writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
                await asyncio.wait_for(reader.readuntil(b'"source":"semhealth"}}'), 5.0)
        finally:
            writer.close()
        assert relay.stats.errors == {"upstream_unreachable": 2}
        assert relay.stats.rejected == {}


async def test_each_rejected_request_is_counted_once_under_its_reason() -> None:
    async with bare_relay(UNREACHABLE) as (relay, host, port):
        for _ in range(2):
            await exchange_raw(host, port, b"NOT HTTP AT ALL\r\n\r\n")
        assert relay.stats.rejected == {"malformed": 2}
        assert relay.stats.errors == {}


async def test_a_request_answered_locally_with_a_body_after_it_is_not_malformed() -> None:
    # The answer is given at the head; the body that follows in the same read is parsed
    # with no exchange left to take it, and is still no error.
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nup"
    async with bare_relay(UNREACHABLE, local=lambda m, u: answer) as (relay, host, port):
        reply = await exchange_raw(
            host, port, b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        )
        assert reply == answer
        assert relay.stats.rejected == {}


# --------------------------------------------------------------------------- framing and reuse


async def test_pipelined_request_bodies_reach_the_upstream_whole() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"ok",))) as stack:
        reply = await exchange_raw(
            *stack.agent.proxy_address,
            b"POST /v1/first HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            b"POST /v1/second HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\nsecond body!"
            b"POST /v1/third HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n5\r\nthird\r\nc\r\n chunked too\r\n0\r\n\r\n",
        )
        assert reply.count(b"HTTP/1.1 200 OK") == 3
        bodies = [r.body for r in stack.upstream.received]
        assert bodies == [b"hello", b"second body!", b"third chunked too"]


async def test_an_http10_client_never_gets_an_interim_response() -> None:
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
    final = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with relay_before(lambda _: [hints, final]) as (_up, _stack, host, port):
        reply = await exchange_raw(host, port, b"GET /x HTTP/1.0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"103" not in reply and b"Link:" not in reply


async def test_an_unasked_101_from_the_upstream_is_a_marked_502_and_never_reaches_the_client() -> (
    None
):
    switch = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    )
    async with relay_before(lambda _: [switch]) as (_up, _stack, host, port):
        reply = await exchange_raw(
            host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert reply.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert b"101" not in reply


async def test_an_http10_client_gets_no_trailer_header_for_the_trailers_it_never_gets() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
    body = b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 1\r\n\r\n"
    async with relay_before(lambda _: [head, body]) as (_up, _stack, host, port):
        reply = await exchange_raw(host, port, b"GET /x HTTP/1.0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b"\r\n\r\nhello world")  # two chunks of one read, joined
    assert b"trailer" not in reply.lower()


async def test_an_upstream_connection_its_server_said_to_close_is_never_reused() -> None:
    # The upstream says "Connection: close" but leaves the connection open: reusing it would
    # send the next request where the server will not read it.
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    async with relay_before(lambda _: [ok]) as (up, _stack, host, port):
        for _ in range(2):
            reply = await exchange_raw(
                host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            assert reply.endswith(b"ok")
    assert up.connections == 2


async def test_a_resent_request_that_fails_again_gets_a_502_after_one_resend() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    served: list[bytes] = []

    def respond(head: bytes) -> list[bytes | float | None]:
        served.append(head)
        return [ok] if len(served) == 1 else [None]  # then the upstream drops every request

    request = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    async with relay_before(respond) as (up, _stack, host, port):
        first = await exchange_raw(host, port, request)
        second = await exchange_raw(host, port, request)
    assert first.endswith(b"ok")
    assert second.startswith(b"HTTP/1.1 502 ")
    assert len(up.requests) == 3  # the first; the second on the pooled connection, then anew


async def test_the_client_connection_serves_its_next_request_after_a_resend() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    served: dict[asyncio.Task[object] | None, int] = {}  # tasks, not ids: ids are reused

    def respond(head: bytes) -> list[bytes | float | None]:
        # Each upstream connection answers once, then drops the next request sent on it.
        task = asyncio.current_task()
        served[task] = served.get(task, 0) + 1
        return [ok] if served[task] == 1 else [None]

    async with relay_before(respond) as (up, _stack, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for _ in range(3):  # the second is resent once; the third follows on the client
                writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
                reply = await asyncio.wait_for(reader.readuntil(b"\r\n\r\nok"), 5.0)
                assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        finally:
            writer.close()
    assert len(up.requests) == 4


# --------------------------------------------------------------------------- what goes upstream


async def test_the_upstream_gets_the_request_line_with_its_query_and_its_own_host() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with relay_before(lambda _: [ok]) as (up, _stack, host, port):
        await exchange_raw(
            host, port, b"GET /v1/x?a=1&b=2 HTTP/1.1\r\nHost: client\r\nX-A: 1\r\n\r\n", until=b"ok"
        )
    authority = up.url.removeprefix("http://").encode()
    assert up.requests == [b"GET /v1/x?a=1&b=2 HTTP/1.1\r\nHost: %s\r\nX-A: 1\r\n\r\n" % authority]


async def test_headers_the_connection_header_names_are_not_sent_upstream() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with relay_before(lambda _: [ok]) as (up, _stack, host, port):
        await exchange_raw(
            host,
            port,
            b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: X-Hop,X-Other\r\nX-Hop: 1\r\n"
            b"X-Other: 2\r\nX-End: 3\r\n\r\n",
            until=b"ok",
        )
    (sent,) = up.requests
    assert b"x-hop" not in sent.lower() and b"x-other" not in sent.lower()
    assert b"\r\nX-End: 3\r\n" in sent


async def test_an_asterisk_form_request_goes_upstream_for_the_root() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with relay_before(lambda _: [ok]) as (up, _stack, host, port):
        reply = await exchange_raw(
            host, port, b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", until=b"ok"
        )
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert up.requests[0].startswith(b"OPTIONS / HTTP/1.1\r\n")


async def test_a_chunked_request_body_sent_after_its_head_reaches_the_upstream_whole() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"ok",))) as stack:
        reader, writer = await asyncio.open_connection(*stack.agent.proxy_address)
        try:
            writer.write(
                b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n"
            )
            await writer.drain()
            await asyncio.sleep(0.1)  # the exchange is under way before the body comes
            writer.write(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            reply = await asyncio.wait_for(reader.read(), 5.0)
        finally:
            writer.close()
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        assert stack.upstream.received[-1].body == b"hello world"
        assert stack.upstream.received[-1].headers["Transfer-Encoding"] == "chunked"


async def test_a_large_replayable_request_on_a_dropped_pooled_connection_is_never_resent() -> None:
    # Past 64 KiB the relay keeps no copy to resend: a 502, and the upstream saw it once.
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    served: dict[asyncio.Task[object] | None, int] = {}

    def respond(head: bytes) -> list[bytes | float | None]:
        task = asyncio.current_task()
        served[task] = served.get(task, 0) + 1
        return [ok] if served[task] == 1 else [None]

    body = b"z" * 100_000
    async with relay_before(respond) as (up, _stack, host, port):
        first = await exchange_raw(
            host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        second = await exchange_raw(
            host,
            port,
            b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (len(body), body),
        )
    assert first.endswith(b"ok")
    assert second.startswith(b"HTTP/1.1 502 ")
    assert len(up.requests) == 2


async def test_a_request_the_upstream_began_answering_is_never_resent() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    served: dict[asyncio.Task[object] | None, int] = {}

    def respond(head: bytes) -> list[bytes | float | None]:
        task = asyncio.current_task()
        served[task] = served.get(task, 0) + 1
        return [ok] if served[task] == 1 else [b"HTTP/1.1 200 OK\r\nContent-Le", None]

    request = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    async with relay_before(respond) as (up, _stack, host, port):
        first = await exchange_raw(host, port, request)
        second = await exchange_raw(host, port, request)
    assert first.endswith(b"ok")
    assert second.startswith(b"HTTP/1.1 502 ")
    assert len(up.requests) == 2


async def test_the_relay_reaches_an_upstream_on_a_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "up.sock")
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nunix"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ok)
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path)
    try:
        async with bare_relay("http://localhost", unix_path=path) as (_relay, host, port):
            reply = await exchange_raw(
                host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
    finally:
        server.close()
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"unix")


# --------------------------------------------------------------------------- what comes back


async def test_a_response_head_split_across_reads_reaches_the_client_with_its_body_whole() -> None:
    steps: list[bytes | float | None] = [
        b"HTTP/1.1 200 OK\r\nContent-",
        0.05,
        b"Length: 11\r\nX-A: 1\r\n\r",
        0.05,
        b"\nhello",
        0.05,
        b" world",
    ]
    async with relay_before(lambda _: steps) as (_up, _stack, host, port):
        reply = await exchange_raw(
            host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert reply.startswith(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-A: 1\r\n")
    assert reply.endswith(b"\r\n\r\nhello world")


async def test_an_upstream_connection_that_sent_bytes_after_a_204_is_never_reused() -> None:
    junk = b"HTTP/1.1 204 No Content\r\n\r\nnot a response"
    async with relay_before(lambda _: [junk]) as (up, _stack, host, port):
        for _ in range(2):
            reply = await exchange_raw(
                host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            assert reply.startswith(b"HTTP/1.1 204 ")
            assert b"not a response" not in reply
    assert up.connections == 2


async def test_an_upstream_head_that_never_ends_is_a_marked_502_at_64_kib() -> None:
    endless = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 70_000
    async with relay_before(lambda _: [endless]) as (_up, _stack, host, port):
        reply = await exchange_raw(
            host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout_s=5.0
        )
    assert reply.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert b"upstream_invalid_response" in reply


async def test_an_upstream_head_of_exactly_64_kib_is_relayed() -> None:
    # 64 KiB of head with no end yet is still a head; the end comes in the next read.
    start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: "
    first = start + b"p" * (64 * 1024 - len(start))
    async with relay_before(lambda _: [first, 0.05, b"\r\n\r\nok"]) as (_up, _stack, host, port):
        reply = await exchange_raw(
            host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b"\r\n\r\nok")


async def test_a_head_response_with_the_length_a_get_would_have_ends_at_its_head() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"  # and no body: it is a HEAD
    async with relay_before(lambda _: [head]) as (_up, _stack, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0) == head
            writer.write(b"HEAD /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            last = await asyncio.wait_for(reader.read(), 5.0)  # the next one is answered too
        finally:
            writer.close()
    assert last == head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")


async def test_a_close_delimited_response_ends_a_keep_alive_client_connection_after_it() -> None:
    # Nothing but the end of the connection can tell the client where such a body ends.
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
    async with relay_before(lambda _: [head, b"hello", None]) as (_up, _stack, host, port):
        reply = await exchange_raw(host, port, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply == head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + b"hello"


@dataclass
class _Capture:
    """A tap that keeps what the relay offers it."""

    exchanges: list[Exchange] = field(default_factory=list)
    offers: list[tuple[bytes, int]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    unanalysed_reasons: list[str] = field(default_factory=list)

    def open_stream(self, exchange: Exchange) -> _Capture:
        self.exchanges.append(exchange)
        return self

    def unanalysed(self, reason: str) -> None:
        self.unanalysed_reasons.append(reason)

    def offer(self, chunk: bytes, t: int) -> None:
        self.offers.append((chunk, t))

    def close(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


async def test_the_tap_gets_the_response_facts_and_the_decoded_body_with_arrival_times() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-TYPE: text/event-stream\r\nContent-Encoding: identity\r\n"
        b"X-RateLimit-Source: tokens\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    async with raw_upstream(
        # The last read holds no body byte (only the last chunk): nothing is offered for it.
        lambda _: [head, b"5\r\nhello\r\n6\r\n world\r\n", 0.05, b"1\r\n!\r\n", 0.05, b"0\r\n\r\n"]
    ) as up:
        capture = _Capture()
        async with bare_relay(up.url, tap=capture) as (_relay, host, port):
            await exchange_raw(
                host, port, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            for _ in range(100):
                if capture.outcomes:
                    break
                await asyncio.sleep(0.01)
    (exchange,) = capture.exchanges
    assert (exchange.content_type, exchange.content_encoding, exchange.ratelimit_source) == (
        "text/event-stream",
        "identity",
        "tokens",
    )
    assert b"".join(chunk for chunk, _ in capture.offers) == b"hello world!"
    assert all(chunk for chunk, _ in capture.offers)  # nothing offered that is not body
    assert all(isinstance(t, int) and t > 0 for _, t in capture.offers)
