"""Markdown helpers shared by the reference-page hooks (not a hook itself)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson


def cell(text: object) -> str:
    """One table cell: pipes escaped, line breaks folded, empty shown as a dash."""
    value = "" if text is None else str(text)
    value = " ".join(value.split()).replace("|", "\\|")
    return value or "—"


def code(value: object) -> str:
    """A value as inline code (JSON for anything that is not a string)."""
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return f"`{text}`" if text else '`""`'


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
    ]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def fill(markdown: str, marker: str, generated: str, page: str) -> str:
    """Put ``generated`` where ``marker`` stands; a page without it is a build error."""
    if marker not in markdown:
        raise RuntimeError(f"{page}: no {marker!r} marker, so the generated part has no place")
    return markdown.replace(marker, generated.rstrip("\n"))


def prometheus_name(name: str, kind: str, unit: str) -> str:
    """The Prometheus name the OpenTelemetry exporter gives an instrument: dots become
    underscores, the unit ``s`` appends ``_seconds``, counters get ``_total``."""
    text = name.replace(".", "_")
    if unit == "s":
        text += "_seconds"
    if kind == "counter":
        text += "_total"
    return text


def metrics_table(rows: Iterable[tuple[str, str, str, str, Sequence[str]]]) -> str:
    """One metrics table from rows of (name, kind, unit, description, labels).

    ``name`` is the OpenTelemetry instrument name; the Prometheus name is derived from it.
    Any table of instruments (the semantic and GenAI ones, the agent's own) renders here.
    """
    out = []
    for name, kind, unit, description, labels in rows:
        shown = unit if unit and unit != "s" else ("seconds" if unit == "s" else "")
        out.append(
            (
                code(prometheus_name(name, kind, unit)),
                kind,
                shown,
                ", ".join(code(label) for label in labels),
                description,
            )
        )
    return table(("Prometheus name", "type", "unit", "labels", "meaning"), out)


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()
