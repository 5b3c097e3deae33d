"""The proxy is transparent: bytes, status and headers reach the client as the upstream sent them."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import itertools
import os
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semhealth.agent.demo.simulator import RawScript, Script, ScriptRequest
from tests.agent.conftest import ThreadedStack, running_stack

_bodies: dict[str, RawScript] = {}
_keys = itertools.count()


def _raw_by_path(request: ScriptRequest) -> RawScript | Script:
    return _bodies[request.path.rsplit("/", 1)[-1]]


def _chunked(data: bytes, cuts: list[int]) -> tuple[bytes, ...]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return tuple(data[a:b] for a, b in itertools.pairwise(points) if b > a)


sse_events = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40), min_size=1, max_size=30
).map(lambda items: "".join(f"data: {orjson.dumps({'t': s}).decode()}\n\n" for s in items).encode())


@pytest.fixture(scope="module")
def raw_stack() -> Any:
    with ThreadedStack(_raw_by_path) as stack:
        yield stack


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.one_of(st.binary(max_size=50_000), sse_events),
    cuts=st.lists(st.integers(min_value=0, max_value=60_000), max_size=30),
    content_type=st.sampled_from(
        ["application/octet-stream", "text/event-stream", "application/json"]
    ),
)
def test_random_bodies_arrive_byte_for_byte(
    raw_stack: Any, body: bytes, cuts: list[int], content_type: str
) -> None:
    key = str(next(_keys))
    _bodies[key] = RawScript(chunks=_chunked(body, cuts), content_type=content_type)
    host, port = raw_stack.agent.proxy_address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("POST", f"/v1/raw/{key}", body=b"{}", headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    received = response.read()
    conn.close()
    assert response.status == 200
    assert response.getheader("Content-Type", "").startswith(content_type)
    assert received == body


async def test_request_body_reaches_upstream_unchanged() -> None:
    payload = os.urandom(300_000)
    async with running_stack(lambda r: RawScript(chunks=(b"ok",))) as stack:
        async with aiohttp.ClientSession() as client:
            async with client.post(
                stack.agent.proxy_url + "/v1/upload?x=1&y=%2F", data=payload
            ) as r:
                assert await r.read() == b"ok"
        received = stack.upstream.received[-1]
        assert received.body == payload
        assert received.path == "/v1/upload"


async def test_429_passes_through_with_its_headers() -> None:
    script = RawScript(
        chunks=(b'{"error":{"type":"rate_limit_exceeded"}}',),
        status=429,
        content_type="application/json",
        headers={"X-RateLimit-Source": "upstream", "Retry-After": "7", "X-Custom": "kept"},
    )
    async with running_stack(lambda r: script) as stack:
        async with aiohttp.ClientSession() as client:
            async with client.post(stack.agent.proxy_url + "/v1/chat/completions", json={}) as r:
                assert r.status == 429
                assert r.headers["X-RateLimit-Source"] == "upstream"
                assert r.headers["Retry-After"] == "7"
                assert r.headers["X-Custom"] == "kept"
                assert await r.read() == script.chunks[0]
        (record,) = await stack.wait_records(1)
        assert record.status == 429
        assert record.error_type == "429"
        assert record.ratelimit_source == "upstream"


async def test_hop_by_hop_headers_are_not_forwarded() -> None:
    script = RawScript(chunks=(b"x",), headers={"X-Hop": "1", "Connection": "X-Hop", "X-End": "2"})
    async with running_stack(lambda r: script) as stack:
        async with aiohttp.ClientSession() as client:
            headers = {
                "Connection": "X-Private",
                "X-Private": "secret",
                "X-App": "a",
                "Keep-Alive": "5",
            }
            async with client.get(stack.agent.proxy_url + "/v1/models", headers=headers) as r:
                await r.read()
                assert "X-Hop" not in r.headers
                assert r.headers["X-End"] == "2"
        sent = stack.upstream.received[-1].headers
        assert "X-Private" not in sent
        assert "Keep-Alive" not in sent
        assert sent["X-App"] == "a"


async def test_absolute_form_target_cannot_redirect_the_proxy() -> None:
    async with running_stack(lambda r: RawScript(chunks=(b"from upstream",))) as stack:
        host, port = stack.agent.proxy_address
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"GET http://203.0.113.9:81/steal?q=1 HTTP/1.1\r\nHost: 203.0.113.9\r\n"
            b"Connection: close\r\n\r\n"
        )
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 200")
        assert reply.endswith(b"from upstream")
        assert stack.upstream.received[-1].path == "/steal"


async def test_unreachable_upstream_gives_502_with_a_json_error() -> None:
    with _closed_port() as port:
        from semhealth.agent.analysis.agent import Agent
        from tests.agent.conftest import agent_config

        agent = Agent(agent_config(f"http://127.0.0.1:{port}"))
        await agent.start()
        try:
            async with aiohttp.ClientSession() as client:
                async with client.post(agent.proxy_url + "/v1/chat/completions", json={}) as r:
                    assert r.status == 502
                    assert r.headers["X-Semhealth-Error"] == "upstream_unreachable"
                    body = await r.json()
                    assert body["error"]["type"] == "upstream_unreachable"
        finally:
            await agent.shutdown()


class _closed_port:
    """A loopback port with nothing listening on it."""

    def __enter__(self) -> int:
        import socket

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        sock.close()
        return self.port

    def __exit__(self, *exc: object) -> None:
        return None


async def _hanging_upstream(delay_s: float) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(delay_s)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def test_upstream_that_does_not_answer_gives_504() -> None:
    from semhealth.agent.analysis.agent import Agent
    from tests.agent.conftest import agent_config

    runner, url = await _hanging_upstream(30)
    agent = Agent(agent_config(url, **{"upstream.timeouts.read_s": 0.3}))
    await agent.start()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(agent.proxy_url + "/v1/models") as r:
                assert r.status == 504
                assert (await r.json())["error"]["type"] == "upstream_timeout"
    finally:
        await agent.shutdown()
        await runner.cleanup()


async def test_upstream_dying_mid_stream_breaks_the_client_stream_too() -> None:
    chunks = tuple(f'data: {{"i": {i}}}\n\n'.encode() for i in range(10))
    script = RawScript(chunks=chunks, gaps_s=0.01, content_type="text/event-stream", die_after=4)
    async with running_stack(lambda r: script) as stack:
        received = b""
        async with aiohttp.ClientSession() as client:
            async with client.post(stack.agent.proxy_url + "/v1/chat/completions", json={}) as r:
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for chunk in r.content.iter_any():
                        received += chunk
        assert received == b"".join(chunks[:4])
        (record,) = await stack.wait_records(1)
        assert record.upstream_aborted
        assert not record.client_aborted


async def test_client_disconnect_cancels_the_upstream_request() -> None:
    chunks = tuple(f'data: {{"i": {i}}}\n\n'.encode() for i in range(200))
    script = RawScript(chunks=chunks, gaps_s=0.02, content_type="text/event-stream")
    async with running_stack(lambda r: script) as stack:
        async with aiohttp.ClientSession() as client:
            r = await client.post(stack.agent.proxy_url + "/v1/chat/completions", json={})
            await r.content.readany()
            r.close()  # drop the connection mid-stream
        (record,) = await stack.wait_records(1)
        assert record.client_aborted
        assert record.duration_s < 2.0  # far sooner than the 4 s the full stream takes
        await asyncio.sleep(0.1)
        assert stack.upstream.open_responses == 0


async def test_oversized_request_body_is_forwarded_but_not_analysed() -> None:
    payload = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]})
    async with running_stack(
        lambda r: RawScript(chunks=(b"{}",), content_type="application/json"),
        **{"limits.max_request_bytes": 1000},
    ) as stack:
        async with aiohttp.ClientSession() as client:
            async with client.post(
                stack.agent.proxy_url + "/v1/chat/completions", data=payload
            ) as r:
                assert r.status == 200
        assert stack.upstream.received[-1].body == payload
        (record,) = await stack.wait_records(1)
        assert not record.request.analysed
        assert record.request.skip_reason == "oversized"
        assert stack.agent.tap.stats.requests_unanalysed == {"oversized": 1}


@pytest.mark.parametrize(
    ("content_chars", "prompt_class"),
    [(5000, "long_context"), (2000, "short")],  # about 1,260 and 510 tokens by size
)
async def test_an_oversized_request_is_classed_by_its_size(
    content_chars: int, prompt_class: str
) -> None:
    payload = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x" * content_chars}]}
    )
    async with running_stack(
        lambda r: RawScript(chunks=(b"{}",), content_type="application/json"),
        **{"limits.max_request_bytes": 1000, "analysis.long_context_tokens": 1000},
    ) as stack:
        async with aiohttp.ClientSession() as client:
            async with client.post(
                stack.agent.proxy_url + "/v1/chat/completions", data=payload
            ) as r:
                assert r.status == 200
        (record,) = await stack.wait_records(1)
        assert record.request.skip_reason == "oversized"
        assert record.prompt_class == prompt_class


async def test_full_tap_queue_sheds_analysis_not_bytes() -> None:
    chunks = tuple(f'data: {{"i": {i}}}\n\n'.encode() for i in range(400))
    script = RawScript(chunks=chunks, content_type="text/event-stream")
    async with running_stack(lambda r: script, **{"limits.tap_queue_size": 1}) as stack:
        bodies = []
        async with aiohttp.ClientSession() as client:

            async def fetch() -> bytes:
                async with client.post(
                    stack.agent.proxy_url + "/v1/chat/completions", json={}
                ) as r:
                    return await r.read()

            bodies = await asyncio.gather(*(fetch() for _ in range(8)))
        assert all(body == b"".join(chunks) for body in bodies)
        records = await stack.wait_records(8)
        assert stack.agent.tap.stats.chunks_dropped > 0
        assert any(record.shed for record in records)


async def test_gzip_response_is_relayed_compressed_and_analysed_decompressed() -> None:
    sse = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
    compressed = gzip.compress(sse)
    script = RawScript(
        chunks=(compressed[:10], compressed[10:]),
        content_type="text/event-stream",
        headers={"Content-Encoding": "gzip"},
    )
    async with running_stack(lambda r: script) as stack:
        async with aiohttp.ClientSession(auto_decompress=False) as client:
            async with client.post(stack.agent.proxy_url + "/v1/chat/completions", json={}) as r:
                assert r.headers["Content-Encoding"] == "gzip"
                assert await r.read() == compressed
        (record,) = await stack.wait_records(1)
        assert record.output_text == "hi"
        assert record.done


async def test_slow_client_pushes_back_on_the_upstream() -> None:
    """Memory stays bounded: the upstream can only get ahead of a slow client by the socket buffers."""
    written = 0
    block = os.urandom(64 * 1024)

    async def firehose(request: web.Request) -> web.StreamResponse:
        nonlocal written
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(2048):  # 128 MiB if nothing pushed back
            await response.write(block)
            written += len(block)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", firehose)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    from semhealth.agent.analysis.agent import Agent
    from tests.agent.conftest import agent_config

    agent = Agent(agent_config(f"http://127.0.0.1:{runner.addresses[0][1]}"))
    await agent.start()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(agent.proxy_url + "/v1/big") as r:
                received = 0
                for _ in range(20):  # read 20 small pieces slowly
                    received += len(await r.content.read(4096))
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)  # give a buffering proxy time to run away
                ahead = written - received
                # Kernel socket buffers on two loopback hops (autotuned up to several MiB
                # each) plus aiohttp's 64 KiB watermarks; a buffering proxy would take all 128 MiB.
                assert ahead < 40 * 1024 * 1024, f"upstream got {ahead} bytes ahead"
                assert written < 2048 * len(block)
    finally:
        await agent.shutdown()
        await runner.cleanup()
