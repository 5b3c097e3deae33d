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

from semhealth.agent.child import run_child, serve_until_stopped
from semhealth.agent.cli import overrides, reload_rules, setup_logging
from semhealth.agent.config import load_config


async def serve(own: argparse.Namespace, run: argparse.Namespace) -> int:
    from semhealth.agent.app import Agent, Settings

    config = load_config(run.config, os.environ, overrides(run))
    setup_logging(config.log.level)
    agent = Agent(config, Settings(tap_socket=own.tap_socket, admin_socket=own.admin_socket))
    reloads: set[asyncio.Task[None]] = set()

    def hangup() -> None:
        task = asyncio.create_task(reload_rules(agent, run))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    return await serve_until_stopped(agent, own.parent, hangup if run.config else None)


def main(argv: Sequence[str] | None = None) -> int:
    return run_child("semhealth analysis", serve, argv)
