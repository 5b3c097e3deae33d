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

Telemetry imports no stage. Each stage keeps plain counters and registers its own
observable instruments on ``Telemetry.meter`` (``observe_tap``, ``observe_relevance``,
``observe_alerting``, ...); they read the counters at collection time, so the hot path
only increments ints. Work a stage sheds goes on ``Telemetry.shed``. Finished records go
through ``Recorder``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
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

from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.observe import Labelled, Shed, observe_counters
from semhealth.agent.telemetry.recorder import (
    VALIDITY_LABELS,
    ConsumeSample,
    Recorder,
    RecorderSettings,
)

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


class Telemetry:
    """Owns the MeterProvider, its readers and the record recorder."""

    def __init__(
        self,
        settings: Settings,
        *,
        consume_sample: ConsumeSample | None = None,
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
        # The one meter every stage registers its own observable instruments on.
        self.meter = meter = self.provider.get_meter("semhealth.agent")
        self.instruments = m.Instruments(meter)
        self.recorder = Recorder(self.instruments, settings.recorder, consume_sample=consume_sample)
        self.shed = Shed(meter)
        recorder, export = self.recorder, self.export_stats
        observe_telemetry(
            meter, recorder.validity_rates, lambda: recorder.guard.folded, lambda: export.failures
        )
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

    def observe_analysis(self, seconds: float) -> None:
        self.instruments.histograms["semhealth_analysis_duration"].record(seconds)

    def render_prometheus(self) -> bytes:
        return generate_latest(self._registry)


def observe_telemetry(
    meter: Any,
    validity_rates: Callable[[], dict[tuple[str, ...], float]],
    folded: Callable[[], int],
    export_failures: Callable[[], int],
) -> None:
    """What telemetry itself knows: the recorder's validity window and label guard, and its
    own exports. Each stage registers its instruments itself (``observe_*``)."""

    def validity(_options: CallbackOptions) -> Sequence[Observation]:
        return [
            Observation(rate, dict(zip(VALIDITY_LABELS, key, strict=True)))
            for key, rate in validity_rates().items()
        ]

    meter.create_observable_gauge(
        "semantic_health_model_output_validity_rate",
        [Labelled(validity, *VALIDITY_LABELS)],
        description="Valid / structured outputs over the rolling window "
        "(telemetry.validity_window_s); absent while the window has none.",
    )
    observe_counters(
        meter,
        {
            "semhealth_label_values_folded": (
                folded,
                "Label values folded into 'other' by the cardinality guard.",
            ),
            "semhealth_otlp_export_failures": (
                export_failures,
                "OTLP metric exports that failed (the agent keeps serving).",
            ),
        },
    )


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
