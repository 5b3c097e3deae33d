"""``semhealth inject``'s document handling: multi-document YAML in, the same out, with the
sidecar added to every Pod template that asks for it (``--uninject``: removed).

Documents are split on their ``---`` markers and each one injection does not change is
written back as its original text, comments and all; a changed one is written as YAML
with its keys in their original order. Pod templates are found in every workload kind
(``POD_TEMPLATE_PATHS``), in a Pod itself, and in the items of a ``List``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from semhealth.agent.kube.errors import InjectionError, ManifestError
from semhealth.agent.kube.patch import apply_patch, plan_injection, uninject_template
from semhealth.agent.kube.settings import Settings

# Where each kind keeps its Pod template (a Pod is its own template).
POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "PodTemplate": ("template",),
}
_DOCUMENT_START = re.compile(r"^---(?=\s|$)", re.MULTILINE)

Rewrite = Callable[[dict[str, Any]], dict[str, Any] | None]


@dataclass(frozen=True)
class Outcome:
    """What happened to one Pod template, for the summary on stderr."""

    where: str
    changed: bool


def inject_text(text: str, settings: Settings, *, source: str = "-") -> tuple[str, list[Outcome]]:
    """``text`` with the sidecar injected where asked (see ``plan_injection``)."""

    def rewrite(template: dict[str, Any]) -> dict[str, Any] | None:
        plan = plan_injection(template, settings)
        return apply_patch(template, plan.operations) if plan.inject else None

    return _rewrite_text(text, rewrite, source)


def uninject_text(text: str, *, source: str = "-") -> tuple[str, list[Outcome]]:
    """``text`` without what injection added (templates it did not inject are unchanged)."""
    return _rewrite_text(text, uninject_template, source)


def _rewrite_text(text: str, rewrite: Rewrite, source: str) -> tuple[str, list[Outcome]]:
    outcomes: list[Outcome] = []
    pieces: list[str] = []
    number = 0  # as YAML counts: comments before the first --- are no document
    for marker, body in _split_documents(text):
        try:
            document = yaml.safe_load(body)
        except yaml.YAMLError as exc:
            raise ManifestError(f"{source}: document {number + 1} is not YAML: {exc}") from exc
        number += 1 if marker or document is not None else 0
        changed = _rewrite_document(document, rewrite, f"{source}#{number}", outcomes)
        if changed is None:
            pieces.append(marker + body)
        else:
            pieces.append((marker and "---\n") + yaml.safe_dump(changed, sort_keys=False))
    return "".join(pieces), outcomes


def _split_documents(text: str) -> Iterator[tuple[str, str]]:
    """(the ``---`` marker line's start, the rest) per document; YAML allows a document
    marker only at the start of a line, so this split is exact."""
    starts = [match.start() for match in _DOCUMENT_START.finditer(text)]
    bounds = [0, *starts, len(text)]
    for begin, end in itertools.pairwise(bounds):
        chunk = text[begin:end]
        if begin == 0 and not chunk and starts:
            continue  # the text starts with a marker
        marker = "---" if chunk.startswith("---") else ""
        yield marker, chunk[len(marker) :]


def _rewrite_document(
    document: Any, rewrite: Rewrite, where: str, outcomes: list[Outcome]
) -> Any | None:
    """The document rewritten, or None when nothing in it changed."""
    if not isinstance(document, dict):
        return None
    kind = document.get("kind")
    if kind == "List" or (isinstance(kind, str) and kind.endswith("List")):
        return _rewrite_list(document, rewrite, where, outcomes)
    if kind not in POD_TEMPLATE_PATHS:
        return None
    name = (document.get("metadata") or {}).get("name", "?")
    label = f"{where} {kind}/{name}"
    path = POD_TEMPLATE_PATHS[kind]
    template = _get(document, path)
    if not isinstance(template, dict):
        return None
    try:
        rewritten = rewrite(template)
    except InjectionError as exc:
        raise InjectionError(f"{label}: {exc}") from exc
    outcomes.append(Outcome(label, rewritten is not None))
    if rewritten is None:
        return None
    return _set(document, path, rewritten)


def _rewrite_list(
    document: dict[str, Any], rewrite: Rewrite, where: str, outcomes: list[Outcome]
) -> dict[str, Any] | None:
    items = document.get("items")
    if not isinstance(items, list):
        return None
    rewritten = [
        _rewrite_document(item, rewrite, f"{where}.items[{i}]", outcomes)
        for i, item in enumerate(items)
    ]
    if all(item is None for item in rewritten):
        return None
    new_items = [new if new is not None else old for old, new in zip(items, rewritten, strict=True)]
    return {**document, "items": new_items}


def _get(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = document
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _set(document: dict[str, Any], path: tuple[str, ...], value: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``document`` with ``value`` at ``path`` (copies only along the path)."""
    if not path:
        return value
    head, *rest = path
    return {**document, head: _set(document[head], tuple(rest), value)}
