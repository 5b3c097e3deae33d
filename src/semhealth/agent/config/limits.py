"""Reading the YAML configuration within limits: file size, nesting depth, alias expansion.

PyYAML shares an aliased node rather than copying it, so a file composes in time linear
in its size; but everything that walks the data afterwards (duplicate-key checks, marks,
the JSON Schema) sees every alias expanded. Eleven lines that alias nine lists of nine,
seven levels deep, expand to 9^7 (4.8 million) values, and ``semhealth config check``
spent 34 s on them. A document nested a few hundred levels deep makes PyYAML's recursive
composer raise ``RecursionError``. So before the file is read for real, one pass over its
YAML events (PyYAML's parser is a state machine: no recursion) measures both, and a file
past a limit is refused as a whole with an issue that names the limit, the key where it
was passed, and its line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from semhealth.agent.config.document import Document, Origin, dotted, read_file
from semhealth.agent.errors import ConfigIssue

# A Kubernetes ConfigMap holds at most 1 MiB, so no deployed configuration is larger.
MAX_FILE_BYTES = 1 << 20
# Values the document holds once every alias is expanded. Real files hold hundreds; a
# route contract inlined as a large JSON Schema a few thousand.
MAX_VALUES = 100_000
# Nested mappings and lists. JSON Schema contracts nest a few dozen levels at most; the
# recursive composer and the checks after it stay far from Python's recursion limit.
MAX_DEPTH = 100
# An issue names the key where a limit was passed; past this many levels it is cut short.
_SHOWN_LEVELS = 8


@dataclass(slots=True)
class _Open:
    """A mapping or list being read: its expanded size so far, and where a key is due."""

    anchor: str | None
    is_mapping: bool
    size: int = 1
    items: int = 0  # events directly inside, so a mapping knows key from value
    key: Any = None  # the key of the value being read, in a mapping


@dataclass(slots=True)
class _Limits:
    """The pass over the events so far."""

    sizes: dict[str, int] = field(default_factory=dict)  # anchor -> expanded size
    stack: list[_Open] = field(default_factory=list)
    values: int = 0  # values read so far, every alias expanded


def read_limited(
    path: str,
    *,
    max_bytes: int = MAX_FILE_BYTES,
    max_values: int = MAX_VALUES,
    max_depth: int = MAX_DEPTH,
) -> Document:
    """``read_file(path)``, unless the file passes a limit: then an empty document with
    one issue naming the limit."""
    issue = _size_issue(path, max_bytes)
    if issue is None:
        issue = _structure_issue(path, max_values, max_depth)
    if issue is None:
        return read_file(path)
    return Document(origins={(): Origin(path)}, issues=[issue])


def _size_issue(path: str, max_bytes: int) -> ConfigIssue | None:
    try:
        size = os.path.getsize(path)
    except OSError:
        return None  # read_file says why it cannot be read
    if size <= max_bytes:
        return None
    return ConfigIssue(
        "",
        f"the file is {size} bytes, over the limit of {max_bytes} bytes (max_bytes)",
        "keep the configuration under the limit; put large contracts in files of their own",
        source=path,
    )


def _structure_issue(path: str, max_values: int, max_depth: int) -> ConfigIssue | None:
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # read_file reports these
    return structure_issue(text, path, max_values=max_values, max_depth=max_depth)


def structure_issue(
    text: str, source: str, *, max_values: int = MAX_VALUES, max_depth: int = MAX_DEPTH
) -> ConfigIssue | None:
    """The limit YAML ``text`` passes, if any; for every YAML the agent reads (contracts
    too), before ``yaml.safe_load`` expands it. Broken YAML is left to the loader."""
    limits = _Limits()
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            problem = _step(limits, event, max_values, max_depth)
            if problem is not None:
                return _issue(limits, event, problem, source)
    except yaml.YAMLError:
        return None  # read_file reports the syntax error with its mark
    return None


def _step(limits: _Limits, event: yaml.Event, max_values: int, max_depth: int) -> str | None:
    """Account for one event; the problem, when it passes a limit."""
    stack = limits.stack
    if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
        if len(stack) >= max_depth:
            return f"the values nest more than {max_depth} levels deep, the limit (max_depth)"
        _note_key(stack, None)
        stack.append(_Open(event.anchor, isinstance(event, yaml.MappingStartEvent)))
        return _count(limits, 1, max_values)
    if isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
        done = stack.pop()
        if done.anchor is not None:
            limits.sizes[done.anchor] = done.size
        if stack:
            stack[-1].size += done.size
        return None
    if isinstance(event, yaml.ScalarEvent):
        _note_key(stack, event.value)
        if event.anchor is not None:
            limits.sizes[event.anchor] = 1
        return _count(limits, 1, max_values, into_parent=True)
    if isinstance(event, yaml.AliasEvent):
        _note_key(stack, None)
        # An anchor still open (a recursive alias) counts once: read_file reports it.
        size = limits.sizes.get(event.anchor or "", 1)
        return _count(limits, size, max_values, into_parent=True)
    return None


def _note_key(stack: list[_Open], scalar: Any) -> None:
    """A new event inside the innermost container: in a mapping, every other one is a key."""
    if not stack:
        return
    top = stack[-1]
    if top.is_mapping and top.items % 2 == 0:
        top.key = scalar if isinstance(scalar, str) else "?"
    top.items += 1


def _count(limits: _Limits, size: int, max_values: int, *, into_parent: bool = False) -> str | None:
    """Count ``size`` more values; ``into_parent``: they are a finished child of the
    innermost container (a scalar or an alias), whose own size grows by as much."""
    if into_parent and limits.stack:
        limits.stack[-1].size += size
    limits.values += size
    if limits.values > max_values:
        return (
            f"the values expand to more than {max_values} through aliases (&anchor, *alias), "
            "the limit (max_values)"
        )
    return None


def _issue(limits: _Limits, event: yaml.Event, problem: str, source: str) -> ConfigIssue:
    mark = event.start_mark
    where = _path(limits.stack[:_SHOWN_LEVELS])
    if len(limits.stack) > _SHOWN_LEVELS:
        where += "..."
    at = f" (at {where})" if where else ""
    return ConfigIssue(
        "",
        problem + at,
        "write the values out, or with fewer aliases and less nesting",
        source=source,
        line=mark.line + 1 if mark is not None else None,
        column=mark.column + 1 if mark is not None else None,
    )


def _path(stack: list[_Open]) -> str:
    parts: list[Any] = []
    for container in stack:
        if container.is_mapping:
            if container.key is not None:
                parts.append(container.key)
        else:
            parts.append(max(container.items - 1, 0))
    return dotted(tuple(parts))
