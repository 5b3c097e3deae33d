"""Rule entries against the schema: its errors put in words, and the words both checks share.

A ``Finding`` is one issue inside one rule entry; its ``where`` is a path inside the entry
(``("threshold", "values", "short")``) that the loader roots under the entry's own path.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, ValidationError  # type: ignore[import-untyped]

from semhealth.common.words import kind_of, show

Where = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Finding:
    """One issue inside one rule entry; ``where`` is relative to the entry."""

    where: Where
    message: str
    fix: str


# -- words ----------------------------------------------------------------------------------


def one_of(value: str, allowed: Iterable[str]) -> str:
    options = list(allowed)
    close = difflib.get_close_matches(value, options, n=1)
    listed = ", ".join(options)
    return f"did you mean '{close[0]}'? (one of: {listed})" if close else f"use one of: {listed}"


def dotted(where: Where) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in where)


# -- shape ----------------------------------------------------------------------------------

_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
}


def shape_findings(entry: Any, validator: Draft202012Validator) -> list[Finding]:
    """The schema's errors for one entry, in words, in the entry's key order."""
    findings = [f for error in validator.iter_errors(entry) for f in _describe(error)]
    order = {key: index for index, key in enumerate(entry)} if isinstance(entry, dict) else {}
    return sorted(findings, key=lambda f: order.get(f.where[0], len(order)) if f.where else -1)


def _describe(error: ValidationError) -> list[Finding]:
    where: Where = tuple(error.absolute_path)
    schema: Mapping[str, Any] = error.schema
    if error.validator == "additionalProperties":
        allowed = list(schema.get("properties", {}))
        return [
            Finding((*where, key), f"unknown setting {show(key)}", _suggest(str(key), allowed))
            for key in error.instance
            if key not in allowed
        ]
    if error.validator == "required":
        missing = [key for key in error.validator_value if key not in error.instance]
        return [Finding((*where, key), f"'{key}' is missing", _add(key, schema)) for key in missing]
    message, fix = _words(error, where, schema)
    return [Finding(where, message, fix)]


def _words(error: ValidationError, where: Where, schema: Mapping[str, Any]) -> tuple[str, str]:
    value, expected = error.instance, error.validator_value
    name = next((str(p) for p in reversed(where) if isinstance(p, str)), "value")
    match error.validator:
        case "type":
            names = [expected] if isinstance(expected, str) else list(expected)
            wanted = " or ".join(_TYPE_WORDS.get(n, n) for n in names)
            if names == ["string"] and isinstance(value, int | float):
                return f"expected a string, got {kind_of(value)}", f'quote it: "{show(value)}"'
            return (
                f"expected {wanted}, got {kind_of(value)}",
                f"set it to {wanted}{_example(schema)}",
            )
        case "enum":
            if name == "op" and value == "":
                # A bare > in YAML starts a folded block, which leaves op empty.
                return "op is empty", 'quote the operator: op: ">"'
            return f"unknown {name} {show(value)}", one_of(str(value), map(str, expected))
        case "pattern":
            title = schema.get("title", name)
            return f"{show(value)} is not a valid {title}", _example(schema, "write it like ")
        case "minimum":
            return f"must be at least {expected}, got {show(value)}", f"use {expected} or more"
        case "minProperties":
            return "must not be empty", f"list at least one entry{_example(schema)}"
        case "uniqueItems":
            return "lists the same label twice", "list each label once"
    return str(error.message), "see the rule schema (semhealth.alerts.rules.RULES_SCHEMA)"


def _suggest(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"remove it; the settings here are: {', '.join(allowed)}"


def _add(key: str, schema: Mapping[str, Any]) -> str:
    return f"add {key}{_example(schema.get('properties', {}).get(key, {}), ': ')}"


def _example(schema: Mapping[str, Any], lead: str = ", e.g. ") -> str:
    examples = schema.get("examples") or []
    return f"{lead}{_inline(examples[0])}" if examples else ""


def _inline(sample: Any) -> str:
    """An example as it would be written in flow-style YAML."""
    if isinstance(sample, dict):
        return "{" + ", ".join(f"{key}: {_inline(value)}" for key, value in sample.items()) + "}"
    if isinstance(sample, list):
        return "[" + ", ".join(_inline(item) for item in sample) + "]"
    return str(sample)
