"""The agent's metrics pipeline: one MeterProvider, two readers.

``PrometheusMetricReader`` serves the admin ``/metrics``; when an OTLP endpoint
is configured, a ``PeriodicExportingMetricReader`` pushes the same instruments
over gRPC or HTTP/protobuf. Exporter failures are logged and counted by the
reader's wrapper and never reach the proxy.

Lifecycle: building a ``Telemetry`` starts nothing. ``start()`` starts the
thread that pushes to OTLP on its interval; ``shutdown()`` stops it, pushes the
last values and closes the exporter, within one deadline. Both are idempotent,
and ``shutdown()`` is safe without ``start()``. ``/metrics`` (the Prometheus
reader) needs no thread and answers either way.

The proxy and the tap keep plain counters (``TapStats``, active streams);
observable instruments read them at collection time, so the hot path only
increments ints. Finished records go through ``Recorder``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from semhealth.agent.analysis.alerting import AlertingStats
from semhealth.agent.analysis.relevance import RelevanceStats
from semhealth.agent.analysis.tap import TapStats
from semhealth.agent.otlp.intake import IntakeStats
from semhealth.agent.otlp.metrics import observe_otlp
from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.recorder import ConsumeSample, Recorder, RecorderSettings
from semhealth.embeddings.cache import CacheStats

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST


@dataclass(frozen=True, slots=True, kw_only=True)
class OTLPSettings:
    endpoint: str  # the URL handed to the exporter as is
    protocol: str = "grpc"  # grpc | http/protobuf
    headers: tuple[tuple[str, str], ...] = ()
    interval_s: float = 15.0
    timeout_s: float = 10.0
    insecure: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    service_name: str = "semhealth"
    resource_attributes: tuple[tuple[str, str], ...] = ()
    otlp: OTLPSettings | None = None
    recorder: RecorderSettings = field(default_factory=RecorderSettings)


@dataclass(slots=True)
class ExportStats:
    exports: int = 0
    failures: int = 0


class _CountingExporter(MetricExporter):
    """Delegates to the real exporter; a failure is counted and logged once per streak."""

    def __init__(self, inner: MetricExporter, stats: ExportStats) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._stats = stats
        self._failing = False

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self._stats.exports += 1
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # an exporter must never take the agent down
            log.warning("OTLP export raised %s", type(exc).__name__)
            result = MetricExportResult.FAILURE
        if result is MetricExportResult.FAILURE:
            self._stats.failures += 1
            if not self._failing:
                log.warning("OTLP metric export failed; retrying at the next interval")
            self._failing = True
        elif self._failing:
            log.info("OTLP metric export recovered")
            self._failing = False
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def build_otlp_exporter(settings: OTLPSettings) -> MetricExporter:
    headers = dict(settings.headers)
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcExporter,
        )

        insecure = settings.insecure
        if insecure is None:
            insecure = settings.endpoint.startswith("http://")
        return GrpcExporter(
            endpoint=settings.endpoint,
            insecure=insecure,
            headers=headers,
            timeout=settings.timeout_s,
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpExporter,
    )

    return HttpExporter(endpoint=settings.endpoint, headers=headers, timeout=settings.timeout_s)


def _observe(read: Callable[[], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
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
    """Owns the MeterProvider, its readers and the record recorder."""

    def __init__(
        self,
        settings: Settings,
        *,
        tap_stats: TapStats,
        active_streams: Callable[[], int],
        relevance_stats: Callable[[], RelevanceStats | None] = lambda: None,
        cache_stats: Callable[[], CacheStats | None] = lambda: None,
        consume_sample: ConsumeSample | None = None,
        alerting_stats: Callable[[], AlertingStats | None] = lambda: None,
        background_failures: Callable[[], dict[str, int]] = dict,
        otlp_stats: Callable[[], IntakeStats | None] = lambda: None,
    ) -> None:
        attributes = {"service.name": settings.service_name, **dict(settings.resource_attributes)}
        self._registry = CollectorRegistry(auto_describe=True)
        # Scope labels would repeat the same constant on every series.
        readers: list[MetricReader] = [
            PrometheusMetricReader(registry=self._registry, scope_info_enabled=False)
        ]
        self.export_stats = ExportStats()
        self._push: _Push | None = None
        if settings.otlp is not None:
            exporter = _CountingExporter(build_otlp_exporter(settings.otlp), self.export_stats)
            # An infinite interval: the SDK reader starts no thread of its own, so that
            # building this starts nothing; start() runs the pushes (see _Push).
            reader = PeriodicExportingMetricReader(
                exporter,
                export_interval_millis=math.inf,
                export_timeout_millis=settings.otlp.timeout_s * 1000,
            )
            readers.append(reader)
            self._push = _Push(reader, settings.otlp.interval_s, settings.otlp.timeout_s)
        self.provider = MeterProvider(
            resource=Resource.create(attributes), metric_readers=readers, views=m.views()
        )
        meter = self.provider.get_meter("semhealth.agent")
        self.instruments = m.Instruments(meter)
        self.recorder = Recorder(self.instruments, settings.recorder, consume_sample=consume_sample)
        self._observe_agent(meter, tap_stats, active_streams)
        meter.create_observable_counter(
            "semhealth_background_failures",
            [_observe_by("task", background_failures)],
            description="Background tasks of the analysis plane that died (a bug: please "
            "report); the analysis process restarts, one process turns /readyz to 503.",
        )
        self._otlp_stats = otlp_stats
        self._observe_relevance(meter, tap_stats, relevance_stats, cache_stats, alerting_stats)
        observe_otlp(meter, otlp_stats)
        self._observe_alerting(meter, alerting_stats)
        self._lifecycle = threading.Lock()
        self._started = False
        self._stopped = False

    def start(self) -> None:
        """Start pushing to OTLP, when an endpoint is configured. Returns at once; a second
        call, or one after ``shutdown``, does nothing."""
        with self._lifecycle:
            if self._started or self._stopped:
                return
            self._started = True
            if self._push is not None:
                self._push.start()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the pushes, push what is left and close the readers, all within ``timeout_s``.
        Safe without ``start`` and safe twice."""
        with self._lifecycle:
            if self._stopped:
                return
            self._stopped = True
        deadline = time.monotonic() + timeout_s
        if self._push is not None:
            self._push.stop(timeout_s)
        remaining = max(deadline - time.monotonic(), 0.0)
        self.provider.shutdown(timeout_millis=remaining * 1000)

    def _observe_agent(
        self, meter: Any, stats: TapStats, active_streams: Callable[[], int]
    ) -> None:
        recorder = self.recorder

        def validity(_options: CallbackOptions) -> Sequence[Observation]:
            return [
                Observation(rate, {m.ROUTE: route, m.MODEL: model, m.PROVIDER: provider})
                for (route, model, provider), rate in recorder.validity_rates().items()
            ]

        meter.create_observable_gauge(
            "semantic_health_model_output_validity_rate",
            [validity],
            description="Valid / structured outputs over the rolling window "
            "(telemetry.validity_window_s); absent while the window has none.",
        )
        gauges = {
            "semhealth_streams_active": (active_streams, "Exchanges the proxy is relaying now."),
            "semhealth_tap_queue_depth": (
                lambda: stats.queue_depth,
                "Response chunks waiting for analysis.",
            ),
        }
        for name, (read, description) in gauges.items():
            meter.create_observable_up_down_counter(name, [_observe(read)], description=description)
        export = self.export_stats
        counters = {
            "semhealth_streams_shed": (
                lambda: stats.streams_shed,
                "Exchanges whose analysis was incomplete because the tap shed chunks.",
            ),
            "semhealth_records": (lambda: stats.records, "Exchanges analysed into a record."),
            "semhealth_analysis_errors": (
                lambda: stats.analysis_errors,
                "Exchanges whose analysis failed inside semhealth (a bug: please report).",
            ),
            "semhealth_label_values_folded": (
                lambda: recorder.guard.folded,
                "Label values folded into 'other' by the cardinality guard.",
            ),
            "semhealth_otlp_export_failures": (
                lambda: export.failures,
                "OTLP metric exports that failed (the agent keeps serving).",
            ),
            "semhealth_analysis_restarts": (
                lambda: stats.analysis_restarts,
                "Times the analysis process died and was started again (forwarding went on).",
            ),
            "semhealth_tap_wire_resets": (
                lambda: stats.wire_resets,
                "Times a forwarder dropped its tap wire because analysis stopped reading it.",
            ),
        }
        for name, (read, description) in counters.items():
            meter.create_observable_counter(name, [_observe(read)], description=description)
        meter.create_observable_counter(
            "semhealth_requests_unanalysed",
            [_observe_by("reason", lambda: dict(stats.requests_unanalysed))],
            description="Requests forwarded without analysing their body, by reason.",
        )
        meter.create_observable_counter(
            "semhealth_requests_rejected",
            [_observe_by("reason", lambda: dict(stats.requests_rejected))],
            description="Malformed requests the proxy answered itself, never forwarded "
            "(malformed, header_timeout, head_too_large, method_not_allowed).",
        )

    def _observe_relevance(
        self,
        meter: Any,
        tap: TapStats,
        relevance: Callable[[], RelevanceStats | None],
        cache: Callable[[], CacheStats | None],
        alerting: Callable[[], AlertingStats | None],
    ) -> None:
        """Relevance and embedding counters; zero while scoring is off, so series never vanish."""

        def dropped() -> dict[str, int]:
            stats = relevance()
            alerts = alerting()
            return {
                "tap": tap.chunks_dropped,
                "relevance": stats.dropped if stats else 0,
                # Samples the evaluator never saw: its buffer was full, or a rule held its
                # maximum of groups.
                "alerts": alerts.samples_shed + alerts.evaluator.groups_dropped if alerts else 0,
                # Spans received over OTLP (and forwarded) that the GenAI mapping never saw.
                "otlp": sum(otlp.receiver.shed.values()) if (otlp := self._otlp_stats()) else 0,
            }

        meter.create_observable_counter(
            "semhealth_dropped",
            [_observe_by("stage", dropped)],
            description="Work shed under load, by stage; the client's bytes are never dropped.",
        )
        counters = {
            "semhealth_relevance_scored": (
                lambda: _field(relevance(), "scored"),
                "Streams whose relevance was scored and recorded.",
            ),
            "semhealth_relevance_errors": (
                lambda: _field(relevance(), "errors"),
                "Streams whose scoring failed in the encoder (counted, never retried).",
            ),
            "semhealth_embedding_cache_hits": (
                lambda: _field(cache(), "hits"),
                "Texts whose embedding came from the cache.",
            ),
            "semhealth_embedding_cache_misses": (
                lambda: _field(cache(), "misses"),
                "Texts the cache did not hold, so the model embedded them.",
            ),
        }
        for name, (read, description) in counters.items():
            meter.create_observable_counter(name, [_observe(read)], description=description)
        # A gauge: the cache's memory grows with it up to relevance.cache_entries, then stays.
        meter.create_observable_up_down_counter(
            "semhealth_embedding_cache_entries",
            [_observe(lambda: _field(cache(), "entries"))],
            description="Vectors the embedding cache holds (at most relevance.cache_entries; "
            "each takes the encoder's dimensions x 4 bytes).",
        )
        meter.create_observable_counter(
            "semhealth_relevance_skipped",
            [_observe_by("reason", lambda: _skipped(relevance()))],
            description="Streams not scored, by reason: sampled_out, no_query, "
            "nothing_to_compare, incomplete, error_response.",
        )

    def _observe_alerting(self, meter: Any, alerting: Callable[[], AlertingStats | None]) -> None:
        """Alert states and delivery; absent while alerting is off."""

        def alerts(_options: CallbackOptions) -> Sequence[Observation]:
            stats = alerting()
            if stats is None:
                return []
            return [
                Observation(stats.pending, {"state": "pending"}),
                Observation(stats.firing, {"state": "firing"}),
            ]

        def delivered(_options: CallbackOptions) -> Sequence[Observation]:
            stats = alerting()
            out = []
            for target in stats.deliveries if stats else ():
                outcomes = {
                    "sent": target.sent,
                    "failed": target.errors,
                    "dropped": target.dropped - target.errors,
                }
                out += [
                    Observation(count, {"alertmanager": target.url, "outcome": outcome})
                    for outcome, count in outcomes.items()
                ]
            return out

        def queued(_options: CallbackOptions) -> Sequence[Observation]:
            stats = alerting()
            return [
                Observation(target.queue_length, {"alertmanager": target.url})
                for target in (stats.deliveries if stats else ())
            ]

        def failures(_options: CallbackOptions) -> Sequence[Observation]:
            stats = alerting()
            if stats is None:
                return []
            return [Observation(stats.evaluation_failures + stats.evaluator.rule_failures)]

        meter.create_observable_up_down_counter(
            "semhealth_alerts", [alerts], description="Alerts pending and firing now, by state."
        )
        meter.create_observable_counter(
            "semhealth_alertmanager_alerts",
            [delivered],
            description="Alerts for each Alertmanager by outcome: sent (accepted), failed "
            "(given up after failed POSTs; resent later while firing), dropped (queue full, "
            "shutdown).",
        )
        meter.create_observable_up_down_counter(
            "semhealth_alertmanager_queue_length",
            [queued],
            description="Alerts waiting to be sent to each Alertmanager.",
        )
        meter.create_observable_counter(
            "semhealth_alert_evaluation_failures",
            [failures],
            description="Rule evaluations that failed inside semhealth (a bug: please report).",
        )

    def observe_analysis(self, seconds: float) -> None:
        self.instruments.histograms["semhealth_analysis_duration"].record(seconds)

    def render_prometheus(self) -> bytes:
        return generate_latest(self._registry)


class _Push:
    """The OTLP reader's collections on its interval, in a thread that ``start`` starts.

    The SDK's ``PeriodicExportingMetricReader`` starts this thread when it is built; here
    the reader is built with an infinite interval (no thread) and this loop does what the
    SDK's ticker does, through the reader's public ``collect``: a push per interval and one
    last push when stopped. A failed collection is logged and the next interval tries again.
    """

    def __init__(self, reader: MetricReader, interval_s: float, timeout_s: float) -> None:
        self._reader = reader
        self._interval_s = interval_s
        self._timeout_ms = timeout_s * 1000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="semhealth-otlp-push", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._collect()
        self._collect()  # the values since the last push, before the exporter closes

    def _collect(self) -> None:
        try:
            self._reader.collect(timeout_millis=self._timeout_ms)
        except Exception as exc:  # a push must never end the pushes after it
            log.warning("OTLP metric collection failed: %s", type(exc).__name__)


def _field(stats: RelevanceStats | CacheStats | None, name: str) -> int:
    return int(getattr(stats, name)) if stats is not None else 0


def _skipped(stats: RelevanceStats | None) -> dict[str, int]:
    # A copy: the OTLP reader's thread iterates while the loop may add a reason.
    return dict(stats.skipped) if stats is not None else {}
