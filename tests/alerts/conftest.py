"""Fixtures for the alerts tests: a real Alertmanager paging a loopback webhook receiver, and
scripted loopback stand-ins for the failure modes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.alerts.alertmanager_server import (
    AlertmanagerServer,
    ScriptedAlertmanager,
    ScriptedFactory,
    WebhookReceiver,
)


@pytest.fixture
async def webhook() -> AsyncIterator[WebhookReceiver]:
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
    """A running Alertmanager that pages ``webhook``; tests may stop and start it again."""
    server = AlertmanagerServer(webhook.hook_url, tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedFactory]:
    """Builds started ``ScriptedAlertmanager(script, prefix)``s; all stop at the end."""
    servers: list[ScriptedAlertmanager] = []

    async def build(script: Callable[[int], int], prefix: str = "") -> ScriptedAlertmanager:
        server = ScriptedAlertmanager(script, prefix)
        await server.start()
        servers.append(server)
        return server

    try:
        yield build
    finally:
        for server in servers:
            await server.stop()
