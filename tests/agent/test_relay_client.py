"""The relay's client side, byte by byte: the request head's limits and forms, how a client
connection lives on (pipelining, half-closes, upgrades), what is counted, and the requests it
sends again; with real loopback upstreams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from semhealth.agent.dataplane.relay import ListenSettings
from semhealth.agent.demo.simulator import RawScript
from tests.agent.conftest import running_stack
from tests.agent.test_relay import exchange_raw, raw_upstream
from tests.agent.test_relay_mutants import _Capture, _marked, bare_relay, relay_before, reset

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
CLOSE_GET = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


# --------------------------------------------------------------------------- the request head


def _head_counting(counted: int) -> bytes:
    """A request whose head the relay counts as ``counted`` bytes: the target, and each
    header's name and value with 4 for ": " and CRLF."""
    fixed = len(b"/") + (4 + 1 + 4) + (5 + 4) + (10 + 5 + 4)  # target, Host, X-Pad, Connection
    pad = b"p" * (counted - fixed)
    return b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + pad + b"\r\nConnection: close\r\n\r\n"


async def test_a_request_head_of_exactly_64_kib_is_relayed() -> None:
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        reply = await exchange_raw(host, port, _head_counting(64 * 1024))
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert len(up.requests) == 1


async def test_a_request_head_one_byte_over_64_kib_gets_the_marked_431() -> None:
    async with raw_upstream(lambda _: [OK]) as up:
        async with bare_relay(up.url) as (relay, host, port):
            reply = await exchange_raw(host, port, _head_counting(64 * 1024 + 1))
            assert relay.stats.rejected == {"head_too_large": 1}
    assert reply == _marked(
        b"431 Request Header Fields Too Large",
        b"head_too_large",
        b"request header fields too large",
        close=True,
    )
    assert up.requests == []


async def test_a_request_target_split_across_reads_reaches_the_upstream_whole() -> None:
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(b"GET /v1/mo")
            await writer.drain()
            await asyncio.sleep(0.05)  # a read of its own
            writer.write(b"dels HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await asyncio.wait_for(reader.read(), 5.0)
        finally:
            writer.close()
    assert [r.split(b" ")[1] for r in up.requests] == [b"/v1/models"]


async def test_a_connect_request_with_a_path_target_is_refused_and_never_goes_upstream() -> None:
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        reply = await exchange_raw(host, port, b"CONNECT /x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert up.requests == []


async def test_a_target_whose_scheme_separator_ends_past_its_16th_byte_is_refused() -> None:
    # Absolute form is told by "://" within the first 16 bytes; later, it is no target at all.
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        reply = await exchange_raw(
            host, port, b"GET abcdefghijklmn://h/x HTTP/1.1\r\nHost: x\r\n\r\n"
        )
    assert reply.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert up.requests == []


async def test_an_absolute_form_request_without_a_path_goes_upstream_for_the_root() -> None:
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        await exchange_raw(
            host, port, b"GET http://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", until=b"ok"
        )
    assert up.requests[0].startswith(b"GET / HTTP/1.1\r\n")


async def test_a_chunked_request_goes_upstream_with_the_relays_head_exactly() -> None:
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        await exchange_raw(
            host,
            port,
            b"POST /v1/x HTTP/1.1\r\nHost: client\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n"
            b"\r\n2\r\n{}\r\n0\r\n\r\n",
            until=b"ok",
        )
    authority = up.url.removeprefix("http://").encode()
    head = b"POST /v1/x HTTP/1.1\r\nHost: %s\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert up.requests[0] == head % authority  # the chunks follow; raw_upstream keeps the head


# --------------------------------------------------------------------------- framing headers


async def test_a_header_valued_chunked_that_is_not_transfer_encoding_leaves_the_body_as_sent() -> (
    None
):
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        await exchange_raw(
            host,
            port,
            b"POST /x HTTP/1.1\r\nHost: x\r\nX-Mode: chunked\r\nContent-Length: 5\r\n"
            b"Connection: close\r\n\r\nhello",
        )
    (sent,) = up.requests
    assert b"transfer-encoding" not in sent.lower()
    assert sent.endswith(b"\r\nContent-Length: 5\r\n\r\nhello")


async def test_a_request_transfer_encoding_with_trailing_spaces_is_relayed_chunked() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"ok",))) as stack:
        await exchange_raw(
            *stack.agent.proxy_address,
            b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked  \r\n"
            b"Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )
        assert stack.upstream.received[-1].body == b"hello"


async def test_a_chunked_response_with_trailing_spaces_after_chunked_reaches_http10_unchunked() -> (
    None
):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked  \r\n\r\n"
    async with relay_before(lambda _: [head, b"5\r\nhello\r\n0\r\n\r\n"]) as (_up, _s, host, port):
        reply = await exchange_raw(host, port, b"GET /x HTTP/1.0\r\n\r\n")
    assert reply.endswith(b"\r\n\r\nhello")
    assert b"transfer-encoding" not in reply.lower()


async def test_a_header_other_than_expect_valued_100_continue_is_forwarded_and_not_answered() -> (
    None
):
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        reply = await exchange_raw(
            host,
            port,
            b"POST /x HTTP/1.1\r\nHost: x\r\nX-Note: 100-continue\r\nContent-Length: 2\r\n"
            b"Connection: close\r\n\r\n{}",
        )
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    (sent,) = up.requests
    assert b"\r\nX-Note: 100-continue\r\n" in sent


async def test_a_response_without_a_reason_phrase_reaches_the_client_with_none() -> None:
    bare = b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok"
    async with relay_before(lambda _: [bare]) as (_up, _stack, host, port):
        reply = await exchange_raw(host, port, CLOSE_GET)
    assert reply == b"HTTP/1.1 200 \r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


async def test_an_answer_that_comes_before_the_request_body_is_whole_closes_the_connection() -> (
    None
):
    # The rest of the body has nowhere to go, and the next request cannot be found after it.
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # and answers at once, as a 413 would
        writer.write(OK)
        await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with bare_relay(url) as (_relay, host, port):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
                reply = await asyncio.wait_for(reader.read(), 5.0)
            finally:
                writer.close()
    finally:
        server.close()
    assert reply == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


# --------------------------------------------------------------------------- the local front


async def test_a_request_the_local_front_takes_by_method_and_target_is_answered_there() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nlive"

    def local(method: bytes, target: bytes) -> bytes | None:
        return answer if (method, target) == (b"GET", b"/healthz") else None

    async with raw_upstream(lambda _: [OK]) as up:
        async with bare_relay(up.url, local=local) as (_relay, host, port):
            reply = await exchange_raw(
                host, port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
    assert reply == answer
    assert up.requests == []


# --------------------------------------------------------------------------- counting


async def test_each_client_connection_is_counted_once() -> None:
    async with raw_upstream(lambda _: [OK]) as up:
        async with bare_relay(up.url) as (relay, host, port):
            for _ in range(3):
                await exchange_raw(host, port, CLOSE_GET)
            assert relay.stats.connections == 3


async def test_each_request_is_counted_once() -> None:
    async with raw_upstream(lambda _: [OK]) as up:
        async with bare_relay(up.url) as (relay, host, port):
            await exchange_raw(host, port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" + CLOSE_GET)
            await exchange_raw(host, port, CLOSE_GET)
            assert relay.stats.requests == 3


async def test_each_connection_idling_out_unused_is_counted_and_none_that_served_a_request() -> (
    None
):
    listen = ListenSettings(keepalive_timeout_s=0.3)
    async with raw_upstream(lambda _: [OK]) as up:
        async with bare_relay(up.url, listen=listen) as (relay, host, port):
            silent = [await asyncio.open_connection(host, port) for _ in range(2)]
            used_reader, used_writer = await asyncio.open_connection(host, port)
            used_writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive
            await asyncio.wait_for(used_reader.readuntil(b"\r\n\r\nok"), 5.0)
            for reader, _ in [*silent, (used_reader, used_writer)]:
                assert await asyncio.wait_for(reader.read(), 5.0) == b""  # idled out
            for _, writer in [*silent, (used_reader, used_writer)]:
                writer.close()
            assert relay.stats.rejected == {"idle_timeout": 2}


async def test_a_refused_connection_whose_client_never_closes_is_ended_after_its_linger() -> None:
    # Past max_client_connections the relay answers, shuts its side and reads what the
    # client still sends for a while (2 s), so the answer is read; then it lets go.
    listen = ListenSettings(max_client_connections=1)
    async with raw_upstream(lambda _: [OK]) as up:
        async with bare_relay(up.url, listen=listen) as (_relay, host, port):
            _, held = await asyncio.open_connection(host, port)
            await asyncio.sleep(0.05)  # accepted before the next one comes
            reader, writer = await asyncio.open_connection(host, port)
            try:
                reply = await asyncio.wait_for(reader.read(), 5.0)
                assert reply.startswith(b"HTTP/1.1 503 ")
                with pytest.raises(ConnectionError):  # it keeps writing; the relay is gone
                    for _ in range(50):  # 10 s at most, five times the linger
                        writer.write(b"still here")
                        await asyncio.wait_for(writer.drain(), 5.0)
                        await asyncio.sleep(0.2)
            finally:
                writer.close()
                held.close()


# --------------------------------------------------------------------------- a connection's life


async def test_a_connection_reads_its_next_request_after_answering_pipelined_ones() -> None:
    async with relay_before(lambda _: [OK]) as (_up, _stack, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
            for _ in range(2):
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\nok"), 5.0)
            writer.write(CLOSE_GET)  # after the pipelined ones: read only if reading resumed
            last = await asyncio.wait_for(reader.read(), 5.0)
        finally:
            writer.close()
    assert last.startswith(b"HTTP/1.1 200 OK\r\n") and last.endswith(b"\r\n\r\nok")


async def test_a_client_upgrade_request_is_answered_and_then_its_connection_ends() -> None:
    # Upgrade is hop-by-hop: the request goes upstream without it, and what the client sends
    # after it on this connection is not HTTP/1.1, so the connection ends with the answer.
    async with relay_before(lambda _: [OK]) as (up, _stack, host, port):
        reply = await exchange_raw(
            host,
            port,
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        )
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\nok")
    assert b"upgrade" not in up.requests[0].lower()


async def test_a_client_that_half_closes_an_idle_connection_has_it_closed() -> None:
    async with raw_upstream(lambda _: [OK]) as up:
        async with bare_relay(up.url) as (_relay, host, port):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write_eof()
                assert await asyncio.wait_for(reader.read(), 5.0) == b""
            finally:
                writer.close()


async def test_a_keep_alive_client_half_closing_after_the_head_gets_the_body_then_the_end() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    async with relay_before(lambda _: [head, 0.3, b"hello"]) as (_up, _stack, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive
            got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            writer.write_eof()  # done sending, still reading: the connection then ends
            rest = await asyncio.wait_for(reader.read(), 5.0)
        finally:
            writer.close()
    assert got == head
    assert rest == b"hello"


# --------------------------------------------------------------------------- sending again


def _drops_its_second_request() -> Callable[[bytes], list[bytes | float | None]]:
    """``respond`` for raw_upstream: each connection answers once, then drops the next."""
    served: dict[asyncio.Task[object] | None, int] = {}  # tasks, not ids: ids are reused

    def respond(head: bytes) -> list[bytes | float | None]:
        task = asyncio.current_task()
        served[task] = served.get(task, 0) + 1
        return [OK] if served[task] == 1 else [None]

    return respond


async def test_a_replayable_request_of_exactly_64_kib_upstream_is_sent_again() -> None:
    # What the relay keeps to resend is at most 64 KiB: the head it writes and the body.
    async with raw_upstream(_drops_its_second_request()) as up:
        authority = up.url.removeprefix("http://").encode()
        async with bare_relay(up.url) as (_relay, host, port):
            await exchange_raw(host, port, CLOSE_GET)
            head = b"PUT /x HTTP/1.1\r\nHost: %s\r\nContent-Length: 65000\r\n\r\n" % authority
            length = 64 * 1024 - len(head)  # five digits, as in the head measured
            body = b"b" * length
            reply = await exchange_raw(
                host,
                port,
                b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % length
                + body,
            )
    assert len(up.requests[1]) == 64 * 1024  # the relay's head and the body, as written
    assert reply.endswith(b"\r\n\r\nok")
    assert len(up.requests) == 3


async def test_a_replayable_request_over_64_kib_in_pieces_is_never_sent_again() -> None:
    piece = b"p" * 30_000
    async with raw_upstream(_drops_its_second_request()) as up:
        async with bare_relay(up.url) as (_relay, host, port):
            await exchange_raw(host, port, CLOSE_GET)
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(
                    b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                    b"Connection: close\r\n\r\n" % (3 * len(piece))
                )
                for _ in range(3):  # three reads on the relay's side, 90,000 bytes in all
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.05)
                reply = await asyncio.wait_for(reader.read(), 5.0)
            finally:
                writer.close()
    assert reply.startswith(b"HTTP/1.1 502 ")
    assert len(up.requests) == 2


async def test_a_request_whose_new_upstream_connection_is_dropped_is_never_sent_again() -> None:
    # Only a pooled connection may have gone stale; a new one dropped is the upstream's 502.
    async with relay_before(lambda _: [None]) as (up, _stack, host, port):
        reply = await exchange_raw(host, port, CLOSE_GET)
    assert reply.startswith(b"HTTP/1.1 502 ")
    assert len(up.requests) == 1


async def test_requests_pipelined_behind_one_whose_client_is_gone_mid_response_never_begin() -> (
    None
):
    # Reading is paused behind a pipelined request, so the reset shows when the relay next
    # writes to the client: mid-body here, with the rest of the body still to come.
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    capture = _Capture()
    async with raw_upstream(lambda _: [head + b"he", 1.0, b"ll", 1.0, b"o"]) as up:
        async with bare_relay(up.url, tap=capture) as (relay, host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\nhe"), 5.0)
            reset(writer)
            for _ in range(500):
                if capture.outcomes:
                    break
                await asyncio.sleep(0.01)
            assert [outcome.client_aborted for outcome in capture.outcomes] == [True]
            assert relay.stats.requests == 1


@dataclass
class Lines:
    url: str = ""
    seen: list[bytes] = field(default_factory=list)  # each request's first line, in order


@contextlib.asynccontextmanager
async def chunk_reading_upstream() -> AsyncIterator[Lines]:
    """An upstream that reads chunked bodies to their last chunk and answers each request
    ``OK``, keeping the connection; its first connection drops its second request. A stray
    byte before a head shows in the first line it keeps."""
    lines = Lines()
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first_connection = connections == 1
        try:
            for served in range(100):
                head = await reader.readuntil(b"\r\n\r\n")
                if first_connection and served == 1:
                    return
                lines.seen.append(head.split(b"\r\n", 1)[0])
                if b"chunked" in head.lower():
                    await reader.readuntil(b"0\r\n\r\n")
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    lines.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield lines
    finally:
        server.close()


async def test_a_chunked_request_sent_again_ends_once_on_its_new_connection() -> None:
    async with chunk_reading_upstream() as up:
        async with bare_relay(up.url) as (_relay, host, port):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\nok"), 5.0)
                # On the pooled connection, which drops it: sent again on a new one.
                writer.write(
                    b"PUT /again HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n0\r\n\r\n"
                )
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\nok"), 5.0)
                # The new connection is pooled: a stray last chunk would lead this head.
                writer.write(CLOSE_GET)
                await asyncio.wait_for(reader.read(), 5.0)
            finally:
                writer.close()
    assert up.seen == [b"GET /first HTTP/1.1", b"PUT /again HTTP/1.1", b"GET /x HTTP/1.1"]


# --------------------------------------------------------------------------- flow control


async def test_an_upstream_that_stops_reading_pushes_back_on_the_clients_request_body() -> None:
    """Memory stays bounded the other way too: a client can only get ahead of an upstream
    that reads nothing by the socket buffers, never by what the relay would hold."""
    arrived, done = asyncio.Event(), asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        arrived.set()
        await done.wait()  # and never reads the body
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    block = b"b" * (64 * 1024)
    total = 2048 * len(block)  # 128 MiB if nothing pushed back
    written = 0
    try:
        async with bare_relay(url) as (_relay, host, port):
            _, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % total)
                await asyncio.wait_for(arrived.wait(), 5.0)
                with contextlib.suppress(TimeoutError):
                    while written < total:
                        writer.write(block)
                        written += len(block)
                        await asyncio.wait_for(writer.drain(), 1.0)  # blocked: pushed back
            finally:
                writer.transport.abort()
    finally:
        done.set()
        server.close()
    # Socket buffers on two loopback hops (autotuned up to several MiB each) and the
    # transports' 64 KiB watermarks; a relay that kept reading would take all 128 MiB.
    assert written < 40 * 1024 * 1024, f"the client got {written} bytes ahead"


async def test_an_upstream_that_resumes_reading_gets_the_whole_request_body() -> None:
    # The back-pressure above is let go of: once the upstream reads again, the client's body
    # flows again, to its end.
    body = b"r" * (16 * 1024 * 1024)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.5)  # not reading: the relay's buffers toward it fill
        got = await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d" % (len(str(len(got))), len(got))
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with bare_relay(url) as (_relay, host, port):
            request = (
                b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % len(body)
            )
            # Bounded as a whole: a relay that never reads again stalls the write, not the read.
            reply = await asyncio.wait_for(exchange_raw(host, port, request + body), 10.0)
    finally:
        server.close()
    assert reply.endswith(b"\r\n\r\n%d" % len(body))
