"""The YAML configuration within limits, and every configuration error naming its key.

The limits (``agent/_config_yaml.py``): file size, nesting depth, and the number of values
once aliases are expanded. The bad configurations are derived from the shipped JSON Schema:
one wrong value at every setting it describes, put into the full example file.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from semhealth.agent.config.document import dotted
from semhealth.agent.config.limits import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_VALUES,
    read_limited,
    structure_issue,
)
from semhealth.agent.config.load import load
from semhealth.agent.config.schema import schema_text
from semhealth.agent.errors import ConfigIssue
from tests.fuzz.budget import examples

FULL = Path(__file__).parent.parent / "agent" / "testdata" / "config" / "full.yaml"
URL = "http://127.0.0.1:8000"


def alias_bomb(levels: int = 7, width: int = 9) -> str:
    """``width ** levels`` values in ``levels + 4`` lines: each list aliases the one above."""
    lines = ["a0: &a0 [" + ", ".join(['"x"'] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    lines += ["upstream:", f"  url: {URL}", "  tls:", f"    verify: *a{levels - 1}"]
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, text: str, name: str = "semhealth.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def only_issue(path: str) -> ConfigIssue:
    _, issues = load(path, {}, {})
    assert len(issues) == 1, [str(i) for i in issues]
    return issues[0]


# -- the limits --------------------------------------------------------------------------------


def test_the_eleven_line_alias_bomb_is_refused_naming_the_limit_and_key(tmp_path: Path) -> None:
    text = alias_bomb()
    assert len(text.splitlines()) == 11
    issue = only_issue(write(tmp_path, text))
    assert issue.path == ""  # the file as a whole: every command refuses it
    assert f"more than {MAX_VALUES}" in issue.message and "(max_values)" in issue.message
    # The first list whose aliases pass the budget: 9**6 values sit in a5.
    assert "(at a5[" in issue.message
    assert (issue.line, issue.column) == (6, 10)  # its first alias


def test_alias_bomb_through_config_check_ends_with_the_limit(tmp_path: Path) -> None:
    path = write(tmp_path, alias_bomb())
    # 34 s before the limit; the timeout only keeps a regression from hanging the suite.
    done = subprocess.run(
        [sys.executable, "-m", "semhealth.agent.cli", "config", "check", path],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"{path}:6:10: the values expand to more than {MAX_VALUES}" in output
    assert "Traceback" not in output


def test_aliases_within_the_limit_still_load(tmp_path: Path) -> None:
    # 9**4 = 6561 values: well within the limit, and read as the schema sees them.
    _, issues = load(write(tmp_path, alias_bomb(levels=4)), {}, {})
    assert issues and all("max_values" not in i.message for i in issues)
    assert any(i.path == "upstream.tls.verify" for i in issues)  # a list is not a boolean


@pytest.mark.parametrize("extra", [0, 1])
def test_the_value_limit_is_exact(tmp_path: Path, extra: int) -> None:
    # The document: one mapping, the key, the list and its items; with an alias, twice over.
    items = ", ".join(["1"] * 7)
    path = write(tmp_path, f"a: &a [{items}]\nb: *a\n")
    values = 1 + 2 * (1 + 1 + 7)  # the root, then per key: the key and the list with 7 items
    doc = read_limited(path, max_values=values - 1 + extra)
    assert bool(doc.issues) == (extra == 0)


def test_deep_nesting_is_refused_instead_of_a_recursion_error(tmp_path: Path) -> None:
    depth = 3000
    issue = only_issue(write(tmp_path, "upstream: " + "[" * depth + "]" * depth + "\n"))
    assert f"nest more than {MAX_DEPTH} levels deep" in issue.message
    assert "(max_depth)" in issue.message and "(at upstream[0][0]" in issue.message
    assert issue.line == 1


def test_nesting_at_the_depth_limit_is_read(tmp_path: Path) -> None:
    # The root mapping is one level; the value nests MAX_DEPTH - 1 more.
    nested = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    _, issues = load(write(tmp_path, f"upstream: {nested}\n"), {}, {})
    assert [i.path for i in issues] == ["upstream"]
    assert "levels deep" not in issues[0].message


def test_oversized_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    padding = "#" + "x" * 99 + "\n"
    text = f"upstream:\n  url: {URL}\n" + padding * (MAX_FILE_BYTES // len(padding) + 1)
    path = write(tmp_path, text)
    issue = only_issue(path)
    assert issue.message == (
        f"the file is {os.path.getsize(path)} bytes, over the limit of {MAX_FILE_BYTES} bytes"
        " (max_bytes)"
    )
    assert issue.source == path


def test_recursive_alias_is_still_reported_by_the_reader(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "upstream: &u\n  url: " + URL + "\n  tls: *u\n"))
    assert "an alias refers to the value that contains it" in issue.message


def test_broken_yaml_is_still_reported_with_its_mark(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "upstream:\n  url: [\n"))
    assert issue.message.startswith("YAML syntax error") and issue.line is not None


@examples(ci=30)
@given(
    levels=st.integers(1, 9),
    width=st.integers(1, 12),
)
def test_any_alias_pyramid_loads_or_is_refused_by_its_true_size(levels: int, width: int) -> None:
    expanded = 4 + sum(width**level for level in range(levels + 1))  # at least
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), alias_bomb(levels, width))
        refused = bool(read_limited(path).issues)
    # Refused exactly when it is large: never a huge document let through, never a small one
    # refused. The margin covers the keys and lists the pyramid adds around the values.
    if expanded > 2 * MAX_VALUES:
        assert refused
    if expanded * 2 < MAX_VALUES:
        assert not refused


# -- every error names its key ----------------------------------------------------------------

SCHEMA: dict[str, Any] = json.loads(schema_text())
BASE: dict[str, Any] = yaml.safe_load(FULL.read_text())
WRONG: tuple[Any, ...] = (
    "not-a-value", -5, 0, 3.5, True, None, [], {"not_a_setting": 1}, "", 10**30, "http://[::1",
)  # fmt: skip


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _resolve(SCHEMA["$defs"][ref.removeprefix("#/$defs/")])
    return node


def _leaves(node: dict[str, Any], path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every setting the schema describes, with its schema: object properties, list items."""
    node = _resolve(node)
    properties = node.get("properties")
    if isinstance(properties, dict) and path:
        yield path, node  # a whole section can be wrong too
    if isinstance(properties, dict):
        for name, child in properties.items():
            yield from _leaves(child, (*path, name))
    elif node.get("type") == "array" and isinstance(node.get("items"), dict):
        yield from _leaves(node["items"], (*path, 0))
    else:
        yield path, node


def _sections(node: dict[str, Any], path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """Every mapping that forbids unknown keys."""
    node = _resolve(node)
    properties = node.get("properties")
    if isinstance(properties, dict):
        if node.get("additionalProperties") is False:
            yield path
        for name, child in properties.items():
            yield from _sections(child, (*path, name))
    elif node.get("type") == "array" and isinstance(node.get("items"), dict):
        yield from _sections(node["items"], (*path, 0))


def _rejects(schema: dict[str, Any], value: Any) -> bool:
    return not Draft202012Validator({"$defs": SCHEMA["$defs"], **schema}).is_valid(value)


LEAVES = [(path, schema) for path, schema in _leaves(SCHEMA, ()) if path]
BAD_VALUES = [
    (path, value) for path, schema in LEAVES for value in WRONG if _rejects(schema, value)
]


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """The full example with ``value`` at ``path`` (parents made where missing)."""
    doc: dict[str, Any] = json.loads(json.dumps(BASE))
    parent: Any = doc
    for part, following in itertools.pairwise(path):
        fresh: Any = [] if isinstance(following, int) else {}
        if isinstance(parent, dict):
            child = parent.get(part)
            if not isinstance(child, dict | list):
                child = parent[part] = fresh
        else:
            while len(parent) <= part:
                parent.append(fresh)
            child = parent[part]
        parent = child
    if isinstance(parent, list):
        while len(parent) <= path[-1]:
            parent.append(None)
    parent[path[-1]] = value
    return doc


def _issues_of(doc: dict[str, Any]) -> tuple[list[str], list[ConfigIssue]]:
    with tempfile.TemporaryDirectory() as folder:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
        path = write(Path(folder), text)
        _, issues = load(path, {}, {})
    return text.splitlines(), issues


def _assert_named(path: tuple[Any, ...], value: Any) -> None:
    lines, issues = _issues_of(_with(path, value))
    named = dotted(path)
    # A mapping written where the schema takes a map of values (alerts' ``peer`` labels) is
    # wrong in one of its entries, and the entry is named: the most precise key.
    entries = {f"{named}.{inner}" for inner in value} if isinstance(value, dict) else set()
    mine = [i for i in issues if i.path == named or i.path in entries]
    assert mine, f"{named} = {value!r}: {[str(i) for i in issues]}"
    # The issue points at the line where the key (or the list item) is written.
    issue = mine[0]
    assert issue.line is not None
    key = path[-1]
    markers = [f"{key}:" if isinstance(key, str) else "- "]
    if isinstance(value, dict):
        markers += [f"{inner}:" for inner in value]  # an unknown key is pointed at itself
    line = lines[issue.line - 1]
    assert any(m in line for m in markers), (named, issue.line, line)


def test_the_schema_gives_many_settings_to_spoil() -> None:
    # Guards the walk itself: an empty or tiny list would make the next tests vacuous.
    assert len(LEAVES) > 80
    assert {p[0] for p, _ in LEAVES} >= {"upstream", "routes", "relevance", "alerts", "telemetry"}


@pytest.mark.parametrize(
    ("path", "value"),
    # One wrong value per setting, deterministic; the property below tries the others.
    list({dotted(p): (p, v) for p, v in reversed(BAD_VALUES)}.values()),
    ids=lambda x: dotted(x) if isinstance(x, tuple) else repr(x)[:12],
)
def test_every_wrong_setting_is_named_by_its_key(path: tuple[Any, ...], value: Any) -> None:
    _assert_named(path, value)


# The parametrized test above covers every setting once; this one the other wrong values.
@examples(ci=10)
@given(case=st.sampled_from(BAD_VALUES))
def test_any_wrong_value_anywhere_is_named_by_its_key(case: tuple[tuple[Any, ...], Any]) -> None:
    _assert_named(*case)


@pytest.mark.parametrize("section", list(_sections(SCHEMA, ())), ids=dotted)
def test_an_unknown_key_in_every_section_is_named(section: tuple[Any, ...]) -> None:
    doc = _with((*section, "surely_not_a_setting"), 1)
    lines, issues = _issues_of(doc)
    mine = [i for i in issues if "surely_not_a_setting" in i.message]
    assert mine, [str(i) for i in issues]
    assert mine[0].path == dotted(section)
    assert mine[0].line is not None and "surely_not_a_setting:" in lines[mine[0].line - 1]


def test_the_limits_apply_to_any_yaml_text_given_its_source() -> None:
    # Contracts and other YAML files can be checked before yaml.safe_load expands them.
    issue = structure_issue(alias_bomb(), "contract.yaml")
    assert issue is not None and issue.source == "contract.yaml" and issue.line == 6
    assert structure_issue("type: object\nproperties: {a: {type: string}}\n", "c.yaml") is None
