"""Background work that dies is never silent: logged once, counted by task, and acted on.

The analysis plane runs long-lived tasks (the tap worker, alert evaluation, the encoders'
micro-batchers). One that ends with an exception would otherwise be found at shutdown, if
at all. ``Health`` hears of it: it logs the exception's type and stack (never its message,
which may quote prompt text), counts it in ``semhealth_background_failures_total{task}``,
and calls ``on_failure``: the analysis process stops so that ``semhealth run`` starts it
again whole; in one process, ``/readyz`` answers 503.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

from semhealth.agent.telemetry.observe import observe_by

log = logging.getLogger(__name__)


class Health:
    def __init__(self, on_failure: Callable[[str], None] | None = None) -> None:
        self.failures: dict[str, int] = {}
        self.on_failure = on_failure

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def reporter(self, task: str) -> Callable[[BaseException], None]:
        """For components that take an ``on_task_failure`` callback."""
        return partial(self.failure, task)

    def watch(self, task: asyncio.Task[None], name: str) -> None:
        """Hear of ``task`` ending with an exception (a cancel is a normal stop)."""
        task.add_done_callback(partial(self._done, name))

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failure(name, task.exception())  # type: ignore[arg-type]

    def failure(self, name: str, exc: BaseException) -> None:
        self.failures[name] = self.failures.get(name, 0) + 1
        stack = "".join(traceback.format_tb(exc.__traceback__))
        log.error(
            "background task %s died with %s (a bug in semhealth: please report):\n%s",
            name,
            type(exc).__name__,
            stack,
        )
        if self.on_failure is not None:
            self.on_failure(name)


def observe_health(meter: Any, health: Health) -> None:
    meter.create_observable_counter(
        "semhealth_background_failures",
        [observe_by("task", lambda: dict(health.failures))],
        description="Background tasks of the analysis plane that died (a bug: please "
        "report); the analysis process restarts, one process turns /readyz to 503.",
    )
