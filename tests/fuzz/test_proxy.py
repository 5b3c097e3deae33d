"""The proxy fuzzer in CI: a thousand seeded raw cases through one real ``semhealth run``.

Each case's bytes through the sidecar are compared with the same case going direct to a
raw-socket upstream (``proxy_harness``); no case may hang, the sidecar must stay up and
ready, and no canary may reach its logs. The deep profile runs 10,000 cases; so does
``nice -n 19 python bench/fuzz_proxy.py --cases 10000``. A failure names its seed:
``python bench/fuzz_proxy.py --seed N --cases 1`` reruns it alone.

``FUZZ_PROXY_SEED`` moves the first seed (the default, 0, keeps CI reproducible).
"""

from __future__ import annotations

import os

from hypothesis import settings

from tests.fuzz.budget import DEEP_EXAMPLES
from tests.fuzz.proxy_cases import Expect, Reply, make_case
from tests.fuzz.proxy_harness import Received, compare, end_to_end, run_seeds


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
