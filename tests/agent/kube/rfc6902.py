"""A small RFC 6902 apply written apart from the product's, so a test of the webhook's patch
does not check the product against itself: add, remove and replace over JSON Pointers
(RFC 6901), with the spec's rules for "-" and for adding into a list by index."""

from __future__ import annotations

import copy
from typing import Any


def apply(document: Any, patch: list[dict[str, Any]]) -> Any:
    result = copy.deepcopy(document)
    for operation in patch:
        result = _apply_one(result, operation)
    return result


def _apply_one(document: Any, operation: dict[str, Any]) -> Any:
    op, path = operation["op"], operation["path"]
    if path == "":
        if op in ("add", "replace"):
            return copy.deepcopy(operation["value"])
        raise ValueError(f"cannot {op} the whole document")
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]
    parent = document
    for token in tokens[:-1]:
        parent = parent[_index(parent, token, for_add=False)]
    last = tokens[-1]
    if op == "add":
        if isinstance(parent, list):
            parent.insert(_index(parent, last, for_add=True), copy.deepcopy(operation["value"]))
        else:
            parent[last] = copy.deepcopy(operation["value"])
    elif op == "remove":
        del parent[_index(parent, last, for_add=False)]
    elif op == "replace":
        # _index raises when the target does not exist, as replace requires.
        parent[_index(parent, last, for_add=False)] = copy.deepcopy(operation["value"])
    else:
        raise ValueError(f"op {op!r} is not used by the injector")
    return document


def _index(container: Any, token: str, *, for_add: bool) -> Any:
    if not isinstance(container, list):
        if not for_add and token not in container:
            raise KeyError(token)
        return token
    if token == "-" and for_add:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise ValueError(f"bad array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not for_add):
        raise IndexError(token)
    return index
