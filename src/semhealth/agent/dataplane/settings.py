"""The data plane's settings, from the validated configuration and the command line."""

from __future__ import annotations

from dataclasses import dataclass

from semhealth.agent.config import Config, ShadowSettings
from semhealth.agent.dataplane.forwarder import ForwarderSettings
from semhealth.agent.dataplane.relay import ListenSettings, UpstreamSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardening:
    """The admin lock-down and the connection limits (``listen.admin_web_config``,
    ``listen.admin_alerts_endpoint``, ``dataplane.max_client_connections``,
    ``dataplane.max_upstream_requests``; ``semhealth run``'s flags override them)."""

    web_config_file: str | None = None
    alerts_endpoint: bool = True
    max_client_connections: int = 0  # per forwarding process; 0: no limit
    max_upstream_requests: int = 0  # per forwarding process; 0: no limit


def hardening(config: Config) -> Hardening:
    """From the configuration, the ``run`` flags already laid over it (``cli.overrides``)."""
    return Hardening(
        web_config_file=config.listen.admin_web_config,
        alerts_endpoint=config.listen.admin_alerts_endpoint,
        max_client_connections=config.dataplane.max_client_connections,
        max_upstream_requests=config.dataplane.max_upstream_requests,
    )


def upstream_settings(config: Config, shadow: ShadowSettings | None = None) -> UpstreamSettings:
    """``shadow``: the live shadowing that runs (None: the configuration's, if any). With one,
    the relay copies the request headers it may resend, less its denylist."""
    shadow = shadow or config.shadow
    upstream = config.upstream
    if upstream.url is None:
        raise ValueError(
            "upstream.url is not set: load_config() reports that before an Agent is built"
        )
    return UpstreamSettings(
        url=upstream.url,
        verify=upstream.tls.verify,
        ca_file=upstream.tls.ca_file,
        client_cert=upstream.tls.client_cert,
        client_key=upstream.tls.client_key,
        connect_timeout_s=upstream.timeouts.connect_s,
        read_timeout_s=upstream.timeouts.read_s,
        total_timeout_s=upstream.timeouts.total_s,
        max_request_bytes=config.collectors.limits.max_request_bytes,
        tap_headers_drop=None
        if shadow is None
        else frozenset(name.encode("latin-1") for name in shadow.upstream.dropped_headers()),
    )


def listen_settings(config: Config, limits: Hardening | None = None) -> ListenSettings:
    dataplane = config.dataplane
    limits = limits or Hardening()
    return ListenSettings(
        header_timeout_s=dataplane.header_timeout_s,
        keepalive_timeout_s=dataplane.keepalive_timeout_s,
        max_client_connections=limits.max_client_connections,
        max_upstream_requests=limits.max_upstream_requests,
    )


def forwarder_settings(
    config: Config,
    *,
    workers: int,
    child_args: tuple[str, ...],
    limits: Hardening | None = None,
) -> ForwarderSettings:
    """``workers`` is resolved by the caller: the command line's, else ``dataplane.workers``."""
    limits = limits or Hardening()
    return ForwarderSettings(
        upstream=upstream_settings(config),
        listen=listen_settings(config, limits),
        proxy_host=config.listen.proxy.host,
        proxy_port=config.listen.proxy.port,
        admin_host=config.listen.admin.host,
        admin_port=config.listen.admin.port,
        tap_budget_bytes=config.dataplane.tap_buffer_bytes,
        workers=workers,
        web_config_file=limits.web_config_file,
        alerts_endpoint=limits.alerts_endpoint,
        child_args=child_args,
    )
