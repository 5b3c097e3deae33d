"""The semhealth process: CLI, configuration, the data plane, the analysis plane.

The names below load on first use (PEP 562): the forwarding process imports
``semhealth.agent.dataplane`` and must not pay for the analysis plane (OpenTelemetry,
the encoders, alerting) that ``Agent`` brings with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from semhealth.agent.analysis.agent import Agent, Settings
    from semhealth.agent.config import Config, ConfigError, default_config, load_config

__all__ = ["Agent", "Config", "ConfigError", "Settings", "default_config", "load_config"]

_HOMES = {
    "Agent": "semhealth.agent.analysis.agent",
    "Settings": "semhealth.agent.analysis.agent",
    "Config": "semhealth.agent.config",
    "ConfigError": "semhealth.agent.config",
    "default_config": "semhealth.agent.config",
    "load_config": "semhealth.agent.config",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'semhealth.agent' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
