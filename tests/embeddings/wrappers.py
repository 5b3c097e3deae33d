"""Backends wrapped around the real model, to watch and to hold back what the batcher sends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from semhealth.embeddings.backend import Backend, Vectors


class Recording:
    """Passes every call to the real backend and remembers the texts of each call."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        return None


class Gated(Recording):
    """Holds every call until ``release()``: a backend as slow as a test needs it to be."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    def release(self) -> None:
        self.gate.set()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        self.entered.set()
        await self.gate.wait()
        return await self.inner.embed(texts)


class Failing(Recording):
    """Raises ``error`` on the first ``times`` calls (all of them when None), then embeds."""

    def __init__(self, inner: Backend, error: BaseException, times: int | None = None) -> None:
        super().__init__(inner)
        self.error = error
        self.times = times

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        if self.times is None or len(self.calls) <= self.times:
            raise self.error
        return await self.inner.embed(texts)


class WrongShape(Recording):
    """Returns one row fewer than it was given texts."""

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.calls.append(list(texts))
        vectors = await self.inner.embed(texts)
        return np.ascontiguousarray(vectors[:-1])
