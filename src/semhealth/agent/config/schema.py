"""The shipped JSON Schema: finding settings in it, and its errors put in words.

The schema checks shape; each error becomes a ``ConfigIssue`` with a message and a fix
written for the keyword that failed (``additionalProperties`` suggests the key meant,
``enum`` the value meant, ``type`` an example).
"""

from __future__ import annotations

import difflib
from importlib import resources
from typing import Any

import orjson
from jsonschema import Draft202012Validator, ValidationError  # type: ignore[import-untyped]

from semhealth.agent.config.checks import one_of
from semhealth.agent.config.document import Path, dotted
from semhealth.agent.errors import ConfigIssue
from semhealth.common.words import kind_of, show

# -- finding settings -----------------------------------------------------------------------


def setting_paths(
    schema: dict[str, Any], node: dict[str, Any] | None = None, path: Path = ()
) -> list[Path]:
    """Every settable path: each object property, not descending into lists."""
    node = resolve(schema, schema if node is None else node)
    paths: list[Path] = []
    for name, child in node.get("properties", {}).items():
        paths.append((*path, name))
        paths += setting_paths(schema, child, (*path, name))
    return paths


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its local ``$ref`` folded in (the node's own keywords win)."""
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return node
    target: dict[str, Any] = schema["$defs"][ref.removeprefix("#/$defs/")]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def subschema(schema: dict[str, Any], path: Path) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in path:
        node = resolve(schema, node) if node is not None else None
        if node is None:
            return None
        node = node.get("items") if isinstance(part, int) else node.get("properties", {}).get(part)
    return resolve(schema, node) if node is not None else None


def types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [str(t) for t in declared]
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return ["string"]
    return []


# -- schema errors, in words ----------------------------------------------------------------


def schema_issues(
    data: dict[str, Any], schema: dict[str, Any]
) -> list[tuple[Path, Path, ConfigIssue]]:
    """(where it is in the file, what to drop before building, the issue) per schema error."""
    out = []
    for error in Draft202012Validator(schema).iter_errors(data):
        out += _describe(error, schema)
    return out


def _describe(
    error: ValidationError, schema: dict[str, Any]
) -> list[tuple[Path, Path, ConfigIssue]]:
    path: Path = tuple(error.absolute_path)
    where = dotted(path)
    value = error.instance
    kind = error.validator
    if kind == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        return [
            (
                (*path, key),
                (*path, key),
                ConfigIssue(where, f"{show(key)} is not a setting", _suggest(str(key), allowed)),
            )
            for key in value
            if key not in allowed
        ]
    if kind == "required":
        prop = subschema(schema, path) or {}
        return [
            (
                path,
                path,
                ConfigIssue(
                    where,
                    f"'{key}' is missing",
                    f"add {key}{_example(prop.get('properties', {}).get(key, {}), ': ')}",
                ),
            )
            for key in error.validator_value
            if key not in value
        ]
    node = {**(subschema(schema, path) or {}), **error.schema}
    message, fix = _words(kind, error.validator_value, value, node, path) or (
        error.message,
        "see `semhealth config schema` for what this setting accepts",
    )
    return [(path, path, ConfigIssue(where, message, fix))]


def _words(
    kind: Any, expected: Any, value: Any, node: dict[str, Any], path: Path
) -> tuple[str, str] | None:
    """Message and fix for the schema keywords this schema uses; None for any other."""
    if kind == "type":
        wanted = _type_words(expected)
        if "object" in types(node) and value is None:
            return (
                f"expected {wanted}, got null",
                "indent its settings below it, or remove the empty key",
            )
        return (
            f"expected {wanted}, got {kind_of(value)}",
            f"set it to {wanted}{_example(node, ', e.g. ')}",
        )
    if kind == "enum":
        name = next((p for p in reversed(path) if isinstance(p, str)), "value")
        allowed = tuple(v if isinstance(v, str) else show(v) for v in expected)
        return f"unknown {name} {show(value)}", one_of(str(value), allowed)
    if kind == "pattern":
        return (
            f"{show(value)} is not a valid {node.get('title', 'value')}",
            f"write it like {' or '.join(map(str, node.get('examples', [])))}",
        )
    if kind == "exclusiveMinimum":
        return (
            f"must be greater than {expected}, got {show(value)}",
            f"use a number above {expected}",
        )
    if kind == "minimum":
        return (
            f"must be at least {expected}, got {show(value)}",
            f"use a number of at least {expected}",
        )
    if kind == "maximum":
        return (
            f"must be at most {expected}, got {show(value)}",
            f"use a number of at most {expected}",
        )
    if kind == "minLength":
        return "must not be empty", f"set a value{_example(node, ', e.g. ')}"
    return None


def _suggest(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"remove it; the settings here are: {', '.join(allowed)}"


def _example(node: dict[str, Any], lead: str) -> str:
    examples = node.get("examples") or ([] if node.get("default") is None else [node["default"]])
    if not examples:
        return ""
    sample = examples[0]
    return lead + (sample if isinstance(sample, str) else orjson.dumps(sample).decode())


_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def _type_words(expected: Any) -> str:
    names = [expected] if isinstance(expected, str) else list(expected)
    return " or ".join(_TYPE_WORDS.get(name, name) for name in names)


def schema_text() -> str:
    """The JSON Schema of the configuration file, as shipped in the package."""
    schema = resources.files("semhealth.agent.config").joinpath("config.schema.json")
    return schema.read_text("utf-8")
