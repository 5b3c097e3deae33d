"""Connection limits of the relay, seen from raw sockets: past each limit the client gets a
marked answer at once (never a hang), and every hit is counted by reason.

    max_client_connections  503 X-Semhealth-Error: too_many_connections, then closed
    max_upstream_requests   503 X-Semhealth-Error: upstream_concurrency_limit, at
                            once, before the request's body is read: so the connection
                            closes (Connection: close), as for every early answer
    header_timeout_s        408 header_timeout (a head that never ends)
    keepalive_timeout_s     closed; counted as idle_timeout when no request ever came

In-process relays for the exact counts, and one real ``semhealth run`` with the flags, whose
``/metrics`` shows the counts that came over the tap wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.dataplane.relay import ListenSettings, Relay, UpstreamSettings
from tests.agent.test_cli import _env, _wait_ready
from tests.agent.test_relay import _NoTap, raw_upstream
from tests.servers import free_port

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


@contextlib.asynccontextmanager
async def relay_to(url: str, listen: ListenSettings) -> AsyncIterator[Relay]:
    relay = Relay(UpstreamSettings(url=url), _NoTap(), listen=listen)
    await relay.start("127.0.0.1", 0)
    try:
        yield relay
    finally:
        await relay.shutdown(0.5)


def _address(relay: Relay) -> tuple[str, int]:
    host, port = relay._servers[0].sockets[0].getsockname()[:2]
    return host, port


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head, await asyncio.wait_for(reader.readexactly(length), 5)


async def test_a_connection_past_the_limit_gets_a_marked_503_and_the_first_ones_are_served() -> (
    None
):
    async with (
        raw_upstream(lambda _: [OK]) as up,
        relay_to(up.url, ListenSettings(max_client_connections=2)) as relay,
    ):
        address = _address(relay)
        held = [await asyncio.open_connection(*address) for _ in range(2)]
        await asyncio.sleep(0.05)  # both accepted before the third arrives
        reader, writer = await asyncio.open_connection(*address)
        # The client sends its request before reading, as every HTTP client does: it must
        # still read the whole answer, then the end of the connection (no reset).
        writer.write(GET)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"X-Semhealth-Error: too_many_connections" in head
        assert b"Connection: close" in head
        assert b'"type":"too_many_connections"' in body
        assert relay.stats.rejected == {"too_many_connections": 1}
        assert up.requests == []  # never forwarded
        # The connections within the limit work as ever.
        for held_reader, held_writer in held:
            held_writer.write(GET)
            await held_writer.drain()
            head, body = await _read_response(held_reader)
            assert head.startswith(b"HTTP/1.1 200 ") and body == b"ok"
        # One closes: the next new connection is accepted again.
        held[0][1].close()
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection(*address)
        writer.write(GET)
        await writer.drain()
        head, body = await _read_response(reader)
        assert head.startswith(b"HTTP/1.1 200 ")
        writer.close()
        held[1][1].close()
        assert relay.stats.rejected == {"too_many_connections": 1}


async def test_a_request_past_the_upstream_limit_gets_a_marked_503_at_once() -> None:
    slow = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n"

    def respond(head: bytes) -> list[bytes | float | None]:
        if head.startswith(b"GET /slow"):
            return [slow, 0.3, b"done"]  # in flight while the second request comes
        return [OK]

    async with (
        raw_upstream(respond) as up,
        relay_to(up.url, ListenSettings(max_upstream_requests=1)) as relay,
    ):
        address = _address(relay)
        slow_reader, slow_writer = await asyncio.open_connection(*address)
        slow_writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await slow_writer.drain()
        await asyncio.wait_for(slow_reader.readuntil(b"\r\n\r\n"), 5)  # it is upstream now
        reader, writer = await asyncio.open_connection(*address)
        writer.write(GET)
        await writer.drain()
        head, body = await _read_response(reader)
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"X-Semhealth-Error: upstream_concurrency_limit" in head
        assert b'"type":"upstream_concurrency_limit"' in body
        assert relay.stats.rejected == {"upstream_concurrency_limit": 1}
        assert relay.stats.errors == {}  # a limit, not a failure of the upstream
        assert b"Connection: close" in head
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # The slow one finishes untouched; then a new request is served again.
        assert await asyncio.wait_for(slow_reader.readexactly(4), 5) == b"done"
        reader, writer = await asyncio.open_connection(*address)
        writer.write(GET)
        await writer.drain()
        head, body = await _read_response(reader)
        assert head.startswith(b"HTTP/1.1 200 ") and body == b"ok"
        writer.close()
        slow_writer.close()
        assert [r.split(b" ")[1] for r in up.requests] == [b"/slow", b"/v1/models"]


async def test_timeouts_are_counted_when_hit_and_a_used_connection_idling_out_is_not() -> None:
    listen = ListenSettings(header_timeout_s=0.3, keepalive_timeout_s=0.3)
    async with raw_upstream(lambda _: [OK]) as up, relay_to(up.url, listen) as relay:
        address = _address(relay)
        # Never sends a byte: closed at the idle timeout, counted.
        silent_reader, silent_writer = await asyncio.open_connection(*address)
        # Half a head: 408 at the header timeout, counted.
        slow_reader, slow_writer = await asyncio.open_connection(*address)
        slow_writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        await slow_writer.drain()
        # One request, then idle: an ordinary keep-alive close, not counted.
        used_reader, used_writer = await asyncio.open_connection(*address)
        used_writer.write(GET)
        await used_writer.drain()
        await _read_response(used_reader)
        assert await asyncio.wait_for(silent_reader.read(), 5) == b""
        assert (await asyncio.wait_for(slow_reader.read(), 5)).startswith(b"HTTP/1.1 408 ")
        assert await asyncio.wait_for(used_reader.read(), 5) == b""
        for writer in (silent_writer, slow_writer, used_writer):
            writer.close()
        assert relay.stats.rejected == {"idle_timeout": 1, "header_timeout": 1}


async def test_semhealth_run_answers_past_its_limits_and_exports_the_counts() -> None:
    def respond(head: bytes) -> list[bytes | float | None]:
        if head.startswith(b"GET /slow"):
            return [b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", 0.5, b"done"]
        return [OK]

    async with raw_upstream(respond) as up:
        proxy_port, admin_port = free_port(), free_port()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "semhealth.agent.cli", "run",
            "--upstream", up.url,
            "--listen", f"127.0.0.1:{proxy_port}",
            "--admin-listen", f"127.0.0.1:{admin_port}",
            "--max-client-connections", "2",
            "--max-upstream-requests", "1",
            env=_env(),
        )  # fmt: skip
        admin = f"http://127.0.0.1:{admin_port}"
        try:
            await _wait_ready(admin, deadline_s=60)
            first = await asyncio.open_connection("127.0.0.1", proxy_port)
            first[1].write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            await first[1].drain()
            await asyncio.wait_for(first[0].readuntil(b"\r\n\r\n"), 5)
            # Two open (one upstream, one idle): a third connection is one too many.
            second = await asyncio.open_connection("127.0.0.1", proxy_port)
            await asyncio.sleep(0.1)
            third = await asyncio.open_connection("127.0.0.1", proxy_port)
            third[1].write(GET)
            await third[1].drain()
            reply = await asyncio.wait_for(third[0].read(), 5)
            assert reply.startswith(b"HTTP/1.1 503 ")
            assert b"X-Semhealth-Error: too_many_connections" in reply
            # The idle one asks while /slow is upstream: one request too many.
            second[1].write(GET)
            await second[1].drain()
            head, _ = await _read_response(second[0])
            assert b"X-Semhealth-Error: upstream_concurrency_limit" in head
            for _, writer in (first, second, third):
                writer.close()
            assert await _rejected(admin) == {
                "upstream_concurrency_limit": 1.0,
                "too_many_connections": 1.0,
            }
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                await asyncio.wait_for(process.wait(), 20)
        assert process.returncode == 0


async def _rejected(admin: str, timeout_s: float = 10.0) -> dict[str, float]:
    """``semhealth_requests_rejected_total`` by reason, once the tap wire has brought both."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    found: dict[str, float] = {}
    async with aiohttp.ClientSession() as client:
        while loop.time() < end:
            async with client.get(admin + "/metrics") as r:
                text = await r.text()
            found = {
                sample.labels["reason"]: sample.value
                for family in text_string_to_metric_families(text)
                if family.name == "semhealth_requests_rejected"
                for sample in family.samples
                if sample.name.endswith("_total")
            }
            if len(found) >= 2:
                return found
            await asyncio.sleep(0.2)
    return found
