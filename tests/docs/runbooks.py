"""Where the default rules' runbook links point: a page of the manual under
``docs/operations/runbooks/``, at the site's own address (``site_url`` in ``mkdocs.yml``)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RUNBOOKS = "operations/runbooks/"
SITE_URL: str = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["site_url"]


def slug(rule_name: str) -> str:
    """``ContextRelevanceLow`` -> ``context-relevance-low``, ``LatencySLO`` -> ``latency-slo``."""
    out = []
    for i, char in enumerate(rule_name):
        if char.isupper() and i and not rule_name[i - 1].isupper():
            out.append("-")
        out.append(char.lower())
    return "".join(out)


def runbook_url(rule_name: str) -> str:
    """The address a default rule's ``runbook_url`` must have."""
    return f"{SITE_URL}{RUNBOOKS}{slug(rule_name)}/"


def runbook_source(url: str) -> Path:
    """The Markdown page of the manual that ``url`` is built from (it may not exist)."""
    assert url.startswith(SITE_URL + RUNBOOKS) and url.endswith("/"), url
    return DOCS / RUNBOOKS / (url.removeprefix(SITE_URL + RUNBOOKS).rstrip("/") + ".md")
