"""The agent's configuration: YAML file, environment overrides, command-line overrides.

Layers, later ones winning key by key: the YAML file, then ``SEMHEALTH_<SECTION>__<KEY>``
environment variables (``__`` nests, values read as YAML), then command-line overrides
(``{"upstream.url": ...}``). The merged document is checked against
``config.schema.json`` (shape), built into frozen dataclasses and checked again by their
``validate()`` (meaning). Every issue found is reported at once, each with the setting's
path, where its value came from (``FILE:LINE:COL``, ``$VARIABLE`` or ``command line``) and
a fix; ``load_config`` raises them together as one ``ConfigError``.

This module is the only place that reads the environment; the rest of the agent gets
values from the ``Config`` it returns.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import orjson
import yaml
from jsonschema import Draft202012Validator, ValidationError  # type: ignore[import-untyped]

from semhealth.agent.errors import ConfigError, ConfigIssue
from semhealth.collectors import config as collectors_config
from semhealth.collectors.config import FRAMINGS, PROVIDERS, Analysis, Extract, Limits, Route
from semhealth.collectors.request import validate_jsonpath

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "ENV_PREFIX",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "TLS",
    "Address",
    "Config",
    "ConfigError",
    "ConfigIssue",
    "Listen",
    "Log",
    "Timeouts",
    "Upstream",
    "check_config_file",
    "default_config",
    "load_config",
    "schema_text",
    "validate_collectors",
]

ENV_PREFIX = "SEMHEALTH_"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")

# Same shape as $defs/address in the schema; the schema rejects the rest before parsing.
_ADDRESS = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+(?:%[0-9A-Za-z._~-]+)?)\]"
    r"|(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)):(?P<port>[0-9]{1,5})"
)
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_ROUTE_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_TLS_FILES = ("ca_file", "client_cert", "client_key")

_D = TypeVar("_D", bound="DataclassInstance")
_Path = tuple[Any, ...]  # keys and list indices from the document root


# -- the dataclasses ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    """A listening address; ``host`` holds an IPv6 address without its brackets."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address | None:
        """Read ``HOST:PORT`` or ``[IPV6]:PORT``; None when ``text`` has neither form."""
        found = _ADDRESS.fullmatch(text)
        if found is None:
            return None
        return cls(host=found["v6"] or found["host"], port=int(found["port"]))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def validate(self) -> list[ConfigIssue]:
        issues = _host_issues(self.host)
        if not 0 <= self.port <= 65535:
            issues.append(
                ConfigIssue(
                    "",
                    f"port {self.port} is out of range",
                    "use a port from 1 to 65535 (0 lets the system pick one)",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class TLS:
    verify: bool = True  # verify the upstream's certificate
    ca_file: str | None = None  # PEM bundle to trust instead of the system store
    client_cert: str | None = None  # PEM client certificate for mutual TLS ...
    client_key: str | None = None  # ... and its key: both or neither

    def validate(self) -> list[ConfigIssue]:
        issues = [issue for name in _TLS_FILES for issue in _file_issues(name, getattr(self, name))]
        if self.client_cert is not None and self.client_key is None:
            issues.append(
                ConfigIssue(
                    "client_key",
                    "client_cert is set without client_key",
                    "set client_key to the certificate's private key file, or remove client_cert",
                )
            )
        if self.client_key is not None and self.client_cert is None:
            issues.append(
                ConfigIssue(
                    "client_cert",
                    "client_key is set without client_cert",
                    "set client_cert to the certificate file, or remove client_key",
                )
            )
        if not self.verify and self.ca_file is not None:
            issues.append(
                ConfigIssue(
                    "ca_file",
                    "ca_file is ignored because verify is false",
                    "remove ca_file, or set verify: true",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """Upstream timeouts in seconds; ``total_s`` None means unlimited."""

    connect_s: float = 10  # TCP and TLS connect
    read_s: float = 300  # longest silence between two upstream reads: streams can be slow
    total_s: float | None = None  # whole exchange; long streams are normal

    def validate(self) -> list[ConfigIssue]:
        issues = _positive("connect_s", self.connect_s) + _positive("read_s", self.read_s)
        if self.total_s is not None:
            issues += _positive("total_s", self.total_s)
            if 0 < self.total_s < self.connect_s:
                issues.append(
                    ConfigIssue(
                        "total_s",
                        f"total_s ({self.total_s:g} s) is shorter than connect_s"
                        f" ({self.connect_s:g} s)",
                        "raise total_s, or set it to null for no limit",
                    )
                )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Upstream:
    url: str | None = None  # required: the file, $SEMHEALTH_UPSTREAM__URL or --upstream
    tls: TLS = field(default_factory=TLS)
    timeouts: Timeouts = field(default_factory=Timeouts)

    def validate(self) -> list[ConfigIssue]:
        issues = _url_issues(self.url)
        issues += _under("tls", self.tls.validate())
        issues += _under("timeouts", self.timeouts.validate())
        plain = self.url is not None and self.url.lower().startswith("http://")
        if plain and any(getattr(self.tls, name) is not None for name in _TLS_FILES):
            # Someone who configured certificates expects TLS; plain text would surprise them.
            issues.append(
                ConfigIssue(
                    "tls",
                    "tls files are set but upstream.url uses http://, so they have no effect",
                    "use an https:// URL, or remove the tls files",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Listen:
    proxy: Address = field(default_factory=lambda: Address(host="0.0.0.0", port=8080))
    admin: Address = field(default_factory=lambda: Address(host="127.0.0.1", port=9464))

    def validate(self) -> list[ConfigIssue]:
        issues = _under("proxy", self.proxy.validate()) + _under("admin", self.admin.validate())
        same_host = self.proxy.host == self.admin.host or bool(
            {self.proxy.host, self.admin.host} & _WILDCARD_HOSTS
        )
        if self.proxy.port == self.admin.port != 0 and same_host:
            issues.append(
                ConfigIssue(
                    "admin",
                    f"admin ({self.admin}) and proxy ({self.proxy}) use the same port",
                    "give listen.admin a port of its own",
                )
            )
        return issues


@dataclass(frozen=True, slots=True, kw_only=True)
class Log:
    level: str = "info"  # one of LOG_LEVELS
    format: str = "text"  # one of LOG_FORMATS

    def validate(self) -> list[ConfigIssue]:
        return _choice("level", self.level, LOG_LEVELS) + _choice(
            "format", self.format, LOG_FORMATS
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    upstream: Upstream = field(default_factory=Upstream)
    listen: Listen = field(default_factory=Listen)
    collectors: collectors_config.Config = field(default_factory=collectors_config.default_config)
    log: Log = field(default_factory=Log)

    def validate(self) -> list[ConfigIssue]:
        return (
            _under("upstream", self.upstream.validate())
            + _under("listen", self.listen.validate())
            + validate_collectors(self.collectors)
            + _under("log", self.log.validate())
        )


def default_config() -> Config:
    """The configuration with every default; not valid until ``upstream.url`` is set."""
    return Config()


def validate_collectors(config: collectors_config.Config) -> list[ConfigIssue]:
    """Check the meaning of ``routes``, ``limits`` and ``analysis`` (paths as in YAML)."""
    return (
        _route_issues(list(enumerate(config.routes)))
        + _under("limits", _limits_issues(config.limits))
        + _under("analysis", _analysis_issues(config.analysis))
    )


# -- what validate() checks -----------------------------------------------------------------


def _under(prefix: str, issues: Iterable[ConfigIssue]) -> list[ConfigIssue]:
    """Re-root issues found by a nested config under its key in the parent."""
    out = []
    for issue in issues:
        joiner = "" if not issue.path or issue.path.startswith("[") else "."
        path = f"{prefix}{joiner}{issue.path}" if issue.path else prefix
        out.append(replace(issue, path=path))
    return out


def _positive(name: str, value: float) -> list[ConfigIssue]:
    if value > 0:
        return []
    return [
        ConfigIssue(
            name, f"{name} must be greater than 0, not {value:g}", "use a number of seconds above 0"
        )
    ]


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> list[ConfigIssue]:
    if value in allowed:
        return []
    return [ConfigIssue(name, f"unknown {name} {_show(value)}", _one_of(value, allowed))]


def _file_issues(name: str, path: str | None) -> list[ConfigIssue]:
    if path is None:
        return []
    if not os.path.isfile(path):
        return [
            ConfigIssue(
                name,
                f"{name} file {path!r} does not exist",
                "correct the path, or mount the file there",
            )
        ]
    if not os.access(path, os.R_OK):
        return [
            ConfigIssue(
                name,
                f"{name} file {path!r} is not readable",
                "make the file readable by the agent's user",
            )
        ]
    return []


def _url_issues(url: str | None) -> list[ConfigIssue]:
    """URL problems; the URL itself is never echoed, since it may carry credentials."""
    if not url:
        return [ConfigIssue("url", "no upstream URL is set", "set upstream.url or pass --upstream")]
    if "://" not in url:
        return [ConfigIssue("url", "the URL has no scheme", "write it like http://127.0.0.1:8000")]
    parts = urlsplit(url)
    problems: list[tuple[str, str]] = []
    if parts.scheme.lower() not in ("http", "https"):
        problems.append(
            (f"scheme {parts.scheme!r} is not supported", "use an http:// or https:// URL")
        )
    if not parts.hostname:
        problems.append(("the URL has no host", "write it like http://HOST:PORT"))
    if parts.username is not None or parts.password is not None:
        problems.append(
            (
                "the URL carries credentials (user:password@)",
                "remove them; the application's own auth headers pass through unchanged",
            )
        )
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        problems.append(("the URL has an invalid port", "use a port from 1 to 65535"))
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        problems.append(("the URL has a query or fragment", "remove everything from the ? or #"))
    return [ConfigIssue("url", message, fix) for message, fix in problems]


def _host_issues(host: str) -> list[ConfigIssue]:
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return [ConfigIssue("", f"{host!r} is not an IPv6 address", "write it like [::1]:8080")]
        return []
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return [
                ConfigIssue("", f"{host!r} is not an IPv4 address", "write it like 127.0.0.1:8080")
            ]
        return []
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return [
            ConfigIssue("", f"{host!r} is not a valid host name", "use a DNS name or an IP address")
        ]
    return []


def _route_issues(routes: list[tuple[int, Route]]) -> list[ConfigIssue]:
    """``routes`` pairs each route with its index in the document, so paths match the file."""
    issues = [
        issue for index, route in routes for issue in _under(f"routes[{index}]", _one_route(route))
    ]
    first: dict[str, tuple[int, Route]] = {}
    for index, route in routes:
        if route.name not in first:
            first[route.name] = (index, route)
            continue
        other_index, other = first[route.name]
        # A shared name is one label over several path patterns (TGI's /generate and
        # /generate_stream); it is only a mistake when the routes read traffic differently.
        if replace(route, match=other.match) != other:
            issues.append(
                ConfigIssue(
                    f"routes[{index}].name",
                    f"route name {route.name!r} is already used by routes[{other_index}],"
                    " which reads traffic differently",
                    "give this route a name of its own; routes may share a name only with the"
                    " same provider, framing and extract",
                )
            )
    return issues


def _one_route(route: Route) -> list[ConfigIssue]:
    issues = []
    if not _ROUTE_NAME.fullmatch(route.name):
        issues.append(
            ConfigIssue(
                "name",
                f"{route.name!r} is not a valid route name",
                "use letters, digits and _, not starting with a digit, e.g. chat_completions",
            )
        )
    if not route.match:
        issues.append(
            ConfigIssue("match", "match is empty", "write a path glob, e.g. */chat/completions")
        )
    elif route.match[0] not in "/*?[":
        issues.append(
            ConfigIssue(
                "match",
                f"match {route.match!r} can never match: request paths start with /",
                f"start it with / or *, e.g. */{route.match}",
            )
        )
    issues += _choice("provider", route.provider, PROVIDERS)
    issues += _choice("framing", route.framing, FRAMINGS)
    return issues + _under("extract", _extract_issues(route.extract))


def _extract_issues(extract: Extract) -> list[ConfigIssue]:
    exprs = [("query", extract.query)] + [
        (f"context[{i}]", expr) for i, expr in enumerate(extract.context)
    ]
    issues = []
    for path, expr in exprs:
        problem = None if expr is None else validate_jsonpath(expr)
        if problem is not None:
            issues.append(
                ConfigIssue(path, problem, "write a JSONPath such as $.messages[-1].content")
            )
    return issues


def _limits_issues(limits: Limits) -> list[ConfigIssue]:
    issues = [
        ConfigIssue(
            f.name, f"{f.name} must be at least 1, not {value}", "use a whole number of at least 1"
        )
        for f in fields(limits)
        if (value := getattr(limits, f.name)) < 1
    ]
    if limits.max_frame_bytes > limits.max_response_bytes:
        issues.append(
            ConfigIssue(
                "max_frame_bytes",
                f"max_frame_bytes ({limits.max_frame_bytes}) is larger than max_response_bytes"
                f" ({limits.max_response_bytes})",
                f"set max_frame_bytes to at most {limits.max_response_bytes},"
                " or raise max_response_bytes",
            )
        )
    return issues


def _analysis_issues(analysis: Analysis) -> list[ConfigIssue]:
    issues = _positive("stall_threshold_s", analysis.stall_threshold_s)
    if analysis.long_context_tokens < 1:
        issues.append(
            ConfigIssue(
                "long_context_tokens",
                f"long_context_tokens must be at least 1, not {analysis.long_context_tokens}",
                "use a whole number of tokens, e.g. 4000",
            )
        )
    return issues


# -- loading --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a value came from; line and column are 1-based and only known for the file."""

    source: str
    line: int | None = None
    column: int | None = None


@dataclass(slots=True)
class _Document:
    """The merged document while layers are applied, with the origin of each value."""

    data: dict[str, Any] = field(default_factory=dict)
    origins: dict[_Path, _Origin] = field(default_factory=dict)
    issues: list[ConfigIssue] = field(default_factory=list)

    def set(self, path: _Path, value: Any, origin: _Origin) -> None:
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

    def _forget(self, prefix: _Path) -> None:
        for path in [p for p in self.origins if p[: len(prefix)] == prefix]:
            del self.origins[path]

    def locate(self, path: _Path, issue: ConfigIssue) -> ConfigIssue:
        """Give ``issue`` the origin of ``path`` or of its nearest ancestor that has one."""
        for depth in range(len(path), -1, -1):
            origin = self.origins.get(path[:depth])
            if origin is not None:
                return replace(issue, source=origin.source, line=origin.line, column=origin.column)
        return issue


def schema_text() -> str:
    """The JSON Schema of the configuration file, as shipped in the package."""
    return resources.files("semhealth.agent").joinpath("config.schema.json").read_text("utf-8")


def load_config(
    path: str | None, env: Mapping[str, str], overrides: Mapping[str, object]
) -> Config:
    """Load, merge and validate the configuration; raise ``ConfigError`` listing every issue.

    ``path`` None means no file. ``env`` is the process environment (only ``SEMHEALTH_*``
    is read). ``overrides`` are command-line values keyed by dotted path
    (``"upstream.url"``); a None value means the flag was not given.
    """
    config, issues = _load(path, env, overrides)
    if issues:
        raise ConfigError(issues)
    return config


def check_config_file(path: str, env: Mapping[str, str]) -> list[ConfigIssue]:
    """Every issue of ``path`` merged with ``env``, for ``semhealth config check``."""
    return _load(path, env, {})[1]


def _load(
    path: str | None, env: Mapping[str, str], overrides: Mapping[str, object]
) -> tuple[Config, list[ConfigIssue]]:
    schema: dict[str, Any] = orjson.loads(schema_text())
    doc = _Document() if path is None else _read_file(path)
    # An unreadable file leaves nothing worth judging the meaning of.
    bad: list[_Path] = [()] if doc.issues else []
    _apply_env(doc, env, schema)
    _apply_overrides(doc, overrides, schema)
    for where, bad_path, issue in _schema_issues(doc.data, schema):
        doc.issues.append(doc.locate(where, issue))
        bad.append(bad_path)
    config, routes = _build(_without(doc.data, bad))
    meaning = (
        _under("upstream", config.upstream.validate())
        + _under("listen", config.listen.validate())
        + _route_issues(routes)
        + _under("limits", _limits_issues(config.collectors.limits))
        + _under("analysis", _analysis_issues(config.collectors.analysis))
        + _under("log", config.log.validate())
    )
    for issue in meaning:
        where = _parse_path(issue.path)
        # A value the schema rejected was replaced by its default; judging that default
        # would only add noise next to the schema's own issue.
        if not any(_overlaps(where, b) for b in bad):
            doc.issues.append(doc.locate(where, issue))
    issues = sorted(doc.issues, key=lambda i: (i.line is None, i.line or 0, i.column or 0))
    return config, issues


def _read_file(path: str) -> _Document:
    doc = _Document(origins={(): _Origin(path)})
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
                f"the file must be a mapping of sections, not {_kind_of(data)}",
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


def _parse_yaml(text: str, path: str, doc: _Document) -> Any:
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


def _node_problems(node: yaml.Node, path: _Path, source: str, above: set[int]) -> list[ConfigIssue]:
    """Duplicate keys (YAML would keep the last silently) and self-referencing aliases."""
    if id(node) in above:
        return [
            _at(
                node,
                source,
                ConfigIssue(
                    _dotted(path),
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
                            _dotted(path),
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


def _record_marks(node: yaml.Node, path: _Path, source: str, origins: dict[_Path, _Origin]) -> None:
    """Map each key (and list item) to its mark; a later duplicate wins, as in the data."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                child = (*path, key.value)
                origins[child] = _Origin(source, key.start_mark.line + 1, key.start_mark.column + 1)
                _record_marks(value, child, source, origins)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            origins[(*path, index)] = _Origin(
                source, item.start_mark.line + 1, item.start_mark.column + 1
            )
            _record_marks(item, (*path, index), source, origins)


def _resolve_files(data: dict[str, Any], base: str) -> None:
    """Relative TLS file paths in the file are read from the file's folder, like Prometheus."""
    upstream = data.get("upstream")
    tls = upstream.get("tls") if isinstance(upstream, dict) else None
    if not isinstance(tls, dict):
        return
    for name in _TLS_FILES:
        value = tls.get(name)
        if isinstance(value, str) and value and not os.path.isabs(value):
            tls[name] = os.path.join(base, value)


def _apply_env(doc: _Document, env: Mapping[str, str], schema: dict[str, Any]) -> None:
    names = {_env_name(path): path for path in _setting_paths(schema)}
    given = [name for name in env if name.startswith(ENV_PREFIX)]
    for name in sorted(given, key=lambda n: (n.count("__"), n)):  # deeper settings win
        origin = _Origin(f"${name}")
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
        value = _env_value(env[name], _subschema(schema, path))
        if isinstance(value, ConfigIssue):
            doc.issues.append(replace(value, path=_dotted(path), source=origin.source))
            continue
        doc.set(path, value, origin)


def _env_value(text: str, schema: dict[str, Any] | None) -> Any:
    """Read ``text`` as YAML, except where a string is wanted and YAML would read something else."""
    takes_string = schema is not None and "string" in _types(schema)
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


def _apply_overrides(
    doc: _Document, overrides: Mapping[str, object], schema: dict[str, Any]
) -> None:
    known = [_dotted(path) for path in _setting_paths(schema)]
    origin = _Origin("command line")
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


def _setting_paths(
    schema: dict[str, Any], node: dict[str, Any] | None = None, path: _Path = ()
) -> list[_Path]:
    """Every settable path: each object property, not descending into lists."""
    node = _resolve(schema, schema if node is None else node)
    paths: list[_Path] = []
    for name, child in node.get("properties", {}).items():
        paths.append((*path, name))
        paths += _setting_paths(schema, child, (*path, name))
    return paths


def _env_name(path: _Path) -> str:
    return ENV_PREFIX + "__".join(str(part).upper() for part in path)


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its local ``$ref`` folded in (the node's own keywords win)."""
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return node
    target: dict[str, Any] = schema["$defs"][ref.removeprefix("#/$defs/")]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def _subschema(schema: dict[str, Any], path: _Path) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in path:
        node = _resolve(schema, node) if node is not None else None
        if node is None:
            return None
        node = node.get("items") if isinstance(part, int) else node.get("properties", {}).get(part)
    return _resolve(schema, node) if node is not None else None


def _types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [str(t) for t in declared]
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return ["string"]
    return []


# -- schema errors, in words ----------------------------------------------------------------


def _schema_issues(
    data: dict[str, Any], schema: dict[str, Any]
) -> list[tuple[_Path, _Path, ConfigIssue]]:
    """(where it is in the file, what to drop before building, the issue) per schema error."""
    out = []
    for error in Draft202012Validator(schema).iter_errors(data):
        out += _describe(error, schema)
    return out


def _describe(
    error: ValidationError, schema: dict[str, Any]
) -> list[tuple[_Path, _Path, ConfigIssue]]:
    path: _Path = tuple(error.absolute_path)
    where = _dotted(path)
    value = error.instance
    kind = error.validator
    if kind == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        return [
            (
                (*path, key),
                (*path, key),
                ConfigIssue(where, f"{_show(key)} is not a setting", _suggest(str(key), allowed)),
            )
            for key in value
            if key not in allowed
        ]
    if kind == "required":
        prop = _subschema(schema, path) or {}
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
    node = {**(_subschema(schema, path) or {}), **error.schema}
    message, fix = _words(kind, error.validator_value, value, node, path) or (
        error.message,
        "see `semhealth config schema` for what this setting accepts",
    )
    return [(path, path, ConfigIssue(where, message, fix))]


def _words(
    kind: Any, expected: Any, value: Any, node: dict[str, Any], path: _Path
) -> tuple[str, str] | None:
    """Message and fix for the schema keywords this schema uses; None for any other."""
    if kind == "type":
        wanted = _type_words(expected)
        if "object" in _types(node) and value is None:
            return (
                f"expected {wanted}, got null",
                "indent its settings below it, or remove the empty key",
            )
        return (
            f"expected {wanted}, got {_kind_of(value)}",
            f"set it to {wanted}{_example(node, ', e.g. ')}",
        )
    if kind == "enum":
        name = next((p for p in reversed(path) if isinstance(p, str)), "value")
        return f"unknown {name} {_show(value)}", _one_of(
            str(value), tuple(str(v) for v in expected)
        )
    if kind == "pattern":
        return (
            f"{_show(value)} is not a valid {node.get('title', 'value')}",
            f"write it like {' or '.join(map(str, node.get('examples', [])))}",
        )
    if kind == "exclusiveMinimum":
        return (
            f"must be greater than {expected}, got {_show(value)}",
            f"use a number above {expected}",
        )
    if kind == "minimum":
        return (
            f"must be at least {expected}, got {_show(value)}",
            f"use a number of at least {expected}",
        )
    if kind == "minLength":
        return "must not be empty", f"set a value{_example(node, ', e.g. ')}"
    return None


def _suggest(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"remove it; the settings here are: {', '.join(allowed)}"


def _one_of(value: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(value.lower(), allowed, n=1)
    listed = ", ".join(allowed)
    return f"did you mean '{close[0]}'? (one of: {listed})" if close else f"use one of: {listed}"


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


def _show(value: Any) -> str:
    """A short rendering of a config value (config, never traffic, so it may be shown)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"{value:g}" if isinstance(value, float) else str(value)
    text = str(value)
    # repr escapes newlines, so one issue always stays on one line.
    return repr(text[:60] + "…") if len(text) > 60 else repr(text)


def _kind_of(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {_show(value)}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"the number {_show(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if value is None or isinstance(value, bool):
        return _show(value)
    return f"a {type(value).__name__}"


# -- paths ----------------------------------------------------------------------------------


def _dotted(path: _Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _parse_path(text: str) -> _Path:
    return tuple(name if index == "" else int(index) for name, index in _PATH_PART.findall(text))


def _overlaps(a: _Path, b: _Path) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]


# -- building the dataclasses ---------------------------------------------------------------


def _without(data: dict[str, Any], bad: list[_Path]) -> dict[str, Any]:
    """A copy of ``data`` without the values the schema rejected, so defaults take their place.

    A rejected list item becomes None rather than disappearing, so the indices of
    the items after it still match the file.
    """
    clean = copy.deepcopy(data)
    for path in bad:
        if not path:
            return {}
        parent: Any = clean
        for part in path[:-1]:
            parent = _child(parent, part)
        last = path[-1]
        if isinstance(parent, dict):
            parent.pop(last, None)
        elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            parent[last] = None
    return clean


def _child(container: Any, part: Any) -> Any:
    if isinstance(container, dict):
        return container.get(part)
    if isinstance(container, list) and isinstance(part, int) and part < len(container):
        return container[part]
    return None


def _section(data: Any, key: str) -> dict[str, Any]:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _fill(default: _D, data: Mapping[str, Any], **nested: Any) -> _D:
    """``default`` with the keys of ``data`` that are its fields, and the ``nested`` ones."""
    names = {f.name for f in fields(default)} - set(nested)
    return replace(default, **{k: v for k, v in data.items() if k in names}, **nested)


def _build(data: dict[str, Any]) -> tuple[Config, list[tuple[int, Route]]]:
    """The dataclasses from a schema-clean document, with routes paired with their indices."""
    upstream = _section(data, "upstream")
    listen = _section(data, "listen")
    routes = [
        (index, _build_route(item))
        for index, item in enumerate(data.get("routes", []))
        if isinstance(item, dict) and "name" in item and "match" in item
    ]
    defaults = collectors_config.default_config()
    collectors = collectors_config.Config(
        routes=tuple(route for _, route in routes) if "routes" in data else defaults.routes,
        limits=_fill(defaults.limits, _section(data, "limits")),
        analysis=_fill(defaults.analysis, _section(data, "analysis")),
    )
    config = Config(
        upstream=_fill(
            Upstream(),
            upstream,
            tls=_fill(TLS(), _section(upstream, "tls")),
            timeouts=_fill(Timeouts(), _section(upstream, "timeouts")),
        ),
        listen=_fill(Listen(), {}, **_addresses(listen)),
        collectors=collectors,
        log=_fill(Log(), _section(data, "log")),
    )
    return config, routes if "routes" in data else []


def _addresses(listen: dict[str, Any]) -> dict[str, Address]:
    # The schema's pattern is Address.parse's, so only a defaulted value is ever skipped here.
    parsed = {name: Address.parse(text) for name, text in listen.items() if isinstance(text, str)}
    return {name: address for name, address in parsed.items() if address is not None}


def _build_route(item: dict[str, Any]) -> Route:
    extract = _section(item, "extract")
    return Route(
        name=item["name"],
        match=item["match"],
        provider=item.get("provider", "auto"),
        framing=item.get("framing", "auto"),
        extract=Extract(query=extract.get("query"), context=tuple(extract.get("context", ()))),
    )
