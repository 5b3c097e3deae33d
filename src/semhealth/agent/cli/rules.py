"""``semhealth rules export`` and ``semhealth rules defaults``: the alert rules for
Prometheus."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from semhealth.agent.cli.files import output_file
from semhealth.agent.config import load_alerts


def add_parser(commands: Any) -> None:
    rules = commands.add_parser("rules", help="the alert rules: export them for Prometheus")
    rules_commands = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    export = rules_commands.add_parser(
        "export",
        help="write the rules in force (defaults + alerts: in the config) as Prometheus rules",
    )
    export.add_argument("--config", metavar="FILE", help="YAML configuration (alerts:)")
    export.add_argument("--format", choices=("prometheus",), default="prometheus")
    export.add_argument("-o", "--output", default="-", metavar="OUT", help="YAML, - for stdout")
    rules_commands.add_parser("defaults", help="print the shipped default rules (YAML)")


def rules(args: argparse.Namespace) -> int:
    from semhealth.alerts import default_rules_text
    from semhealth.alerts.prometheus import render_rules

    if args.rules_command == "defaults":
        sys.stdout.write(default_rules_text())
        return 0
    alerts = load_alerts(args.config, os.environ)
    source = args.config or "the shipped default rules"
    text = render_rules(alerts.load_rules(), source=source)
    with output_file(args.output) as out:
        out.write(text)
    return 0
