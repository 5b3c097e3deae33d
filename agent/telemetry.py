"""The agent's metrics: one MeterProvider, read by Prometheus' text endpoint.

Instruments are declared once here. The proxy and the tap keep plain counters
(``TapStats``, ``Proxy.active_streams``); observable instruments read them at
collection time, so the hot path only increments ints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from semhealth.agent.tap import TapStats

CONTENT_TYPE = CONTENT_TYPE_LATEST


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    service_name: str = "semhealth"
    resource_attributes: tuple[tuple[str, str], ...] = ()


def _observe(read: Callable[[], int | float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(read())]

    return callback


def _observe_by(
    label: str, read: Callable[[], dict[str, int]]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, {label: key}) for key, value in read().items()]

    return callback


class Telemetry:
    """Owns the MeterProvider and its readers; ``render_prometheus`` serves ``/metrics``."""

    def __init__(
        self,
        settings: Settings,
        *,
        tap_stats: TapStats,
        active_streams: Callable[[], int],
    ) -> None:
        attributes = {"service.name": settings.service_name, **dict(settings.resource_attributes)}
        self._registry = CollectorRegistry(auto_describe=True)
        # Scope labels would repeat the same constant on every series.
        self._prometheus = PrometheusMetricReader(registry=self._registry, scope_info_enabled=False)
        self.provider = MeterProvider(
            resource=Resource.create(attributes), metric_readers=[self._prometheus]
        )
        meter = self.provider.get_meter("semhealth.agent")
        stats = tap_stats
        meter.create_observable_up_down_counter(
            "semhealth_streams_active",
            [_observe(active_streams)],
            description="Exchanges the proxy is relaying now.",
        )
        meter.create_observable_up_down_counter(
            "semhealth_tap_queue_depth",
            [_observe(lambda: stats.queue_depth)],
            description="Response chunks waiting for analysis.",
        )
        meter.create_observable_counter(
            "semhealth_dropped",
            [_observe_by("stage", lambda: {"tap": stats.chunks_dropped})],
            description="Work shed under load, by stage; the client's bytes are never dropped.",
        )
        meter.create_observable_counter(
            "semhealth_streams_shed",
            [_observe(lambda: stats.streams_shed)],
            description="Exchanges whose analysis was incomplete because the tap shed chunks.",
        )
        meter.create_observable_counter(
            "semhealth_records",
            [_observe(lambda: stats.records)],
            description="Exchanges analysed into a stream record.",
        )
        meter.create_observable_counter(
            "semhealth_requests_unanalysed",
            [_observe_by("reason", lambda: dict(stats.requests_unanalysed))],
            description="Requests forwarded without analysing their body, by reason.",
        )
        meter.create_observable_counter(
            "semhealth_analysis_errors",
            [_observe(lambda: stats.analysis_errors)],
            description="Exchanges whose analysis failed inside semhealth (a bug: please report).",
        )

    def render_prometheus(self) -> bytes:
        return generate_latest(self._registry)

    def shutdown(self) -> None:
        self.provider.shutdown()
