"""The data plane's settings, from the validated configuration."""

from __future__ import annotations

from semhealth.agent.config import Config
from semhealth.agent.dataplane.forwarder import ForwarderSettings
from semhealth.agent.dataplane.relay import ListenSettings, UpstreamSettings


def upstream_settings(config: Config) -> UpstreamSettings:
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
    )


def forwarder_settings(
    config: Config, *, workers: int, run_args: tuple[str, ...]
) -> ForwarderSettings:
    """``workers`` is resolved by the caller: the command line's, else ``dataplane.workers``."""
    dataplane = config.dataplane
    return ForwarderSettings(
        upstream=upstream_settings(config),
        listen=ListenSettings(
            header_timeout_s=dataplane.header_timeout_s,
            keepalive_timeout_s=dataplane.keepalive_timeout_s,
        ),
        proxy_host=config.listen.proxy.host,
        proxy_port=config.listen.proxy.port,
        admin_host=config.listen.admin.host,
        admin_port=config.listen.admin.port,
        tap_budget_bytes=dataplane.tap_buffer_bytes,
        workers=workers,
        run_args=run_args,
    )
