"""``semhealth config check FILE`` and ``semhealth config schema``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from semhealth.agent.config import check_config_file, schema_text


def add_parser(commands: Any) -> None:
    config = commands.add_parser("config", help="check or describe the configuration")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_commands.add_parser("check", help="validate a configuration file")
    check.add_argument("file", metavar="FILE")
    config_commands.add_parser("schema", help="print the configuration's JSON Schema")


def main(args: argparse.Namespace) -> int:
    if args.config_command == "schema":
        sys.stdout.write(schema_text())
        return 0
    return _config_check(args.file)


def _config_check(path: str) -> int:
    issues = check_config_file(path, os.environ)
    for issue in issues:
        print(issue, file=sys.stderr)
    if any(not issue.warning for issue in issues):
        return 1
    # Warnings say what will not work as written; the file still runs.
    warned = len(issues)
    print(f"{path}: ok" + (f", with {warned} warning{'s' * (warned > 1)}" if warned else ""))
    return 0
