"""Signal truth under load: with 200 streams at once through `semhealth run` (both planes),
the continuity index and TTFT it exports match what really happened.

The upstream is scripted: TTFT 50 ms, gaps alternating 10 and 30 ms, so each stream's
continuity index is 10 ms. It notes when each request reached its handler and when it
handed each event to the kernel; those moments, not the script, are the truth, since a
loaded machine delays the script itself. Arrival times are taken in the forwarding
process, so a busy analysis process cannot bend them.

- Continuity: within 1 ms of the upstream's own.
- TTFT: the sidecar's clock starts when it has the request head and stops when the first
  token reaches it, so its figure lies between the upstream's own TTFT (which excludes the
  trip of the request and of the first token) and the client's (which includes both).

A tolerance on what the product measures is correctness, not speed.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time

import aiohttp
import orjson
from aiohttp import web

from tests.agent.test_planes import Sidecar, sidecar

STREAMS = 200
TOKENS = 64
TTFT_S = 0.05
GAPS_S = (0.010, 0.030)
TOLERANCE_S = 0.001
RAMP_S = 0.002  # starts spread over 0.4 s: each stream overlaps the others for most of its 1.3 s


def _event(text: str) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "truth",
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}  # fmt: skip
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class TruthfulUpstream:
    """Streams the script and keeps, per stream, when the request came and each event left."""

    def __init__(self) -> None:
        self.truth: list[tuple[int, list[int]]] = []  # (request received, event send times)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic_ns()
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        sent: list[int] = []
        await asyncio.sleep(TTFT_S)
        for i in range(TOKENS):
            if i:
                await asyncio.sleep(GAPS_S[i % 2])
            sent.append(time.monotonic_ns())
            await response.write(_event(f"t{i} "))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self.truth.append((received, sent))
        return response


async def _recorded(running: Sidecar, streams: int) -> dict[str, float]:
    """The sidecar's metrics once ``streams`` streams have been recorded."""
    for _ in range(100):
        metrics = await running.metrics()
        if metrics.get("semantic_health_stream_continuity_index_seconds_count", 0) >= streams:
            return metrics
        await asyncio.sleep(0.1)
    raise AssertionError(f"fewer than {streams} streams were recorded")


def _continuity_s(times: list[int]) -> float:
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    return statistics.pstdev(gaps)


async def _round(client: aiohttp.ClientSession, proxy: str) -> list[float]:
    """200 overlapping streams; the TTFT each client saw, in seconds."""
    body = {"model": "truth", "stream": True, "messages": [{"role": "user", "content": "go"}]}

    async def one(index: int) -> float:
        await asyncio.sleep(index * RAMP_S)
        sent = time.monotonic_ns()
        first: int | None = None
        async with client.post(proxy + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            async for chunk in r.content.iter_any():
                if first is None and b'"content":"t0 "' in chunk:
                    first = time.monotonic_ns()
        assert first is not None
        return (first - sent) / 1e9

    return await asyncio.gather(*(one(i) for i in range(STREAMS)))


async def test_exported_continuity_and_ttft_match_the_truth_under_200_streams() -> None:
    upstream = TruthfulUpstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with sidecar(f"http://127.0.0.1:{runner.addresses[0][1]}") as running:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
                # A first round opens the sidecar's upstream connections, as a sidecar in
                # service has them open; the second is the one measured.
                await _round(client, running.proxy)
                warm = await _recorded(running, STREAMS)
                upstream.truth.clear()
                client_ttfts = await _round(client, running.proxy)
                done = await _recorded(running, 2 * STREAMS)
    finally:
        await runner.cleanup()
    metrics = {name: done[name] - warm.get(name, 0.0) for name in done}

    assert metrics.get("semhealth_dropped_total", 0) == 0  # nothing shed at 200 x 50 tokens/s
    assert len(upstream.truth) == STREAMS
    true_continuity = statistics.fmean(_continuity_s(sent) for _, sent in upstream.truth)
    upstream_ttft = statistics.fmean((sent[0] - came) / 1e9 for came, sent in upstream.truth)
    client_ttft = statistics.fmean(client_ttfts)
    continuity = (
        metrics["semantic_health_stream_continuity_index_seconds_sum"]
        / metrics["semantic_health_stream_continuity_index_seconds_count"]
    )
    ttft = (
        metrics["gen_ai_server_time_to_first_token_seconds_sum"]
        / metrics["gen_ai_server_time_to_first_token_seconds_count"]
    )
    report = (
        f"continuity {continuity * 1e3:.3f} ms (upstream {true_continuity * 1e3:.3f}, script "
        f"10.000); TTFT {ttft * 1e3:.3f} ms (upstream {upstream_ttft * 1e3:.3f}, client "
        f"{client_ttft * 1e3:.3f}, script 50)"
    )
    print(report)
    assert abs(continuity - true_continuity) <= TOLERANCE_S, report
    assert upstream_ttft - TOLERANCE_S <= ttft <= client_ttft + TOLERANCE_S, report
