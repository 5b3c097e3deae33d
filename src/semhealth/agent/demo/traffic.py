# ruff: noqa: RUF001 -- the prompts are Chinese as well as English: full-width punctuation
# there is meant.
"""Demo traffic: a client that sends a realistic mix of LLM requests to a base URL.

``semhealth demo`` points it at the proxy, which forwards to the simulated upstream, so a
newcomer sees every signal move. The mix of request kinds and its rates come from the same
``DemoProfile`` that drives the simulated upstream. Each request carries a query and a
context (system prompt, instructions or attached documents) built from the simulator's
corpus: the context is about the query's topic with probability ``related_context_rate``
and about other topics otherwise, which the context-relevance score should tell apart.

Every response is read to its end (the proxy measures the whole stream) and each request
ends in exactly one of: ``ok`` (2xx, body complete), ``http_errors`` (answered non-2xx),
``failed`` (connection or timeout error, also mid-body) or ``cancelled`` (cut by shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import aiohttp
import orjson

from semhealth.agent.demo.simulator import CORPUS, CorpusEntry, DemoProfile

logger = logging.getLogger(__name__)

_ANTHROPIC_VERSION = "2023-06-01"

_SYSTEM = {
    "en": "You are a helpful assistant. Answer using only these documents:\n\n",
    "zh": "你是一个乐于助人的助手。请只根据以下资料回答：\n\n",
}

_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "confidence": {"type": "number"},
        "topic": {"type": "string"},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}

_SEARCH_TOOL: dict[str, Any] = {
    "name": "search_knowledge_base",
    "description": "Search the knowledge base for passages about a question.",
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "top_k": {"type": "integer"},
            "language": {"type": "string", "enum": ["en", "zh"]},
        },
        "required": ["query", "top_k"],
    },
}


def _mix(profile: DemoProfile) -> tuple[tuple[str, float], ...]:
    return (
        ("chat_stream", profile.mix_chat_stream),
        ("chat_json", profile.mix_chat_json),
        ("chat_tool", profile.mix_chat_tool),
        ("responses", profile.mix_responses),
        ("anthropic", profile.mix_anthropic),
    )


@dataclass(frozen=True, slots=True)
class TrafficStats:
    """Counts so far. ``sent == ok + http_errors + failed + cancelled + in_flight``."""

    sent: int = 0
    ok: int = 0
    http_errors: int = 0
    failed: int = 0
    cancelled: int = 0
    by_status: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def in_flight(self) -> int:
        return self.sent - self.ok - self.http_errors - self.failed - self.cancelled


@dataclass(frozen=True, slots=True)
class DemoRequest:
    """One request to send: where, with which headers, and its JSON body."""

    kind: str
    path: str
    headers: Mapping[str, str]
    body: dict[str, Any]


# --------------------------------------------------------------------------- request mix


def build_request(profile: DemoProfile, rng: random.Random) -> DemoRequest:
    """A random request of the profile's mix, with a query and a fitting or unrelated context."""
    kinds = _mix(profile)
    kind = rng.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]
    lang = "zh" if rng.random() < profile.chinese_rate else "en"
    entry = rng.choice([e for e in CORPUS if e.lang == lang])
    related = rng.random() < profile.related_context_rate
    documents = _context_documents(entry, related, rng)
    builders: dict[str, Callable[[], DemoRequest]] = {
        "chat_stream": lambda: _chat_stream(profile, entry, documents),
        "chat_json": lambda: _chat_json(profile, entry, documents, rng),
        "chat_tool": lambda: _chat_tool(profile, entry, documents),
        "responses": lambda: _responses(profile, entry, documents, rng),
        "anthropic": lambda: _anthropic(profile, entry, documents),
    }
    return builders[kind]()


def _context_documents(entry: CorpusEntry, related: bool, rng: random.Random) -> list[str]:
    """The query's own document plus a distractor, or only documents about other topics."""
    others = [e.document for e in CORPUS if e.topic != entry.topic]
    if related:
        return [entry.document, rng.choice(others)]
    return rng.sample(others, k=2)


def _system_prompt(entry: CorpusEntry, documents: list[str]) -> str:
    return _SYSTEM[entry.lang] + "\n\n".join(documents)


def _openai_headers() -> dict[str, str]:
    return {"Authorization": "Bearer demo", "Content-Type": "application/json"}


def _chat_messages(entry: CorpusEntry, documents: list[str]) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": _system_prompt(entry, documents)},
        {"role": "user", "content": entry.question},
    ]


def _chat_stream(profile: DemoProfile, entry: CorpusEntry, documents: list[str]) -> DemoRequest:
    body = {
        "model": profile.openai_model,
        "messages": _chat_messages(entry, documents),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return DemoRequest("chat_stream", "/v1/chat/completions", _openai_headers(), body)


def _chat_json(
    profile: DemoProfile, entry: CorpusEntry, documents: list[str], rng: random.Random
) -> DemoRequest:
    schema_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": _ANSWER_SCHEMA, "strict": True},
    }
    use_schema = rng.random() < 0.5
    body: dict[str, Any] = {
        "model": profile.openai_model,
        "messages": _chat_messages(entry, documents),
        "response_format": schema_format if use_schema else {"type": "json_object"},
        "stream": rng.random() < profile.stream_rate,
    }
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    return DemoRequest("chat_json", "/v1/chat/completions", _openai_headers(), body)


def _chat_tool(profile: DemoProfile, entry: CorpusEntry, documents: list[str]) -> DemoRequest:
    body = {
        "model": profile.openai_model,
        "messages": _chat_messages(entry, documents),
        "tools": [{"type": "function", "function": _SEARCH_TOOL}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return DemoRequest("chat_tool", "/v1/chat/completions", _openai_headers(), body)


def _responses(
    profile: DemoProfile, entry: CorpusEntry, documents: list[str], rng: random.Random
) -> DemoRequest:
    body: dict[str, Any] = {
        "model": profile.openai_model,
        "instructions": _system_prompt(entry, documents),
        "input": [{"role": "user", "content": [{"type": "input_text", "text": entry.question}]}],
        "stream": rng.random() < profile.stream_rate,
    }
    if rng.random() < 0.25:
        body["text"] = {
            "format": {"type": "json_schema", "name": "answer", "schema": _ANSWER_SCHEMA}
        }
    return DemoRequest("responses", "/v1/responses", _openai_headers(), body)


def _anthropic(profile: DemoProfile, entry: CorpusEntry, documents: list[str]) -> DemoRequest:
    attached = [
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": document},
            "title": f"document {i}",
        }
        for i, document in enumerate(documents, start=1)
    ]
    body = {
        "model": profile.anthropic_model,
        "max_tokens": 1024,
        "system": _SYSTEM[entry.lang].strip(),
        "messages": [
            {"role": "user", "content": [*attached, {"type": "text", "text": entry.question}]}
        ],
        "stream": True,
    }
    headers = {
        "x-api-key": "demo",
        "anthropic-version": _ANTHROPIC_VERSION,
        "Content-Type": "application/json",
    }
    return DemoRequest("anthropic", "/v1/messages", headers, body)


# --------------------------------------------------------------------------- generator


class TrafficGenerator:
    """Sends ``build_request`` traffic to ``base_url`` at up to ``rate_per_s`` requests a
    second, at most ``concurrency`` at a time, until shutdown or ``max_requests`` sent."""

    def __init__(
        self,
        base_url: str,
        profile: DemoProfile,
        rng: random.Random,
        concurrency: int = 4,
        rate_per_s: float = 2.0,
        *,
        max_requests: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        self._base_url = base_url.rstrip("/")
        self._profile = profile
        self._rng = rng
        self._concurrency = concurrency
        self._interval_s = 1.0 / rate_per_s
        self._max_requests = max_requests
        self._session: aiohttp.ClientSession | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._requests: set[asyncio.Task[_Outcome]] = set()
        self._counts: Counter[str] = Counter()
        self._by_status: Counter[int] = Counter()
        self._finished = asyncio.Event()

    @property
    def stats(self) -> TrafficStats:
        c = self._counts
        return TrafficStats(
            sent=c["sent"],
            ok=c["ok"],
            http_errors=c["http_errors"],
            failed=c["failed"],
            cancelled=c["cancelled"],
            by_status=MappingProxyType(dict(self._by_status)),
        )

    async def start(self) -> None:
        if self._dispatcher is not None:
            raise RuntimeError("TrafficGenerator is already started")
        timeout = aiohttp.ClientTimeout(total=self._profile.request_timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout)
        dispatch = self._dispatch(self._session)
        self._dispatcher = asyncio.create_task(dispatch, name="semhealth-demo-traffic")
        self._dispatcher.add_done_callback(self._on_dispatcher_done)

    async def wait(self) -> None:
        """Return once ``max_requests`` have been sent and answered (or the generator stopped)."""
        await self._finished.wait()

    async def shutdown(self, deadline_s: float = 5.0) -> None:
        """Stop sending, let requests in flight finish until the deadline, cancel the rest."""
        dispatcher, self._dispatcher = self._dispatcher, None
        if dispatcher is not None and not dispatcher.done():
            dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
        if self._requests:
            _, pending = await asyncio.wait(set(self._requests), timeout=deadline_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        self._finished.set()

    async def _dispatch(self, session: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self._concurrency)
        next_at = loop.time()
        while self._max_requests is None or self._counts["sent"] < self._max_requests:
            await slots.acquire()
            # Pace to the rate, but never burst to catch up after the slots were full.
            next_at = max(next_at, loop.time())
            await asyncio.sleep(next_at - loop.time())
            next_at += self._interval_s
            request = build_request(self._profile, self._rng)
            self._counts["sent"] += 1
            task = asyncio.create_task(_send(session, self._base_url, request))
            self._requests.add(task)
            task.add_done_callback(self._record)
            task.add_done_callback(lambda _: slots.release())
        if self._requests:
            await asyncio.wait(set(self._requests))
        self._finished.set()

    def _on_dispatcher_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("demo traffic stopped", exc_info=task.exception())
            self._finished.set()

    def _record(self, task: asyncio.Task[_Outcome]) -> None:
        """Count a finished request once, however it ended (even cancelled before it ran)."""
        self._requests.discard(task)
        if task.cancelled():
            self._counts["cancelled"] += 1
            return
        if task.exception() is not None:
            logger.error("demo request crashed", exc_info=task.exception())
            self._counts["failed"] += 1
            return
        status, outcome = task.result()
        if status is not None:
            self._by_status[status] += 1
        self._counts[outcome] += 1


_Outcome = tuple[
    int | None, str
]  # (HTTP status if a head arrived, "ok" | "http_errors" | "failed")


async def _send(session: aiohttp.ClientSession, base_url: str, request: DemoRequest) -> _Outcome:
    status: int | None = None
    try:
        data = orjson.dumps(request.body)
        async with session.post(base_url + request.path, data=data, headers=request.headers) as r:
            status = r.status
            async for _ in r.content.iter_any():
                pass  # read to the end: the proxy measures the whole stream
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        logger.debug("demo request failed: %s", type(exc).__name__)
        return status, "failed"
    return status, "ok" if 200 <= status < 300 else "http_errors"
