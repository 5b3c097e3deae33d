"""The remote-backend tests' shared pieces: the real model's vectors and a loopback server.

The model itself is the session's (``minilm`` in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.local import LocalBackend
from tests.embeddings.loopback import TEXTS, EmbeddingServer, Script, embedding_server


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
