"""Fixtures for end-to-end tests: real loopback servers, the real agent."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from semhealth.agent.analysis.agent import Agent
from semhealth.agent.config import load_config
from semhealth.agent.demo.simulator import RawScript, Script, ScriptRequest, SimulatedUpstream
from semhealth.collectors.record import StreamRecord


@dataclass
class Stack:
    upstream: SimulatedUpstream
    agent: Agent
    records: list[StreamRecord] = field(default_factory=list)

    async def wait_records(self, n: int, timeout_s: float = 5.0) -> list[StreamRecord]:
        """Analysis is asynchronous: wait until ``n`` records were produced."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(self.records) < n:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"expected {n} records, got {len(self.records)}")
            await asyncio.sleep(0.01)
        return self.records


ScriptFor = Callable[[ScriptRequest], Script | RawScript]


def agent_config(upstream_url: str, **settings: Any) -> Any:
    overrides: dict[str, object] = {
        "upstream.url": upstream_url,
        "listen.proxy": "127.0.0.1:0",
        "listen.admin": "127.0.0.1:0",
        "relevance.enabled": False,  # tests that score turn it on: loading models costs seconds
    }
    overrides.update(settings)
    return load_config(None, {}, overrides)


@asynccontextmanager
async def running_stack(script_for: ScriptFor, **settings: Any) -> AsyncIterator[Stack]:
    """A scripted upstream and an agent in front of it, on loopback."""
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    records: list[StreamRecord] = []
    from semhealth.agent.analysis.agent import Settings

    agent = Agent(agent_config(upstream.url, **settings), Settings(consumers=[records.append]))
    try:
        await agent.start()
        yield Stack(upstream, agent, records)
    finally:
        await agent.shutdown()
        await upstream.shutdown()


class ThreadedStack:
    """A stack on its own event loop in a thread, for synchronous (hypothesis) tests."""

    def __init__(self, script_for: ScriptFor, **settings: Any) -> None:
        self._script_for = script_for
        self._settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._cm: Any = None
        self.stack: Stack | None = None

    def __enter__(self) -> Stack:
        self._thread.start()
        self._cm = running_stack(self._script_for, **self._settings)
        self.stack = asyncio.run_coroutine_threadsafe(self._cm.__aenter__(), self._loop).result(10)
        return self.stack

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._cm.__aexit__(None, None, None), self._loop).result(
            20
        )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


@pytest.fixture
def threaded_stack() -> Iterator[Callable[..., ThreadedStack]]:
    yield ThreadedStack
