"""semhealth's judgement put back on the user's traces: ``gen_ai.evaluation.result`` events.

The OpenTelemetry GenAI semantic conventions define the event (now kept in
open-telemetry/semantic-conventions-genai, ``model/gen-ai/events.yaml``): a log record named
``gen_ai.evaluation.result``, parented to the GenAI operation span it judges, with

=================================  ======================================================
``gen_ai.evaluation.name``         ``context_relevance``, ``answer_relevance`` or
                                   ``output_validity``
``gen_ai.evaluation.score.value``  the calibrated relevance score (0..1); validity 1.0 / 0.0
``gen_ai.evaluation.score.label``  relevance: ``relevant`` at or above the threshold (the
                                   ContextRelevanceLow rule's 0.75 by default), else
                                   ``not_relevant``; validity: ``valid``, or the first failure
                                   (``truncated``, ``syntax``, ``schema``, ``contract``)
``gen_ai.response.id``             the provider's response id, when the record has one
``error.type``                     ``schema_error``: the output's schema could not be used, so
                                   validity was not judged (no score, no label)
=================================  ======================================================

``gen_ai.evaluation.explanation`` is never sent, nor any body: an explanation could hold text
of the traffic, and no prompt or response text ever leaves semhealth.

Only records that carry a ``TraceRef`` are judged here (a ``traceparent`` on the proxied
request, or the OTLP span a record was built from); the events' trace and span ids are its.
Events go through the OpenTelemetry SDK's logs pipeline (``LoggerProvider``,
``BatchLogRecordProcessor``, an OTLP/gRPC or OTLP/HTTP exporter) in the SDK's own thread:
emitting is an append to a bounded queue, never a wait. Past ``max_queue_size`` events are
shed before they reach the SDK; every event is counted once as exported or dropped (by reason).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.metrics import Observation
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.util.types import AnyValue

from semhealth.agent.errors import ConfigIssue
from semhealth.agent.telemetry.observe import Labelled
from semhealth.alerts import Rule

if TYPE_CHECKING:
    from opentelemetry._logs import Logger
    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, Meter

    from semhealth.collectors import StreamRecord, ValidityResult
    from semhealth.collectors.record import TraceRef
    from semhealth.embeddings import RelevanceScores

log = logging.getLogger(__name__)

EVENT_NAME = "gen_ai.evaluation.result"
# Attribute names, as the conventions spell them.
EVALUATION_NAME = "gen_ai.evaluation.name"
SCORE_VALUE = "gen_ai.evaluation.score.value"
SCORE_LABEL = "gen_ai.evaluation.score.label"
RESPONSE_ID = "gen_ai.response.id"
ERROR_TYPE = "error.type"
# Our evaluations and labels: few, fixed values, as the conventions ask of labels.
CONTEXT_RELEVANCE = "context_relevance"
ANSWER_RELEVANCE = "answer_relevance"
OUTPUT_VALIDITY = "output_validity"
RELEVANT = "relevant"
NOT_RELEVANT = "not_relevant"
VALID = "valid"
SCHEMA_ERROR = "schema_error"  # the schema could not be used: an error of the evaluation

DEFAULT_THRESHOLD = 0.75  # ContextRelevanceLow's line, what the relevance calibration targets
RELEVANCE_SIGNAL = "context_relevance_score"
PROTOCOLS = ("grpc", "http/protobuf")
_LOGS_PATH = "/v1/logs"
_SCOPE = "semhealth.evaluation"

# Dropped events, by reason.
QUEUE_FULL = "queue_full"  # the export queue was full: the endpoint is slow or down
EXPORT_FAILED = "export_failed"  # the endpoint refused the batch or could not be reached
SHUTDOWN = "shutdown"  # still queued when the shutdown deadline passed, or emitted after it
ERROR = "error"  # the SDK raised on emit (a bug)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationSettings:
    """Where evaluation events go and how they are judged (the YAML's
    ``otlp_receiver.evaluation``, plus what the agent knows: its resource and threshold).

    ``endpoint`` is the collector's URL: for ``grpc`` as the OTLP exporter takes it
    (``http://`` means a plaintext channel unless ``insecure`` says otherwise); for
    ``http/protobuf`` the base URL (``/v1/logs`` is appended) or the full logs URL.
    """

    enabled: bool = False
    endpoint: str | None = None
    protocol: str = "grpc"
    headers: tuple[tuple[str, str], ...] = ()
    insecure: bool | None = None
    timeout_s: float = 10.0  # one export, retries included
    relevance_threshold: float = DEFAULT_THRESHOLD
    service_name: str = "semhealth"
    resource_attributes: tuple[tuple[str, str], ...] = ()
    max_queue_size: int = 2048  # events waiting for export; past it, new ones are shed
    max_export_batch_size: int = 512
    schedule_delay_s: float = 1.0  # the longest an event waits before its batch is sent

    def validate(self, path: str = "otlp_receiver.evaluation") -> list[ConfigIssue]:
        """Every problem, each naming its key (under ``path``) and the fix."""
        issues: list[ConfigIssue] = []
        if self.enabled and not self.endpoint:
            issues.append(
                ConfigIssue(
                    f"{path}.endpoint",
                    "evaluation events are enabled but have no endpoint",
                    "set it to your collector's OTLP URL, e.g. http://collector:4317, "
                    "or set enabled: false",
                )
            )
        if self.protocol not in PROTOCOLS:
            issues.append(
                ConfigIssue(
                    f"{path}.protocol",
                    f"unknown protocol {self.protocol!r}",
                    "use grpc or http/protobuf",
                )
            )
        if not 0.0 <= self.relevance_threshold <= 1.0:
            issues.append(
                ConfigIssue(
                    f"{path}.relevance_threshold",
                    f"{self.relevance_threshold} is not a calibrated score",
                    "write a number between 0 and 1, e.g. 0.75",
                )
            )
        issues += _positive(path, timeout_s=self.timeout_s, schedule_delay_s=self.schedule_delay_s)
        issues += _positive(
            path,
            max_queue_size=self.max_queue_size,
            max_export_batch_size=self.max_export_batch_size,
        )
        return issues


def _positive(path: str, **values: float) -> list[ConfigIssue]:
    return [
        ConfigIssue(f"{path}.{key}", f"{value} is not positive", "write a number above 0")
        for key, value in values.items()
        if not value > 0
    ]


def relevance_threshold(rules: Iterable[Rule], default: float = DEFAULT_THRESHOLD) -> float:
    """The absolute floor of the first rule that alerts on low context relevance (the shipped
    ContextRelevanceLow: 0.75), so a label of ``not_relevant`` means what the alert means;
    ``default`` when no rule has a plain one (a baseline rule compares changes, not scores)."""
    for rule in rules:
        if (
            rule.signal == RELEVANCE_SIGNAL
            and rule.baseline is None
            and rule.op in ("<", "<=")
            and isinstance(rule.threshold, int | float)
        ):
            return float(rule.threshold)
    return default


def settings_from_config(
    block: Any,
    *,
    forward: Any = None,
    service_name: str = "semhealth",
    resource_attributes: tuple[tuple[str, str], ...] = (),
    threshold: float = DEFAULT_THRESHOLD,
) -> EvaluationSettings:
    """``EvaluationSettings`` from the configuration's ``otlp_receiver.evaluation`` block.

    Without an endpoint of its own the events go to ``forward`` (``otlp_receiver.forward``,
    the next hop), with its headers, TLS choice and timeout; an endpoint of its own gets none
    of forward's headers, which may be credentials for another host. The protocol is the
    block's, else forward's. Keys neither has keep their defaults; a
    ``relevance_threshold`` in the block wins over ``threshold`` (the alert rules' floor).
    """
    defaults = EvaluationSettings()
    endpoint = _get(block, "endpoint", None)
    via_forward = endpoint is None and forward is not None
    shared = forward if via_forward else block  # where the connection settings come from
    headers = _get(shared, "headers", ())
    if isinstance(headers, Mapping):
        headers = tuple(headers.items())
    return EvaluationSettings(
        enabled=bool(_get(block, "enabled", False)),
        endpoint=_get(forward, "endpoint", None) if via_forward else endpoint,
        protocol=_get(block, "protocol", _get(forward, "protocol", defaults.protocol)),
        headers=tuple((str(k), str(v)) for k, v in headers),
        insecure=_get(shared, "insecure", None),
        timeout_s=float(_get(shared, "timeout_s", defaults.timeout_s)),
        relevance_threshold=float(_get(block, "relevance_threshold", threshold)),
        service_name=service_name,
        resource_attributes=resource_attributes,
        max_queue_size=int(_get(block, "max_queue_size", defaults.max_queue_size)),
        max_export_batch_size=int(
            _get(block, "max_export_batch_size", defaults.max_export_batch_size)
        ),
        schedule_delay_s=float(_get(block, "schedule_delay_s", defaults.schedule_delay_s)),
    )


def _get(block: Any, name: str, fallback: Any) -> Any:
    """``block.name``, or ``fallback`` where the block lacks it (or is None) or it is None."""
    value = getattr(block, name, None)
    return fallback if value is None else value


@dataclass(slots=True)
class EvaluationStats:
    """What the emitter did. Every event offered ends exactly once: exported, or dropped for
    one reason (shed before the queue, refused, left at shutdown), or is still ``pending``."""

    emitted: int = 0  # handed to the export queue
    exported: int = 0  # accepted by the endpoint
    dropped: dict[str, int] = field(default_factory=dict)  # by reason (QUEUE_FULL, ...)
    pending: int = 0  # emitted, not yet handed to the exporter
    untraced: int = 0  # records that carried no trace: nothing to put an event on

    def copy(self) -> EvaluationStats:
        return EvaluationStats(
            self.emitted, self.exported, dict(self.dropped), self.pending, self.untraced
        )

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


# --------------------------------------------------------------------------- events


def relevance_attributes(
    name: str, score: float, threshold: float, response_id: str | None
) -> dict[str, AnyValue]:
    """One relevance evaluation's attributes."""
    attributes: dict[str, AnyValue] = {
        EVALUATION_NAME: name,
        SCORE_VALUE: float(score),
        SCORE_LABEL: RELEVANT if score >= threshold else NOT_RELEVANT,
    }
    return _with_response_id(attributes, response_id)


def validity_attributes(
    results: Sequence[ValidityResult], response_id: str | None
) -> dict[str, AnyValue] | None:
    """One record's output validity: valid only when every structured output is, else the
    first failure; None when it had none. Outputs whose schema could not be used are not
    judged: with nothing else judged, the event says so in ``error.type``."""
    judged = [result.result for result in results if result.result != SCHEMA_ERROR]
    if not results:
        return None
    attributes: dict[str, AnyValue] = {EVALUATION_NAME: OUTPUT_VALIDITY}
    if not judged:
        attributes[ERROR_TYPE] = SCHEMA_ERROR
    else:
        failure = next((kind for kind in judged if kind != VALID), None)
        attributes[SCORE_VALUE] = 0.0 if failure else 1.0
        attributes[SCORE_LABEL] = failure or VALID
    return _with_response_id(attributes, response_id)


def _with_response_id(
    attributes: dict[str, AnyValue], response_id: str | None
) -> dict[str, AnyValue]:
    if response_id:
        attributes[RESPONSE_ID] = response_id
    return attributes


def span_context(ref: TraceRef) -> Context:
    """A context whose current span is the one ``ref`` names (remote: another process's)."""
    parent = SpanContext(
        trace_id=int(ref.trace_id, 16),
        span_id=int(ref.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.DEFAULT),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


# --------------------------------------------------------------------------- export


class _CountingExporter(LogRecordExporter):
    """Delegates to the OTLP exporter, counting each batch as it leaves the queue and again
    as it ends (exported or failed). Runs in the batch processor's thread."""

    def __init__(
        self, inner: LogRecordExporter, stats: EvaluationStats, lock: threading.Lock
    ) -> None:
        self._inner = inner
        self._stats = stats
        self._lock = lock
        self._failing = False

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        n = len(batch)
        with self._lock:
            self._stats.pending -= n
        try:
            result = self._inner.export(batch)
        except Exception as exc:  # an exporter must never take the agent down
            log.warning("evaluation event export raised %s", type(exc).__name__)
            result = LogRecordExportResult.FAILURE
        with self._lock:
            if result is LogRecordExportResult.SUCCESS:
                self._stats.exported += n
            else:
                self._stats.drop(EXPORT_FAILED, n)
        self._note(result is LogRecordExportResult.SUCCESS)
        return result

    def _note(self, ok: bool) -> None:
        """One log line per streak of failures, and one when exports recover."""
        if not ok and not self._failing:
            log.warning("evaluation events could not be exported: dropped and counted")
        elif ok and self._failing:
            log.info("evaluation event export recovered")
        self._failing = not ok

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        # The batch processor hands on what is left of its deadline; the gRPC exporter takes
        # it, the HTTP one takes nothing.
        shutdown: Callable[..., None] = self._inner.shutdown
        if "timeout_millis" in inspect.signature(shutdown).parameters:
            shutdown(timeout_millis=timeout_millis)
        else:
            shutdown()


def logs_endpoint(endpoint: str, protocol: str) -> str:
    """The URL the exporter is given: over HTTP a base URL (what ``otlp_receiver.forward``
    takes) gets ``/v1/logs`` appended; a URL that already ends with it is kept."""
    if protocol == "grpc":
        return endpoint
    path = urlsplit(endpoint).path.rstrip("/")
    return endpoint if path.endswith(_LOGS_PATH) else endpoint.rstrip("/") + _LOGS_PATH


def build_exporter(settings: EvaluationSettings) -> LogRecordExporter:
    """The SDK's OTLP log exporter for ``settings`` (gRPC or HTTP/protobuf)."""
    assert settings.endpoint is not None, "validate() first"
    headers = dict(settings.headers)
    endpoint = logs_endpoint(settings.endpoint, settings.protocol)
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
            OTLPLogExporter as GrpcExporter,
        )

        insecure = settings.insecure
        if insecure is None:
            insecure = endpoint.startswith("http://")
        return GrpcExporter(
            endpoint=endpoint, insecure=insecure, headers=headers, timeout=settings.timeout_s
        )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpExporter,
    )

    return HttpExporter(endpoint=endpoint, headers=headers, timeout=settings.timeout_s)


class EvaluationEmitter:
    """Turns judged records into ``gen_ai.evaluation.result`` events on their traces.

    Wire ``consume_record`` as a record consumer (output validity) and ``record_relevance``
    as a relevance sink (``RelevanceStage.also_record``). ``start`` builds the SDK pipeline
    (its export thread); ``shutdown`` flushes what is queued within a deadline. Both are safe
    to call in any order and twice; events before ``start`` or after ``shutdown`` are dropped
    (counted as ``shutdown``). ``clock`` stamps each event: when it was judged (Unix ns).
    """

    def __init__(
        self, settings: EvaluationSettings, *, clock: Callable[[], int] = time.time_ns
    ) -> None:
        issues = settings.validate()
        if issues:
            raise ValueError("; ".join(str(issue) for issue in issues))
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()  # the stats are shared with the export thread
        self.stats = EvaluationStats()
        self._provider: LoggerProvider | None = None
        self._processor: BatchLogRecordProcessor | None = None
        self._logger: Logger | None = None
        self._stopped = False

    def snapshot(self) -> EvaluationStats:
        """A consistent copy of ``stats``, for readers on other threads (metric exports)."""
        with self._lock:
            return self.stats.copy()

    # -- lifecycle

    def start(self) -> None:
        """Build the exporter and the batch processor (which starts the SDK's export thread)."""
        if self._provider is not None or self._stopped:
            return
        settings = self._settings
        exporter = _CountingExporter(build_exporter(settings), self.stats, self._lock)
        processor = BatchLogRecordProcessor(
            exporter,
            schedule_delay_millis=settings.schedule_delay_s * 1000,
            max_export_batch_size=min(settings.max_export_batch_size, settings.max_queue_size),
            export_timeout_millis=settings.timeout_s * 1000,
            max_queue_size=settings.max_queue_size,
        )
        attributes = {"service.name": settings.service_name, **dict(settings.resource_attributes)}
        provider = LoggerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
        provider.add_log_record_processor(processor)
        self._provider, self._processor = provider, processor
        self._logger = provider.get_logger(_SCOPE)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop taking events, export what is queued within ``timeout_s`` (off the loop: the
        SDK's shutdown blocks), and count what could not go as dropped."""
        self._stopped = True
        provider, processor = self._provider, self._processor
        self._provider = self._processor = self._logger = None
        if provider is None or processor is None:
            return
        await asyncio.to_thread(_close, provider, processor, timeout_s)
        with self._lock:
            if self.stats.pending:
                self.stats.drop(SHUTDOWN, self.stats.pending)
                self.stats.pending = 0

    # -- the pipeline's side

    def consume_record(self, record: StreamRecord) -> None:
        """Output validity of a traced record that had structured outputs."""
        ref = record.trace
        if ref is None:
            self.stats.untraced += 1
            return
        attributes = validity_attributes(record.validity, record.response_id)
        if attributes is not None:
            self._emit(span_context(ref), attributes)

    def record_relevance(self, record: StreamRecord, scores: RelevanceScores) -> None:
        """Context and answer relevance of a traced record, where each was scored."""
        ref = record.trace
        if ref is None:
            return
        threshold = self._settings.relevance_threshold
        parent = span_context(ref)  # one context for both events
        for name, score in ((CONTEXT_RELEVANCE, scores.context), (ANSWER_RELEVANCE, scores.answer)):
            if score is not None:
                self._emit(parent, relevance_attributes(name, score, threshold, record.response_id))

    def _emit(self, parent: Context, attributes: dict[str, AnyValue]) -> None:
        logger = self._logger
        stats = self.stats
        with self._lock:
            if logger is None:
                stats.drop(SHUTDOWN)
                return
            # Shed here, before the SDK's queue, whose own shedding is silent.
            if stats.pending >= self._settings.max_queue_size:
                stats.drop(QUEUE_FULL)
                return
            stats.pending += 1
            stats.emitted += 1
        try:
            logger.emit(
                timestamp=self._clock(),
                context=parent,
                severity_number=SeverityNumber.INFO,
                event_name=EVENT_NAME,
                attributes=attributes,
            )
        except Exception:  # the tap's worker calls this: a bug here must not stop records
            log.exception("evaluation event could not be emitted (a bug: please report)")
            with self._lock:
                stats.pending -= 1
                stats.drop(ERROR)


def observe_evaluation(meter: Meter, stats: Callable[[], EvaluationStats]) -> None:
    """``semhealth_evaluation_events_total{result=exported|queue_full|export_failed|shutdown|
    error}``: what became of each evaluation event."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        now = stats()
        observations = [Observation(now.exported, {"result": "exported"})]
        observations += [Observation(n, {"result": reason}) for reason, n in now.dropped.items()]
        return observations

    meter.create_observable_counter(
        "semhealth_evaluation_events",
        [Labelled(callback, "result")],
        description="gen_ai.evaluation.result events sent to otlp_receiver.evaluation's "
        "endpoint (exported), or dropped: queue_full (the endpoint is slow or down), "
        "export_failed (refused or unreachable), shutdown (still queued at shutdown).",
    )


def _close(provider: LoggerProvider, processor: BatchLogRecordProcessor, timeout_s: float) -> None:
    """Shut the pipeline down within ``timeout_s``: the worker exports what is queued until
    the deadline, then the exporter is shut, which cuts a retry short. The SDK's public
    ``shutdown`` waits 30 s on a dead endpoint, so the deadline goes to the batcher inside it
    (SDK 1.45; without it, the public call)."""
    batcher = getattr(processor, "_batch_processor", None)
    shutdown = getattr(batcher, "shutdown", None)
    if shutdown is not None:
        shutdown(timeout_millis=timeout_s * 1000)
    else:
        processor.shutdown()  # type: ignore[no-untyped-call]
    provider.shutdown()  # finds its processor shut down already
