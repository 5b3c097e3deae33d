"""Fixtures for the alerts tests: a real Alertmanager paging a loopback webhook receiver, and
scripted loopback stand-ins for the failure modes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from tests.alerts.alertmanager_server import (
    AlertmanagerServer,
    ScriptedAlertmanager,
    ScriptedFactory,
    always,
)


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


@pytest.fixture
async def relayed(alertmanager: AlertmanagerServer) -> AsyncIterator[ScriptedAlertmanager]:
    """A recording stand-in in front of a real Alertmanager: every POST is kept (so tests see
    the requests as sent) and passed on, and Alertmanager's answer is the answer."""
    server = ScriptedAlertmanager(always(200), forward_to=alertmanager.url)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
