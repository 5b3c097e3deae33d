"""Seeded cases for the proxy fuzzer: raw upstream responses and raw client requests.

``make_case(seed)`` is a pure function of the seed, so any failure reruns exactly with
``python bench/fuzz_proxy.py --seed N --cases 1``. A case is:

- a raw HTTP/1.1 request, valid (POST with a Content-Length or chunked body, GET, HEAD,
  keep-alive or ``Connection: close``, split anywhere across writes) or hostile (a broken
  request line, a header without a colon, Content-Length and Transfer-Encoding together,
  a bad chunk size, a head over 64 KiB, NUL and bare CR in headers, CONNECT, an HTTP/2
  preface, an absolute-form target naming another host);
- the raw response the upstream writes to it: status, headers in any case with hop-by-hop
  ones mixed in, a body framed by Content-Length, chunked (with extensions and trailers)
  or the connection's close, holding SSE, NDJSON, JSON or binary with any line ending,
  invalid UTF-8 and lines up to hundreds of KiB; written in pieces split anywhere; maybe
  cut off at any byte (head included), or with broken chunked framing;
- what the client must see through the proxy compared with going direct (``Expect``).

Every body holds the case's canary; it must never appear in the agent's logs.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from enum import Enum

import orjson

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "proxy-authenticate"}
)


class Expect(Enum):
    """How the client's bytes through the proxy compare with going direct."""

    SAME = "same"  # status, end-to-end headers and body bytes equal; both ended alike
    PREFIX = "prefix"  # broken framing: the proxy relays bytes up to the fault, then closes
    GATEWAY_ERROR = "gateway_error"  # no whole head came: the proxy's own marked 502
    REJECT_OR_RELAY = "reject_or_relay"  # hostile request: a marked 4xx, a close, or relayed


@dataclass(frozen=True, slots=True)
class Reply:
    """What the raw upstream writes for one request, piece by piece."""

    pieces: tuple[bytes, ...]
    close: bool  # close the connection after the last piece
    framing: str  # length | chunked | close | none


@dataclass(frozen=True, slots=True)
class Case:
    seed: int
    token: str  # in the request path; the upstream finds the reply by it
    method: str
    request_pieces: tuple[bytes, ...]  # the client's writes
    again: bytes | None  # a second request on the same connection once the first is answered
    pipelined: bool  # the second request goes out with the first, not after its answer
    reply: Reply
    expect: Expect
    canary: str
    describe: str  # one line for a failure report: what was generated

    @property
    def request(self) -> bytes:
        return b"".join(self.request_pieces)


def canary_of(seed: int) -> str:
    return f"CANARY{seed}Z"


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    token = f"c{seed}"
    canary = canary_of(seed)
    hostile = rng.random() < 0.15
    if hostile:
        method, request, kind = _hostile_request(rng, token, canary)
    else:
        method, request, kind = _valid_request(rng, token, canary)
    reply, damage, notes = _reply(rng, method, canary)
    if hostile:
        expect = Expect.REJECT_OR_RELAY
    elif damage == "head":
        expect = Expect.GATEWAY_ERROR
    elif damage == "framing":
        expect = Expect.PREFIX
    else:
        expect = Expect.SAME
    pieces = _split(rng, request, max_pieces=4)
    # Keep-alive: the same request again on the connection, when both ends keep it open.
    again, pipelined = None, False
    keep = b"connection: close" not in request.lower() and not reply.close
    if expect is Expect.SAME and keep and rng.random() < 0.4:
        again = request
        pipelined = rng.random() < 0.3
        kind += "+pipelined" if pipelined else "+again"
    describe = f"seed={seed} request={kind} reply={notes} expect={expect.value}"
    return Case(seed, token, method, pieces, again, pipelined, reply, expect, canary, describe)


# -- requests --------------------------------------------------------------------------------


def _path(rng: random.Random, token: str) -> str:
    tail = rng.choice(["/v1/chat/completions", "/v1/messages", "/api/chat", "/generate", "/x"])
    query = rng.choice(["", "?a=1", "?stream=true&b=%20"])
    return f"/fuzz/{token}{tail}{query}"


def _valid_request(rng: random.Random, token: str, canary: str) -> tuple[str, bytes, str]:
    method = rng.choice(["POST", "POST", "POST", "GET", "HEAD", "PUT"])
    body = b""
    if method in ("POST", "PUT"):
        prompt = canary + " " + rng.choice(["hi", "é中😀", "x" * rng.randrange(0, 3000)])
        body = orjson.dumps({"model": "m", "stream": True,
                             "messages": [{"role": "user", "content": prompt}]})  # fmt: skip
    headers = [("Host", "upstream.test"), ("User-Agent", "fuzz/1"), ("X-Case", token)]
    if rng.random() < 0.3:
        headers.append(("Authorization", f"Bearer {canary}"))
    close = rng.random() < 0.5
    if close:
        headers.append(("Connection", "close"))
    if body and rng.random() < 0.2:
        headers.append(("Expect", "100-continue"))  # sent with its body at once, as some do
    if rng.random() < 0.2:
        headers += [("X-Empty", ""), ("X-Tab", "a\tb"), ("X-Latin", "caf\xe9")]
    chunked = bool(body) and rng.random() < 0.3
    if chunked:
        headers.append(("Transfer-Encoding", "chunked"))
        trailer = f"X-Request-Trailer: {canary}" if rng.random() < 0.3 else None
        encoded = _chunked(rng, body, trailer=trailer)
    else:
        if body or method in ("POST", "PUT"):
            headers.append(("Content-Length", str(len(body))))
        encoded = body
    version = "HTTP/1.1"
    head = f"{method} {_path(rng, token)} {version}\r\n"
    head += "".join(f"{_case(rng, k)}: {v}\r\n" for k, v in headers) + "\r\n"
    kind = f"{method}{'/chunked' if chunked else ''}{'/close' if close else ''}"
    return method, head.encode("latin-1") + encoded, kind


def _hostile_request(rng: random.Random, token: str, canary: str) -> tuple[str, bytes, str]:
    path = _path(rng, token)
    body = f'{{"prompt":"{canary}"}}'.encode()
    cl = f"Content-Length: {len(body)}\r\n"
    kinds = {
        "bad_request_line": f"POST  {path}  HTTP/1.1 extra\r\nHost: a\r\n{cl}\r\n".encode() + body,
        "no_colon": f"POST {path} HTTP/1.1\r\nHost a\r\nX-{canary}\r\n{cl}\r\n".encode() + body,
        "cl_and_te": (
            f"POST {path} HTTP/1.1\r\nHost: a\r\n{cl}Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        + body,
        "two_cl": f"POST {path} HTTP/1.1\r\nHost: a\r\n{cl}Content-Length: 3\r\n\r\n".encode()
        + body,
        "bad_chunk": f"POST {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        f"zz\r\n{canary}\r\n0\r\n\r\n".encode(),
        "negative_cl": f"POST {path} HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n".encode(),
        "huge_head": f"GET {path} HTTP/1.1\r\nHost: a\r\nX-Big: {'b' * 70_000}\r\n\r\n".encode(),
        "nul_header": f"GET {path} HTTP/1.1\r\nHost: a\r\nX-N: a\x00{canary}\r\n\r\n".encode(),
        "bare_cr": f"GET {path} HTTP/1.1\r\nHost: a\rX-Q: {canary}\r\n\r\n".encode(),
        "obs_fold": f"GET {path} HTTP/1.1\r\nHost: a\r\nX-F: a\r\n {canary}\r\n\r\n".encode(),
        "connect": b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
        "h2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "absolute_form": f"GET http://evil.example{path} HTTP/1.1\r\nHost: evil.example\r\n"
        f"Connection: close\r\n\r\n".encode(),
        "garbage": bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))),
        "http10": f"GET {path} HTTP/1.0\r\nHost: a\r\n\r\n".encode(),
        "lf_only": f"GET {path} HTTP/1.1\nHost: a\nConnection: close\n\n".encode(),
    }
    kind = rng.choice(sorted(kinds))
    method = kinds[kind].split(b" ", 1)[0].decode("latin-1")
    return method, kinds[kind], f"hostile:{kind}"


# -- replies ---------------------------------------------------------------------------------


def _reply(rng: random.Random, method: str, canary: str) -> tuple[Reply, str, str]:
    """The reply, the damage done to it (none | abort | head | framing), and a description."""
    status = rng.choice([200] * 8 + [201, 404, 429, 500, 503, 204, 304])
    bodiless = method == "HEAD" or status in (204, 304)
    content_type, body = _body(rng, canary)
    framing = "none" if bodiless else rng.choice(["length", "chunked", "close"])
    headers: list[tuple[str, str]] = [("Content-Type", content_type), ("X-Req", canary[:6])]
    if rng.random() < 0.3:
        headers.append(("Keep-Alive", "timeout=5"))
        headers.append(("Connection", "keep-alive, X-Hop"))
        headers.append(("X-Hop", "drop me"))
    if rng.random() < 0.2:
        headers.append(("Proxy-Authenticate", "Basic"))
    if rng.random() < 0.3:
        headers.append(("Set-Cookie", "a=b; Path=/"))
        headers.append(("set-cookie", "c=d"))
    if rng.random() < 0.2:  # header fidelity: odd but valid values, many and long ones
        headers += [("X-Empty", ""), ("X-Latin", "caf\xe9"), ("X-Long", "v" * 8000)]
        headers += [(f"X-N{i}", str(i)) for i in range(rng.randrange(1, 100))]
    encoded = b""
    if framing == "length":
        headers.append(("Content-Length", str(len(body))))
        encoded = body
    elif framing == "chunked":
        headers.append(("Transfer-Encoding", "chunked"))
        encoded = _chunked(rng, body, trailer="X-Checksum: 1" if rng.random() < 0.3 else None)
    elif framing == "close":
        encoded = body
    elif method == "HEAD" and status not in (204, 304):
        headers.append(("Content-Length", str(len(body))))  # what a GET would have had
    # A server that says close, closes; one that closes says so (or frames by the close).
    said_close = framing == "close" or rng.random() < 0.1
    if said_close:
        headers.append(("Connection", "close"))
    reason = rng.choice(["OK", "Whatever", ""])
    head = f"HTTP/1.1 {status} {reason}\r\n"
    head += "".join(f"{_case(rng, k)}: {v}\r\n" for k, v in headers) + "\r\n"
    if rng.random() < 0.1:  # interim answers before the final one
        head = rng.choice(_INTERIM) + head
    raw = head.encode("latin-1") + encoded
    damage = "none"
    close = said_close
    roll = rng.random()
    if roll < 0.08:
        # Cut off anywhere, mostly in the body; inside the head, no whole head ever comes.
        # Strictly before the end: a whole reply and then a close is no abort, but a server
        # closing a kept-alive connection, a race no proxy can win for a request it must not
        # send twice.
        in_body = len(raw) > len(head) and rng.random() < 0.7
        at = rng.randrange(len(head) if in_body else 0, len(raw))
        damage = "head" if at < len(head) else "abort"
        raw, close = raw[:at], True
    elif roll < 0.12 and framing == "chunked":
        bad = rng.choice([b"zz\r\n", b"-1\r\n", b"1;\x00\r\n", b"ffffffffffffffffff\r\n"])
        # The first chunk's size line is broken: nothing after the head can be framed.
        raw, close, damage = head.encode("latin-1") + bad + encoded, True, "framing"
    elif roll < 0.14:
        raw, close, damage = b"HTTP/1.1 2OO Broken\r\n\r\n" + encoded, True, "head"
    notes = f"{status}/{framing}/{content_type.split(';')[0]}/{len(body)}B/{damage}"
    return Reply(_split(rng, raw, max_pieces=12), close, framing), damage, notes


def _body(rng: random.Random, canary: str) -> tuple[str, bytes]:
    kind = rng.choice(["sse", "sse", "ndjson", "json", "binary"])
    ending = rng.choice([b"\n", b"\r\n", b"\r"]) if kind == "sse" else b"\n"
    texts = [rng.choice(["Hel", "lo", " é", "中文", "😀", canary, "\\n", '"q"'])
             for _ in range(rng.randrange(0, 12))]  # fmt: skip
    if rng.random() < 0.05:
        texts.append("y" * rng.randrange(70_000, 300_000))  # an oversized line
    if kind == "sse":
        events = [b"data: " + orjson.dumps({"choices": [{"delta": {"content": t}}]}) for t in texts]
        events.append(b"data: [DONE]")
        body = b"".join(e + ending + ending for e in events)
        return "text/event-stream", _spoil(rng, body)
    if kind == "ndjson":
        lines = [orjson.dumps({"message": {"content": t}, "done": False}) for t in texts]
        return "application/x-ndjson", _spoil(rng, b"".join(line + b"\n" for line in lines))
    if kind == "json":
        choice = {"message": {"content": "".join(texts)}}
        return "application/json", orjson.dumps({"choices": [choice]})
    raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400)))
    return "application/octet-stream", raw + canary.encode()


def _spoil(rng: random.Random, body: bytes) -> bytes:
    """Invalid UTF-8 or stray line endings, sometimes."""
    if body and rng.random() < 0.2:
        at = rng.randrange(len(body))
        body = body[:at] + rng.choice([b"\xff", b"\xe4\xb8", b"\r", b"\n\n", b"\x00"]) + body[at:]
    return body


# -- shared helpers -------------------------------------------------------------------------


_INTERIM = (
    "HTTP/1.1 100 Continue\r\n\r\n",
    "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n",
)


def _chunked(rng: random.Random, body: bytes, *, trailer: str | None) -> bytes:
    out = []
    pos = 0
    while pos < len(body):
        size = rng.randrange(1, max(2, min(len(body) - pos, 5000) + 1))
        ext = rng.choice([b"", b"", b";ext=1", b';a=b;c="d"'])
        out.append(b"%x%s\r\n%s\r\n" % (size, ext, body[pos : pos + size]))
        pos += size
    tail = f"{trailer}\r\n".encode() if trailer else b""
    return b"".join(out) + b"0\r\n" + tail + b"\r\n"


def _split(rng: random.Random, raw: bytes, *, max_pieces: int) -> tuple[bytes, ...]:
    if not raw:
        return (b"",)
    points = sorted({rng.randrange(1, len(raw) + 1) for _ in range(rng.randrange(0, max_pieces))})
    bounds = [0, *points, len(raw)]
    return tuple(raw[a:b] for a, b in itertools.pairwise(bounds) if b > a)


def _case(rng: random.Random, name: str) -> str:
    """Header names in any case: they are case-insensitive, and the proxy keeps them as sent."""
    return rng.choice([name, name.lower(), name.upper()])
