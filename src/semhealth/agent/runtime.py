"""What every process ``semhealth run`` starts has in common: its own flags before ``--``,
the ``run`` arguments after it, and serving until a signal or its supervisor's end."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from semhealth.agent.cli import build_parser, resolve_config_file, run_async, stop_on_signals
from semhealth.agent.config import ConfigError
from semhealth.agent.errors import SemhealthError

log = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5

Serve = Callable[[argparse.Namespace, argparse.Namespace], Coroutine[Any, Any, int]]


class Part(Protocol):
    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...


def child_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--tap-socket", required=True)
    parser.add_argument("--admin-socket")
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("run_args", nargs=argparse.REMAINDER)
    return parser


def parse_child_args(
    prog: str, argv: Sequence[str]
) -> tuple[argparse.Namespace, argparse.Namespace]:
    """(this child's flags, the ``semhealth run`` arguments it was started with)."""
    own = child_parser(prog).parse_args(argv)
    rest = list(own.run_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    run = build_parser().parse_args(["run", *rest])
    resolve_config_file(run)
    return own, run


async def watch_parent(stop: asyncio.Event, parent: int) -> None:
    """A child whose supervisor (``parent``, read when the child started) is gone stops
    too: it would be reparented, not killed."""
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("the supervising process is gone: stopping")
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), _PARENT_POLL_S)


async def serve_until_stopped(part: Part, parent: int, stop: asyncio.Event | None = None) -> int:
    """Start ``part``, serve until ``stop`` (by default SIGTERM/SIGINT; make it with
    ``stop_on_signals`` first, so a stop while the part starts is a clean stop) or the
    supervisor's end, then shut it down."""
    stop = stop or stop_on_signals()
    await part.start()
    try:
        await watch_parent(stop, parent)
    finally:
        await part.shutdown()
    return 0


def run_child(prog: str, serve: Serve, argv: Sequence[str] | None = None) -> int:
    """A child's ``main``: its exit code, with start-up failures said plainly. ``own.parent``
    is the supervisor's pid, read first: it may die while this child loads."""
    parent = os.getppid()
    own, run = parse_child_args(prog, sys.argv[1:] if argv is None else argv)
    own.parent = parent
    try:
        return run_async(serve(own, run))
    except ConfigError as exc:
        print(f"{prog}: configuration is not valid:\n{exc}", file=sys.stderr)
        return 2
    except SemhealthError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
