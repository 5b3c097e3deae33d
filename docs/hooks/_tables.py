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


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()
