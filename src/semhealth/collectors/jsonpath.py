"""JSONPath expressions of the configuration's ``extract`` blocks: checked when the
configuration loads, applied to request bodies in analysis.

Apart from ``request.py`` so that checking a configuration (the forwarding process does)
loads jsonpath-ng alone, not the provider adapters that reading a request needs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jsonpath_ng.ext import parse as _jsonpath_parse  # type: ignore[import-untyped]


def validate_jsonpath(expr: str) -> str | None:
    """Return why ``expr`` is not a valid JSONPath expression, or None when it is.

    For the config validator: the message names only the expression and the
    parser's position, never request content.
    """
    try:
        _jsonpath_parse(expr)
    except Exception as exc:  # jsonpath-ng raises several unrelated types for bad syntax
        return f"invalid JSONPath expression {expr!r}: {exc}"
    return None


@lru_cache(maxsize=256)
def _compiled(expr: str) -> Any:
    """Parse once per expression (parsing costs ~30 ms); None when it does not parse."""
    try:
        return _jsonpath_parse(expr)
    except Exception:  # validated at config load; a bad one here just matches nothing
        return None


def jsonpath_values(expr: str, doc: object) -> list[Any]:
    path = _compiled(expr)
    if path is None:
        return []
    try:
        return [match.value for match in path.find(doc)]
    except Exception:
        # Filters can meet values of any type (TypeError on comparisons) and deep
        # nesting exceeds the recursion limit; a request body must never raise here.
        return []
