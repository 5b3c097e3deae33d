"""Samples to windows to rules to Alertmanager, and the same rules for Prometheus.

``Evaluator`` keeps bounded windows per rule group and steps each alert through
Prometheus' states; ``Notifier`` delivers to Alertmanager's API v2; ``render_rules``
writes the same rules as Prometheus rule groups. Rules come from ``load_rules``:
the shipped defaults, overridden by name, plus the user's own.

The delivery names (``Notifier``, ``NotifierSettings``, ``DeliveryStats``) are imported on
first use (PEP 562): they need aiohttp, which loading rules and evaluating them do not, so
reading the configuration (the forwarding process does) never imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from semhealth.alerts.errors import AlertsError, RuleError, RuleIssue
from semhealth.alerts.evaluator import Evaluator, GroupStatus, RuleStatus
from semhealth.alerts.evaluator import Stats as EvaluatorStats
from semhealth.alerts.model import Alert, Baseline, Rule, Thresholds
from semhealth.alerts.prometheus import render_rules, rule_groups
from semhealth.alerts.rules import (
    RULES_SCHEMA,
    default_rule_entries,
    default_rules_text,
    load_rules,
    parse_rules,
)
from semhealth.alerts.sample import Sample
from semhealth.alerts.signals import SIGNALS, Signal, signal_named

if TYPE_CHECKING:
    from semhealth.alerts.alertmanager import DeliveryStats, Notifier
    from semhealth.alerts.alertmanager import Settings as NotifierSettings

# Public names imported on first use: (module, name there).
_LAZY = {
    "DeliveryStats": ("alertmanager", "DeliveryStats"),
    "Notifier": ("alertmanager", "Notifier"),
    "NotifierSettings": ("alertmanager", "Settings"),
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where[0]}"), where[1])
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "RULES_SCHEMA",
    "SIGNALS",
    "Alert",
    "AlertsError",
    "Baseline",
    "DeliveryStats",
    "Evaluator",
    "EvaluatorStats",
    "GroupStatus",
    "Notifier",
    "NotifierSettings",
    "Rule",
    "RuleError",
    "RuleIssue",
    "RuleStatus",
    "Sample",
    "Signal",
    "Thresholds",
    "default_rule_entries",
    "default_rules_text",
    "load_rules",
    "parse_rules",
    "render_rules",
    "rule_groups",
    "signal_named",
]
