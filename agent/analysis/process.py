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
import sys
from collections.abc import Sequence

from semhealth.agent.cli import (
    build_parser,
    overrides,
    reload_rules,
    run_async,
    setup_logging,
    stop_on_signals,
)
from semhealth.agent.config import ConfigError, load_config
from semhealth.agent.dataplane.forwarder import watch_parent
from semhealth.agent.errors import SemhealthError


def child_parser(prog: str) -> argparse.ArgumentParser:
    """A child's own flags; after ``--`` come the ``semhealth run`` arguments."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--tap-socket", required=True)
    parser.add_argument("--admin-socket")
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("run_args", nargs=argparse.REMAINDER)
    return parser


def parse_child_args(
    prog: str, argv: Sequence[str]
) -> tuple[argparse.Namespace, argparse.Namespace]:
    own = child_parser(prog).parse_args(argv)
    rest = list(own.run_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    return own, build_parser().parse_args(["run", *rest])


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

    stop = stop_on_signals(hangup if run.config else None)
    await agent.start()
    try:
        await watch_parent(stop, own.parent)
    finally:
        await agent.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parent = os.getppid()  # before anything slow: the supervisor may die while we load
    own, run = parse_child_args("semhealth-analysis", sys.argv[1:] if argv is None else argv)
    own.parent = parent
    try:
        return run_async(serve(own, run))
    except ConfigError as exc:
        print(f"semhealth analysis: configuration is not valid:\n{exc}", file=sys.stderr)
        return 2
    except SemhealthError as exc:
        print(f"semhealth analysis: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
