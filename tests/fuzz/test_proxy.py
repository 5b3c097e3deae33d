"""The proxy fuzzer in CI: a thousand seeded raw cases through one real ``semhealth run``.

Each case's bytes through the sidecar are compared with the same case going direct to a
raw-socket upstream (``proxy_harness``); no case may hang, the sidecar must stay up and
ready, and no canary may reach its logs. The deep profile runs 10,000 cases; so does
``nice -n 19 python bench/fuzz_proxy.py --cases 10000``. A failure names its seed:
``python bench/fuzz_proxy.py --seed N --cases 1`` reruns it alone.

``FUZZ_PROXY_SEED`` moves the first seed (the default, 0, keeps CI reproducible).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from hypothesis import settings

from tests.fuzz.budget import DEEP_EXAMPLES
from tests.fuzz.proxy_cases import Expect, Reply, make_case
from tests.fuzz.proxy_harness import (
    RawUpstream,
    Received,
    SeenRequest,
    Sidecar,
    compare,
    compare_requests,
    end_to_end,
    run_case,
    run_seeds,
)


def case_count() -> int:
    default = settings.default
    deep = default is not None and default.max_examples >= DEEP_EXAMPLES
    return 10_000 if deep else 1_000


async def test_a_thousand_raw_cases_through_semhealth_run_match_going_direct() -> None:
    first = int(os.environ.get("FUZZ_PROXY_SEED", "0"))
    result = await run_seeds(range(first, first + case_count()))
    assert result.cases == case_count()
    assert not result.failures, "\n".join(str(f) for f in result.failures)
    # Every kind of case was in the mix, so a pass means something.
    assert set(result.by_expect) == {e.value for e in Expect}
    # Hostile requests were answered by the proxy itself, marked, at least for the most part.
    marked = sum(n for answer, n in result.answers.items() if "marked" in answer)
    assert marked > sum(result.answers.values()) / 2


# -- the generator and the comparison, on their own --------------------------------------------


def test_a_case_is_a_pure_function_of_its_seed() -> None:
    assert make_case(4711) == make_case(4711)
    assert make_case(4711) != make_case(4712)


def test_the_generator_makes_every_kind_of_case() -> None:
    cases = [make_case(seed) for seed in range(2000)]
    kinds = {c.describe.split("request=")[1].split(" ")[0].split("+")[0] for c in cases}
    hostile = {k for k in kinds if k.startswith("hostile:")}
    assert len(hostile) == 16
    assert {"POST", "POST/chunked", "GET", "HEAD", "PUT/chunked/close"} <= kinds
    replies = [c.describe.split("reply=")[1].split(" ")[0] for c in cases]
    for framing in ("/length/", "/chunked/", "/close/", "/none/"):
        assert any(framing in r for r in replies)
    assert any(c.again is not None for c in cases)
    assert any(len(c.reply.pieces) > 5 for c in cases)
    assert any(sum(map(len, c.reply.pieces)) > 70_000 for c in cases)  # oversized lines
    # Every request body carries the canary (a chunked one may have it cut by chunk framing).
    plain = [c for c in cases if c.method in ("POST", "PUT") and b"chunked" not in c.request]
    assert all(
        c.canary.encode() in c.request for c in plain if c.expect is not Expect.REJECT_OR_RELAY
    )


def received(
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    *,
    complete: bool = False,
    eof: bool = False,
) -> Received:
    head = b"HTTP/1.1 %d X\r\n" % status + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    raw = head + b"\r\n" + body
    return Received(raw=raw, status=status, headers=headers, head_end=len(head) + 2,
                    body_end=len(raw), complete=complete, eof=eof)  # fmt: skip


CASE = make_case(1)
SAME = type(CASE)(**{**{f: getattr(CASE, f) for f in CASE.__slots__}, "expect": Expect.SAME})
DIRECT = received(200, [(b"Content-Type", b"text/event-stream"), (b"Connection", b"x-hop"),
                        (b"X-Hop", b"1"), (b"Keep-Alive", b"timeout=5")], b"data: a\n\n",
                  complete=True)  # fmt: skip


def test_hop_by_hop_headers_and_those_connection_names_are_not_compared() -> None:
    proxied = received(200, [(b"Content-Type", b"text/event-stream"), (b"Connection", b"close")],
                       b"data: a\n\n", complete=True)  # fmt: skip
    assert end_to_end(DIRECT) == [(b"Content-Type", b"text/event-stream")]
    assert compare(SAME, DIRECT, proxied, 0) == []


def test_the_comparison_finds_each_difference() -> None:
    headers = [(b"Content-Type", b"text/event-stream")]
    body = b"data: a\n\n"
    problems = {
        "status": received(201, headers, body, complete=True),
        "headers": received(200, [(b"content-type", b"text/event-stream")], body, complete=True),
        "body": received(200, headers, b"data: b\n\n", complete=True),
        "complete": received(200, headers, body, eof=True),
        "hang": Received(timed_out=True),
    }
    for what, proxied in problems.items():
        found = compare(SAME, DIRECT, proxied, 0)
        assert found, what
    assert compare(SAME, DIRECT, received(200, headers, body, complete=True), 1) == [
        "the proxy forwarded a request the upstream could not parse"
    ]


def test_gateway_and_prefix_expectations_are_checked() -> None:
    gateway = type(CASE)(**{**{f: getattr(CASE, f) for f in CASE.__slots__},
                            "expect": Expect.GATEWAY_ERROR})  # fmt: skip
    marked = received(502, [(b"X-Semhealth-Error", b"upstream_unreachable")], b"{}", complete=True)
    assert compare(gateway, Received(eof=True), marked, 0) == []
    assert compare(gateway, Received(eof=True), received(502, [], b"", complete=True), 0)
    prefix = type(CASE)(**{**{f: getattr(CASE, f) for f in CASE.__slots__},
                           "expect": Expect.PREFIX, "reply": Reply((b"",), True, "chunked")})  # fmt: skip
    direct = received(200, [], b"5\r\nhello\r\nzz\r\nmore", eof=True)
    assert compare(prefix, direct, received(200, [], b"5\r\nhello\r\n", eof=True), 0) == []
    assert compare(prefix, direct, received(200, [], b"5\r\nhellx", eof=True), 0)
    assert compare(prefix, direct, received(200, [], b"5\r\nhello\r\n"), 0)  # left open


# -- the harness catches a proxy that is wrong ------------------------------------------------


class FlippingRelay:
    """A TCP relay to the upstream that changes one byte of every answer past its 300th:
    the kind of bug the fuzzer exists to catch."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        tasks = [
            asyncio.create_task(_pipe(reader, up_writer, flip_at=None)),
            asyncio.create_task(_pipe(up_reader, writer, flip_at=300)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.close()
        up_writer.close()


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, flip_at: int | None
) -> None:
    seen = 0
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            if flip_at is not None and seen <= flip_at < seen + len(data):
                at = flip_at - seen
                data = data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]
            seen += len(data)
            writer.write(data)
            await writer.drain()


async def test_the_harness_catches_a_relay_that_changes_one_byte() -> None:
    upstream = RawUpstream()
    await upstream.start()
    relay = FlippingRelay(upstream.ports["behind"])
    port = await relay.start()
    stand_in = Sidecar(process=None, proxy_port=port, admin_port=0, log_path="")  # type: ignore[arg-type]
    try:
        seeds = [s for s in range(400) if make_case(s).expect is Expect.SAME][:25]
        failures = [await run_case(upstream, stand_in, seed, timeout_s=2) for seed in seeds]
    finally:
        await relay.stop()
        await upstream.stop()
    caught = [f for f in failures if f is not None]
    assert caught, "a relay that corrupts answers passed the fuzzer"
    assert all(f"--seed {f.seed} --cases 1" in str(f) for f in caught)
    assert any("body differs" in p or "headers differ" in p for f in caught for p in f.problems)


def test_the_request_comparison_allows_only_what_a_proxy_may_change() -> None:
    direct = SeenRequest(b"POST", b"/fuzz/c1/x", ((b"Host", b"a"), (b"Connection", b"x-hop"),
                         (b"X-Hop", b"1"), (b"X-Keep", b"v"), (b"Proxy-Authorization", b"k")),
                         b"body")  # fmt: skip
    fine = SeenRequest(b"POST", b"/fuzz/c1/x", ((b"Host", b"127.0.0.1:1"), (b"X-Keep", b"v")),
                       b"body")  # fmt: skip
    assert compare_requests([direct], [fine]) == []
    assert compare_requests([direct], [])
    for changed in (
        SeenRequest(b"GET", fine.url, fine.headers, fine.body),
        SeenRequest(fine.method, b"/fuzz/c1/y", fine.headers, fine.body),
        SeenRequest(fine.method, fine.url, ((b"x-keep", b"v"),), fine.body),
        SeenRequest(fine.method, fine.url, fine.headers, b"bod"),
    ):
        assert compare_requests([direct], [changed]), changed
