"""``semhealth`` command line: run, demo, config check, config schema."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from semhealth.agent.config import ConfigError, check_config_file, load_config, schema_text

log = logging.getLogger("semhealth")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semhealth",
        description="Semantic-health observability for LLM services.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the sidecar proxy in front of one upstream")
    run.add_argument("--config", metavar="FILE", help="YAML configuration file")
    _add_listen_flags(run)
    run.add_argument("--upstream", metavar="URL", help="upstream base URL (overrides the file)")

    demo = commands.add_parser(
        "demo", help="the sidecar in front of a built-in simulated LLM, with live traffic"
    )
    _add_listen_flags(demo)
    demo.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long (default: until Ctrl-C)",
    )
    demo.add_argument(
        "--rate",
        type=float,
        default=8.0,
        metavar="RPS",
        help="requests per second the traffic generator sends (default 8)",
    )
    demo.add_argument(
        "--concurrency", type=int, default=16, help="most requests in flight at once (default 16)"
    )
    demo.add_argument("--seed", type=int, default=None, help="random seed for repeatable traffic")

    config = commands.add_parser("config", help="check or describe the configuration")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_commands.add_parser("check", help="validate a configuration file")
    check.add_argument("file", metavar="FILE")
    config_commands.add_parser("schema", help="print the configuration's JSON Schema")
    return parser


def _add_listen_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", metavar="HOST:PORT", help="proxy listen address")
    parser.add_argument(
        "--admin-listen",
        metavar="HOST:PORT",
        help="admin listen address (/healthz, /readyz, /metrics)",
    )
    parser.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error"))


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    pairs = {
        "upstream.url": getattr(args, "upstream", None),
        "listen.proxy": args.listen,
        "listen.admin": args.admin_listen,
        "log.level": args.log_level,
    }
    return {key: value for key, value in pairs.items() if value is not None}


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


async def _serve_until_signal(run_for: float | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), run_for)


async def _run(args: argparse.Namespace) -> int:
    from semhealth.agent.app import Agent

    config = load_config(args.config, os.environ, _overrides(args))
    _setup_logging(config.log.level)
    agent = Agent(config)
    await agent.start()
    try:
        await _serve_until_signal(None)
    finally:
        await agent.shutdown()
    return 0


async def _demo(args: argparse.Namespace) -> int:
    from semhealth.agent.demo import run_demo

    return await run_demo(args)


def _config_check(path: str) -> int:
    issues = check_config_file(path, os.environ)
    if not issues:
        print(f"{path}: ok")
        return 0
    for issue in issues:
        print(issue, file=sys.stderr)
    return 1


def _run_async(main: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: int = uvloop.run(main)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "config":
            if args.config_command == "schema":
                sys.stdout.write(schema_text())
                return 0
            return _config_check(args.file)
        if args.command == "run":
            return _run_async(_run(args))
        return _run_async(_demo(args))
    except ConfigError as exc:
        print(f"semhealth: configuration is not valid:\n{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
