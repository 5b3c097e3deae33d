"""Build-time hook: the default alert rules, from the shipped ``defaults.yaml``.

Fills ``<!-- generated: alerts -->`` in ``reference/alerts.md`` with one row per default
rule of the module named below (``default_rule_entries()``).
"""

from __future__ import annotations

import importlib
from typing import Any

from _tables import as_text, code, fill, table

MODULE = "semhealth.alerts"
PAGE = "reference/alerts.md"
MARKER = "<!-- generated: alerts -->"
RUNBOOKS = "operations/runbooks/"


def slug(rule_name: str) -> str:
    """``ContextRelevanceLow`` -> ``context-relevance-low``."""
    out = []
    for i, char in enumerate(rule_name):
        if char.isupper() and i and not rule_name[i - 1].isupper():
            out.append("-")
        out.append(char.lower())
    return "".join(out)


def entries() -> list[dict[str, Any]]:
    return list(importlib.import_module(MODULE).default_rule_entries())


def condition(rule: dict[str, Any]) -> str:
    parts = [f"{rule['aggregation']} {rule['signal']} over {rule['window']}"]
    threshold = rule["threshold"]
    if isinstance(threshold, dict):
        values = ", ".join(f"{k} {v}" for k, v in threshold["values"].items())
        parts.append(f"{rule['op']} ({threshold['by']}: {values})")
    else:
        parts.append(f"{rule['op']} {as_text(threshold)}")
    if "baseline" in rule:
        parts.append(f"against baseline {as_text(rule['baseline'])}")
    if "match" in rule:
        parts.append(f"where {as_text(rule['match'])}")
    if "min_samples" in rule:
        parts.append(f"(at least {rule['min_samples']} samples)")
    if "group_by" in rule:
        parts.append(f"per {', '.join(rule['group_by'])}")
    return " ".join(parts)


def render() -> str:
    rows = []
    for rule in entries():
        name = rule["name"]
        annotations = rule.get("annotations", {})
        rows.append(
            (
                code(name),
                condition(rule),
                rule.get("for", "0s"),
                rule.get("labels", {}).get("severity", ""),
                annotations.get("summary", "") and code(annotations["summary"]),
                f"[runbook](../{RUNBOOKS}{slug(name)}.md)",
            )
        )
    header = ("rule", "fires when", "for", "severity", "summary", "runbook")
    return table(header, rows)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    return fill(markdown, MARKER, render(), PAGE)
