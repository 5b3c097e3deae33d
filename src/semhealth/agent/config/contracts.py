"""Route contracts: a JSON Schema file per route whose rules express what a valid answer means.

A contract is plain JSON Schema (``if``/``then``/``else``, ``dependentSchemas``,
``const``...), written as JSON or YAML, e.g. "risk_level is high exactly when
amount > 1,000,000". Files are read once at start-up; a bad one stops start-up
with a message naming the route. ``attach_contracts`` hands the loaded schemas to
the collectors, which check every structured answer where its record is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import orjson
import yaml

from semhealth.collectors.config import Config, Route


class ContractError(ValueError):
    """A contract file that cannot be used; the message says why, without its content."""


def load_contract(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ContractError(f"cannot read {path!r}: {exc.strerror}") from exc
    if not path.endswith(".json"):
        # The limits every YAML the agent reads passes before it is expanded (alias bombs).
        # Imported here: the configuration checks load contracts, and _config_yaml is theirs.
        from semhealth.agent.config.limits import structure_issue

        issue = structure_issue(raw.decode("utf-8", "replace"), path)
        if issue is not None:
            raise ContractError(f"{path!r}: {issue.message}")
    try:
        schema = orjson.loads(raw) if path.endswith(".json") else yaml.safe_load(raw)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise ContractError(f"{path!r} is not valid {_format(path)}") from exc
    if not isinstance(schema, dict):
        raise ContractError(f"{path!r} must hold a JSON Schema object")
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise ContractError(f"{path!r} is not a valid JSON Schema (at {where})") from exc
    return schema


def load_contracts(routes: Iterable[Route]) -> dict[str, dict[str, Any]]:
    """Route name -> contract schema, for every route that names a contract file."""
    return {route.name: load_contract(route.contract) for route in routes if route.contract}


def attach_contracts(config: Config) -> Config:
    """``config`` with each route's contract file loaded into its ``contract_schema``.

    Start-up only: it reads the files, and raises ``ContractError`` for one that cannot be
    used (the agent's configuration checks have reported that already, by key).
    """
    routes = tuple(
        dataclasses.replace(route, contract_schema=load_contract(route.contract))
        if route.contract
        else route
        for route in config.routes
    )
    return dataclasses.replace(config, routes=routes)


def _format(path: str) -> str:
    return "JSON" if path.endswith(".json") else "YAML"
