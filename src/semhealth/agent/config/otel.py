"""OpenTelemetry variables and the Kubernetes downward API: a layer for ``telemetry:``.

Precedence, later winning: the file, ``K8S_*``, ``OTEL_*``, then ``SEMHEALTH_*`` and the
command line (applied after this layer). Variables follow the OpenTelemetry specs
(configuration/sdk-environment-variables and protocol/exporter):

- an empty variable counts as unset;
- a metrics-specific ``OTEL_EXPORTER_OTLP_METRICS_*`` variable wins over the generic one,
  which is then not read at all;
- ``k=v,k2=v2`` lists have their values percent-decoded, and a malformed list is
  discarded whole;
- durations and timeouts are whole milliseconds.

A malformed value is an issue naming the variable and the fix; the spec's "warn and
ignore" would start the agent with telemetry the operator did not ask for. Other
``OTEL_*`` variables are not errors: other tools in the pod read them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from semhealth.agent.config.checks import protocol_issues
from semhealth.agent.config.document import Document, Origin, Path, dotted
from semhealth.agent.config.model import OTLP, OTLP_PROTOCOLS
from semhealth.agent.errors import ConfigIssue
from semhealth.common.words import show

_GENERIC_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"

_OTLP: Path = ("telemetry", "otlp")
_ENDPOINT: Path = (*_OTLP, "endpoint")
_SERVICE_NAME: Path = ("telemetry", "service_name")
_RESOURCE: Path = ("telemetry", "resource_attributes")
# The Helm chart sets these from fieldRef; OTEL_RESOURCE_ATTRIBUTES wins over them.
_DOWNWARD_API = (
    ("K8S_POD_NAME", "k8s.pod.name"),
    ("K8S_NAMESPACE_NAME", "k8s.namespace.name"),
    ("K8S_NODE_NAME", "k8s.node.name"),
    ("K8S_POD_UID", "k8s.pod.uid"),
)
_MAX_MILLISECONDS = 2**31 - 1  # the range the spec asks SDKs to support
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_RESOURCE_EXAMPLE = "deployment.environment.name=prod,team=search"
_HEADERS_EXAMPLE = "api-key=KEY,x-team=search"

_Read = Callable[[str], Any]  # a value for the document, or a ConfigIssue (path unset)


def apply_otel_env(doc: Document, env: Mapping[str, str]) -> None:
    """Set ``telemetry`` values from ``K8S_*`` and ``OTEL_*`` variables, in precedence order."""
    for name, attribute in _DOWNWARD_API:
        value = _given(env, name)
        if value is not None:
            doc.set((*_RESOURCE, attribute), value, Origin(f"${name}"))
    _apply_resource_attributes(doc, env)
    service_name = _given(env, "OTEL_SERVICE_NAME")
    if service_name is not None:
        doc.set(_SERVICE_NAME, service_name, Origin("$OTEL_SERVICE_NAME"))
    for names, key, read in _EXPORTER:
        _apply_one(doc, env, names, (*_OTLP, key), read)
    # Last, so that it beats any endpoint the OTEL_* variables above gave.
    disabled = _given(env, "OTEL_SDK_DISABLED")
    off = None if disabled is None else _boolean(disabled)
    if off is True:
        doc.set(_ENDPOINT, None, Origin("$OTEL_SDK_DISABLED"))
    elif isinstance(off, ConfigIssue):
        doc.issues.append(replace(off, path=dotted(_ENDPOINT), source="$OTEL_SDK_DISABLED"))


def resolve_endpoint(doc: Document) -> None:
    """Once every layer is applied, make an endpoint taken from ``OTEL_*`` the exporter's URL.

    For http/protobuf, the generic variable is a base URL that gets ``v1/metrics`` and the
    metrics-specific one is used as is, with ``/`` when it has no path. Which applies
    depends on the final protocol, which a later layer may have set, so this runs last.
    """
    origin = doc.origins.get(_ENDPOINT)
    otlp = _mapping(_mapping(doc.data.get("telemetry")).get("otlp"))
    endpoint = otlp.get("endpoint")
    if origin is None or not isinstance(endpoint, str):
        return
    if otlp.get("protocol", OTLP().protocol) != "http/protobuf":
        return
    if origin.source == f"${_GENERIC_ENDPOINT}":
        doc.set(_ENDPOINT, _signal_url(endpoint), origin)
    elif origin.source == f"${_METRICS_ENDPOINT}":
        doc.set(_ENDPOINT, _with_root_path(endpoint), origin)


# -- one variable ---------------------------------------------------------------------------


def _given(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value; None when unset or empty, which the spec makes the same."""
    value = env.get(name)
    return value if value is not None and value.strip() else None


def _pick(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """(name, value) of the first of ``names`` that is set: signal-specific names come first."""
    for name in names:
        value = _given(env, name)
        if value is not None:
            return name, value
    return None


def _apply_one(
    doc: Document, env: Mapping[str, str], names: tuple[str, ...], path: Path, read: _Read
) -> None:
    picked = _pick(env, names)
    if picked is None:
        return
    name, text = picked
    value = read(text)
    if isinstance(value, ConfigIssue):
        doc.issues.append(replace(value, path=dotted(path), source=f"${name}"))
        return
    doc.set(path, value, Origin(f"${name}"))


def _apply_resource_attributes(doc: Document, env: Mapping[str, str]) -> None:
    name = "OTEL_RESOURCE_ATTRIBUTES"
    text = _given(env, name)
    if text is None:
        return
    attributes = _pairs(text, example=_RESOURCE_EXAMPLE)
    if isinstance(attributes, ConfigIssue):
        doc.issues.append(replace(attributes, path=dotted(_RESOURCE), source=f"${name}"))
        return
    # service.name has a setting of its own; OTEL_SERVICE_NAME, applied next, beats it.
    service_name = attributes.pop("service.name", "")
    if service_name:
        doc.set(_SERVICE_NAME, service_name, Origin(f"${name}"))
    for key, value in attributes.items():
        doc.set((*_RESOURCE, key), value, Origin(f"${name}"))


# -- reading values -------------------------------------------------------------------------


def _text(text: str) -> str:
    return text


def _protocol(text: str) -> str | ConfigIssue:
    value = text.strip().lower()  # the spec reads enum values case-insensitively
    issues = protocol_issues(value, OTLP_PROTOCOLS)
    return issues[0] if issues else value


def _boolean(text: str) -> bool | ConfigIssue:
    value = text.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    return ConfigIssue("", f"expected true or false, got {show(text)}", "set it to true or false")


def _milliseconds(text: str, *, example: int, zero: str) -> float | ConfigIssue:
    digits = text.strip()
    if not re.fullmatch(r"[0-9]+", digits):
        return ConfigIssue(
            "",
            f"expected a whole number of milliseconds, got {show(text)}",
            f"write milliseconds as digits, e.g. {example}",
        )
    milliseconds = int(digits)
    if milliseconds == 0:
        return ConfigIssue("", zero, f"use a number of milliseconds above 0, e.g. {example}")
    if milliseconds > _MAX_MILLISECONDS:
        return ConfigIssue(
            "",
            f"{milliseconds} milliseconds is more than the largest supported, {_MAX_MILLISECONDS}",
            f"use a smaller number of milliseconds, e.g. {example}",
        )
    return milliseconds / 1000


def _timeout_s(text: str) -> float | ConfigIssue:
    # The spec reads 0 as "no timeout"; an export that can hang forever would stall shutdown.
    return _milliseconds(text, example=10000, zero="0 (no timeout) is not supported")


def _interval_s(text: str) -> float | ConfigIssue:
    return _milliseconds(text, example=15000, zero="the interval must be greater than 0")


def _headers(text: str) -> dict[str, str] | ConfigIssue:
    pairs = _pairs(text, example=_HEADERS_EXAMPLE)
    if isinstance(pairs, ConfigIssue):
        return pairs
    # Names are case-insensitive; gRPC metadata accepts only lower case.
    return {name.lower(): value for name, value in pairs.items()}


def _pairs(text: str, *, example: str) -> dict[str, str] | ConfigIssue:
    """``k=v,k2=v2`` with percent-decoded values (W3C Baggage without properties).

    Issues name the entry by its 1-based position and never show a value: header values
    are credentials.
    """
    pairs: dict[str, str] = {}
    fix = f"write key=value pairs separated by commas, e.g. {example}"
    for number, member in enumerate(text.split(","), start=1):
        if not member.strip():
            continue
        key, equals, raw = member.partition("=")
        key = key.strip()
        if not equals:
            return ConfigIssue("", f"entry {number} has no '='", fix)
        if not key:
            return ConfigIssue("", f"entry {number} has an empty key", fix)
        value = _decoded(raw.strip())
        if value is None:
            return ConfigIssue(
                "",
                f"entry {number} has a value that is not valid percent-encoding",
                "write % as %25, and encode only UTF-8 bytes as %XX",
            )
        pairs[key] = value
    return pairs


def _decoded(text: str) -> str | None:
    if _BAD_ESCAPE.search(text):
        return None
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        return None


# -- endpoint URLs --------------------------------------------------------------------------


def _signal_url(base: str) -> str:
    """``base`` with ``v1/metrics`` appended to its path, with exactly one slash between."""
    try:
        parts = urlsplit(base)
    except ValueError:
        return base  # the endpoint check reports it
    if "://" not in base:
        return base
    path = parts.path if parts.path.endswith("/") else f"{parts.path}/"
    return urlunsplit(parts._replace(path=f"{path}v1/metrics"))


def _with_root_path(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "://" not in url or parts.path:
        return url
    return urlunsplit(parts._replace(path="/"))


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _signal(suffix: str) -> tuple[str, ...]:
    return (f"OTEL_EXPORTER_OTLP_METRICS_{suffix}", f"OTEL_EXPORTER_OTLP_{suffix}")


# (variables, metrics-specific first; key under telemetry.otlp; reader)
_EXPORTER: tuple[tuple[tuple[str, ...], str, _Read], ...] = (
    (_signal("ENDPOINT"), "endpoint", _text),
    (_signal("PROTOCOL"), "protocol", _protocol),
    (_signal("HEADERS"), "headers", _headers),
    (_signal("TIMEOUT"), "timeout_s", _timeout_s),
    (("OTEL_METRIC_EXPORT_INTERVAL",), "interval_s", _interval_s),
    (_signal("INSECURE"), "insecure", _boolean),
)
