"""Fixtures for the alerts tests: a real Alertmanager paging a loopback webhook receiver, and
scripted loopback stand-ins for the failure modes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from tests.alerts.alertmanager_server import (
    ScriptedAlertmanager,
    ScriptedFactory,
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
