"""Promises of the relay that mutation testing (bench/mutation.py) found untested: each test
pins one behaviour the README states and that a surviving mutant broke."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable

import orjson
import pytest

from semhealth.agent.demo.simulator import RawScript
from tests.agent.conftest import Stack, running_stack
from tests.agent.test_relay import RawUpstream, exchange_raw, raw_upstream


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
