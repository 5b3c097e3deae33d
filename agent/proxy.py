"""The sidecar's reverse proxy: forwards every request to the one upstream, streams
the response back byte for byte, and gives the tap a copy of each chunk.

Order on the hot path, per chunk: read from upstream, note the arrival time,
write to the client (``await`` lets a slow client push back on the upstream
through TCP), then offer a copy to the tap (never blocks). Nothing is buffered
beyond aiohttp's own read/write watermarks.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from semhealth.agent.tap import Outcome, Tap, TapStream
from semhealth.collectors.collector import Exchange

log = logging.getLogger(__name__)

# RFC 9110 section 7.6.1 hop-by-hop headers, plus Host (the upstream's is set by
# the client library) and proxy-only headers. Headers named in Connection too.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_REQUEST_DROP = _HOP_BY_HOP | {"host", "expect"}


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamSettings:
    """What the proxy needs of the configured upstream."""

    url: str
    verify: bool = True
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0
    total_timeout_s: float | None = None
    max_request_bytes: int = 1 << 20


def end_to_end(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: frozenset[str]
) -> CIMultiDict[str]:
    """Headers without hop-by-hop ones and without any the Connection header names."""
    named = {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
        if token.strip()
    }
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower not in drop and lower not in named:
            out.add(name, value)
    return out


def build_ssl_context(settings: UpstreamSettings) -> ssl.SSLContext | bool:
    if not settings.url.startswith("https:"):
        return True  # aiohttp's default; unused for plain http
    if not settings.verify:
        return False
    context = ssl.create_default_context(cafile=settings.ca_file)
    if settings.client_cert:
        context.load_cert_chain(settings.client_cert, settings.client_key)
    return context


class _RequestCopy:
    """Streams the client's request body to the upstream, keeping a bounded copy for analysis."""

    def __init__(self, content: aiohttp.StreamReader, limit: int) -> None:
        self._content = content
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self.oversized = False

    async def stream(self) -> AsyncIterator[bytes]:
        async for chunk in self._content.iter_any():
            self._keep(chunk)
            yield chunk

    def _keep(self, chunk: bytes) -> None:
        if self.oversized:
            return
        self._size += len(chunk)
        if self._size > self._limit:
            self.oversized = True
            self._parts.clear()
        else:
            self._parts.append(chunk)

    def body(self) -> bytes | None:
        return None if self.oversized else b"".join(self._parts)


class Proxy:
    """The request handler of the proxy listener. ``start`` opens the upstream session."""

    def __init__(self, settings: UpstreamSettings, tap: Tap) -> None:
        self._settings = settings
        self._tap = tap
        self._base = URL(settings.url.rstrip("/"))
        self._session: aiohttp.ClientSession | None = None
        self.active_streams = 0

    async def start(self) -> None:
        if self._session is not None:
            return
        s = self._settings
        timeout = aiohttp.ClientTimeout(
            total=s.total_timeout_s,
            sock_connect=s.connect_timeout_s,
            sock_read=s.read_timeout_s,
        )
        connector = aiohttp.TCPConnector(limit=0, ssl=build_ssl_context(s))
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,  # the client gets the upstream's bytes, compressed or not
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def shutdown(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _target(self, request: web.BaseRequest) -> URL:
        # Only the path and query of the request are used: an absolute-form request
        # target cannot point the proxy at another host.
        rel = request.rel_url
        return self._base.with_path(
            self._base.raw_path.rstrip("/") + rel.raw_path, encoded=True
        ).with_query(rel.raw_query_string)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start_ns = time.monotonic_ns()
        session = self._session
        if session is None:
            return _error_response(503, "not_ready", "semhealth is starting or stopping")
        copy = _RequestCopy(request.content, self._settings.max_request_bytes)
        has_body = request.body_exists
        headers = end_to_end(request.headers, _REQUEST_DROP)
        self.active_streams += 1
        try:
            upstream = await session.request(
                request.method,
                self._target(request),
                headers=headers,
                data=copy.stream() if has_body else None,
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ServerTimeoutError):
            self.active_streams -= 1
            return _error_response(504, "upstream_timeout", "the upstream did not answer in time")
        except aiohttp.ClientError as exc:
            self.active_streams -= 1
            log.warning("upstream request failed: %s", type(exc).__name__)
            return _error_response(
                502, "upstream_unreachable", "semhealth could not reach the upstream"
            )
        except BaseException:
            self.active_streams -= 1
            raise
        try:
            return await self._relay(request, upstream, copy, start_ns)
        finally:
            self.active_streams -= 1
            upstream.release()

    async def _relay(
        self,
        request: web.BaseRequest,
        upstream: aiohttp.ClientResponse,
        copy: _RequestCopy,
        start_ns: int,
    ) -> web.StreamResponse:
        response_ns = time.monotonic_ns()
        body = copy.body()
        if copy.oversized:
            self._tap.stats.unanalysed("oversized")
        exchange = Exchange(
            method=request.method,
            path=request.rel_url.path,
            start_ns=start_ns,
            status=upstream.status,
            content_type=upstream.headers.get("Content-Type"),
            content_encoding=upstream.headers.get("Content-Encoding"),
            response_ns=response_ns,
            request_body=body,
            request_skip="oversized" if copy.oversized else None,
            ratelimit_source=upstream.headers.get("X-RateLimit-Source"),
        )
        stream = self._tap.open_stream(exchange)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(end_to_end(upstream.headers, _HOP_BY_HOP))
        outcome = Outcome(end_ns=0)
        try:
            await response.prepare(request)
            await _pump(upstream, response, stream, outcome)
            if not outcome.upstream_aborted:
                await response.write_eof()
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client goes away (handler_cancellation).
            outcome.client_aborted = True
            upstream.close()
            raise
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            outcome.client_aborted = True
            upstream.close()
        finally:
            outcome.end_ns = time.monotonic_ns()
            stream.close(outcome)
        if outcome.upstream_aborted and request.transport is not None:
            # End the client's connection the way the upstream ended ours: without
            # the terminating chunk, so the client sees the body is incomplete.
            request.transport.close()
        return response


async def _pump(
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    stream: TapStream,
    outcome: Outcome,
) -> None:
    """Relay the body. Upstream failures end the pump and are noted on ``outcome``."""
    reader = upstream.content
    while True:
        try:
            chunk = await reader.readany()
        except (TimeoutError, aiohttp.ServerTimeoutError):
            outcome.upstream_aborted = True
            outcome.error_type = "upstream_timeout"
            return
        except aiohttp.ClientError:
            outcome.upstream_aborted = True
            outcome.error_type = "upstream_aborted"
            return
        if not chunk:
            return
        t = time.monotonic_ns()
        await response.write(chunk)
        stream.offer(chunk, t)


def _error_response(status: int, kind: str, message: str) -> web.Response:
    """The proxy's own errors, marked so they are not mistaken for the upstream's."""
    body = orjson.dumps({"error": {"type": kind, "message": message, "source": "semhealth"}})
    return web.Response(
        status=status,
        body=body,
        content_type="application/json",
        headers={"X-Semhealth-Error": kind},
    )
