"""Two things every background part of the agent does with its asyncio tasks: finish them
within a shutdown deadline, and say when one dies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

OnFailure = Callable[[BaseException], None]


async def finish_within(tasks: Iterable[asyncio.Task[Any]], timeout_s: float) -> None:
    """Let ``tasks`` finish until the deadline, then cancel the rest and wait for them."""
    waiting = set(tasks)
    if not waiting:
        return
    _done, pending = await asyncio.wait(waiting, timeout=timeout_s)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def failure_reporter(
    on_failure: OnFailure | None, log: logging.Logger, what: str
) -> Callable[[asyncio.Task[Any]], None]:
    """A done-callback: a task that died is handed to ``on_failure`` (the Health helper),
    else logged by exception type, never by message (it may quote traffic)."""

    def done(task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        assert exc is not None
        if on_failure is not None:
            on_failure(exc)
        else:
            log.error("%s task %s died with %s", what, task.get_name(), type(exc).__name__)

    return done
