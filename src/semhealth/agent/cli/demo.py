"""``semhealth demo``: the sidecar in front of a built-in simulated LLM, with live traffic."""

from __future__ import annotations

import argparse
from typing import Any

from semhealth.agent.cli.run import add_listen_flags


def add_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo", help="the sidecar in front of a built-in simulated LLM, with live traffic"
    )
    add_listen_flags(demo)
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


async def demo(args: argparse.Namespace) -> int:
    from semhealth.agent.demo.run import run_demo

    return await run_demo(args)
