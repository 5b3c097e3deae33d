"""An extra forwarding process (``dataplane.workers`` above one):
``python -m semhealth.agent.dataplane``.

Started and supervised by ``semhealth run``; it listens on the same port (``SO_REUSEPORT``)
and sends its tap wire to the same analysis process.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from semhealth.agent.config import load_config
from semhealth.agent.dataplane.forwarder import Forwarder, resolve_workers
from semhealth.agent.dataplane.settings import forwarder_settings, hardening
from semhealth.agent.runtime import RunArgs, run_child, serve_until_stopped, setup_logging


async def serve(own: argparse.Namespace, run: RunArgs) -> int:
    # The files only analysis reads are not this process's to open (their libraries).
    config = load_config(run.config, os.environ, dict(run.overrides), analysis_files=False)
    setup_logging(config.log.level, config.log.format)
    workers = resolve_workers(config.dataplane.workers)
    settings = forwarder_settings(config, workers=workers, child_args=(), limits=hardening(config))
    forwarder = Forwarder(settings, worker=own.worker, runtime_dir=os.path.dirname(own.tap_socket))
    return await serve_until_stopped(forwarder, own.parent)


def main(argv: Sequence[str] | None = None) -> int:
    return run_child("semhealth forwarder", serve, argv)
