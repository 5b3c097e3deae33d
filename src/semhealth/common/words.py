"""The words configuration messages use for values: short, one line, never traffic.

Both the agent's configuration checks and the alert rules' checks say "expected a number,
got the string 'x'" the same way, from here.
"""

from __future__ import annotations

from typing import Any

_LONGEST = 60  # characters of a value shown before it is cut


def show(value: Any) -> str:
    """A short rendering of a setting's value (configuration, never traffic, so it may be
    shown)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    # repr escapes newlines, so one issue always stays on one line.
    return repr(text[:_LONGEST] + "…") if len(text) > _LONGEST else repr(text)


def kind_of(value: Any) -> str:
    """What a value is, in words, for "expected ..., got ..." messages."""
    if isinstance(value, str):
        return f"the string {show(value)}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"the number {show(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if value is None or isinstance(value, bool):
        return show(value)
    return f"a {type(value).__name__}"
