# ruff: noqa: RUF001 -- the Chinese texts carry full-width punctuation on purpose.
"""Real embedding servers on loopback, backed by the real local model, that misbehave on cue.

``EmbeddingServer`` serves an OpenAI-compatible ``POST /v1/embeddings`` and a TEI-style
``POST /embed`` + ``GET /info`` with aiohttp; a ``Script`` says how it answers the next
requests (a status, a delay, a row too few, rows scaled, in reverse order, a raw body) and
records what arrived. ``relevance_cases`` and ``assert_same_scores`` compare a remote
backend's relevance scores with the local backend's.
"""

from __future__ import annotations

import asyncio
import importlib.resources
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from semhealth.embeddings.backend import Embedder
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.relevance import RelevanceScorer

# Texts every remote test embeds: English, Chinese, a long one, punctuation.
TEXTS = [
    "How do I reset my password if I can't log in?",
    "Click 'Forgot password' on the login page and follow the link we email you.",
    "如何重置我的密码？",
    "点击登录页面上的“忘记密码”，然后按照邮件中的链接操作。",
    "The river's ecology changed after the dam was built. " * 4,
    "GPU drivers: 550.54 / CUDA 12.4 -- ok!",
]
SHORT = TEXTS[:3]  # for tests about the answer's shape rather than its values


@dataclass
class Script:
    """How the server answers, and what it was sent. Tests change it between calls."""

    status: int = 200
    delay_s: float = 0.0  # held this long (or until released) before answering
    drop_rows: int = 0  # rows left off the end of the answer
    scale: float = 1.0  # rows multiplied by this: a server that does not normalise
    reverse: bool = False  # OpenAI rows in reverse order (each keeps its index)
    raw_body: bytes | None = None  # answer this instead of rows
    info: dict[str, Any] | None = None  # GET /info's answer; None: 404
    bodies: list[Any] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)


class EmbeddingServer:
    def __init__(self, model: LocalBackend, script: Script) -> None:
        self.model = model
        self.script = script
        app = web.Application()
        app.router.add_post("/v1/embeddings", self._openai)
        app.router.add_post("/embed", self._tei)
        app.router.add_get("/info", self._info)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def base_url(self) -> str:
        return str(self.server.make_url("/"))

    async def _answer_rows(self, request: web.Request, texts: list[str]) -> np.ndarray | None:
        script = self.script
        if script.delay_s:
            try:
                async with asyncio.timeout(script.delay_s):
                    await script.release.wait()
            except TimeoutError:
                pass
        if script.status != 200 or script.raw_body is not None:
            return None
        vectors = await self.model.embed(texts)
        return vectors[: len(vectors) - script.drop_rows] * np.float32(script.scale)

    def _refusal(self, texts: list[str]) -> web.Response:
        if self.script.raw_body is not None:
            return web.Response(body=self.script.raw_body, content_type="application/json")
        # Real servers echo inputs in their errors; the client must never pass them on.
        return web.Response(status=self.script.status, text=f"refused inputs: {texts}")

    def _record(self, request: web.Request, body: Any) -> None:
        self.script.bodies.append(body)
        self.script.headers.append(dict(request.headers))

    async def _openai(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self._record(request, body)
        rows = await self._answer_rows(request, body["input"])
        if rows is None:
            return self._refusal(body["input"])
        data = [
            {"object": "embedding", "index": index, "embedding": row.tolist()}
            for index, row in enumerate(rows)
        ]
        if self.script.reverse:
            data.reverse()
        answer = {"object": "list", "data": data, "model": body["model"], "usage": {}}
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def _tei(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self._record(request, body)
        rows = await self._answer_rows(request, body["inputs"])
        if rows is None:
            return self._refusal(body["inputs"])
        answer = [row.tolist() for row in rows]
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def _info(self, request: web.Request) -> web.Response:
        if self.script.info is None:
            raise web.HTTPNotFound()
        return web.Response(body=orjson.dumps(self.script.info), content_type="application/json")


@asynccontextmanager
async def embedding_server(model: LocalBackend, script: Script) -> AsyncIterator[EmbeddingServer]:
    server = EmbeddingServer(model, script)
    await server.server.start_server()
    try:
        yield server
    finally:
        script.release.set()  # a held answer must not hold up the server's close
        await server.server.close()


@dataclass(frozen=True)
class Case:
    query: str
    chunks: tuple[str, ...]
    answer: str


def relevance_cases(count: int = 2) -> list[Case]:
    """The first ``count`` queries of the shipped labelled pairs, English and Chinese, with
    all their contexts as chunks and the relevant one as the answer."""
    path = importlib.resources.files("semhealth.embeddings") / "data" / "relevance_pairs.jsonl"
    by_query: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = orjson.loads(line)
        by_query.setdefault(record["query"], []).append(record)
    queries = list(by_query)
    chinese = [query for query in queries if by_query[query][0]["lang"] == "zh"]
    chosen = queries[: count // 2] + chinese[: count - count // 2]
    return [
        Case(
            query,
            tuple(record["context"] for record in by_query[query]),
            next(r["context"] for r in by_query[query] if r["label"] == 1),
        )
        for query in chosen
    ]


async def assert_same_scores(remote: Embedder, local: Embedder, cases: Sequence[Case]) -> None:
    remote_scorer, local_scorer = RelevanceScorer(remote), RelevanceScorer(local)
    for case in cases:
        got = await remote_scorer.score(case.query, case.chunks, case.answer)
        want = await local_scorer.score(case.query, case.chunks, case.answer)
        assert got.context is not None and want.context is not None
        assert got.answer is not None and want.answer is not None
        assert abs(got.context - want.context) < 1e-5
        assert abs(got.answer - want.answer) < 1e-5
