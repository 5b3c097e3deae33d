"""An extra forwarding process (``workers`` above one): ``python -m semhealth.agent.dataplane``.

Started and supervised by ``semhealth run``; it listens on the same port (``SO_REUSEPORT``)
and sends its tap wire to the same analysis process.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from semhealth.agent.analysis.process import parse_child_args
from semhealth.agent.cli import overrides, run_async, setup_logging, stop_on_signals
from semhealth.agent.config import ConfigError, load_config
from semhealth.agent.dataplane.forwarder import Forwarder, resolve_workers, watch_parent
from semhealth.agent.dataplane.settings import forwarder_settings


async def serve(own: argparse.Namespace, run: argparse.Namespace) -> int:
    config = load_config(run.config, os.environ, overrides(run))
    setup_logging(config.log.level)
    workers = resolve_workers(config.dataplane.workers)
    settings = forwarder_settings(config, workers=workers, run_args=())
    forwarder = Forwarder(settings, worker=own.worker, runtime_dir=os.path.dirname(own.tap_socket))
    stop = stop_on_signals()
    await forwarder.start()
    try:
        await watch_parent(stop, own.parent)
    finally:
        await forwarder.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parent = os.getppid()  # before anything slow: the supervisor may die while we load
    own, run = parse_child_args("semhealth-forwarder", sys.argv[1:] if argv is None else argv)
    own.parent = parent
    try:
        return run_async(serve(own, run))
    except ConfigError as exc:
        print(f"semhealth forwarder: configuration is not valid:\n{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
