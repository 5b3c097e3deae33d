"""One lifecycle for the agent's parts, and the runner that starts and stops them together.

A part starts quickly (``start`` returns once it serves; the tasks it launches are its own)
and stops by a deadline (``shutdown(deadline)``: a ``time.monotonic()`` instant, the same
for every part). The runner starts the parts in the order they were added, downstream
first (what consumes before what produces), and stops them in the reverse order, upstream
first, so that each part's last output still has somewhere to go. If a part fails to
start, the ones already started are stopped before the failure is raised. Shutdown is safe
without start and safe twice; it stops every part whatever the others did and reports every
failure together, as one ``ExceptionGroup``, the way OpenTelemetry's
``MeterProvider.shutdown`` does.

No part divides the deadline by hand: each gets the one deadline, less a small reserve for
every part still to stop after it, so a part that waits for in-flight work (a proxy
draining its exchanges) can never leave the ones after it no time at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

# Kept back from the deadline for each part that stops later: enough to flush a queue or
# close a socket, small against the agent's default shutdown timeout of 10 s.
RESERVE_S = 0.2


class Component(Protocol):
    async def start(self) -> None: ...

    async def shutdown(self, deadline: float) -> None:
        """Stop intake, finish or drop what is in flight, release everything, by
        ``deadline`` (``time.monotonic()``)."""


@dataclass(frozen=True, slots=True)
class Part:
    """A part whose lifecycle is two callables: for parts built before this protocol, or
    ones whose stop is a call into a thread."""

    start_part: Callable[[], Awaitable[None]] | None
    stop_part: Callable[[float], Awaitable[None]]

    async def start(self) -> None:
        if self.start_part is not None:
            await self.start_part()

    async def shutdown(self, deadline: float) -> None:
        await self.stop_part(deadline)


def seconds_left(deadline: float, least: float = 0.1) -> float:
    """The time to ``deadline``, never less than ``least``: a part that is late still gets a
    moment to close what it holds."""
    return max(deadline - time.monotonic(), least)


class Components:
    """The agent's parts, started in order and stopped in reverse, on one deadline."""

    def __init__(self) -> None:
        self._parts: list[tuple[str, Component]] = []
        self._started: list[tuple[str, Component]] = []

    def add(self, name: str, part: Component) -> None:
        """Add ``part``; parts start in the order they are added."""
        self._parts.append((name, part))

    async def start(self, timeout_s: float) -> None:
        """Start every part in order. If one fails, stop those started (within
        ``timeout_s``) and raise its error."""
        try:
            for name, part in self._parts:
                await part.start()
                self._started.append((name, part))
        except BaseException:
            await self.shutdown(timeout_s)
            raise

    async def shutdown(self, timeout_s: float) -> None:
        """Stop the started parts in reverse order, each by the one deadline less the
        reserve of those after it; raise every failure together."""
        deadline = time.monotonic() + timeout_s
        started, self._started = self._started, []
        errors: list[Exception] = []
        for after, (name, part) in enumerate(reversed(started)):
            later = len(started) - after - 1
            own = deadline - RESERVE_S * later
            try:
                await asyncio.wait_for(part.shutdown(own), seconds_left(own))
            except Exception as exc:
                log.error("shutdown of %s failed: %r", name, exc)
                errors.append(exc)
        if errors:
            raise ExceptionGroup("semhealth shutdown had failures", errors)
