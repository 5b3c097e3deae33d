"""What the configuration's ``validate()`` methods check: meaning, after the schema's shape.

Each check returns ``ConfigIssue`` values whose path is relative to the object checked;
``under`` re-roots them below the parent's key, so a nested config never needs to know
where it sits in the file.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import fields, replace
from typing import Any
from urllib.parse import urlsplit

from semhealth.agent.config.contracts import ContractError, load_contract
from semhealth.agent.errors import ConfigIssue
from semhealth.agent.wire import MAX_CHUNK_BYTES
from semhealth.collectors import (
    FRAMINGS,
    PROVIDERS,
    Analysis,
    Extract,
    Limits,
    Route,
    validate_jsonpath,
)
from semhealth.common.words import show

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
# OTLP examples by protocol: gRPC takes the collector's address, OTLP/HTTP the full URL.
OTLP_EXAMPLES = {
    "grpc": "http://otel-collector:4317",
    "http/protobuf": "http://otel-collector:4318/v1/metrics",
}

# The OTLP receiver forwards every signal, so its next hop is a base URL (or gRPC address).
FORWARD_EXAMPLES = {
    "grpc": "http://otel-collector:4317",
    "http/protobuf": "http://otel-collector:4318",
}
SIGNAL_PATHS = ("/v1/traces", "/v1/logs", "/v1/metrics")

_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_ROUTE_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")  # gRPC metadata and HTTP/1 agree on this much


# -- shared helpers -------------------------------------------------------------------------


def under(prefix: str, issues: Iterable[ConfigIssue]) -> list[ConfigIssue]:
    """Re-root issues found by a nested config under its key in the parent."""
    out = []
    for issue in issues:
        joiner = "" if not issue.path or issue.path.startswith("[") else "."
        path = f"{prefix}{joiner}{issue.path}" if issue.path else prefix
        out.append(replace(issue, path=path))
    return out


def positive(name: str, value: float) -> list[ConfigIssue]:
    if value > 0:
        return []
    return [
        ConfigIssue(
            name, f"{name} must be greater than 0, not {value:g}", "use a number of seconds above 0"
        )
    ]


def choice(name: str, value: str, allowed: tuple[str, ...]) -> list[ConfigIssue]:
    if value in allowed:
        return []
    return [ConfigIssue(name, f"unknown {name} {show(value)}", one_of(value, allowed))]


def one_of(value: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(value.lower(), allowed, n=1)
    listed = ", ".join(allowed)
    return f"did you mean '{close[0]}'? (one of: {listed})" if close else f"use one of: {listed}"


# -- upstream and listen --------------------------------------------------------------------


def file_issues(name: str, path: str | None) -> list[ConfigIssue]:
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


def url_problems(url: str, *, example: str, credentials_fix: str) -> list[tuple[str, str]]:
    """(message, fix) per problem of an http(s) URL; the URL itself is never echoed,
    since it may carry credentials."""
    if "://" not in url:
        return [("the URL has no scheme", f"write it like {example}")]
    try:
        parts = urlsplit(url)
    except ValueError:  # brackets that do not hold an IPv6 address
        return [
            ("the URL cannot be parsed", "write an IPv6 host in brackets, e.g. http://[::1]:8000")
        ]
    problems: list[tuple[str, str]] = []
    if parts.scheme.lower() not in ("http", "https"):
        problems.append(
            (f"scheme {parts.scheme!r} is not supported", "use an http:// or https:// URL")
        )
    if not parts.hostname:
        problems.append(("the URL has no host", "write it like http://HOST:PORT"))
    if parts.username is not None or parts.password is not None:
        problems.append(("the URL carries credentials (user:password@)", credentials_fix))
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        problems.append(("the URL has an invalid port", "use a port from 1 to 65535"))
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        problems.append(("the URL has a query or fragment", "remove everything from the ? or #"))
    return problems


def upstream_url_issues(url: str | None, *, required: bool = True) -> list[ConfigIssue]:
    """``required`` False: an agent with an OTLP receiver may run without a proxy."""
    if url is None and not required:
        return []
    if not url:
        return [ConfigIssue("url", "no upstream URL is set", "set upstream.url or pass --upstream")]
    problems = url_problems(
        url,
        example="http://127.0.0.1:8000",
        credentials_fix="remove them; the application's own auth headers pass through unchanged",
    )
    return [ConfigIssue("url", message, fix) for message, fix in problems]


def host_issues(host: str) -> list[ConfigIssue]:
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


# -- routes, limits, analysis ---------------------------------------------------------------


def route_issues(routes: list[tuple[int, Route]]) -> list[ConfigIssue]:
    """``routes`` pairs each route with its index in the document, so paths match the file."""
    issues = [
        issue for index, route in routes for issue in under(f"routes[{index}]", _one_route(route))
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
    issues += choice("provider", route.provider, PROVIDERS)
    issues += choice("framing", route.framing, FRAMINGS)
    issues += _contract_issues(route.contract)
    return issues + under("extract", _extract_issues(route.extract))


def _contract_issues(path: str | None) -> list[ConfigIssue]:
    missing = file_issues("contract", path)
    if missing or path is None:
        return missing
    try:
        load_contract(path)
    except ContractError as exc:
        return [
            ConfigIssue("contract", str(exc), "fix the file: it must be one JSON Schema object")
        ]
    return []


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


def limits_issues(limits: Limits) -> list[ConfigIssue]:
    issues = [
        ConfigIssue(
            f.name, f"{f.name} must be at least 1, not {value}", "use a whole number of at least 1"
        )
        for f in fields(limits)
        if (value := getattr(limits, f.name)) < 1
    ]
    if 1 <= limits.tap_queue_bytes < MAX_CHUNK_BYTES:
        issues.append(
            ConfigIssue(
                "tap_queue_bytes",
                f"tap_queue_bytes must be at least {MAX_CHUNK_BYTES}, not {limits.tap_queue_bytes}:"
                f" one upstream read is a chunk of up to {MAX_CHUNK_BYTES} bytes; below that"
                " every such chunk is shed",
                f"use at least {MAX_CHUNK_BYTES}; the default, {Limits().tap_queue_bytes}, holds"
                " many streams' chunks",
            )
        )
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


def analysis_issues(analysis: Analysis) -> list[ConfigIssue]:
    issues = positive("stall_threshold_s", analysis.stall_threshold_s)
    if analysis.long_context_tokens < 1:
        issues.append(
            ConfigIssue(
                "long_context_tokens",
                f"long_context_tokens must be at least 1, not {analysis.long_context_tokens}",
                "use a whole number of tokens, e.g. 4000",
            )
        )
    return issues


# -- relevance ------------------------------------------------------------------------------

# What each pooling that is not mean does with a context's windows: none of them reads top_k.
_POOLING_WITHOUT_TOP_K = {
    "max": "scores a context by its best window alone",
    "softmax": "weighs every window by its similarity",
}


def ignored_top_k(pooling: str, top_k: int) -> list[ConfigIssue]:
    """A warning for a ``top_k`` written under a pooling that never reads it (only mean does)."""
    does = _POOLING_WITHOUT_TOP_K.get(pooling)
    if does is None:
        return []
    return [
        ConfigIssue(
            "top_k",
            f"top_k is set to {top_k}, but pooling {pooling} {does} and never reads it",
            "remove top_k, or set relevance.pooling: mean to average the top_k best windows",
            warning=True,
        )
    ]


# -- telemetry ------------------------------------------------------------------------------


def protocol_issues(protocol: str, allowed: tuple[str, ...]) -> list[ConfigIssue]:
    if protocol == "http/json":
        # A valid OTLP protocol, so "unknown" would mislead: it is one we do not export.
        return [
            ConfigIssue("protocol", "protocol 'http/json' is not supported", "use http/protobuf")
        ]
    return choice("protocol", protocol, allowed)


def endpoint_issues(endpoint: str, protocol: str) -> list[ConfigIssue]:
    """An OTLP endpoint's problems; like the upstream URL, it is never echoed."""
    example = OTLP_EXAMPLES.get(protocol, OTLP_EXAMPLES["grpc"])
    if not endpoint:
        return [
            ConfigIssue("endpoint", "the endpoint is empty", "set a URL, or null for no OTLP push")
        ]
    problems = url_problems(
        endpoint,
        example=example,
        credentials_fix="remove them; send credentials in telemetry.otlp.headers",
    )
    if not problems:
        problems = _endpoint_path_problems(urlsplit(endpoint).path, protocol)
    return [ConfigIssue("endpoint", message, fix) for message, fix in problems]


def _endpoint_path_problems(path: str, protocol: str) -> list[tuple[str, str]]:
    if protocol == "http/protobuf" and not path:
        # OTLP/HTTP posts to the URL as given; a bare host would post metrics to "/".
        return [
            (
                "the URL has no path; OTLP/HTTP posts to the URL as given",
                f"give the full URL, e.g. {OTLP_EXAMPLES['http/protobuf']}",
            )
        ]
    if protocol == "grpc" and path not in ("", "/"):
        # gRPC drops the path; one there usually means an OTLP/HTTP URL under the wrong protocol.
        return [
            (
                "gRPC ignores the URL's path",
                "remove the path, or set protocol: http/protobuf if this is an OTLP/HTTP URL",
            )
        ]
    return []


def forward_endpoint_issues(endpoint: str, protocol: str) -> list[ConfigIssue]:
    """The OTLP receiver's next hop: for http/protobuf a base URL that each signal's path
    is appended to, for grpc a bare ``http(s)://HOST:PORT``; never echoed."""
    example = FORWARD_EXAMPLES.get(protocol, FORWARD_EXAMPLES["grpc"])
    if not endpoint:
        return [ConfigIssue("endpoint", "the endpoint is empty", "set a URL, or null for none")]
    problems = url_problems(
        endpoint,
        example=example,
        credentials_fix="remove them; send credentials in otlp_receiver.forward.headers",
    )
    path = urlsplit(endpoint).path if not problems else ""
    if protocol == "grpc" and path not in ("", "/"):
        problems.append(
            (
                "gRPC ignores the URL's path",
                "remove the path, or set protocol: http/protobuf if this is an OTLP/HTTP URL",
            )
        )
    elif protocol == "http/protobuf" and path.rstrip("/").endswith(SIGNAL_PATHS):
        # Each signal has its own path; a signal's path here would be doubled.
        problems.append(
            (
                "the URL ends with a signal's path, but /v1/traces, /v1/logs and /v1/metrics"
                " are appended to it",
                f"give the base URL, e.g. {FORWARD_EXAMPLES['http/protobuf']}",
            )
        )
    return [ConfigIssue("endpoint", message, fix) for message, fix in problems]


def port_clash(name: str, address: Any, other_name: str, other: Any) -> list[ConfigIssue]:
    """``address`` (at ``name``) and ``other`` listen on the same port of one host."""
    same_host = address.host == other.host or bool({address.host, other.host} & WILDCARD_HOSTS)
    if address.port == other.port != 0 and same_host:
        return [
            ConfigIssue(
                name,
                f"{name} ({address}) and {other_name} ({other}) use the same port",
                f"give {name} a port of its own",
            )
        ]
    return []


def insecure_issues(
    insecure: bool | None, endpoint: str | None, protocol: str
) -> list[ConfigIssue]:
    https = endpoint is not None and endpoint.lower().startswith("https://")
    if protocol == "grpc" and insecure is True and https:
        # The https scheme wins over insecure (OTLP exporter spec), so the setting does nothing.
        return [
            ConfigIssue(
                "insecure",
                "insecure is true but the endpoint uses https://, which always means TLS",
                "set insecure to null, or use an http:// endpoint for plain text",
            )
        ]
    return []


def header_issues(headers: tuple[tuple[str, str], ...]) -> list[ConfigIssue]:
    """Header names must be tokens; values are never shown (they hold API keys)."""
    issues = []
    for name, value in headers:
        if not _HEADER_NAME.fullmatch(name):
            issues.append(
                ConfigIssue(
                    "headers",
                    f"{show(name)} is not a valid header name",
                    "use letters, digits and -, e.g. api-key",
                )
            )
        elif not _HEADER_VALUE.fullmatch(value):
            issues.append(
                ConfigIssue(
                    f"headers.{name}",
                    f"the value of header {name!r} has a line break, control character"
                    " or non-ASCII character",
                    "use printable ASCII only; encode binary or non-ASCII values first",
                )
            )
    return issues


def attribute_issues(attributes: tuple[tuple[str, str], ...]) -> list[ConfigIssue]:
    issues = []
    for name, _ in attributes:
        if not name:
            issues.append(
                ConfigIssue(
                    "resource_attributes",
                    "a resource attribute has an empty name",
                    "give it a name, e.g. deployment.environment.name",
                )
            )
        elif name == "service.name":
            issues.append(
                ConfigIssue(
                    "resource_attributes",
                    "'service.name' is set by telemetry.service_name, not here",
                    "move the value to telemetry.service_name",
                )
            )
    return issues
