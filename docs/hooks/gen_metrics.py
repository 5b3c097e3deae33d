"""Build-time hook: the metrics reference's instrument table, from the agent's own table.

Fills ``<!-- generated: metrics -->`` in ``reference/metrics.md`` with one row per
``Spec`` in ``SPECS`` of the module named below.
"""

from __future__ import annotations

import importlib
from typing import Any

from _tables import fill, metrics_table

MODULE = "semhealth.agent.metrics"
PAGE = "reference/metrics.md"
MARKER = "<!-- generated: metrics -->"


def rows() -> list[tuple[str, str, str, str, tuple[str, ...]]]:
    specs = importlib.import_module(MODULE).SPECS
    return [(s.name, s.kind, s.unit, s.description, tuple(s.attributes)) for s in specs]


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    return fill(markdown, MARKER, metrics_table(rows()), PAGE)
