"""The semhealth process: CLI, configuration, the data plane, the analysis plane.

The names below load on first use (PEP 562): the forwarding process imports
``semhealth.agent.dataplane`` and must not pay for the analysis plane (OpenTelemetry,
the encoders, alerting) that ``Agent`` brings with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from semhealth.common.lazy import on_first_use

if TYPE_CHECKING:
    from semhealth.agent.analysis.agent import Agent, Settings
    from semhealth.agent.config import Config, ConfigError, default_config, load_config

__all__ = ["Agent", "Config", "ConfigError", "Settings", "default_config", "load_config"]

_HOMES = {
    "Agent": "analysis.agent",
    "Settings": "analysis.agent",
    "Config": "config",
    "ConfigError": "config",
    "default_config": "config",
    "load_config": "config",
}


__getattr__, __dir__ = on_first_use(globals(), _HOMES)
