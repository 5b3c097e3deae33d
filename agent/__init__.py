"""The semhealth process: CLI, configuration, proxy tap, admin endpoints, telemetry."""

from semhealth.agent.app import Agent, Settings
from semhealth.agent.config import Config, ConfigError, default_config, load_config

__all__ = ["Agent", "Config", "ConfigError", "Settings", "default_config", "load_config"]
