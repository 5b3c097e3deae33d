"""The stream the recording benches share: one JSON-mode OpenAI chat exchange, analysed from
its bytes, and a per-call timer. One definition, so their figures compare."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import orjson

from semhealth.collectors.collector import StreamCollector
from semhealth.collectors.config import Config
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import StreamRecord

TOKENS = 54  # content deltas: with the usage chunk and [DONE], a 55-chunk stream
MODEL = "gpt-4o-mini"
# One configuration for every exchange, as the agent's tap has (building the default routes
# costs ~15 µs, which no stream pays in the agent).
CONFIG = Config()


def json_mode_request() -> bytes:
    return orjson.dumps(
        {
            "model": MODEL,
            "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {"type": "json_object"},
            "messages": [
                {"role": "system", "content": "You extract invoice fields as JSON. " * 20},
                {"role": "user", "content": "Extract the fields of invoice 4711."},
            ],
        }
    )


def json_mode_stream(tokens: int = TOKENS) -> list[bytes]:
    """SSE chunks of a JSON answer cut into ``tokens`` deltas, then usage and [DONE]."""
    answer = orjson.dumps({"invoice": 4711, "items": [f"item {i}" for i in range(20)]}).decode()
    assert tokens <= len(answer), f"the answer has {len(answer)} characters"
    cuts = [len(answer) * i // tokens for i in range(tokens + 1)]
    pieces = [answer[a:b] for a, b in itertools.pairwise(cuts)]
    chunks = []
    for piece in pieces:
        delta = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        event = {"id": "c", "object": "chat.completion.chunk", "model": MODEL, **delta}
        chunks.append(b"data: " + orjson.dumps(event) + b"\n\n")
    usage = {"prompt_tokens": 300, "completion_tokens": len(pieces), "total_tokens": 0}
    tail = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    chunks.append(b"data: " + orjson.dumps(tail) + b"\n\ndata: [DONE]\n\n")
    return chunks


def chat_exchange(body: bytes, *, start_ns: int = 0, ttft_ns: int = 1_000_000) -> Exchange:
    """A streamed chat completion's exchange as the proxy sees its response begin."""
    return Exchange(
        method="POST", path="/v1/chat/completions", start_ns=start_ns, status=200,
        content_type="text/event-stream", content_encoding=None,
        response_ns=start_ns + ttft_ns, request_body=body,
    )  # fmt: skip


def analyse(chunks: list[bytes], body: bytes) -> StreamRecord:
    """The record the agent's tap would build, with chunks 20 ms apart."""
    collector = StreamCollector(chat_exchange(body), CONFIG)
    t = 50_000_000
    for chunk in chunks:
        t += 20_000_000
        collector.feed(chunk, t)
    return collector.finish(t + 1_000_000)


def per_call_us(
    fn: Callable[[], object],
    seconds: float,
    batch: int = 50,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> list[float]:
    """µs per call, one figure per ``batch`` calls timed together (so the clock's own cost
    stays out of the figure), for ``seconds``. ``clock``: ``time.thread_time_ns`` gives CPU
    time, which other processes on a shared machine disturb less than wall time."""
    samples = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = clock()
        for _ in range(batch):
            fn()
        samples.append((clock() - began) / batch / 1000)
    return samples
