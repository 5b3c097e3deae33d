"""The agent's configuration: YAML file, environment overrides, command-line overrides.

Layers, later ones winning key by key: the YAML file, then the standard OpenTelemetry
variables (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_*``
...) and the Kubernetes downward-API ones (``K8S_POD_NAME`` ...) for ``telemetry:``, then
``SEMHEALTH_<SECTION>__<KEY>`` environment variables (``__`` nests, values read as YAML),
then command-line overrides (``{"upstream.url": ...}``). The merged document is checked
against ``config.schema.json`` (shape), built into frozen dataclasses and checked again by
their ``validate()`` (meaning). Every issue found is reported at once, each with the
setting's path, where its value came from (``FILE:LINE:COL``, ``$VARIABLE`` or ``command
line``) and a fix; ``load_config`` raises them together as one ``ConfigError``.

This module is the only place that reads the environment, through the mapping handed to
``load_config``; the rest of the agent gets values from the ``Config`` it returns. The
dataclasses live in ``_config_model`` and the loading machinery in the other private
``_config_*`` modules; none of them imports this one, which only re-exports and loads.
"""

from __future__ import annotations

from collections.abc import Mapping

from semhealth.agent.config.load import load as _load
from semhealth.agent.config.model import (
    ENV_PREFIX,
    LOG_FORMATS,
    LOG_LEVELS,
    OTLP,
    OTLP_PROTOCOLS,
    RELEVANCE_ENABLED,
    TLS,
    Address,
    Alertmanager,
    Alerts,
    Config,
    DataPlane,
    DiffLog,
    Listen,
    Log,
    Relevance,
    ShadowSettings,
    ShadowUpstream,
    Telemetry,
    Timeouts,
    Tolerances,
    Upstream,
    default_config,
    validate_collectors,
)
from semhealth.agent.config.schema import schema_text
from semhealth.agent.errors import ConfigError, ConfigIssue

__all__ = [
    "ENV_PREFIX",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "OTLP",
    "OTLP_PROTOCOLS",
    "RELEVANCE_ENABLED",
    "TLS",
    "Address",
    "Alertmanager",
    "Alerts",
    "Config",
    "ConfigError",
    "ConfigIssue",
    "DataPlane",
    "DiffLog",
    "Listen",
    "Log",
    "Relevance",
    "ShadowSettings",
    "ShadowUpstream",
    "Telemetry",
    "Timeouts",
    "Tolerances",
    "Upstream",
    "check_config_file",
    "default_config",
    "load_alerts",
    "load_config",
    "load_relevance",
    "schema_text",
    "validate_collectors",
]


def load_config(
    path: str | None,
    env: Mapping[str, str],
    overrides: Mapping[str, object],
    *,
    analysis_files: bool = True,
    warnings: list[ConfigIssue] | None = None,
) -> Config:
    """Load, merge and validate the configuration; raise ``ConfigError`` listing every issue.

    ``path`` None means no file. ``env`` is the process environment (``SEMHEALTH_*``,
    ``OTEL_*`` and the downward-API ``K8S_*`` variables are read). ``overrides`` are
    command-line values keyed by dotted path (``"upstream.url"``); a None value means the
    flag was not given. Every file the configuration names is read as the agent reads it;
    ``analysis_files`` False skips those only the analysis process reads (the shadow
    tokenizer, the calibration, a scorer's TLS files), for the forwarding processes, which
    must not load the libraries that read them: the analysis process checks them at its start.
    Warnings (``issue.warning``: a setting nothing reads) never stop it; ``warnings``, when
    given, gets them appended, for the caller to log once.
    """
    config, issues = _load(path, env, overrides, analysis_files=analysis_files)
    errors = [issue for issue in issues if not issue.warning]
    if errors:
        raise ConfigError(errors)
    if warnings is not None:
        warnings += [issue for issue in issues if issue.warning]
    return config


def load_relevance(path: str | None, env: Mapping[str, str]) -> Relevance:
    """The ``relevance:`` section alone, for the commands that only score (``semhealth
    score``, ``calibrate``, ``scorer``); raise ``ConfigError`` for its issues and the file's.

    The rest of the file is not theirs to judge: ``upstream.url`` need not be set.
    """
    config, issues = _load(path, env, {})
    own = [
        issue
        for issue in issues
        if issue.path.split(".")[0] in ("", "relevance") and not issue.warning
    ]
    if own:
        raise ConfigError(own)
    return config.relevance


def load_alerts(path: str | None, env: Mapping[str, str]) -> Alerts:
    """The ``alerts:`` section alone, for ``semhealth rules``; raise ``ConfigError`` for its
    issues and the file's (``upstream.url`` need not be set)."""
    config, issues = _load(path, env, {}, analysis_files=False)
    own = [
        issue
        for issue in issues
        if issue.path.split(".")[0] in ("", "alerts") and not issue.warning
    ]
    if own:
        raise ConfigError(own)
    return config.alerts


def check_config_file(path: str, env: Mapping[str, str]) -> list[ConfigIssue]:
    """Every issue of ``path`` merged with ``env``, for ``semhealth config check``; warnings
    (``issue.warning``) among them, in file order."""
    return _load(path, env, {})[1]
