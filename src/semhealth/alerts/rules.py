"""Alert rules from YAML: the shipped defaults, the agent's configuration and rules files,
checked and turned into ``model.Rule`` values.

Rule entries come in layers, each overriding the ones before: the defaults
(``defaults.yaml``), then the entries in the agent's configuration, then each rules file
in order. An entry named like an earlier rule changes only the settings it writes
(``labels`` and ``annotations`` merge key by key) and ``enabled: false`` removes the
rule; any other entry is a new rule and must be complete. Every entry is checked for
shape against ``RULES_SCHEMA`` as written, and every resulting rule for meaning once
merged, and all issues are reported together in one ``RuleError``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
import yaml
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from semhealth.alerts._rule_checks import REQUIRED, check_rule
from semhealth.alerts._rule_shape import Finding, dotted, shape_findings
from semhealth.alerts.errors import RuleError, RuleIssue
from semhealth.alerts.model import Rule
from semhealth.common.words import kind_of

_PACKAGE = "semhealth.alerts"
# libyaml's loader when PyYAML was built with it: the same documents, several times faster.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGED_KEYS = ("labels", "annotations")  # an override adds to these rather than replacing them

# The JSON Schema of one rule entry. The agent embeds it in its own configuration schema,
# so treat it as read-only.
RULES_SCHEMA: dict[str, Any] = orjson.loads(
    resources.files(_PACKAGE).joinpath("rule.schema.json").read_bytes()
)
_VALIDATOR = Draft202012Validator(RULES_SCHEMA)


def default_rules_text() -> str:
    """The shipped ``defaults.yaml`` as written, comments and all."""
    return resources.files(_PACKAGE).joinpath("defaults.yaml").read_text(encoding="utf-8")


def default_rule_entries() -> list[dict[str, Any]]:
    """The entries of the shipped ``defaults.yaml``, freshly parsed (callers may change them)."""
    entries: list[dict[str, Any]] = yaml.load(default_rules_text(), Loader=_LOADER)["rules"]
    return entries


def parse_rules(
    entries: Iterable[Any], *, base: Iterable[Any] = (), path: str = "rules"
) -> tuple[Rule, ...]:
    """The rules of ``base`` (usually ``default_rule_entries()``) overridden by ``entries``.

    Raises ``RuleError`` with every issue found; issue paths are ``{path}[i]...`` for
    ``entries`` and ``defaults[i]...`` for ``base``.
    """
    rules, issues = _resolve(
        [_Layer("defaults", tuple(base), shipped=True), _Layer(path, tuple(entries))]
    )
    if issues:
        raise RuleError(issues)
    return rules


def load_rules(
    *,
    defaults: bool = True,
    entries: Iterable[Any] = (),
    files: Iterable[str | os.PathLike[str]] = (),
    path: str = "rules",
) -> tuple[Rule, ...]:
    """The full rule set: the defaults (if on), overridden by ``entries`` (the agent's
    configuration, issues under ``{path}[i]``) and then by each rules file in turn (a YAML
    mapping ``rules: [...]``, issues under ``FILE: rules[i]``).

    A missing or unreadable file, or one that is not YAML, is an issue like any other:
    ``RuleError`` lists them all and nothing is half-loaded.
    """
    layers = [_Layer("defaults", tuple(default_rule_entries()), shipped=True)] if defaults else []
    layers.append(_Layer(path, tuple(entries)))
    issues: list[RuleIssue] = []
    for file in files:
        file_entries, file_issues = _read_rules_file(os.fspath(file))
        issues += file_issues
        layers.append(_Layer(f"{os.fspath(file)}: rules", file_entries))
    rules, rule_issues = _resolve(layers)
    if issues or rule_issues:
        raise RuleError([*issues, *rule_issues])
    return rules


# -- layering -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layer:
    path: str  # issue path prefix: entry i is "{path}[i]"
    entries: tuple[Any, ...]
    shipped: bool = False  # the defaults: assumed valid on their own


@dataclass(frozen=True, slots=True)
class _Merged:
    """One rule as the layers so far define it."""

    fields: Mapping[str, Any]  # the well-shaped settings, overrides applied
    origins: Mapping[str, str]  # "threshold" or "labels.team" -> the entry that wrote it
    path: str  # the entry that last changed the rule
    buildable: bool  # complete, and no entry for it had a shape error


def _resolve(layers: Iterable[_Layer]) -> tuple[tuple[Rule, ...], list[RuleIssue]]:
    merged: dict[str, _Merged] = {}
    shipped: set[str] = set()
    order: dict[str, int] = {}  # entry path -> position, to list issues in document order
    found: list[tuple[int, RuleIssue]] = []
    for layer in layers:
        names: dict[str, str] = {}  # names defined in this layer -> where
        for index, entry in enumerate(layer.entries):
            where = f"{layer.path}[{index}]"
            order[where] = len(order)
            if layer.shipped:
                shipped.add(where)
            found += [(order[where], issue) for issue in _apply(entry, where, merged, names)]
    rules = []
    for rule in merged.values():
        if rule.fields.get("enabled", True) is False:
            continue
        built, findings = check_rule(rule.fields, buildable=rule.buildable)
        for finding in findings:
            origin = _blame(rule, finding, shipped)
            issue = RuleIssue(origin + dotted(finding.where), finding.message, finding.fix)
            found.append((order[origin], issue))
        if built is not None:
            rules.append(built)
    return tuple(rules), [issue for _, issue in sorted(found, key=lambda pair: pair[0])]


def _apply(
    entry: Any, where: str, merged: dict[str, _Merged], names: dict[str, str]
) -> list[RuleIssue]:
    """Check one entry's shape and fold it into ``merged``; the issues found on the way."""
    findings = shape_findings(entry, _VALIDATOR)
    issues = [RuleIssue(where + dotted(f.where), f.message, f.fix) for f in findings]
    bad = {f.where[0] for f in findings if f.where}
    if not isinstance(entry, dict) or "name" in bad or any(not f.where for f in findings):
        return issues  # not a mapping, or no usable name: nothing to merge
    name: str = entry["name"]
    if name in names:
        message = f"rule {name!r} is already defined at {names[name]}"
        fix = "rename one of them, or merge the two entries into one"
        return [*issues, RuleIssue(f"{where}.name", message, fix)]
    names[name] = where
    good = {key: value for key, value in entry.items() if key not in bad}
    previous = merged.get(name)
    if previous is not None:
        merged[name] = _override(previous, good, where, clean=not bad)
        return issues
    missing = [key for key in REQUIRED if key not in entry]
    if missing:
        issues.append(_incomplete(where, name, missing, list(merged)))
    merged[name] = _Merged(good, _origins(good, where), where, not bad and not missing)
    return issues


def _override(previous: _Merged, good: Mapping[str, Any], where: str, *, clean: bool) -> _Merged:
    fields = dict(previous.fields)
    for key, value in good.items():
        fields[key] = {**fields.get(key, {}), **value} if key in _MERGED_KEYS else value
    origins = {**previous.origins, **_origins(good, where)}
    return _Merged(fields, origins, where, previous.buildable and clean)


def _origins(fields: Mapping[str, Any], where: str) -> dict[str, str]:
    origins = dict.fromkeys(fields, where)
    for key in _MERGED_KEYS:
        origins.update({f"{key}.{name}": where for name in fields.get(key, {})})
    return origins


def _incomplete(where: str, name: str, missing: list[str], known: list[str]) -> RuleIssue:
    message = f"new rule {name!r} is missing {', '.join(missing)}"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)  # typos, not kin
    if close:
        fix = f"did you mean '{close[0]}'? an entry named like a rule changes only what it sets"
    else:
        fix = f"add {', '.join(missing)}; a new rule needs {', '.join(REQUIRED)}"
    return RuleIssue(where, message, fix)


def _blame(rule: _Merged, finding: Finding, shipped: set[str]) -> str:
    """The entry to blame for a finding: the one that wrote the field it is about.

    A shipped default is valid on its own, so an issue with a field a default wrote comes
    from an override of other fields (a ``group_by`` that drops a label an annotation
    uses): it is blamed on the last entry that changed the rule.
    """
    where = finding.where
    origin = None
    if len(where) > 1 and where[0] in _MERGED_KEYS:
        origin = rule.origins.get(f"{where[0]}.{where[1]}")
    if origin is None and where:
        origin = rule.origins.get(str(where[0]))
    if origin is None or origin in shipped:
        return rule.path
    return origin


# -- rules files ----------------------------------------------------------------------------


def _read_rules_file(file: str) -> tuple[tuple[Any, ...], list[RuleIssue]]:
    """A rules file's entries, or the issue that stops it being read."""
    try:
        text = Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        return (), [
            RuleIssue(
                file, "rules file does not exist", "correct the path, or mount the file there"
            )
        ]
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return (), [
            RuleIssue(
                file, f"cannot read the rules file: {reason}", "make it a readable UTF-8 file"
            )
        ]
    try:
        document = yaml.load(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else file
        message = f"YAML syntax error: {exc.problem}"
        return (), [
            RuleIssue(at, message, "fix the YAML there (indentation, quotes, a missing colon)")
        ]
    except yaml.YAMLError as exc:
        return (), [RuleIssue(file, f"YAML error: {type(exc).__name__}", "fix the file's YAML")]
    return _document_entries(file, document)


def _document_entries(file: str, document: Any) -> tuple[tuple[Any, ...], list[RuleIssue]]:
    if document is None:
        return (), []  # an empty file: no rules
    if not isinstance(document, dict):
        message = f"expected a mapping with a rules list, got {kind_of(document)}"
        return (), [
            RuleIssue(file, message, "start the file with rules: and list the rules below it")
        ]
    issues = [_unknown_key(file, key) for key in document if key != "rules"]
    entries = document.get("rules")
    if entries is None:
        return (), issues
    if not isinstance(entries, list):
        message = f"expected a list of rules, got {kind_of(entries)}"
        return (), [
            *issues,
            RuleIssue(f"{file}: rules", message, "list the rules, one '- name: ...' each"),
        ]
    return tuple(entries), issues


def _unknown_key(file: str, key: Any) -> RuleIssue:
    fix = "a rules file holds one key, rules: a list of rules"
    if key == "groups":
        fix += " (not Prometheus' groups: list the rules directly under rules:)"
    return RuleIssue(f"{file}: {key}", f"unknown key {key!r}", fix)
