"""The configuration document while layers are applied: values, where each came from, issues.

Also reads the YAML file into such a document, keeping the line and column of every key
and list item so that issues can point at them (``FILE:LINE:COL``).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from semhealth.agent.errors import ConfigIssue
from semhealth.common.words import kind_of

# The TLS sections' file settings: resolved against the file's folder here, checked in checks.
TLS_FILES = ("ca_file", "client_cert", "client_key")

Path = tuple[Any, ...]  # keys and list indices from the document root

_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a value came from; line and column are 1-based and only known for the file."""

    source: str
    line: int | None = None
    column: int | None = None


@dataclass(slots=True)
class Document:
    """The merged document while layers are applied, with the origin of each value."""

    data: dict[str, Any] = field(default_factory=dict)
    origins: dict[Path, Origin] = field(default_factory=dict)
    issues: list[ConfigIssue] = field(default_factory=list)

    def set(self, path: Path, value: Any, origin: Origin) -> None:
        """Set ``path`` to ``value``; mappings merge key by key into mappings already there."""
        parent = self.data
        for depth, key in enumerate(path[:-1]):
            child = parent.get(key)
            if not isinstance(child, dict):
                child = parent[key] = {}
                self._forget(path[: depth + 1])
            parent = child
        current = parent.get(path[-1])
        if isinstance(value, dict) and isinstance(current, dict):
            for key, item in value.items():
                self.set((*path, key), item, origin)
            return
        parent[path[-1]] = copy.deepcopy(value)
        self._forget(path)
        self.origins[path] = origin

    def _forget(self, prefix: Path) -> None:
        for path in [p for p in self.origins if p[: len(prefix)] == prefix]:
            del self.origins[path]

    def locate(self, path: Path, issue: ConfigIssue) -> ConfigIssue:
        """Give ``issue`` the origin of ``path`` or of its nearest ancestor that has one."""
        for depth in range(len(path), -1, -1):
            origin = self.origins.get(path[:depth])
            if origin is not None:
                return replace(issue, source=origin.source, line=origin.line, column=origin.column)
        return issue


def read_file(path: str) -> Document:
    """The file as a document; one that cannot be read or parsed is empty, with its issue."""
    doc = Document(origins={(): Origin(path)})
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        doc.issues.append(
            ConfigIssue(
                "",
                f"cannot read the file: {reason}",
                "check the path and its permissions",
                source=path,
            )
        )
        return doc
    except UnicodeDecodeError as exc:
        doc.issues.append(
            ConfigIssue(
                "",
                f"the file is not UTF-8 text (byte {exc.start})",
                "save it as UTF-8",
                source=path,
            )
        )
        return doc
    data = _parse_yaml(text, path, doc)
    if data is None:
        return doc
    if not isinstance(data, dict):
        doc.issues.append(
            ConfigIssue(
                "",
                f"the file must be a mapping of sections, not {kind_of(data)}",
                "write the sections (upstream:, listen:, routes: ...) at the top level",
                source=path,
                line=1,
                column=1,
            )
        )
        return doc
    _resolve_files(data, os.path.dirname(path))
    doc.data = data
    return doc


def _parse_yaml(text: str, path: str, doc: Document) -> Any:
    """The file's data (None when empty or broken), recording the mark of every value."""
    try:
        loader = yaml.SafeLoader(text)  # the reader rejects control characters here
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        doc.issues.append(
            ConfigIssue(
                "",
                f"YAML syntax error: {exc.reason} (character #x{exc.character:04x})",
                "remove the control character, or quote it as an escape sequence",
                source=path,
                line=line,
                column=column,
            )
        )
        return None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        problems = _node_problems(node, (), path, set())
        if problems:
            doc.issues += problems
            return None
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        doc.issues.append(
            ConfigIssue(
                "",
                f"YAML syntax error: {exc.problem or exc.context}",
                "correct the YAML here: check the indentation, the : after keys and closing quotes",
                source=path,
                line=mark.line + 1 if mark else None,
                column=mark.column + 1 if mark else None,
            )
        )
        return None
    except yaml.YAMLError as exc:
        doc.issues.append(
            ConfigIssue("", f"YAML error: {type(exc).__name__}", "correct the YAML", source=path)
        )
        return None
    finally:
        loader.dispose()
    # Construction flattened merge keys (<<) into the nodes, so marks are read afterwards.
    _record_marks(node, (), path, doc.origins)
    return data


def _node_problems(node: yaml.Node, path: Path, source: str, above: set[int]) -> list[ConfigIssue]:
    """Duplicate keys (YAML would keep the last silently) and self-referencing aliases."""
    if id(node) in above:
        return [
            _at(
                node,
                source,
                ConfigIssue(
                    dotted(path),
                    "an alias refers to the value that contains it",
                    "remove the recursive alias",
                ),
            )
        ]
    above = above | {id(node)}
    problems: list[ConfigIssue] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                problems += _node_problems(value, path, source, above)
                continue
            name = key.value if isinstance(key, yaml.ScalarNode) else "?"
            if name in seen:
                problems.append(
                    _at(
                        key,
                        source,
                        ConfigIssue(
                            dotted(path),
                            f"{name!r} is set twice (first on line {seen[name]})",
                            "keep only one of them",
                        ),
                    )
                )
            seen.setdefault(name, key.start_mark.line + 1)
            problems += _node_problems(value, (*path, name), source, above)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            problems += _node_problems(item, (*path, index), source, above)
    return problems


def _at(node: yaml.Node, source: str, issue: ConfigIssue) -> ConfigIssue:
    mark = node.start_mark
    return replace(issue, source=source, line=mark.line + 1, column=mark.column + 1)


def _record_marks(node: yaml.Node, path: Path, source: str, origins: dict[Path, Origin]) -> None:
    """Map each key (and list item) to its mark; a later duplicate wins, as in the data."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                child = (*path, key.value)
                origins[child] = Origin(source, key.start_mark.line + 1, key.start_mark.column + 1)
                _record_marks(value, child, source, origins)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            origins[(*path, index)] = Origin(
                source, item.start_mark.line + 1, item.start_mark.column + 1
            )
            _record_marks(item, (*path, index), source, origins)


def _resolve_files(data: dict[str, Any], base: str) -> None:
    """Relative file paths (TLS files, route contracts, the relevance calibration) are read
    from the file's folder, like Prometheus."""
    upstream = data.get("upstream")
    tls = upstream.get("tls") if isinstance(upstream, dict) else None
    files = [(tls, name) for name in TLS_FILES] if isinstance(tls, dict) else []
    routes = data.get("routes")
    if isinstance(routes, list):
        files += [(route, "contract") for route in routes if isinstance(route, dict)]
    relevance = data.get("relevance")
    if isinstance(relevance, dict):
        files.append((relevance, "calibration"))
    for holder, name in files:
        value = holder.get(name)
        if isinstance(value, str) and value and not os.path.isabs(value):
            holder[name] = os.path.join(base, value)


# -- paths ----------------------------------------------------------------------------------


def dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_path(text: str) -> Path:
    return tuple(name if index == "" else int(index) for name, index in _PATH_PART.findall(text))


def overlaps(a: Path, b: Path) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]
