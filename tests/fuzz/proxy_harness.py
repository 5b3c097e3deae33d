"""The proxy fuzzer's machinery: a raw-socket upstream, a raw client, the comparison, and
one long-lived ``semhealth run`` that every case goes through.

Each case (``proxy_cases.make_case``) is sent twice: straight to the raw upstream, and
through the sidecar to the same upstream (on a second listener, so what the proxy sent it
is told apart). The two answers are compared as ``Expect`` says, and so are the requests
the upstream got each way (method, target, end-to-end headers in order and case, body);
the sidecar must stay up and ready, never hang a case, and never write a canary from a
body or header to its logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import httptools

from tests.fuzz.proxy_cases import HOP_BY_HOP, Case, Expect, make_case

CASE_TIMEOUT_S = 20.0
_TOKEN = re.compile(rb"/fuzz/([^/?\s]+)")
_CANARY = re.compile(r"CANARY(\d+)Z")


# -- the raw upstream ------------------------------------------------------------------------


@dataclass(frozen=True)
class SeenRequest:
    """A request as the upstream parsed it: what a proxy must pass on."""

    method: bytes
    url: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes  # decoded from its framing


@dataclass
class _Requests:
    """httptools callbacks for one upstream connection: the requests completed so far."""

    parser: httptools.HttpRequestParser | None = None
    url: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)
    method: bytes = b""
    done: list[SeenRequest] = field(default_factory=list)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.method:  # trailers come after the head: not the request's headers
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.method = self.parser.get_method()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done.append(
            SeenRequest(self.method, self.url, tuple(self.headers), b"".join(self.body))
        )
        self.url, self.headers, self.body, self.method = b"", [], [], b""


@dataclass
class UpstreamStats:
    requests: int = 0
    parse_errors: list[str] = field(default_factory=list)  # the token last seen, per error


class RawUpstream:
    """Writes each case's reply, piece by piece, to whichever request names its token.

    Two listeners: ``direct`` for the fuzzer's own client, ``behind`` for the sidecar. A
    request the upstream cannot parse is counted per listener: behind the proxy, that is a
    request the proxy should never have forwarded.
    """

    def __init__(self) -> None:
        self.cases: dict[str, Case] = {}
        self.seen: dict[tuple[str, str], list[SeenRequest]] = {}  # (listener, token) -> requests
        self.stats = {"direct": UpstreamStats(), "behind": UpstreamStats()}
        self._servers: list[asyncio.Server] = []
        self.ports: dict[str, int] = {}

    async def start(self) -> None:
        for name in ("direct", "behind"):
            server = await asyncio.start_server(
                functools.partial(self._serve, name), "127.0.0.1", 0
            )
            self._servers.append(server)
            self.ports[name] = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()

    async def _serve(
        self, listener: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        state = _Requests()
        parser = state.parser = httptools.HttpRequestParser(state)
        stats = self.stats[listener]
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                try:
                    parser.feed_data(data)
                except httptools.HttpParserUpgrade:
                    return
                except httptools.HttpParserError:
                    match = _TOKEN.search(state.url)
                    stats.parse_errors.append(match.group(1).decode() if match else "?")
                    return
                for seen in state.done:
                    stats.requests += 1
                    match = _TOKEN.search(seen.url)
                    if match:
                        self.seen.setdefault((listener, match.group(1).decode()), []).append(seen)
                    if not await self._reply(seen.url, writer):
                        return
                state.done.clear()
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()

    async def _reply(self, url: bytes, writer: asyncio.StreamWriter) -> bool:
        """Write the case's reply; False when the connection is to be closed."""
        match = _TOKEN.search(url)
        case = self.cases.get(match.group(1).decode()) if match else None
        if case is None:
            writer.write(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
            return False
        for piece in case.reply.pieces:
            writer.write(piece)
            await writer.drain()
            # A pause lets each piece reach the proxy as a read of its own, mostly.
            await asyncio.sleep(0.0005 if len(case.reply.pieces) > 1 else 0)
        return not case.reply.close


# -- the raw client --------------------------------------------------------------------------


@dataclass
class Received:
    """What a client got back on one connection, as far as one response goes."""

    raw: bytes = b""
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    head_end: int | None = None  # offset of the body's first byte in ``raw``
    body_end: int | None = None  # offset just past the message, when it completed
    complete: bool = False
    eof: bool = False
    parse_error: bool = False
    timed_out: bool = False
    again: Received | None = None  # the answer to the case's second request, if sent
    interim: list[int] = field(default_factory=list)  # 1xx statuses before the final answer

    @property
    def body(self) -> bytes:
        """The bytes after the head, framing included, up to the message's end or EOF."""
        if self.head_end is None:
            return b""
        return self.raw[self.head_end : self.body_end]

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


class _ResponseParser:
    def __init__(self, received: Received, bodiless: bool) -> None:
        self.received = received
        self.bodiless = bodiless
        self.parser = httptools.HttpResponseParser(self)
        self.fed = 0
        self.message_start = 0  # where the head being parsed starts (after any 1xx)
        self.in_interim = False

    def feed(self, data: bytes) -> None:
        received = self.received
        self.fed = len(received.raw)
        received.raw += data
        if received.complete or received.parse_error:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            received.parse_error = True

    # llhttp parses every message a read holds; once this one is complete, the callbacks
    # belong to the next response (pipelined), which another parser reads.
    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.received.complete:
            self.received.headers.append((name, value))

    def on_headers_complete(self) -> None:
        received = self.received
        if received.complete:
            return
        status = self.parser.get_status_code()
        end = received.raw.find(b"\r\n\r\n", self.message_start)
        head_end = end + 4 if end >= 0 else len(received.raw)
        if 100 <= status < 200:
            # An interim answer: the final one follows on the same connection.
            received.interim.append(status)
            received.headers = []
            self.message_start = head_end
            self.in_interim = True
            return
        received.status = status
        received.head_end = head_end
        if self.bodiless or received.status in (204, 304):
            received.complete = True
            received.body_end = received.head_end

    def on_message_complete(self) -> None:
        received = self.received
        if self.in_interim:
            self.in_interim = False
            return
        if not received.complete:
            received.complete = True
            # llhttp has consumed exactly the message: its end is where this feed stopped.
            received.body_end = self._message_end()

    def _message_end(self) -> int:
        # The parser does not say where in the chunk the message ended; re-find it from the
        # framing: a length body ends after it, a chunked one after its last chunk.
        received = self.received
        assert received.head_end is not None
        length = received.header(b"content-length")
        if length is not None and length.strip().isdigit():
            return received.head_end + int(length)
        end = _chunked_end(received.raw, received.head_end)
        return end if end is not None else len(received.raw)


def _chunked_end(raw: bytes, start: int) -> int | None:
    pos = start
    while True:
        line_end = raw.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(raw[pos:line_end].split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            trailer_end = raw.find(b"\r\n\r\n", line_end)
            if raw[line_end : line_end + 4] == b"\r\n\r\n":
                return line_end + 4
            return trailer_end + 4 if trailer_end >= 0 else None
        pos = line_end + 2 + size + 2


async def fetch(port: int, case: Case, timeout_s: float = CASE_TIMEOUT_S) -> Received:
    """Send the case's request to ``port`` and read one response (or to EOF); then the
    second request, if the case has one and the first answer left the connection open."""
    received = Received()
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                pieces = case.request_pieces
                if case.pipelined and case.again is not None:
                    pieces = (*pieces, case.again)
                sender = asyncio.create_task(_send(writer, pieces))
                await _read(reader, received, case.method, b"")
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                    await sender
                if case.again is not None and received.complete and not _closing(received):
                    received.again = Received()
                    if not case.pipelined:
                        await _send(writer, [case.again])
                    rest = received.raw[received.body_end or len(received.raw) :]
                    await _read(reader, received.again, case.method, rest)
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()
    except TimeoutError:
        received.timed_out = True
    except (ConnectionError, OSError):
        received.eof = True  # reset by the peer: the connection ended
    return received


async def _read(
    reader: asyncio.StreamReader, received: Received, method: str, already: bytes
) -> None:
    parser = _ResponseParser(received, bodiless=method == "HEAD")
    if already:
        parser.feed(already)
    # After a parse error, read on to the end: who closes, and when, is compared.
    while not received.complete:
        data = await reader.read(65536)
        if not data:
            received.eof = True
            return
        parser.feed(data)


def _closing(received: Received) -> bool:
    value = received.header(b"connection") or b""
    return b"close" in value.lower()


async def _send(writer: asyncio.StreamWriter, pieces: Iterable[bytes]) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0)


# -- comparing -------------------------------------------------------------------------------


def end_to_end(received: Received, *, drop: Iterable[bytes] = ()) -> list[tuple[bytes, bytes]]:
    """The headers a proxy must pass on unchanged: hop-by-hop ones and those Connection
    names left out."""
    named = {
        token.strip().lower()
        for name, value in received.headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    skip = {h.encode() for h in HOP_BY_HOP} | named | set(drop)
    return [(k, v) for k, v in received.headers if k.lower() not in skip]


def compare(case: Case, direct: Received, proxied: Received, upstream_errors: int) -> list[str]:
    """Every way the proxied answer differs from what ``case.expect`` allows."""
    if proxied.timed_out:
        return [f"no answer or close through the proxy within {CASE_TIMEOUT_S:.0f} s (hang)"]
    problems: list[str] = []
    if upstream_errors:
        problems.append("the proxy forwarded a request the upstream could not parse")
    match case.expect:
        case Expect.SAME:
            problems += _same(direct, proxied, _asks_continue(case.request))
            if direct.again is not None or proxied.again is not None:
                if direct.again is None or proxied.again is None:
                    problems.append("only one side took the second request on its connection")
                else:
                    again = _same(direct.again, proxied.again, _asks_continue(case.again or b""))
                    problems += [f"second request: {p}" for p in again]
        case Expect.PREFIX:
            if proxied.status != direct.status:
                problems.append(
                    f"status {proxied.status} through the proxy, {direct.status} direct"
                )
            if not direct.body.startswith(proxied.body):
                problems.append("the body through the proxy is not a prefix of the direct one")
            if not proxied.eof:
                problems.append("broken framing did not end the client's connection")
        case Expect.GATEWAY_ERROR:
            if proxied.status != 502 or proxied.header(b"x-semhealth-error") is None:
                problems.append(f"expected the proxy's marked 502, got {proxied.status}")
        case Expect.REJECT_OR_RELAY:
            problems += _reject_or_relay(proxied)
    return problems


# What the relay leaves out of a request (RFC 9110 §7.6.1, and the framing it redoes), what it
# writes itself (Host: the upstream's authority; Transfer-Encoding for a chunked body), and the
# expectation it answers itself (Expect: 100-continue, as nginx and Envoy do).
_REQUEST_DROP = frozenset(
    {b"host", b"transfer-encoding", b"trailer", b"proxy-authorization", b"expect"}
    | {h.encode() for h in HOP_BY_HOP}
)


def _asks_continue(request: bytes) -> bool:
    head = request.split(b"\r\n\r\n", 1)[0].lower()
    return b"\r\nexpect: 100-continue" in head


def compare_requests(direct: list[SeenRequest], proxied: list[SeenRequest]) -> list[str]:
    """The upstream must get the client's request through the proxy as it gets it direct:
    method, target, end-to-end headers in order and case, and the body's bytes."""
    if not direct:
        return []
    if not proxied:
        return ["the request never reached the upstream through the proxy"]
    problems = []
    # A pooled connection found closed may be retried, so compare the last of each.
    for label, a, b in (("first", direct[0], proxied[0]), ("last", direct[-1], proxied[-1])):
        if (a.method, a.url) != (b.method, b.url):
            problems.append(
                f"{label} request line {b.method!r} {b.url!r}, direct {a.method!r} {a.url!r}"
            )
        if any(k.lower() == b"expect" for k, _ in b.headers):
            problems.append(f"{label} request: the proxy forwarded the Expect it answers itself")
        if _end_to_end_request(a) != _end_to_end_request(b):
            problems.append(
                f"{label} request headers {_end_to_end_request(b)!r}, direct {_end_to_end_request(a)!r}"
            )
        if a.body != b.body:
            problems.append(f"{label} request body {len(b.body)} bytes, direct {len(a.body)}")
    return sorted(set(problems))


def _end_to_end_request(seen: SeenRequest) -> list[tuple[bytes, bytes]]:
    named = {
        token.strip().lower()
        for name, value in seen.headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    return [(k, v) for k, v in seen.headers if k.lower() not in _REQUEST_DROP | named]


def _same(direct: Received, proxied: Received, asked_continue: bool = False) -> list[str]:
    """``asked_continue``: the request said Expect: 100-continue, which the proxy answers
    itself with a 100 ahead of the upstream's own interim answers (it may leave it out when
    the whole body is already in: RFC 9110 §10.1.1)."""
    if direct.timed_out:
        return ["the direct exchange hung: the case itself is wrong"]
    problems = []
    if proxied.status != direct.status:
        problems.append(f"status {proxied.status} through the proxy, {direct.status} direct")
    # The proxy may add Connection: close (it ends the client's connection after a
    # close-delimited or cut-off body).
    if end_to_end(proxied, drop=[b"connection"]) != end_to_end(direct):
        problems.append(
            f"end-to-end headers differ: {end_to_end(proxied)!r} vs {end_to_end(direct)!r}"
        )
    if proxied.body != direct.body:
        problems.append(
            f"body differs: {len(proxied.body)} bytes through the proxy, {len(direct.body)} direct"
            f" (first difference at byte {_first_difference(proxied.body, direct.body)})"
        )
    allowed = [direct.interim, [100, *direct.interim]] if asked_continue else [direct.interim]
    if proxied.interim not in allowed:
        problems.append(f"interim answers {proxied.interim} through the proxy, {direct.interim}")
    if proxied.complete != direct.complete:
        problems.append(f"complete {proxied.complete} through the proxy, {direct.complete} direct")
    return problems


def _reject_or_relay(proxied: Received) -> list[str]:
    if proxied.status is None:
        return [] if proxied.eof else ["hostile request neither answered nor closed"]
    if proxied.header(b"x-semhealth-error") is not None:
        return [] if 400 <= proxied.status < 600 else [f"marked error with {proxied.status}"]
    return []  # relayed: the upstream's answer, and the upstream parsed what it was sent


def _first_difference(a: bytes, b: bytes) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


# -- the sidecar -----------------------------------------------------------------------------


CONFIG = """\
relevance:
  enabled: false
alerts:
  enabled: false
upstream:
  timeouts:
    read_s: 30
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Sidecar:
    process: asyncio.subprocess.Process
    proxy_port: int
    admin_port: int
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    async def ready(self) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.admin_port)
        except OSError:
            return False
        try:
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()
        return answer.startswith(b"HTTP/1.1 200")


def _prepare(folder: str) -> tuple[str, str]:
    config = Path(folder) / "semhealth.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    return str(config), str(Path(folder) / "sidecar.log")


def _open_log(path: str) -> BinaryIO:
    return open(path, "wb")  # handed to the child, closed by the caller


@contextlib.asynccontextmanager
async def sidecar(upstream_port: int, folder: str, *extra: str) -> AsyncIterator[Sidecar]:
    """One ``semhealth run`` in front of the upstream, logging at debug level to a file."""
    config, log_path = _prepare(folder)
    proxy_port, admin_port = free_port(), free_port()
    log = _open_log(log_path)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "semhealth.agent.cli", "run", "--config", config,
            "--upstream", f"http://127.0.0.1:{upstream_port}",
            "--listen", f"127.0.0.1:{proxy_port}",
            "--admin-listen", f"127.0.0.1:{admin_port}",
            "--log-level", "debug", *extra,
            stdout=log, stderr=log, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
    finally:
        log.close()  # the child holds its own copy
    running = Sidecar(process, proxy_port, admin_port, log_path)
    try:
        deadline = time.monotonic() + 120
        while not await running.ready():
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"semhealth run did not get ready:\n{running.log()[-3000:]}")
            await asyncio.sleep(0.2)
        yield running
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


# -- running cases ---------------------------------------------------------------------------


@dataclass
class Failure:
    seed: int
    describe: str
    problems: list[str]

    def __str__(self) -> str:
        rerun = f"rerun: python bench/fuzz_proxy.py --seed {self.seed} --cases 1"
        shown = [p if len(p) <= 400 else p[:400] + "..." for p in self.problems]
        return f"{self.describe}\n  " + "\n  ".join(shown) + f"\n  {rerun}"


@dataclass
class Run:
    cases: int = 0
    failures: list[Failure] = field(default_factory=list)
    by_expect: dict[str, int] = field(default_factory=dict)
    # What the proxy answered each kind of request: "hostile:cl_and_te -> 400 marked", ...
    answers: dict[str, int] = field(default_factory=dict)
    log_bytes: int = 0


def answer_of(case: Case, proxied: Received) -> str:
    """How the proxy answered, in a word or two, for the run's tally."""
    kind = case.describe.split("request=", 1)[1].split(" ", 1)[0]
    if proxied.timed_out:
        how = "hang"
    elif proxied.status is None:
        how = "closed"
    else:
        marked = " marked" if proxied.header(b"x-semhealth-error") is not None else ""
        how = f"{proxied.status}{marked}"
    return f"{kind} -> {how}"


async def run_case(
    upstream: RawUpstream,
    running: Sidecar,
    seed: int,
    answers: dict[str, int] | None = None,
    *,
    timeout_s: float = CASE_TIMEOUT_S,
) -> Failure | None:
    case = make_case(seed)
    upstream.cases[case.token] = case
    try:
        direct = await fetch(upstream.ports["direct"], case, timeout_s)
        errors_before = len(upstream.stats["behind"].parse_errors)
        proxied = await fetch(running.proxy_port, case, timeout_s)
        # A parse error behind the proxy, for this case's token, is this case's.
        new = upstream.stats["behind"].parse_errors[errors_before:]
        mine = sum(1 for token in new if token in (case.token, "?"))
        problems = compare(case, direct, proxied, mine)
        if case.expect is not Expect.REJECT_OR_RELAY:
            problems += compare_requests(
                upstream.seen.pop(("direct", case.token), []),
                upstream.seen.pop(("behind", case.token), []),
            )
        if answers is not None and case.expect is Expect.REJECT_OR_RELAY:
            answer = answer_of(case, proxied)
            answers[answer] = answers.get(answer, 0) + 1
    finally:
        del upstream.cases[case.token]
        for listener in ("direct", "behind"):
            upstream.seen.pop((listener, case.token), None)
    return Failure(seed, case.describe, problems) if problems else None


async def run_seeds(
    seeds: Iterable[int], *, concurrency: int = 8, sidecar_args: tuple[str, ...] = ()
) -> Run:
    """Every seed's case through one sidecar; then its health and its logs are checked."""
    result = Run()
    upstream = RawUpstream()
    await upstream.start()
    gate = asyncio.Semaphore(concurrency)
    try:
        with tempfile.TemporaryDirectory() as folder:
            async with sidecar(upstream.ports["behind"], folder, *sidecar_args) as running:

                async def one(seed: int) -> None:
                    async with gate:
                        try:
                            failure = await run_case(upstream, running, seed, result.answers)
                        except Exception as exc:  # a broken case is reported, not fatal
                            failure = Failure(seed, f"seed={seed}", [f"harness error: {exc!r}"])
                    result.cases += 1
                    expect = make_case(seed).expect.value
                    result.by_expect[expect] = result.by_expect.get(expect, 0) + 1
                    if failure is not None:
                        result.failures.append(failure)

                await asyncio.gather(*(one(seed) for seed in seeds))
                await asyncio.sleep(1.0)  # analysis logs what it saw after the last case
                result.failures += _health(running, await running.ready())
                result.log_bytes = len(running.log())
    finally:
        await upstream.stop()
    result.failures.sort(key=lambda f: f.seed)
    return result


def _health(running: Sidecar, ready: bool) -> list[Failure]:
    failures = []
    if running.process.returncode is not None:
        failures.append(Failure(-1, "sidecar", [f"exited with {running.process.returncode}"]))
    elif not ready:
        failures.append(Failure(-1, "sidecar", ["/readyz is not 200 after the cases"]))
    log = running.log()
    for seed in sorted({int(s) for s in _CANARY.findall(log)}):
        failures.append(Failure(seed, f"seed={seed}", ["its canary text is in the sidecar's logs"]))
    if "Traceback" in log:
        at = log.index("Traceback")
        failures.append(
            Failure(-1, "sidecar", ["a traceback in the logs:\n" + log[at : at + 1500]])
        )
    return failures
