"""Recorded traffic through the live pipeline, on the recording's clock.

Exchanges are rebuilt by the same ``StreamCollector`` (with the route contracts attached,
as the agent does), OTLP input by the same ``GenAITraces`` the receiver uses. Records are
then taken in the order the live agent finished them (end time) and fed to the same
``Recorder`` the agent's telemetry uses, whose clocks read the record's end time: the
``Sample``s it emits carry the time the live agent stamped them with. Relevance is scored
by the configured encoder (every eligible record; the live ``sample_rate`` does not apply)
and recorded at that same time. An ``Evaluator`` with the configured rules is fed those
samples and evaluated every ``alerts.evaluation_interval_s`` of replayed time, from the
first record to the last: each change of an alert's state is an ``AlertTransition``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from semhealth.agent.config import Config
from semhealth.agent.config.contracts import attach_contracts
from semhealth.agent.relevance import EMPTY, LoadedEncoders, eligibility, offline_scorer
from semhealth.agent.replay.inputs import ExchangeInput, Input, OTLPInput
from semhealth.agent.replay.results import AlertTransition, InputProblem, RecordResult
from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.pipeline import OTLPSettings, build_otlp_exporter
from semhealth.agent.telemetry.recorder import Recorder, RecorderSettings, error_type
from semhealth.alerts import Evaluator, Rule, Sample
from semhealth.collectors import Config as CollectorsConfig
from semhealth.collectors import StreamCollector, StreamRecord
from semhealth.embeddings import EmbeddingError, Overloaded, RelevanceScores

log = logging.getLogger(__name__)

_SCORE_WINDOW = 64  # scores in flight at once: enough to fill the micro-batcher's batches


@dataclass(frozen=True, slots=True)
class Replayed:
    """A record rebuilt from an input, with where it came from."""

    record: StreamRecord
    id: str
    source_file: str
    line: int
    chunk_times: bool = True


@dataclass(slots=True)
class Built:
    records: list[Replayed] = field(default_factory=list)
    problems: list[InputProblem] = field(default_factory=list)


# -- inputs -> records ------------------------------------------------------------------------


def exchange_record(item: ExchangeInput, config: CollectorsConfig) -> StreamRecord:
    """The record the live tap built for this exchange. Clock: Unix-epoch nanoseconds."""
    recorded = item.recorded
    start_ns = round(recorded.time * 1e9)
    collector = StreamCollector(recorded.exchange(start_ns), config)
    for offset, chunk in recorded.chunks:
        collector.feed(chunk, start_ns + offset)
    outcome = recorded.outcome(start_ns)
    record = collector.finish(
        outcome.end_ns,
        client_aborted=outcome.client_aborted,
        upstream_aborted=outcome.upstream_aborted,
        shed=recorded.shed,
        error_type=outcome.error_type,
    )
    if recorded.elided_bytes:
        record = dataclasses.replace(
            record, response_bytes=record.response_bytes + recorded.elided_bytes
        )
    if not item.chunk_times:
        # One body at one time: the deltas' times are unknown, not all equal.
        record = dataclasses.replace(record, first_delta_ns=None, delta_ns=(), continuity=None)
    return record


class _OTLPRecords:
    """OTLP inputs through ``GenAITraces``; records come back through ``_consume``.

    Its clock counts input lines: a GenAI span waits ``_WAIT_LINES`` lines of its file for
    its trace's events and retriever spans (an exporter writes a trace's pieces close
    together), then its record is built, so memory stays bounded on a long file.
    """

    _WAIT_LINES = 1000.0

    def __init__(self, built: Built, collectors: CollectorsConfig) -> None:
        from semhealth.agent.otlp.genai import GenAISettings, GenAITraces

        self._built = built
        self._path = ""
        self._lines = 0
        self._ordinal: dict[str, int] = {}
        self._traces = GenAITraces(
            GenAISettings(trace_wait_s=self._WAIT_LINES),
            self._consume,
            collectors=collectors,
            clock=lambda: float(self._lines),
        )

    def _consume(self, record: StreamRecord) -> None:
        path = self._path
        ordinal = self._ordinal[path] = self._ordinal.get(path, 0) + 1
        trace = record.trace
        ident = f"{trace.trace_id}/{trace.span_id}" if trace is not None else f"otlp-{ordinal}"
        self._built.records.append(Replayed(record, ident, path, ordinal))

    def add(self, item: OTLPInput) -> None:
        if item.source_file != self._path:
            self._traces.close()  # a trace does not span files: the last file's are done
            self._path = item.source_file
        self._lines += 1
        if item.signal == "traces":
            self._traces.add_spans(item.resource)
        else:
            self._traces.add_logs(item.resource)
        self._traces.flush()

    def close(self) -> None:
        self._traces.close()


def build_records(inputs: Iterable[Input], config: Config) -> Built:
    """Every input as a record, and every input that could not be one as a problem."""
    built = Built()
    collectors = attach_contracts(config.collectors)
    otlp: _OTLPRecords | None = None
    for item in inputs:
        if isinstance(item, InputProblem):
            built.problems.append(item)
        elif isinstance(item, ExchangeInput):
            try:
                record = exchange_record(item, collectors)
            except Exception as exc:  # the collectors never raise on bad bytes: this is a bug
                # The type only: an exception's message may quote the traffic.
                error = f"could not be analysed ({type(exc).__name__}: a bug, please report)"
                built.problems.append(_problem(item, error))
                continue
            built.records.append(
                Replayed(record, item.recorded.id, item.source_file, item.line, item.chunk_times)
            )
        else:
            if otlp is None:
                try:
                    otlp = _OTLPRecords(built, collectors)
                except ImportError:
                    built.problems.append(
                        _problem(item, "OTLP input needs semhealth.agent.otlp.genai")
                    )
                    continue
            otlp.add(item)
    if otlp is not None:
        otlp.close()
    return built


def _problem(item: ExchangeInput | OTLPInput, error: str) -> InputProblem:
    return InputProblem(source_file=item.source_file, line=item.line, error=error)


# -- relevance --------------------------------------------------------------------------------


@dataclass(slots=True)
class Scored:
    scores: dict[int, RelevanceScores] = field(default_factory=dict)  # by index in ``records``
    skipped: dict[int, str] = field(default_factory=dict)  # why not, by index
    off: str | None = None  # why nothing was scored


async def score_records(
    records: Sequence[Replayed],
    config: Config,
    *,
    loaded: LoadedEncoders = EMPTY,
    progress: Callable[[int], object] = lambda _n: None,
) -> Scored:
    """Relevance of every eligible record, ``_SCORE_WINDOW`` at a time through the batcher."""
    scored = Scored()
    async with offline_scorer(config.relevance, loaded) as scorer:
        if isinstance(scorer, str):
            scored.off = scorer
            return scored
        todo = []
        for index, replayed in enumerate(records):
            reason = eligibility(replayed.record)
            if reason is None:
                todo.append(index)
            else:
                scored.skipped[index] = reason
        for start in range(0, len(todo), _SCORE_WINDOW):
            window = todo[start : start + _SCORE_WINDOW]
            results = await asyncio.gather(
                *(_score_one(scorer, records[index].record) for index in window)
            )
            for index, result in zip(window, results, strict=True):
                if isinstance(result, str):
                    scored.skipped[index] = result
                else:
                    scored.scores[index] = result
            progress(len(window))
    return scored


async def _score_one(scorer: Any, record: StreamRecord) -> RelevanceScores | str:
    query = record.request.query or ""
    for attempt in range(20):
        try:
            scores: RelevanceScores = await scorer.score(
                query, record.request.context, record.output_text or None
            )
            return scores
        except Overloaded:
            await asyncio.sleep(0.05 * (attempt + 1))  # offline: waiting is fine
        except EmbeddingError as exc:
            log.warning("relevance scoring failed: %s", type(exc).__name__)
            return "error"
    return "overloaded"


# -- alerts on the replayed clock -------------------------------------------------------------


class ReplayAlerts:
    """The configured rules over the replayed span, evaluated every ``interval_s`` of it."""

    def __init__(self, rules: Sequence[Rule], *, interval_s: float, resend_delay_s: float):
        self._evaluator = Evaluator(
            rules, notify=lambda _alerts: None, resend_delay_s=resend_delay_s, interval_s=interval_s
        )
        self._interval_s = interval_s
        self._next_at: float | None = None
        self._states: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        self.transitions: list[AlertTransition] = []

    def observe(self, sample: Sample) -> None:
        self._evaluator.observe(sample)

    def advance(self, t: float) -> None:
        """Evaluate every tick before ``t``; the first tick is the first record's time."""
        if self._next_at is None:
            self._next_at = t
        while self._next_at < t:
            self._evaluate(self._next_at)
            self._next_at += self._interval_s

    def finish(self, end: float) -> None:
        """Evaluate up to the first tick at or after ``end``, so every sample was seen."""
        if self._next_at is None:
            return
        while True:
            self._evaluate(self._next_at)
            if self._next_at >= end:
                return
            self._next_at += self._interval_s

    def _evaluate(self, now: float) -> None:
        self._evaluator.evaluate(now)
        for rule in self._evaluator.snapshot(now):
            for group in rule.groups:
                key = (rule.name, tuple(sorted(group.labels.items())))
                before = self._states.get(key, "inactive")
                if group.state == before:
                    continue
                self._states[key] = group.state
                if group.state in ("pending", "firing", "resolved"):
                    self.transitions.append(
                        AlertTransition(
                            rule=rule.name,
                            state=group.state,
                            time=now,
                            labels=dict(group.labels),
                            value=group.value,
                        )
                    )


# -- metrics ----------------------------------------------------------------------------------


class _Clock:
    """The replayed time the recorder reads: a record's end while it is recorded."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def otlp_push_settings(endpoint: str, config: Config) -> OTLPSettings:
    """``--otlp-push``: OTLP/HTTP when the endpoint names /v1/metrics, else the configured
    protocol (gRPC by default)."""
    configured = config.telemetry.otlp
    protocol = "http/protobuf" if "/v1/metrics" in endpoint else configured.protocol
    return OTLPSettings(
        endpoint=endpoint,
        protocol=protocol,
        headers=configured.headers,
        timeout_s=configured.timeout_s,
        insecure=configured.insecure,
    )


class _OutcomeExporter(MetricExporter):
    """Delegates; remembers whether the export succeeded, so the CLI can say so."""

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self.result: MetricExportResult | None = None

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            self.result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # a failed push is reported, never a crash after the work
            log.warning("OTLP push raised %s", type(exc).__name__)
            self.result = MetricExportResult.FAILURE
        return self.result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class ReplayMetrics:
    """The agent's instruments and ``Recorder`` on a provider of the replay's own; with an
    OTLP endpoint, ``push`` exports the totals once (a backfill)."""

    def __init__(self, config: Config, push: OTLPSettings | None) -> None:
        telemetry = config.telemetry
        self.clock = _Clock()
        readers: list[MetricReader] = []
        self._reader: PeriodicExportingMetricReader | None = None
        self._exporter: _OutcomeExporter | None = None
        self._timeout_ms = 10_000.0
        if push is not None:
            self._timeout_ms = push.timeout_s * 1000
            self._exporter = _OutcomeExporter(build_otlp_exporter(push))
            # An infinite interval: no thread; push() collects once.
            self._reader = PeriodicExportingMetricReader(
                self._exporter,
                export_interval_millis=math.inf,
                export_timeout_millis=self._timeout_ms,
            )
            readers.append(self._reader)
        attributes: dict[str, str | bool] = {
            "service.name": telemetry.service_name,
            **dict(telemetry.resource_attributes),
            "semhealth.replay": True,
        }
        self._provider = MeterProvider(
            resource=Resource.create(attributes), metric_readers=readers, views=m.views()
        )
        self.recorder = Recorder(
            m.Instruments(self._provider.get_meter("semhealth.agent")),
            RecorderSettings(
                validity_window_s=telemetry.validity_window_s,
                max_label_values=telemetry.max_label_values,
            ),
            clock=self.clock,
            wall_clock=self.clock,
        )

    def push(self) -> bool | None:
        """Export the totals once: True if the endpoint took them, None without one."""
        if self._reader is None or self._exporter is None:
            return None
        self._reader.collect(timeout_millis=self._timeout_ms)
        return self._exporter.result is MetricExportResult.SUCCESS

    def close(self) -> None:
        self._provider.shutdown(timeout_millis=10_000)


# -- results ----------------------------------------------------------------------------------


def record_result(
    replayed: Replayed, scores: RelevanceScores | None, skipped: str | None
) -> RecordResult:
    record = replayed.record
    continuity = record.continuity
    return RecordResult(
        id=replayed.id,
        source_file=replayed.source_file,
        line=replayed.line,
        time=record.start_ns / 1e9,
        source=record.source,
        route=record.route,
        model=record.model,
        provider=record.provider,
        prompt_class=record.prompt_class,
        status=record.status,
        error_type=error_type(record),
        duration_s=record.duration_s,
        ttft_s=record.ttft_s,
        ttfb_s=record.ttfb_s,
        continuity_index_s=continuity.index_s if continuity is not None else None,
        max_gap_s=continuity.max_gap_s if continuity is not None else None,
        stalls=continuity.stalls if continuity is not None else 0,
        input_tokens=record.usage.input_tokens,
        output_tokens=record.usage.output_tokens,
        validity=tuple((v.result, tuple(v.reasons)) for v in record.validity),
        context_relevance=scores.context if scores is not None else None,
        answer_relevance=scores.answer if scores is not None else None,
        relevance_skipped=skipped,
        chunk_times=replayed.chunk_times,
    )
