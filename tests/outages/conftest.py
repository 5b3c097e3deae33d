"""The scripted upstream every outage test sends its traffic to."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream
from tests.outages.harness import PIECES


class Upstream:
    """The scripted LLM on a fixed port, whose behaviour a test switches: ``ok``,
    ``slow_headers`` (holds the response head past the proxy's read timeout), ``slow_body``
    (a long pause mid-stream, within the timeout), or ``down`` (nothing listens)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self._server: SimulatedUpstream | None = None
        self.port = 0

    def _script(self, _request: ScriptRequest) -> Script:
        if self.mode == "slow_headers":
            return Script(status=503, ttft_s=2.0)
        if self.mode == "slow_body":
            return Script(pieces=PIECES, gaps_s=(0.0, 0.4, 0.0))
        return Script(pieces=PIECES)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def set(self, mode: str) -> None:
        self.mode = mode
        if mode == "down" and self._server is not None:
            server, self._server = self._server, None
            await server.shutdown()
        elif mode != "down" and self._server is None:
            self._server = SimulatedUpstream(self._script)
            await self._server.start(port=self.port)
            self.port = int(self._server.url.rsplit(":", 1)[1])

    async def close(self) -> None:
        await self.set("down")


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream()
    await server.set("ok")
    try:
        yield server
    finally:
        await server.close()
