"""The relay at the byte level: what a raw HTTP/1.1 peer sees, through the sidecar and direct.

Each defect a review found in the aiohttp proxy that came before has a test here: invalid
chunked framing that hung the client, a request trailer that leaked into the next request,
``Expect: 100-continue`` left unanswered, an unmarked 500 for a control character in an
upstream header, headers re-cased, added or dropped, tracebacks quoting request bytes,
and slow heads kept open forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from semhealth.agent.dataplane.relay import ListenSettings, Relay, UpstreamSettings
from semhealth.agent.demo.simulator import RawScript
from semhealth.agent.wire import Outcome
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import StreamRecord
from tests.agent.conftest import running_stack
from tests.servers import require_binary

CANARY = "canary-7f3a-prompt-text"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class RawUpstream:
    """A loopback server that answers with exactly the bytes a test scripts."""

    url: str
    requests: list[bytes] = field(default_factory=list)  # each request's raw head and body
    connections: int = 0  # how many connections the relay opened to it


@contextlib.asynccontextmanager
async def raw_upstream(
    respond: Callable[[bytes], list[bytes | float | None]],
) -> AsyncIterator[RawUpstream]:
    """Reads each request head (and a Content-Length body), then writes ``respond(head)``:
    byte strings are written, floats are pauses, None closes the connection. Keeps the
    connection open otherwise."""
    state = RawUpstream(url="")
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        state.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                state.requests.append(head + body)
                for step in respond(head):
                    if step is None:
                        return
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    else:
                        writer.write(step)
                        await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    # Heads up to 1 MiB: the relay's own limit on a request head (64 KiB) is tested through it.
    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=1 << 20)
    port = server.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def exchange_raw(
    host: str, port: int, request: bytes, *, until: bytes | None = None, timeout_s: float = 5.0
) -> bytes:
    """Send ``request`` and read the reply to the end of the connection, or to ``until``."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        if until is None:
            return await asyncio.wait_for(reader.read(), timeout_s)
        return await asyncio.wait_for(reader.readuntil(until), timeout_s)
    finally:
        writer.close()


_CLOSE_GET = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def _relayed(steps: list[bytes | float | None]) -> bytes:
    """What a client gets for one ``Connection: close`` GET through the relay, in front of an
    upstream that answers with ``steps``."""
    async with raw_upstream(lambda _: steps) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            return await exchange_raw(*stack.agent.proxy_address, _CLOSE_GET)


def _hostport(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


# --------------------------------------------------------------------------- framing


async def test_invalid_chunked_framing_mid_body_ends_the_client_connection() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    good = b"5\r\nhello\r\n"
    async with raw_upstream(lambda _: [head + good, 0.05, b"zz\r\nnot a chunk\r\n"]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            host, port = stack.agent.proxy_address
            request = b"GET /v1/stream HTTP/1.1\r\nHost: x\r\n\r\n"
            # Before: aiohttp's readany() never returned and the client waited forever.
            reply = await exchange_raw(host, port, request, timeout_s=5.0)
            assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
            assert good in reply
            assert not reply.endswith(b"0\r\n\r\n")  # never a clean end for a broken body
            (record,) = await stack.wait_records(1)
            assert record.upstream_aborted
            assert record.error_type == "upstream_invalid_response"


async def test_chunk_extensions_and_trailers_reach_the_client_as_sent() -> None:
    body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTrailer: X-Checksum\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with raw_upstream(lambda _: [head, body]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            host, port = stack.agent.proxy_address
            request = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            reply = await exchange_raw(host, port, request)
            assert reply.endswith(body)
            assert b"Trailer: X-Checksum\r\n" in reply


async def test_a_chunked_sse_body_with_crlf_line_ends_read_after_each_event_arrives_whole() -> None:
    # Each read ends with an event's CRLF CRLF and the next begins with its chunk's CRLF:
    # no end of the body, though they look like one.
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    event = b"data: x\r\n\r\n"
    reads = [b"b\r\n" + event, b"\r\nb\r\n" + event, b"\r\n0\r\n\r\n"]
    async with raw_upstream(lambda _: [head + reads[0], 0.05, reads[1], 0.05, reads[2]]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            reply = await exchange_raw(*stack.agent.proxy_address, _CLOSE_GET)
    assert reply.endswith(b"\r\n\r\n" + b"".join(reads))


async def test_http10_client_gets_the_body_unchunked_on_a_closing_connection() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with raw_upstream(lambda _: [head, b"5\r\nhello\r\n0\r\n\r\n"]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            host, port = stack.agent.proxy_address
            reply = await exchange_raw(host, port, b"GET /x HTTP/1.0\r\n\r\n")
            head_out, _, body = reply.partition(b"\r\n\r\n")
            assert body == b"hello"
            assert b"Transfer-Encoding" not in head_out
            assert b"Connection: close" in head_out


# --------------------------------------------------------------------------- headers


async def test_response_head_reaches_the_client_exactly_as_going_direct() -> None:
    """Case, order, duplicates and obs-text kept; nothing added (no Date, Server or
    Content-Type the upstream did not send); 103 Early Hints relayed; trailers kept."""
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    head = (
        b"HTTP/1.1 200 Fine Thanks\r\n"
        b'ETag: "v1"\r\n'
        b"x-lower-case: a\r\n"
        b"Set-Cookie: a=1\r\n"
        b"X-Obs-Text: caf\xe9\r\n"
        b"Set-Cookie: b=2\r\n"
        b"Trailer: X-Digest\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    body = b"3\r\nabc\r\n0\r\nX-Digest: d\r\n\r\n"
    async with raw_upstream(lambda _: [early, 0.01, head, body]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            direct = await exchange_raw(*_hostport(up.url), request, until=body)
            through = await exchange_raw(*stack.agent.proxy_address, request)
    assert direct == early + head + body
    # The one difference: the relay says it will close, as the client asked.
    assert through == early + head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + body


async def test_a_response_the_upstream_sends_after_the_final_one_never_reaches_the_client() -> None:
    # A misbehaving upstream answers once more in the same write: only the first answer is
    # the request's, and the record keeps its status.
    answers = b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    async with raw_upstream(lambda _: [answers]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            request = b"DELETE /v1/files/f1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            through = await exchange_raw(*stack.agent.proxy_address, request)
            await stack.wait_records(1)
    assert through == b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
    assert [record.status for record in stack.records] == [204]


async def test_bytes_after_a_content_length_body_in_the_same_read_never_reach_the_client() -> None:
    # The response ends at its length, as nginx and Envoy end it: a second answer the
    # upstream wrote with it is nobody's.
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    unasked = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra"
    through = await _relayed([answer + unasked])
    assert through == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


async def test_bytes_after_the_terminating_chunk_in_the_same_read_never_reach_the_client() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"2\r\nok\r\n0\r\nX-Digest: d\r\n\r\n"
    through = await _relayed([head + body + b"\r\n\r\nnot a response"])
    assert through == head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + body


@pytest.mark.parametrize("cut", [0, 1, 2, 3])
async def test_bytes_after_a_chunked_end_split_over_two_reads_never_reach_the_client(
    cut: int,
) -> None:
    # The closing CRLF CRLF of the chunked body, after its trailer, cut after ``cut`` of its
    # bytes: the read that ends it also holds bytes that are nobody's.
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"2\r\nok\r\n0\r\nX-Digest: d\r\n\r\n"
    whole = head + body + b"\r\nnot a response"  # a CRLF first: the parser would skip it
    at = len(head + body) - 4 + cut
    steps: list[bytes | float | None] = [whole[:at], 0.05, whole[at:]]
    through = await _relayed(steps)
    assert through.endswith(b"\r\n\r\n" + body)


async def test_bytes_after_a_content_length_body_over_two_reads_never_reach_the_client() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"
    steps: list[bytes | float | None] = [head + b"ab", 0.05, b"cHTTP/1.1 200 OK\r\n\r\n"]
    through = await _relayed(steps)
    assert through.endswith(b"\r\n\r\nabc")


async def test_bytes_after_a_chunked_end_split_over_three_reads_never_reach_the_client() -> None:
    # The closing CRLF CRLF spread over three reads, the middle one a single byte.
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    steps: list[bytes | float | None] = [
        head + b"2\r\nok\r\n0\r",
        0.05,
        b"\n",
        0.05,
        b"\r\nnot a response",
    ]
    through = await _relayed(steps)
    assert through.endswith(b"\r\n\r\n2\r\nok\r\n0\r\n\r\n")


async def test_an_upstream_connection_that_sent_bytes_after_its_response_is_never_reused() -> None:
    # A stray CRLF, which the parser would skip as the space between two responses: still
    # bytes nobody asked for, and the connection is in no state to reuse.
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\r\n"
    async with raw_upstream(lambda _: [answer]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            for _ in range(2):
                through = await exchange_raw(*stack.agent.proxy_address, _CLOSE_GET)
                assert through.endswith(b"\r\n\r\nok")
    assert up.connections == 2


async def test_a_response_with_bytes_after_its_end_is_recorded_whole_not_aborted() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    async with raw_upstream(lambda _: [answer + b"garbage"]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            await exchange_raw(*stack.agent.proxy_address, _CLOSE_GET)
            (record,) = await stack.wait_records(1)
    assert (record.status, record.error_type, record.upstream_aborted) == (200, None, False)


async def test_analysis_gets_only_the_response_body_not_the_bytes_after_it() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    unasked = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra"
    async with raw_upstream(lambda _: [answer + unasked]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            await exchange_raw(*stack.agent.proxy_address, _CLOSE_GET)
            (record,) = await stack.wait_records(1)
    assert record.response_bytes == 2


async def test_a_final_response_without_a_reason_phrase_never_takes_the_interim_ones() -> None:
    # RFC 9112 lets the reason phrase be empty, its space too; the client gets the status
    # line with the space and no phrase, never the phrase of the 100 before it.
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok"
    through = await _relayed([answer])
    assert through == (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 \r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    )


async def test_control_character_in_an_upstream_header_is_a_marked_502() -> None:
    bad = b"HTTP/1.1 200 OK\r\nX-Bad: a\x01b\r\nContent-Length: 2\r\n\r\nhi"
    async with raw_upstream(lambda _: [bad]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            reply = await exchange_raw(
                *stack.agent.proxy_address,
                b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            assert reply.startswith(b"HTTP/1.1 502 ")
            assert b"X-Semhealth-Error: upstream_invalid_response\r\n" in reply
            (record,) = await stack.wait_records(1)
            assert record.status == 502
            assert record.error_type == "upstream_invalid_response"


async def test_request_trailer_never_reaches_the_next_request_on_the_connection() -> None:
    """Request trailers are dropped (RFC 9110 §6.5.1 lets a proxy discard them): aiohttp's
    server, as the upstream here, would put them into the next request's headers, the
    defect the proxy before this one had itself."""
    async with running_stack(lambda r: RawScript(chunks=(b"ok",))) as stack:
        host, port = stack.agent.proxy_address
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"POST /v1/first HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\nX-Trailer-Field: leaked\r\n\r\n"
        )
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b"ok"), 5)
        writer.write(b"GET /v1/second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        second = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
        first_req, second_req = stack.upstream.received[-2:]
        assert first_req.body == b"{}"
        assert "X-Trailer-Field" not in second_req.headers


async def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"stored",))) as stack:
        host, port = stack.agent.proxy_address
        reader, writer = await asyncio.open_connection(host, port)
        body = b"x" * 100_000
        writer.write(
            b"POST /v1/upload HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        )
        await writer.drain()
        # Before: nothing came back and curl waited its whole expect timeout.
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert interim.startswith(b"HTTP/1.1 100 ")
        writer.write(body)
        await writer.drain()
        final = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert final.startswith(b"HTTP/1.1 200") and final.endswith(b"stored")
        assert stack.upstream.received[-1].body == body


def _stored(head: bytes) -> list[bytes | float | None]:
    """An upstream that never sends 100 Continue: it reads the whole body, then answers."""
    return [b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nstored"]


async def test_expect_100_continue_is_answered_by_the_sidecar_when_the_upstream_sends_none() -> (
    None
):
    body = b"x" * 100_000
    async with raw_upstream(_stored) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            reader, writer = await asyncio.open_connection(*stack.agent.proxy_address)
            writer.write(
                b"POST /v1/upload HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            )
            await writer.drain()
            # No body is sent until the 100 comes: without it, this waits forever.
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(body)
            await writer.drain()
            final = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert final.startswith(b"HTTP/1.1 200 OK\r\n") and final.endswith(b"stored")
            assert up.requests[-1].endswith(b"\r\n\r\n" + body)


async def test_the_expect_header_the_sidecar_answered_is_not_sent_upstream() -> None:
    async with raw_upstream(_stored) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            reply = await exchange_raw(
                *stack.agent.proxy_address,
                b"POST /v1/upload HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                b"X-After: kept\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            )
            assert reply.endswith(b"stored")
            (sent,) = up.requests
            assert b"expect" not in sent.lower()
            assert b"\r\nX-After: kept\r\n" in sent


async def test_curl_posting_a_body_over_max_request_bytes_with_expect_gets_its_answer(
    tmp_path: Path,
) -> None:
    curl = require_binary("curl", "curl")
    body = tmp_path / "body.bin"
    body.write_bytes(b"y" * 300_000)  # over the limit below: forwarded, not analysed
    async with raw_upstream(_stored) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()),
            **{"upstream.url": up.url, "limits.max_request_bytes": 100_000},
        ) as stack:
            host, port = stack.agent.proxy_address
            process = await asyncio.create_subprocess_exec(
                curl, "-sS", "--expect100-timeout", "60", "-H", "Expect: 100-continue",
                "--data-binary", f"@{body}", f"http://{host}:{port}/v1/upload",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                # curl waits 60 s for a 100 that does not come; the sidecar's comes at once.
                out, err = await asyncio.wait_for(process.communicate(), 20)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            assert (process.returncode, out, err) == (0, b"stored", b"")
            assert up.requests[-1].endswith(b"\r\n\r\n" + body.read_bytes())


async def test_head_requests_keep_the_connection_usable() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"0123456789",))) as stack:
        host, port = stack.agent.proxy_address
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(2):
            writer.write(b"HEAD /v1/x HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
        writer.write(b"GET /v1/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        last = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert last.endswith(b"0123456789")


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with running_stack(lambda r: RawScript(chunks=(r.path.encode(),))) as stack:
        host, port = stack.agent.proxy_address
        reply = await exchange_raw(
            host,
            port,
            b"GET /v1/a HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /v1/b HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /v1/c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        assert reply.index(b"/v1/a") < reply.index(b"/v1/b") < reply.index(b"/v1/c")
        assert reply.count(b"HTTP/1.1 200") == 3


def _drops_the_second_request_on_a_connection() -> Callable[[bytes], list[bytes | float | None]]:
    """The first request on a connection is answered; a second one finds it closed, as
    when an upstream's keep-alive timeout races the relay's reuse."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    served: dict[int, int] = {}

    def respond(head: bytes) -> list[bytes | float | None]:
        task = id(asyncio.current_task())
        served[task] = served.get(task, 0) + 1
        return [ok] if served[task] == 1 else [None]

    return respond


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\n"
        b"Content-Length: 2\r\nConnection: close\r\n\r\n{}",
    ],
    ids=["get", "post-with-idempotency-key"],
)
async def test_a_replayable_request_on_a_dropped_pooled_connection_is_sent_again(
    request_bytes: bytes,
) -> None:
    async with raw_upstream(_drops_the_second_request_on_a_connection()) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            first = await exchange_raw(*stack.agent.proxy_address, request_bytes)
            second = await exchange_raw(*stack.agent.proxy_address, request_bytes)
    assert first.endswith(b"ok") and second.endswith(b"ok")
    assert len(up.requests) == 3  # the second one twice: on the dropped connection, then anew


async def test_a_post_on_a_dropped_pooled_connection_is_never_sent_twice() -> None:
    # The upstream may have started the LLM call before it died: a 502, as nginx answers.
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\n{}"
    )
    async with raw_upstream(_drops_the_second_request_on_a_connection()) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            first = await exchange_raw(*stack.agent.proxy_address, request)
            second = await exchange_raw(*stack.agent.proxy_address, request)
    assert first.endswith(b"ok")
    assert second.startswith(b"HTTP/1.1 502 ")
    assert len(up.requests) == 2


# --------------------------------------------------------------------------- a client that leaves


@dataclass
class SilentUpstream:
    """A loopback upstream that reads one request and then says nothing, for ``silence_s``,
    watching for the relay to close the connection."""

    url: str
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # the request is in
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # the relay hung up


@contextlib.asynccontextmanager
async def silent_upstream(silence_s: float = 30.0) -> AsyncIterator[SilentUpstream]:
    state = SilentUpstream(url="")
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            state.arrived.set()
            # b"" (a FIN) or a reset: either way the relay let go of the request.
            await asyncio.wait_for(reader.read(), silence_s)
            state.closed.set()
        except ConnectionError:
            state.closed.set()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def left_before_the_head(request: bytes) -> StreamRecord:
    """``request`` sent to a sidecar whose upstream stays silent for 30 s, then a normal
    close (a FIN: nothing unread, so no reset); the relay must hang up on the upstream long
    before the silence ends. The exchange's record."""
    async with silent_upstream() as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            _, writer = await asyncio.open_connection(*stack.agent.proxy_address)
            writer.write(request)
            await writer.drain()
            await asyncio.wait_for(up.arrived.wait(), 5.0)
            writer.close()
            await asyncio.wait_for(up.closed.wait(), 5.0)
            (record,) = await stack.wait_records(1)
            return record


async def test_a_client_that_closes_before_the_head_is_a_499_and_its_upstream_request_ends() -> (
    None
):
    # A keep-alive request whose client closes normally (as an SDK's timeout does) while the
    # upstream has not answered: the client is gone, not half-closed.
    record = await left_before_the_head(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert record.status == 499
    assert record.client_aborted
    assert record.error_type == "client_aborted"


async def test_a_client_that_closes_mid_request_body_is_a_499_even_with_connection_close() -> None:
    # The body can never be complete, so no FIN here can be a half-close.
    record = await left_before_the_head(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        b'Connection: close\r\n\r\n{"model":'
    )
    assert record.status == 499
    assert record.error_type == "client_aborted"


async def test_a_client_that_half_closes_after_its_request_still_gets_the_whole_response() -> None:
    body = b"hello, half-closed client"
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    async with raw_upstream(lambda _: [0.5, answer]) as up:
        async with running_stack(
            lambda r: RawScript(chunks=()), **{"upstream.url": up.url}
        ) as stack:
            reader, writer = await asyncio.open_connection(*stack.agent.proxy_address)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                b"Connection: close\r\n\r\n{}"
            )
            await writer.drain()
            writer.write_eof()  # shutdown(SHUT_WR): done sending, still reading
            reply = await asyncio.wait_for(reader.read(), 5.0)
            writer.close()
            assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
            assert reply.endswith(b"\r\n\r\n" + body)
            (record,) = await stack.wait_records(1)
            assert record.status == 200
            assert not record.client_aborted
            assert record.error_type is None


# --------------------------------------------------------------------------- hostile clients


@pytest.mark.parametrize(
    "request_bytes",
    [
        f"GET /{CANARY} HTTP/1.1\r\nHo\x00st: x\r\n\r\n".encode(),
        f"POST /v1/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n{CANARY}".encode(),
        f"{CANARY} / HTTP/1.1\r\n\r\n".encode(),
        f"POST /v1/chat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{CANARY}\r\n".encode(),
    ],
    ids=["nul-in-header", "cl-and-te", "bad-method", "bad-chunk-size"],
)
async def test_malformed_requests_get_a_plain_error_and_nothing_of_them_is_logged(
    request_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_stack(lambda r: RawScript(chunks=(b"never",))) as stack:
        reply = await exchange_raw(*stack.agent.proxy_address, request_bytes)
    assert reply.startswith(b"HTTP/1.1 400 ") or reply == b""
    assert CANARY.encode() not in reply
    assert CANARY not in caplog.text
    assert b"never" not in reply


async def test_rejected_requests_are_counted_by_reason_on_metrics() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"never",))) as stack:
        await exchange_raw(*stack.agent.proxy_address, b"GARBAGE / HTTP/1.1\r\n\r\n")
        await exchange_raw(*stack.agent.proxy_address, b"CONNECT h:443 HTTP/1.1\r\n\r\n")
        async with aiohttp.ClientSession() as client:
            async with client.get(stack.agent.admin_url + "/metrics") as r:
                text = await r.text()
    assert 'semhealth_requests_rejected_total{reason="malformed"} 1.0' in text
    assert 'semhealth_requests_rejected_total{reason="method_not_allowed"} 1.0' in text


async def test_absolute_form_with_credentials_cannot_choose_the_upstream() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"from upstream",))) as stack:
        reply = await exchange_raw(
            *stack.agent.proxy_address,
            b"GET http://user:pw@198.51.100.7:8080/p?q=1 HTTP/1.1\r\nHost: 198.51.100.7\r\n"
            b"Connection: close\r\n\r\n",
        )
        assert reply.endswith(b"from upstream")
        assert stack.upstream.received[-1].path == "/p"


async def test_connect_is_refused() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"never",))) as stack:
        reply = await exchange_raw(
            *stack.agent.proxy_address, b"CONNECT 198.51.100.7:443 HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert reply.startswith(b"HTTP/1.1 405 ")
        assert stack.upstream.received == []


class _NoTap:
    def open_stream(self, exchange: Exchange) -> _NoStream:
        return _NoStream()

    def unanalysed(self, reason: str) -> None:
        return None


class _NoStream:
    def offer(self, chunk: bytes, t: int) -> None:
        return None

    def close(self, outcome: Outcome) -> None:
        return None


async def test_slow_headers_are_cut_by_the_header_timeout() -> None:
    relay = Relay(
        UpstreamSettings(url="http://127.0.0.1:9"),
        _NoTap(),
        listen=ListenSettings(header_timeout_s=0.3),
    )
    host, port = await relay.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and then nothing
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 3)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert relay.stats.rejected == {"header_timeout": 1}
    finally:
        await relay.shutdown(0.5)


async def test_idle_keepalive_connections_are_closed_after_their_timeout() -> None:
    relay = Relay(
        UpstreamSettings(url="http://127.0.0.1:9"),
        _NoTap(),
        listen=ListenSettings(keepalive_timeout_s=0.2),
    )
    host, port = await relay.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(host, port)
        assert await asyncio.wait_for(reader.read(), 3) == b""
        writer.close()
    finally:
        await relay.shutdown(0.5)


async def test_the_connection_serves_the_next_request_after_a_502() -> None:
    # A failed connect paused reading from the client; the next request on the same
    # keep-alive connection waited for the idle timeout (75 s) before this was fixed.
    async with running_stack(
        lambda r: RawScript(chunks=()), **{"upstream.url": "http://127.0.0.1:9"}
    ) as stack:
        reader, writer = await asyncio.open_connection(*stack.agent.proxy_address)
        for _ in range(3):
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert head.startswith(b"HTTP/1.1 502 ")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        writer.close()


async def test_a_proxy_error_is_counted_as_a_request() -> None:
    async with running_stack(
        lambda r: RawScript(chunks=()), **{"upstream.url": "http://127.0.0.1:9"}
    ) as stack:
        reply = await exchange_raw(
            *stack.agent.proxy_address,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Connection: close\r\n\r\n{}",
        )
        assert reply.startswith(b"HTTP/1.1 502 ")
        (record,) = await stack.wait_records(1)
        assert (record.status, record.error_type) == (502, "upstream_unreachable")
