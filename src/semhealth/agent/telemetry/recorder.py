"""Finished stream records -> instrument updates. Stats are data; this only records them.

One call per stream (never per chunk), off the forwarding path. The record comes
checked: its continuity and validity were computed where it was built
(``semhealth.collectors.collector.check_record``). Label values pass a cardinality
guard first, and no text from the request or the response is ever used as a label.
The same values go, as ``Sample``s, to the alert evaluator when one is wired in: it
sees exactly what the metrics see.

What a failed exchange feeds: ``semantic_health_requests_total`` (with its
``error_type``), the operation duration (with ``error.type``, as the GenAI
conventions allow) and the token usage it reported. Latency per chunk or token,
continuity and validity come from successful, whole streams only; the collectors
leave continuity and validity out for a client that left mid-stream.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.util.types import AttributeValue

from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.batching import StreamIntervals
from semhealth.alerts.sample import Sample
from semhealth.collectors import Continuity, gen_ai_provider, intervals_s, operation_name
from semhealth.collectors.record import StreamRecord, ValidityResult

if TYPE_CHECKING:  # it loads numpy, which an agent that scores nothing never needs
    from semhealth.embeddings.relevance import RelevanceScores

OTHER = "other"


# The labels every alert signal carries (see semhealth.alerts.signals).
_ALERT_LABELS = (m.ROUTE, m.MODEL, m.PROVIDER, m.PROMPT_CLASS, m.VARIANT)


def _alert_labels(attrs: Mapping[str, AttributeValue]) -> dict[str, str]:
    """The labels alert rules group by, as text, of those ``attrs`` has."""
    return {key: str(attrs[key]) for key in _ALERT_LABELS if key in attrs}


class LabelGuard:
    """Bounded label values: the first ``max_values`` distinct values of a key pass, later ones
    fold into ``other``. Routes are bounded by configuration; what this guards is every label
    whose values come from traffic: the model, the provider a GenAI span names, and the error
    type (an upstream's error code, or its ``X-RateLimit-Source`` header)."""

    def __init__(self, max_values: int) -> None:
        self._max = max_values
        self._seen: dict[str, set[str]] = {}
        self.folded = 0

    def fold(self, key: str, value: str) -> str:
        seen = self._seen.setdefault(key, set())
        if value in seen:
            return value
        if len(seen) < self._max:
            seen.add(value)
            return value
        self.folded += 1
        return OTHER


class RollingRatio:
    """valid / checked per label set over a sliding window, in fixed slots so memory
    stays bounded whatever the traffic."""

    def __init__(self, window_s: float, slots: int = 30) -> None:
        self._slot_s = window_s / slots
        self._slots = slots
        self._counts: dict[tuple[str, ...], dict[int, list[int]]] = {}
        # ratios() runs in the OTLP reader's thread too, while add() runs on the event loop:
        # without the lock, pruning iterates a dict that add() is growing.
        self._lock = threading.Lock()

    def add(self, key: tuple[str, ...], ok: bool, now: float) -> None:
        slot = int(now / self._slot_s)
        with self._lock:
            cells = self._counts.setdefault(key, {})
            cell = cells.setdefault(slot, [0, 0])
            cell[0] += ok
            cell[1] += 1
            if len(cells) > self._slots:
                self._prune(cells, slot)

    def _prune(self, cells: dict[int, list[int]], current: int) -> None:
        for old in [s for s in cells if s <= current - self._slots]:
            del cells[old]

    def ratios(self, now: float) -> dict[tuple[str, ...], float]:
        return {key: ok / total for key, (ok, total) in self.counts(now).items()}

    def counts(self, now: float) -> dict[tuple[str, ...], tuple[int, int]]:
        """(valid, checked) per label set within the window; empty sets are forgotten."""
        current = int(now / self._slot_s)
        out = {}
        with self._lock:
            for key, cells in list(self._counts.items()):
                self._prune(cells, current)
                ok = sum(c[0] for c in cells.values())
                total = sum(c[1] for c in cells.values())
                if total:
                    out[key] = (ok, total)
                else:
                    del self._counts[key]
        return out


@dataclass(frozen=True, slots=True)
class RecorderSettings:
    validity_window_s: float = 300.0
    max_label_values: int = 100
    # Labels every series this recorder writes: ``primary`` and ``shadow`` while live
    # shadowing runs (the candidate's records have a recorder of their own). None: no label.
    # Prometheus needs one label set per metric, so both sides carry it or neither does.
    variant: str | None = None


def error_type(record: StreamRecord) -> str:
    """The error class of an exchange, as the record has it; "" for a success.

    429s carry who throttled (``429_upstream``, ``429_gateway``) from ``X-RateLimit-Source``.
    """
    kind = record.error_type or ""
    if kind == "429" and record.ratelimit_source:
        source = record.ratelimit_source.strip().lower()
        return f"429_{source}" if source.isidentifier() else "429"
    return kind


# The validity gauge's labels: a semantic series' own but the variant (the gauge is the
# primary's), so proxied and OTLP validity are never averaged together.
VALIDITY_LABELS = (m.ROUTE, m.MODEL, m.PROVIDER, m.PROMPT_CLASS, m.SOURCE)


def validity_key(attrs: Mapping[str, AttributeValue]) -> tuple[str, ...]:
    return tuple(str(attrs[label]) for label in VALIDITY_LABELS)


ConsumeSample = Callable[[Sample], None]


class Recorder:
    """``consume_record`` for the telemetry pipeline.

    ``consume_sample`` (the alert evaluator's ``observe``) gets one ``Sample`` per signal
    value recorded, stamped with ``wall_clock``; ``clock`` times the validity window.
    """

    def __init__(
        self,
        instruments: m.Instruments,
        settings: RecorderSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        consume_sample: ConsumeSample | None = None,
    ) -> None:
        variant = settings.variant
        self._variant: dict[str, AttributeValue] = {} if variant is None else {m.VARIANT: variant}
        self._c = instruments.counters
        self._h = instruments.histograms
        self._settings = settings
        self._clock = clock
        self._wall_clock = wall_clock
        self.consume_sample = consume_sample
        self.guard = LabelGuard(settings.max_label_values)
        self.validity = RollingRatio(settings.validity_window_s)

    def semantic_attributes(self, record: StreamRecord) -> dict[str, AttributeValue]:
        return {
            m.ROUTE: self.guard.fold(m.ROUTE, record.route),
            m.MODEL: self.guard.fold(m.MODEL, record.model),
            m.PROVIDER: self.guard.fold(m.PROVIDER, record.provider),
            m.PROMPT_CLASS: record.prompt_class,
            m.SOURCE: record.source,
            **self._variant,
        }

    def _emit(self, signal: str, value: float, labels: Mapping[str, str], t: float) -> None:
        """A sample for the alert rules; ``labels`` and ``t`` are made once a record and
        shared by its samples (read-only, as ``Sample`` types them)."""
        if self.consume_sample is not None:
            self.consume_sample(Sample(signal, value, labels, t))

    def record_relevance(self, record: StreamRecord, scores: RelevanceScores) -> None:
        """The calibrated scores of one record, once its embeddings are back."""
        attrs = self.semantic_attributes(record)
        labels = _alert_labels(attrs)
        t = self._wall_clock()
        if scores.context is not None:
            self._h["semantic_health_context_relevance_score"].record(scores.context, attrs)
            self._emit("context_relevance_score", scores.context, labels, t)
        if scores.answer is not None:
            self._h["semantic_health_answer_relevance_score"].record(scores.answer, attrs)
            self._emit("answer_relevance_score", scores.answer, labels, t)

    def consume_record(self, record: StreamRecord) -> None:
        semantic = self.semantic_attributes(record)
        route = str(semantic[m.ROUTE])
        model = str(semantic[m.MODEL])
        request_model = self.guard.fold(m.MODEL, record.request.model or record.model)
        gen_ai: dict[str, AttributeValue] = {
            m.OPERATION: operation_name(record.provider),
            m.GEN_AI_PROVIDER: gen_ai_provider(str(semantic[m.PROVIDER])),
            m.PROVIDER: semantic[m.PROVIDER],
            m.REQUEST_MODEL: request_model,
            m.RESPONSE_MODEL: model,
            m.ROUTE: route,
            m.PROMPT_CLASS: record.prompt_class,
            m.SOURCE: record.source,
            **self._variant,
        }
        # "" (a success) is no error type: it never takes one of the guard's places.
        kind = error_type(record)
        failure = self.guard.fold(m.ERROR_TYPE, kind) if kind else ""
        self._c["semantic_health_requests"].add(
            1, {**semantic, m.STATUS_CLASS: f"{record.status // 100}xx", m.ERROR_TYPE: failure}
        )
        labels = _alert_labels(semantic)
        t = self._wall_clock()
        self._emit("request_success_rate", 0.0 if failure else 1.0, labels, t)
        if record.provider_tools:  # few records have any: no Counter for the rest
            provider_tools = self._c["semantic_health_provider_tool_calls"]
            for kind, calls in Counter(record.provider_tools).items():
                provider_tools.add(calls, {**semantic, m.TOOL_KIND: kind})
        self._record_gen_ai(record, gen_ai, failure, t)
        if record.continuity is not None:
            self._record_continuity(record.continuity, semantic, labels, t)
        self._record_validity(record.validity, semantic, labels, t)

    def _record_gen_ai(
        self, record: StreamRecord, attrs: dict[str, AttributeValue], failure: str, t: float
    ) -> None:
        duration_attrs = {**attrs, m.ERROR: failure} if failure else attrs
        self._h["gen_ai.client.operation.duration"].record(record.duration_s, duration_attrs)
        # Alert labels use the short names; Signal.prometheus_labels maps them back.
        labels = {
            m.ROUTE: str(attrs[m.ROUTE]),
            m.MODEL: str(attrs[m.RESPONSE_MODEL]),
            m.PROVIDER: str(attrs[m.GEN_AI_PROVIDER]),
            m.PROMPT_CLASS: str(attrs[m.PROMPT_CLASS]),
        }
        self._emit("operation_duration", record.duration_s, labels, t)
        tokens = self._h["gen_ai.client.token.usage"]
        if record.usage.input_tokens is not None:
            tokens.record(record.usage.input_tokens, {**attrs, m.TOKEN_TYPE: "input"})
        if record.usage.output_tokens is not None:
            tokens.record(record.usage.output_tokens, {**attrs, m.TOKEN_TYPE: "output"})
        if record.usage.reasoning_tokens is not None:
            self._h["gen_ai.client.inference.usage.reasoning.output_tokens"].record(
                record.usage.reasoning_tokens, attrs
            )
        # A client that left is a failure too (client_aborted): its stream is partial.
        if failure or not record.streamed or record.shed:
            return
        if record.ttfb_s is not None:
            self._h["gen_ai.client.operation.time_to_first_chunk"].record(record.ttfb_s, attrs)
            self._emit("time_to_first_chunk", record.ttfb_s, labels, t)
        if record.ttft_s is not None:
            self._h["gen_ai.server.time_to_first_token"].record(record.ttft_s, attrs)
            self._emit("time_to_first_token", record.ttft_s, labels, t)
        # Every interval is counted: one measurement carries them all (see telemetry.batching).
        # A stream without two deltas records none: an empty batch would be held for nothing.
        intervals = StreamIntervals(intervals_s(record.delta_ns))
        if intervals.values:
            self._h["gen_ai.client.operation.time_per_output_chunk"].record(intervals, attrs)
        tpot = _time_per_output_token(record)
        if tpot is not None:
            self._h["gen_ai.server.time_per_output_token"].record(tpot, attrs)
            self._emit("time_per_output_token", tpot, labels, t)

    def _record_continuity(
        self,
        continuity: Continuity,
        attrs: dict[str, AttributeValue],
        labels: Mapping[str, str],
        t: float,
    ) -> None:
        if continuity.index_s is None or continuity.max_gap_s is None:
            return
        self._h["semantic_health_stream_continuity_index"].record(continuity.index_s, attrs)
        self._h["semantic_health_stream_max_gap"].record(continuity.max_gap_s, attrs)
        self._emit("stream_continuity_index", continuity.index_s, labels, t)
        self._emit("stream_max_gap", continuity.max_gap_s, labels, t)
        if continuity.stalls:
            self._c["semantic_health_stream_stalls"].add(continuity.stalls, attrs)

    def _record_validity(
        self,
        results: tuple[ValidityResult, ...],
        attrs: dict[str, AttributeValue],
        labels: Mapping[str, str],
        t: float,
    ) -> None:
        if not results:
            return
        now = self._clock()
        key = validity_key(attrs)
        for result in results:
            self._c["semantic_health_outputs"].add(1, {**attrs, m.RESULT: result.result})
            self._count_reasons(result, attrs)
            self.validity.add(key, result.result == "valid", now)
            self._emit("model_output_validity_rate", float(result.result == "valid"), labels, t)

    def _count_reasons(self, result: ValidityResult, attrs: dict[str, AttributeValue]) -> None:
        reasons = self._c["semantic_health_output_failure_reasons"]
        for reason in result.reasons:
            reasons.add(1, {**attrs, m.RESULT: result.result, m.REASON: reason})

    def validity_rates(self) -> dict[tuple[str, ...], float]:
        """Current validity rate per ``VALIDITY_LABELS``; sets with no outputs are absent."""
        return self.validity.ratios(self._clock())

    def validity_counts(self) -> dict[tuple[str, ...], tuple[int, int]]:
        """(valid, checked) per ``VALIDITY_LABELS`` within the window."""
        return self.validity.counts(self._clock())


def _time_per_output_token(record: StreamRecord) -> float | None:
    """Mean time per token after the first: (last delta - first delta) / (tokens - 1)."""
    if len(record.delta_ns) < 2:
        return None
    tokens = record.usage.output_tokens or len(record.delta_ns)
    if tokens < 2:
        return None
    return (record.delta_ns[-1] - record.delta_ns[0]) / 1e9 / (tokens - 1)
