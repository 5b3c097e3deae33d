"""The analysis process: ``python -m semhealth.agent.analysis``, started and supervised by
``semhealth run``.

It builds everything that is not forwarding (the tap and collectors, the recorder and
telemetry, relevance, alerting, the admin app) from the same ``run`` arguments and
environment as its parent, reads the forwarders' tap wires on ``--tap-socket`` and serves
the admin app on ``--admin-socket`` for the forwarder's admin front.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence

from semhealth.agent.config import load_config
from semhealth.agent.runtime import (
    RunArgs,
    reload_rules,
    run_child,
    serve_until_stopped,
    setup_logging,
    stop_on_signals,
)

BACKGROUND_FAILURE_EXIT = 3  # a background task died; the supervisor restarts the process


# Forwarding and analysis share the pod's CPUs; when both want one, the kernel gives it to
# forwarding (nice 0). Analysis then falls behind and sheds, counted, instead of delaying a
# token: the design's rule, enforced by the scheduler rather than hoped for.
ANALYSIS_NICENESS = 10


async def serve(own: argparse.Namespace, run: RunArgs) -> int:
    from semhealth.agent.analysis.agent import Agent, Settings

    os.nice(ANALYSIS_NICENESS)
    config = load_config(run.config, os.environ, dict(run.overrides))
    setup_logging(config.log.level, config.log.format)
    reloads: set[asyncio.Task[None]] = set()
    failed: list[str] = []

    def hangup() -> None:
        task = asyncio.create_task(reload_rules(agent, run))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    stop = stop_on_signals(hangup if run.config else None)

    def background_failure(task: str) -> None:
        # Half an analysis plane is worse than a restart: stop, and be started again whole.
        failed.append(task)
        stop.set()

    settings = Settings(
        tap_socket=own.tap_socket,
        admin_socket=own.admin_socket,
        on_background_failure=background_failure,
        record=run.record,
    )
    agent = Agent(config, settings)
    await serve_until_stopped(agent, own.parent, stop)
    return BACKGROUND_FAILURE_EXIT if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_child("semhealth analysis", serve, argv)
