"""Test support: the committed dashboards, their panel queries, and Grafana's variable
substitution.

``generate`` is ``grafana/generate.py`` loaded as a module (it puts ``grafana/`` on the path
for ``semhealth_grafana``). ``substitute`` does what Grafana does to a Prometheus query before
sending it: ``$name`` and ``${name}`` become the variable's value; a multi-value selection is
sent as the regex ``(a|b)``, "All" as the variable's ``allValue`` (``.*`` on ours).
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"
COMMITTED = (GRAFANA / "dashboards", REPO / "helm" / "semhealth" / "dashboards")
NAMES = ("semhealth-overview.json", "semhealth-streams.json", "semhealth-agent.json")

# Grafana's own variables our queries use, with what a 1 s scrape interval makes of them.
BUILTINS = {"__rate_interval": "1m"}

_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@cache
def generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "semhealth_grafana_generate", GRAFANA / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed(name: str, folder: Path = COMMITTED[0]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((folder / name).read_text())
    return loaded


def boards() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in NAMES:
        yield name, committed(name)


def panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row (rows are not collapsed, so panels are top-level)."""
    for panel in board["panels"]:
        if panel["type"] != "row":
            yield panel


@dataclass(frozen=True)
class Query:
    board: str  # file name
    panel_id: int
    panel: str  # title
    ref_id: str
    expr: str

    @property
    def id(self) -> str:
        return f"{self.board.removesuffix('.json')}:{self.panel_id}{self.ref_id}:{self.panel}"


def queries() -> list[Query]:
    return [
        Query(name, panel["id"], panel["title"], target["refId"], target["expr"])
        for name, board in boards()
        for panel in panels(board)
        for target in panel.get("targets", [])
    ]


def variable_names(board: Mapping[str, Any]) -> set[str]:
    return {variable["name"] for variable in board["templating"]["list"]}


def used_variables(expr: str) -> set[str]:
    return {braced or bare for braced, bare in _VARIABLE.findall(expr)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with every variable replaced; an unknown variable raises ``KeyError``."""
    known = {**BUILTINS, **values}
    return _VARIABLE.sub(lambda m: known[m.group(1) or m.group(2)], expr)


_REGEX_SPECIAL = re.compile(r"[$^*+?.()|\\{}\[\]]")


def multi(*values: str) -> str:
    """A multi-value selection as Grafana's Prometheus data source sends it: a regex
    alternation, each special character escaped with two backslashes (one for the regex, one
    for the PromQL string), as its ``prometheusSpecialRegexEscape`` does."""
    escaped = (_REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value) for value in values)
    return "(" + "|".join(escaped) + ")"
