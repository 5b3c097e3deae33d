"""How the relay reaches its upstream: the URL it is given (scheme, host, port, base path),
TLS (a CA file, no verification, a client certificate), and the upstream that cannot be
reached in time or streams past the total timeout. Real loopback servers throughout: plain,
TLS, IPv6 and on a Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from semhealth.agent.dataplane.relay import Relay, UpstreamSettings, _UpstreamConnection
from tests.agent.test_relay import exchange_raw, raw_upstream
from tests.agent.test_relay_mutants import _Capture, _NoTap, bare_relay
from tests.embeddings.certs import Pki, make_pki

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
GET = b"GET /v1/models?limit=2 HTTP/1.1\r\nHost: client\r\nConnection: close\r\n\r\n"


@dataclass
class Heads:
    """The request heads an upstream received."""

    url: str = ""
    received: list[bytes] = field(default_factory=list)


@contextlib.asynccontextmanager
async def upstream_at(
    host: str = "127.0.0.1", *, tls: ssl.SSLContext | None = None, unix_path: str | None = None
) -> AsyncIterator[Heads]:
    """An upstream that answers each request ``OK`` and keeps its head: on ``host`` (IPv4 or
    IPv6), or on ``unix_path``, over TLS when ``tls`` is given."""
    heads = Heads()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            heads.received.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(OK)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # a client that did not trust us, or that we did not trust
        finally:
            writer.close()

    if unix_path is not None:
        server = await asyncio.start_unix_server(handle, unix_path, ssl=tls)
    else:
        server = await asyncio.start_server(handle, host, 0, ssl=tls)
        port = server.sockets[0].getsockname()[1]
        authority = f"[{host}]" if ":" in host else host
        heads.url = f"{'https' if tls else 'http'}://{authority}:{port}"
    try:
        yield heads
    finally:
        server.close()


def server_tls(pki: Pki, *, client_ca: str | None = None) -> ssl.SSLContext:
    """The upstream's side of TLS; with ``client_ca`` it requires a client certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server.cert, pki.server.key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


def host_header(head: bytes) -> bytes:
    (line,) = [line for line in head.split(b"\r\n") if line.lower().startswith(b"host:")]
    return line.split(b":", 1)[1].strip()


# --------------------------------------------------------------------------- the URL


async def test_an_upstream_on_a_unix_socket_gets_the_urls_host_without_the_default_port(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "up.sock")
    async with upstream_at(unix_path=path) as up:
        async with bare_relay("http://localhost", unix_path=path) as (_relay, host, port):
            reply = await exchange_raw(host, port, GET)
    assert reply.endswith(b"\r\n\r\nok")
    (head,) = up.received
    assert host_header(head) == b"localhost"


async def test_an_ipv6_upstream_gets_its_address_in_brackets_in_the_host_header() -> None:
    async with upstream_at("::1") as up:
        async with bare_relay(up.url) as (_relay, host, port):
            reply = await exchange_raw(host, port, GET)
    assert reply.endswith(b"\r\n\r\nok")
    (head,) = up.received
    assert host_header(head) == up.url.removeprefix("http://").encode()


async def test_the_upstream_urls_base_path_prefixes_each_request_path() -> None:
    async with upstream_at() as up:
        async with bare_relay(up.url + "/openai/") as (_relay, host, port):
            await exchange_raw(host, port, GET)
    (head,) = up.received
    assert head.startswith(b"GET /openai/v1/models?limit=2 HTTP/1.1\r\n")


def test_an_upstream_url_that_is_not_http_or_https_is_refused_naming_its_scheme() -> None:
    with pytest.raises(ValueError, match="upstream url must be http or https, not 'ftp'"):
        Relay(UpstreamSettings(url="ftp://127.0.0.1/files"), _NoTap())


# --------------------------------------------------------------------------- TLS


async def test_the_relay_reaches_an_https_upstream_its_ca_file_trusts(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with upstream_at(tls=server_tls(pki)) as up:
        async with bare_relay(up.url, ca_file=pki.ca) as (_relay, host, port):
            reply = await exchange_raw(host, port, GET)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\nok")
    assert len(up.received) == 1


async def test_an_https_upstream_the_relay_does_not_trust_gets_a_marked_502(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path)  # a CA of its own, in no trust store the relay reads
    async with upstream_at(tls=server_tls(pki)) as up:
        async with bare_relay(up.url) as (_relay, host, port):
            reply = await exchange_raw(host, port, GET)
    assert reply.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert b"X-Semhealth-Error: upstream_unreachable\r\n" in reply
    assert up.received == []


async def test_an_https_upstream_is_reached_untrusted_when_verification_is_off(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path)
    async with upstream_at(tls=server_tls(pki)) as up:
        async with bare_relay(up.url, verify=False) as (_relay, host, port):
            reply = await exchange_raw(host, port, GET)
    assert reply.endswith(b"\r\n\r\nok")
    assert len(up.received) == 1


async def test_an_https_upstream_that_requires_a_client_certificate_gets_the_relays(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path)
    client = pki.client(tmp_path, "sidecar")
    async with upstream_at(tls=server_tls(pki, client_ca=pki.ca)) as up:
        async with bare_relay(
            up.url, ca_file=pki.ca, client_cert=client.cert, client_key=client.key
        ) as (_relay, host, port):
            reply = await exchange_raw(host, port, GET)
    assert reply.endswith(b"\r\n\r\nok")
    assert len(up.received) == 1


# --------------------------------------------------------------------------- failing upstreams


@contextlib.contextmanager
def never_accepting() -> Iterator[str]:
    """A listener whose accept queue is full and never read: a connect to it never completes
    (the kernel drops the SYN), as with an upstream host that is down behind a firewall."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        fillers = []
        try:
            for _ in range(3):
                filler = socket.socket()
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(address)
                fillers.append(filler)
            yield f"http://{address[0]}:{address[1]}"
        finally:
            for filler in fillers:
                filler.close()


async def test_an_upstream_that_never_accepts_the_connection_gets_a_marked_504() -> None:
    with never_accepting() as url:
        async with bare_relay(url, connect_timeout_s=0.2) as (relay, host, port):
            reply = await exchange_raw(host, port, GET)
            assert relay.stats.errors == {"upstream_timeout": 1}
    assert reply.startswith(b"HTTP/1.1 504 Gateway Timeout\r\n")
    assert b"X-Semhealth-Error: upstream_timeout\r\n" in reply


async def test_a_failed_upstream_connection_is_logged_with_its_error_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="semhealth.agent.dataplane.relay")
    async with bare_relay("http://127.0.0.1:9") as (_relay, host, port):
        await exchange_raw(host, port, GET)
    assert [r.getMessage() for r in caplog.records] == [
        "upstream connection failed: ConnectionRefusedError"
    ]


async def test_an_upstream_still_streaming_at_total_timeout_s_is_cut_and_marked() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    steps: list[bytes | float | None] = [head]
    for _ in range(300):  # 30 s of a byte every 0.1 s: the read timeout never fires
        steps += [b"1\r\nx\r\n", 0.1]
    capture = _Capture()
    async with raw_upstream(lambda _: steps) as up:
        async with bare_relay(up.url, tap=capture, total_timeout_s=0.5) as (_relay, host, port):
            reply = await exchange_raw(host, port, GET, timeout_s=10.0)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert not reply.endswith(b"0\r\n\r\n")  # never a clean end for a cut body
    (outcome,) = capture.outcomes
    assert (outcome.upstream_aborted, outcome.error_type) == (True, "upstream_timeout")


# --------------------------------------------------------------------------- writes upstream

BODY = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
POST_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"


@dataclass
class Writes:
    """Every write the relay makes to an upstream connection, in order."""

    data: list[bytes] = field(default_factory=list)
    made: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
def upstream_writes(monkeypatch: pytest.MonkeyPatch) -> Writes:
    writes = Writes()
    write = _UpstreamConnection.write

    def recorded(self: _UpstreamConnection, data: bytes) -> None:
        writes.data.append(data)
        writes.made.set()
        write(self, data)

    monkeypatch.setattr(_UpstreamConnection, "write", recorded)
    return writes


async def test_a_request_head_and_the_body_read_with_it_go_upstream_in_one_write(
    upstream_writes: Writes,
) -> None:
    request = POST_HEAD % len(BODY) + BODY
    async with raw_upstream(lambda _: [OK]) as up, bare_relay(up.url) as (_, host, port):
        reply = await exchange_raw(host, port, request, until=b"ok")
    assert reply.endswith(b"ok")
    assert len(upstream_writes.data) == 1
    assert upstream_writes.data[0].endswith(b"\r\n\r\n" + BODY)
    assert up.requests == upstream_writes.data


async def test_a_body_still_arriving_goes_upstream_as_each_read_comes(
    upstream_writes: Writes,
) -> None:
    # Nothing waits for the end of the body: each client read is one write upstream.
    half = len(BODY) // 2
    async with raw_upstream(lambda _: [OK]) as up, bare_relay(up.url) as (_, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(POST_HEAD % len(BODY) + BODY[:half])
        await writer.drain()
        await asyncio.wait_for(upstream_writes.made.wait(), 5)
        assert upstream_writes.data[0].endswith(b"\r\n\r\n" + BODY[:half])
        writer.write(BODY[half:])
        assert (await reader.readuntil(b"ok")).endswith(b"ok")
        writer.close()
    assert upstream_writes.data[1:] == [BODY[half:]]
    assert up.requests == [b"".join(upstream_writes.data)]
