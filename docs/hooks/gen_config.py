"""Build-time hook: the configuration reference, from the configuration's JSON Schema.

Fills ``<!-- generated: configuration -->`` in ``reference/configuration.md`` with one
table per top-level section: every key path with its type, default, allowed values and the
schema's own description. The schema comes from ``schema_text()`` of the module named below.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import orjson
from _tables import code, fill, table

MODULE = "semhealth.agent.config"
PAGE = "reference/configuration.md"
MARKER = "<!-- generated: configuration -->"


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a local ``$ref`` merged in (the node's own words win)."""
    ref = node.get("$ref")
    if not ref:
        return node
    target = defs[ref.rsplit("/", 1)[1]]
    return {**_resolve(target, defs), **{k: v for k, v in node.items() if k != "$ref"}}


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node = _resolve(node, defs)
    if "const" in node:
        return code(node["const"])
    for key in ("oneOf", "anyOf"):
        if key in node:
            return " or ".join(_type(option, defs) for option in node[key])
    kind = node.get("type")
    if "enum" in node and kind is None:
        return "enum"
    names = kind if isinstance(kind, list) else [kind] if kind else []
    shown = []
    for name in names:
        if name == "array" and "items" in node:
            item = _resolve(node["items"], defs)
            shown.append(f"array of {item.get('title') or _type(item, defs)}")
        else:
            shown.append(str(name))
    text = " or ".join(shown) or "any"
    title = node.get("title")
    return f"{text} ({title})" if title and not node.get("properties") else text


def _details(node: dict[str, Any]) -> str:
    parts = [node.get("description", "")]
    if "enum" in node:
        parts.append("One of: " + ", ".join(code(value) for value in node["enum"]) + ".")
    bounds = [
        f"{word} {node[key]}"
        for key, word in (
            ("minimum", "at least"),
            ("exclusiveMinimum", "above"),
            ("maximum", "at most"),
        )
        if key in node
    ]
    if bounds:
        parts.append(", ".join(bounds).capitalize() + ".")
    if node.get("examples"):
        parts.append("Example: " + ", ".join(code(value) for value in node["examples"][:2]) + ".")
    return " ".join(part for part in parts if part)


def _rows(
    path: str, node: dict[str, Any], defs: dict[str, Any]
) -> Iterator[tuple[str, str, str, str]]:
    node = _resolve(node, defs)
    default = code(node["default"]) if "default" in node else ""
    yield (code(path), _type(node, defs), default, _details(node))
    for name, child in node.get("properties", {}).items():
        yield from _rows(f"{path}.{name}", child, defs)
    items = node.get("items")
    if isinstance(items, dict):
        item = _resolve(items, defs)
        for name, child in item.get("properties", {}).items():
            yield from _rows(f"{path}[].{name}", child, defs)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("properties"):
        for name, child in extra["properties"].items():
            yield from _rows(f"{path}.<name>.{name}", child, defs)


def render() -> str:
    schema = orjson.loads(importlib.import_module(MODULE).schema_text())
    defs = schema.get("$defs", {})
    out = []
    for name, node in schema["properties"].items():
        node_r = _resolve(node, defs)
        out += [f"## `{name}`", "", node_r.get("description", ""), ""]
        out.append(table(("key", "type", "default", "meaning"), list(_rows(name, node, defs))))
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    return fill(markdown, MARKER, render(), PAGE)
