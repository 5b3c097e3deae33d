"""The ``semhealth`` command line: one module per command, each with its ``add_parser`` and
its body; this module assembles the parser and dispatches.

The CLI is the top of the agent: nothing imports it. The processes ``semhealth run`` starts
parse only their own arguments (``semhealth.agent.runtime``), and each command imports what
it runs when it runs, so building the parser never loads torch, the encoders or the
OpenTelemetry SDK.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from semhealth.agent.cli import config as config_cli
from semhealth.agent.cli import demo as demo_cli
from semhealth.agent.cli import diff as diff_cli
from semhealth.agent.cli import kube as kube_cli
from semhealth.agent.cli import replay as replay_cli
from semhealth.agent.cli import rules as rules_cli
from semhealth.agent.cli import run as run_cli
from semhealth.agent.cli import score as score_cli
from semhealth.agent.cli import scorer as scorer_cli
from semhealth.agent.config import ConfigError
from semhealth.agent.errors import CONFIG_EXIT, ConfigRefused, SemhealthError
from semhealth.agent.runtime import resolve_config_file, run_async
from semhealth.embeddings.errors import EmbeddingError

__all__ = ["build_parser", "main"]

Command = Callable[[argparse.Namespace], int]
AsyncCommand = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

# In the order ``semhealth --help`` lists them.
_PARSERS = (
    run_cli.add_parser,
    demo_cli.add_parser,
    score_cli.add_parser,
    scorer_cli.add_parser,
    config_cli.add_parser,
    rules_cli.add_parser,
    replay_cli.add_parser,
    diff_cli.add_parser,
    kube_cli.add_parser,
)
_COMMANDS: dict[str, Command] = {
    "config": config_cli.main,
    "rules": rules_cli.rules,
    "inject": kube_cli.inject,
    "replay": replay_cli.main,
    "diff": diff_cli.main,
}
_ASYNC_COMMANDS: dict[str, AsyncCommand] = {
    "run": run_cli.run,
    "demo": demo_cli.demo,
    "score": score_cli.score,
    "calibrate": score_cli.calibrate,
    "scorer": scorer_cli.scorer,
    "injector": kube_cli.injector,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semhealth",
        description="Semantic-health observability for LLM services.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in _PARSERS:
        add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    resolve_config_file(args)
    try:
        if args.command in _COMMANDS:
            return _COMMANDS[args.command](args)
        return run_async(_ASYNC_COMMANDS[args.command](args))
    except ConfigError as exc:
        print(f"semhealth: configuration is not valid:\n{exc}", file=sys.stderr)
        return CONFIG_EXIT
    except ConfigRefused as exc:
        print(f"semhealth {args.command}: {exc}", file=sys.stderr)
        return CONFIG_EXIT
    except (SemhealthError, EmbeddingError, OSError) as exc:
        # Start-up failures: a model that does not load, a file that cannot be read.
        print(f"semhealth {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
