"""``semhealth run``: the sidecar. Its flags, what they override in the configuration, and
the supervisor that starts the forwarding and analysis processes (or, ``--in-process``,
both planes in this one)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from typing import Any

from semhealth.agent.cli import replay as replay_cli
from semhealth.agent.config import Config, ConfigIssue, load_config
from semhealth.agent.runtime import (
    RunArgs,
    reload_rules,
    serve_until_signal,
    setup_logging,
    stop_on_signals,
    warn_missing_config,
)

log = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    run = commands.add_parser(
        "run", help="run the sidecar: a proxy in front of one upstream, an OTLP receiver, or both"
    )
    config_file = run.add_mutually_exclusive_group()
    config_file.add_argument("--config", metavar="FILE", help="YAML configuration file")
    config_file.add_argument(
        "--config-if-present",
        metavar="FILE",
        help="as --config, but a missing file means the defaults and flags (an injected "
        "sidecar whose ConfigMap is not in its namespace still starts, and says so)",
    )
    add_listen_flags(run)
    run.add_argument(
        "--upstream",
        metavar="URL",
        help="upstream base URL (overrides the file; may be left out when an OTLP receiver "
        "listens, for an agent without a proxy)",
    )
    run.add_argument(
        "--otlp-grpc-listen",
        metavar="HOST:PORT",
        help="OTLP/gRPC receiver address (overrides otlp_receiver.grpc_listen)",
    )
    run.add_argument(
        "--otlp-http-listen",
        metavar="HOST:PORT",
        help="OTLP/HTTP receiver address (overrides otlp_receiver.http_listen)",
    )
    run.add_argument(
        "--workers",
        metavar="N|auto",
        help="forwarding processes on the proxy port (overrides dataplane.workers; "
        "auto: one per CPU)",
    )
    run.add_argument(
        "--in-process",
        action="store_true",
        help="forward and analyse in one process (for debugging; the default runs analysis "
        "in a process of its own so it can never delay forwarding)",
    )
    replay_cli.add_record_flags(run)
    _add_hardening_flags(run)


def _add_hardening_flags(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="TLS and basic auth for the admin port, in Prometheus exporter-toolkit's web.yml "
        "format; /healthz and /readyz stay open",
    )
    run.add_argument(
        "--no-alerts-endpoint",
        action="store_true",
        help="answer /alerts on the admin port with 404",
    )
    run.add_argument(
        "--max-client-connections",
        type=_limit,
        metavar="N",
        help="client connections per forwarding process; past it a new one gets 503 "
        "too_many_connections (default: no limit)",
    )
    run.add_argument(
        "--max-upstream-requests",
        type=_limit,
        metavar="N",
        help="requests upstream at once per forwarding process; past it 503 "
        "upstream_concurrency_limit (default: no limit)",
    )


def _limit(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0: no limit)")
    return int(text)


def add_listen_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", metavar="HOST:PORT", help="proxy listen address")
    parser.add_argument(
        "--admin-listen",
        metavar="HOST:PORT",
        help="admin listen address (/healthz, /readyz, /metrics)",
    )
    parser.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error"))
    parser.add_argument(
        "--alertmanager",
        action="append",
        metavar="URL",
        help="Alertmanager base URL to page (repeatable; replaces alerts.alertmanager.urls)",
    )


def overrides(args: argparse.Namespace) -> dict[str, object]:
    no_alerts = getattr(args, "no_alerts_endpoint", False)
    pairs = {
        "upstream.url": getattr(args, "upstream", None),
        "listen.proxy": args.listen,
        "listen.admin": args.admin_listen,
        "log.level": args.log_level,
        "alerts.alertmanager.urls": args.alertmanager,
        "dataplane.workers": _workers_flag(getattr(args, "workers", None)),
        "otlp_receiver.grpc_listen": getattr(args, "otlp_grpc_listen", None),
        "otlp_receiver.http_listen": getattr(args, "otlp_http_listen", None),
        "listen.admin_web_config": getattr(args, "web_config_file", None),
        "listen.admin_alerts_endpoint": False if no_alerts else None,
        "dataplane.max_client_connections": getattr(args, "max_client_connections", None),
        "dataplane.max_upstream_requests": getattr(args, "max_upstream_requests", None),
    }
    return {key: value for key, value in pairs.items() if value is not None}


def _workers_flag(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.isdigit() else value


def run_args(args: argparse.Namespace) -> RunArgs:
    """What the processes ``run`` starts are handed: resolved here once, so none of them
    parses this command line again."""
    return RunArgs(
        config=args.config, overrides=overrides(args), record=replay_cli.record_settings(args)
    )


async def run(args: argparse.Namespace) -> int:
    # Every file the configuration names is read here, before anything starts (the admin
    # port's web configuration and certificates included), except those only the analysis
    # process reads: this process forwards and must not map their libraries. The analysis
    # process reads them first thing, and a refusal there stops start-up (ConfigRefused).
    warnings: list[ConfigIssue] = []
    config = load_config(
        args.config,
        os.environ,
        overrides(args),
        analysis_files=args.in_process,
        warnings=warnings,
    )
    if config.upstream.url is None and not args.in_process:
        # A receiver alone runs in this one process, which then reads those files too.
        config = load_config(args.config, os.environ, overrides(args))
    setup_logging(config.log.level, config.log.format)
    for warning in warnings:  # here only: the processes this one starts do not repeat them
        log.warning("%s", warning)
    warn_missing_config(args)
    # A --record file that cannot be written stops start-up here, said plainly.
    replay_cli.check_record_file(args)
    from semhealth.agent.dataplane.settings import hardening

    limits = hardening(config)
    if args.in_process or config.upstream.url is None:
        # No upstream (an OTLP receiver alone): no proxy, so no forwarding processes to keep
        # analysis away from; the agent serves the receiver and the admin port itself.
        return await _run_in_process(args, config)
    from semhealth.agent.dataplane.forwarder import Forwarder, resolve_workers
    from semhealth.agent.dataplane.settings import forwarder_settings

    settings = forwarder_settings(
        config,
        workers=resolve_workers(config.dataplane.workers),
        child_args=run_args(args).argv(),
        limits=limits,
    )
    forwarder = Forwarder(settings)
    # Signals first: a stop while the analysis process loads its models is a clean stop.
    stop = stop_on_signals(forwarder.reload if args.config else None)
    try:
        starting = asyncio.ensure_future(forwarder.start())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()
            await stopping
        else:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
    finally:
        await forwarder.shutdown()
    return 0


async def _run_in_process(args: argparse.Namespace, config: Config) -> int:
    from semhealth.agent.admin.gate import AdminAccess
    from semhealth.agent.analysis.agent import Agent, Settings
    from semhealth.agent.dataplane.settings import hardening, listen_settings

    limits = hardening(config)
    access = AdminAccess(
        web_config_file=limits.web_config_file, alerts_endpoint=limits.alerts_endpoint
    )
    started_with = run_args(args)
    settings = Settings(
        record=started_with.record,
        admin=access,
        listen=listen_settings(config, limits),
    )
    agent = Agent(config, settings)
    await agent.start()
    reloads: set[asyncio.Task[None]] = set()  # held until done, so none is collected early

    def hangup() -> None:
        task = asyncio.create_task(reload_rules(agent, started_with))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    try:
        await serve_until_signal(None, on_hangup=hangup if args.config else None)
    finally:
        await agent.shutdown()
    return 0
