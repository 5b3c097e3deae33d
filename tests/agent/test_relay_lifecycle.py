"""The relay's listener from start to shutdown: where it binds (an address, a socket handed
to it, a port shared with SO_REUSEPORT or still in TIME_WAIT), and how shutdown drains the
exchanges in flight by its deadline; real loopback clients and upstreams."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from semhealth.agent.dataplane.relay import Relay, RelayStats, UpstreamSettings
from tests.agent.test_relay import exchange_raw, raw_upstream
from tests.agent.test_relay_mutants import _NoTap
from tests.servers import free_port

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
CLOSE_GET = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def _relay(url: str) -> Relay:
    return Relay(UpstreamSettings(url=url), _NoTap())


@contextlib.asynccontextmanager
async def stopping(relay: Relay) -> AsyncIterator[Relay]:
    try:
        yield relay
    finally:
        await relay.shutdown(1.0)


# --------------------------------------------------------------------------- binding


async def test_start_binds_the_host_and_port_it_is_given_and_returns_them() -> None:
    port = free_port()
    async with raw_upstream(lambda _: [OK]) as up, stopping(_relay(up.url)) as relay:
        bound = await relay.start("127.0.0.1", port)
        reply = await exchange_raw("127.0.0.1", port, CLOSE_GET)
    assert bound == ("127.0.0.1", port)
    assert reply.endswith(b"\r\n\r\nok")


async def test_a_relay_started_on_a_listening_socket_serves_on_it() -> None:
    # The forwarding workers share one socket their parent bound.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    address = sock.getsockname()
    async with raw_upstream(lambda _: [OK]) as up, stopping(_relay(up.url)) as relay:
        host, port = await relay.start("", 0, sock=sock)
        reply = await exchange_raw(host, port, CLOSE_GET)
    assert (host, port) == address
    assert reply.endswith(b"\r\n\r\nok")


async def test_two_relays_started_with_reuse_port_share_one_port() -> None:
    port = free_port()
    async with (
        raw_upstream(lambda _: [OK]) as up,
        stopping(_relay(up.url)) as first,
        stopping(_relay(up.url)) as second,
    ):
        await first.start("127.0.0.1", port, reuse_port=True)
        assert await second.start("127.0.0.1", port, reuse_port=True) == ("127.0.0.1", port)


async def test_a_second_relay_on_a_port_in_use_fails_to_start() -> None:
    port = free_port()
    async with (
        raw_upstream(lambda _: [OK]) as up,
        stopping(_relay(up.url)) as first,
        stopping(_relay(up.url)) as second,
    ):
        await first.start("127.0.0.1", port)
        with pytest.raises(OSError):
            await second.start("127.0.0.1", port)


async def test_a_relay_restarted_right_after_serving_binds_its_port_again() -> None:
    # The relay closed the client's connection first: that connection is in TIME_WAIT on
    # the relay's port for a minute, and only SO_REUSEADDR lets a listener bind it again.
    port = free_port()
    async with raw_upstream(lambda _: [OK]) as up:
        async with stopping(_relay(up.url)) as relay:
            await relay.start("127.0.0.1", port)
            await exchange_raw("127.0.0.1", port, CLOSE_GET)
        async with stopping(_relay(up.url)) as again:
            assert await again.start("127.0.0.1", port) == ("127.0.0.1", port)


# --------------------------------------------------------------------------- shutdown


def _slow_by_path(head: bytes) -> list[bytes | float | None]:
    """A head at once, the body after as many tenths of a second as the path says."""
    tenths = int(head.split(b" ")[1].strip(b"/"))
    return [b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", tenths / 10, b"done"]


async def _head_read(
    relay_port: int, path: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", relay_port)
    writer.write(b"GET /%s HTTP/1.1\r\nHost: x\r\n\r\n" % path)  # keep-alive
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    return reader, writer


async def test_shutdown_lets_every_exchange_in_flight_finish_then_closes_its_connection() -> None:
    async with raw_upstream(_slow_by_path) as up:
        relay = _relay(up.url)
        _, port = await relay.start("127.0.0.1", 0)
        sooner, sooner_writer = await _head_read(port, b"2")
        later, later_writer = await _head_read(port, b"6")
        stopping_task = asyncio.create_task(relay.shutdown(10.0))
        try:
            # Each whole, then the end of its connection as soon as it is done: a keep-alive
            # connection takes no new request once shutdown has begun.
            assert await asyncio.wait_for(sooner.read(), 5.0) == b"done"
            assert not stopping_task.done()  # the later one is still on its way
            assert await asyncio.wait_for(later.read(), 5.0) == b"done"
            await asyncio.wait_for(stopping_task, 15.0)
        finally:
            for writer in (sooner_writer, later_writer):
                writer.close()


async def test_shutdown_cuts_the_exchanges_still_running_at_its_deadline() -> None:
    async with raw_upstream(
        lambda _: [b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", 30.0]
    ) as up:
        relay = _relay(up.url)
        _, port = await relay.start("127.0.0.1", 0)
        reader, writer = await _head_read(port, b"x")
        await asyncio.wait_for(relay.shutdown(0.2), 5.0)
        try:
            with contextlib.suppress(ConnectionResetError):  # cut: a reset, or at least an end
                assert await asyncio.wait_for(reader.read(), 5.0) == b""
        finally:
            writer.close()


async def test_shutdown_closes_idle_connections_at_once_while_another_drains() -> None:
    async with raw_upstream(_slow_by_path) as up:
        relay = _relay(up.url)
        _, port = await relay.start("127.0.0.1", 0)
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        busy, busy_writer = await _head_read(port, b"5")
        stopping_task = asyncio.create_task(relay.shutdown(10.0))
        try:
            # A FIN, while the busy one is still on its way: read() would raise on a reset.
            assert await asyncio.wait_for(idle_reader.read(), 5.0) == b""
            assert not stopping_task.done()
            assert await asyncio.wait_for(busy.read(), 5.0) == b"done"
            await asyncio.wait_for(stopping_task, 15.0)
        finally:
            idle_writer.close()
            busy_writer.close()


# --------------------------------------------------------------------------- quiet


def _quiet_relay(url: str, quiet_after_s: float) -> tuple[Relay, list[float]]:
    """A relay that notes the loop time of each call of its quiet hook."""
    calls: list[float] = []
    relay = Relay(
        UpstreamSettings(url=url),
        _NoTap(),
        on_quiet=lambda: calls.append(asyncio.get_running_loop().time()),
        quiet_after_s=quiet_after_s,
    )
    return relay, calls


async def test_the_quiet_hook_runs_once_its_delay_after_the_last_exchange_ends() -> None:
    async with raw_upstream(lambda _: [OK]) as up:
        relay, calls = _quiet_relay(up.url, 0.2)
        async with stopping(relay):
            _, port = await relay.start("127.0.0.1", 0)
            await exchange_raw("127.0.0.1", port, CLOSE_GET)
            ended = asyncio.get_running_loop().time()
            await asyncio.sleep(1.0)
    assert len(calls) == 1  # once a quiet spell, not every delay
    assert calls[0] - ended >= 0.2 - 0.05


async def test_an_exchange_begun_before_the_quiet_delay_passes_puts_the_hook_off() -> None:
    async with raw_upstream(_slow_by_path) as up:
        relay, calls = _quiet_relay(up.url, 1.0)
        async with stopping(relay):
            _, port = await relay.start("127.0.0.1", 0)
            await exchange_raw(
                "127.0.0.1", port, b"GET /0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            reader, writer = await _head_read(port, b"20")  # its body 2 s on
            try:
                await asyncio.sleep(1.5)  # past the first exchange's quiet delay
                assert calls == []
                assert await asyncio.wait_for(reader.readexactly(4), 5.0) == b"done"
            finally:
                writer.close()
            await asyncio.sleep(1.5)
    assert len(calls) == 1


# --------------------------------------------------------------------------- memory

CHUNKED_OK = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
_RELAY_TYPES = frozenset(
    {"_Exchange", "_ClientConnection", "_Request", "HttpRequestParser", "HttpResponseParser"}
)


@contextlib.contextmanager
def cyclic_garbage() -> Iterator[list[str]]:
    """The type names of what only the cyclic collector would have freed in the block."""
    found: list[str] = []
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found += [type(thing).__name__ for thing in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def test_a_finished_exchange_is_freed_without_the_cyclic_collector() -> None:
    # The response parser's callbacks hold their exchange; finishing lets go of the parser,
    # so nothing an exchange made waits for a collection (21 objects an exchange did).
    get = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
    async with raw_upstream(lambda _: [CHUNKED_OK]) as up, stopping(_relay(up.url)) as relay:
        host, port = await relay.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(host, port)
        with cyclic_garbage() as found:
            for _ in range(20):
                writer.write(get)
                await reader.readuntil(b"0\r\n\r\n")
        writer.close()
    assert _RELAY_TYPES.isdisjoint(found), sorted(set(found) & _RELAY_TYPES)


async def test_a_closed_client_connection_is_freed_without_the_cyclic_collector() -> None:
    async with raw_upstream(lambda _: [CHUNKED_OK]) as up, stopping(_relay(up.url)) as relay:
        host, port = await relay.start("127.0.0.1", 0)
        with cyclic_garbage() as found:
            for _ in range(20):
                await exchange_raw(host, port, CLOSE_GET)
            await asyncio.sleep(0.1)  # the relay sees each connection end
    assert _RELAY_TYPES.isdisjoint(found), sorted(set(found) & _RELAY_TYPES)


# --------------------------------------------------------------------------- counters


async def test_the_stats_listener_hears_of_each_exchange_and_each_rejection() -> None:
    # The tap wire checks its counters only when told: an exchange that begins (the streams
    # in flight) and a rejection (counted without an exchange) each tell it.
    heard: list[int] = []
    async with raw_upstream(lambda _: [OK]) as up:
        stats = RelayStats(on_change=lambda: heard.append(1))
        relay = Relay(UpstreamSettings(url=up.url), _NoTap(), stats=stats)
        async with stopping(relay):
            host, port = await relay.start("127.0.0.1", 0)
            await exchange_raw(host, port, CLOSE_GET)
            assert len(heard) == 1
            await exchange_raw(host, port, b"NOT HTTP AT ALL\r\n\r\n")
            assert stats.rejected == {"malformed": 1}
            assert len(heard) == 2
