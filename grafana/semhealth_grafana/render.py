"""Dashboards to JSON text: stable key order, two-space indent, one trailing newline, so the
committed files only change when a dashboard does."""

from __future__ import annotations

import json
from collections.abc import Callable

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from semhealth_grafana import agent, overview, streams

# File name -> builder, in the order the dashboards link to each other.
FILES: dict[str, Callable[[], dash.Dashboard]] = {
    "semhealth-overview.json": overview.build,
    "semhealth-streams.json": streams.build,
    "semhealth-agent.json": agent.build,
}


def render(board: dash.Dashboard) -> str:
    built = board.build()
    # Panel ids in layout order, so links such as /d/<uid>?viewPanel=<id> stay valid as long
    # as the layout does.
    for number, panel in enumerate(built.panels or [], start=1):
        panel.id_val = number
    return json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def dashboards() -> dict[str, str]:
    """Every dashboard: file name -> JSON text."""
    return {name: render(build()) for name, build in FILES.items()}
