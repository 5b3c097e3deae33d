"""The ``SEMHEALTH_*`` environment layer and the command-line layer of the configuration.

``SEMHEALTH_<SECTION>__<KEY>`` names any setting outside a list (``__`` nests); its value
is read as YAML, except where the schema wants a string. Command-line overrides are keyed
by dotted path (``upstream.url``). Unknown names are issues with the closest known name.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from semhealth.agent.config.document import Document, Origin, Path, dotted
from semhealth.agent.config.model import ENV_PREFIX
from semhealth.agent.config.schema import setting_paths, subschema, types
from semhealth.agent.errors import ConfigIssue


def apply_env(doc: Document, env: Mapping[str, str], schema: dict[str, Any]) -> None:
    names = {env_name(path): path for path in setting_paths(schema)}
    given = [name for name in env if name.startswith(ENV_PREFIX)]
    for name in sorted(given, key=lambda n: (n.count("__"), n)):  # deeper settings win
        origin = Origin(f"${name}")
        path = names.get(name)
        if path is None:
            guess = name.removeprefix(ENV_PREFIX).lower().replace("__", ".")
            close = difflib.get_close_matches(name, names, n=1)
            fix = (
                f"did you mean {close[0]}?"
                if close
                else f"remove it; settings are named like {ENV_PREFIX}UPSTREAM__URL"
            )
            doc.issues.append(ConfigIssue(guess, "unknown setting", fix, source=origin.source))
            continue
        value = _env_value(env[name], subschema(schema, path))
        if isinstance(value, ConfigIssue):
            doc.issues.append(replace(value, path=dotted(path), source=origin.source))
            continue
        doc.set(path, value, origin)


def env_name(path: Path) -> str:
    return ENV_PREFIX + "__".join(str(part).upper() for part in path)


def _env_value(text: str, schema: dict[str, Any] | None) -> Any:
    """Read ``text`` as YAML, except where a string is wanted and YAML would read something else."""
    takes_string = schema is not None and "string" in types(schema)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        if takes_string:
            return text
        problem = getattr(exc, "problem", None) or type(exc).__name__
        return ConfigIssue(
            "",
            f"the value is not valid YAML: {problem}",
            "quote it, or write a YAML or JSON list or mapping",
        )
    if takes_string and value is not None and not isinstance(value, str):
        return text  # "[::1]:8080" or "on" are meant as written
    return value


def apply_overrides(doc: Document, overrides: Mapping[str, object], schema: dict[str, Any]) -> None:
    known = [dotted(path) for path in setting_paths(schema)]
    origin = Origin("command line")
    for key in sorted(overrides, key=lambda k: (k.count("."), k)):
        value = overrides[key]
        if value is None:
            continue
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            fix = (
                f"did you mean {close[0]}?"
                if close
                else "use a setting's dotted path, e.g. upstream.url"
            )
            doc.issues.append(ConfigIssue(key, "unknown setting", fix, source=origin.source))
            continue
        doc.set(tuple(key.split(".")), value, origin)
