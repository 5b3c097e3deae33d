"""GenAI traces and logs received over OTLP -> the same ``StreamRecord`` the proxy tap builds.

``GenAITraces`` is fed by the OTLP receiver's request handlers (``add_spans``, ``add_logs``:
fast, never raising; every span is looked at only by its attribute keys unless it is a GenAI
or retriever span) and drained by a timer (``flush``). A GenAI span (an inference operation:
``chat``, ``text_completion``, ``generate_content``, or OpenLLMetry's ``llm.request.type``
``chat``/``completion``) waits ``trace_wait_s`` after it arrived for what belongs with it:

- its events, as log records with its trace and span ids or as span events (the
  ``gen_ai.client.inference.operation.details`` event, the older ``gen_ai.*.message`` /
  ``gen_ai.choice`` events, OpenLIT's ``gen_ai.content.*`` events, OpenLLMetry's chunk events);
- the documents of the retriever spans of its trace, before or after it.

Retriever spans recognised, and where their documents' text is read from:

- GenAI conventions: ``gen_ai.operation.name`` ``retrieval``, ``gen_ai.retrieval.documents``
  (a list of objects; text from ``content``, ``text`` or ``page_content``);
- OpenLLMetry vector-DB instrumentations (Chroma, Qdrant, Pinecone, ...): ``db.query.result``
  span events with ``db.query.result.document``;
- OpenLLMetry LangChain/LlamaIndex retrievers: a ``traceloop.span.kind`` span whose name says
  ``retriev`` with ``traceloop.entity.output`` (JSON; every ``page_content`` / ``text`` in it);
- OpenInference (Arize Phoenix): ``retrieval.documents.N.document.content``.

Memory is bounded: GenAI spans, retriever spans and early events held all count against
``max_pending_spans``; past it new ones are shed and counted. A message attribute larger than
``max_message_bytes`` is not read (counted as ``oversized``; the record says so: an oversized
request is ``analysed=False``, an oversized output ``truncated``). Malformed values are counted
by reason in ``stats.malformed`` and skipped. Nothing here logs or exports text.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from semhealth.agent.otlp import conventions as c
from semhealth.agent.otlp.conventions import Problems, attribute_map, plain
from semhealth.agent.otlp.genai_record import OTHER_ROUTE, GenAISpan, build_record
from semhealth.agent.otlp.messages import SpanEvent
from semhealth.collectors import Config, SchemaCache, StreamRecord, default_config

log = logging.getLogger(__name__)

_GENAI_EVENTS = frozenset(
    {
        c.OPERATION_DETAILS_EVENT,
        c.CHOICE_EVENT,
        c.COMPLETION_CHUNK_EVENT,
        c.OPENLIT_PROMPT_EVENT,
        c.OPENLIT_COMPLETION_EVENT,
        *c.MESSAGE_EVENTS,
    }
)
_LEGACY_REQUEST_TYPES = frozenset({"chat", "completion"})
_NON_INFERENCE = frozenset({"embeddings", "execute_tool", "invoke_agent", "create_agent"})


@dataclass(frozen=True, slots=True, kw_only=True)
class GenAISettings:
    # How long a GenAI span waits for the retriever spans and log events of its trace.
    trace_wait_s: float = 2.0
    max_pending_spans: int = 10_000  # bounded memory; past it spans are shed and counted
    max_message_bytes: int = 1 << 20  # a message attribute larger than this is not analysed
    route_attribute: str = "service.name"  # resource/span attribute that names the route label


@dataclass(slots=True)
class GenAIStats:
    """Counters since start. ``malformed`` counts values that could not be read, by reason."""

    spans_seen: int = 0
    genai_spans: int = 0
    retriever_spans: int = 0
    log_records_seen: int = 0
    genai_events: int = 0
    records: int = 0
    shed: int = 0  # spans not held: max_pending_spans reached
    shed_events: int = 0  # log records not held: max_pending_spans reached
    oversized: int = 0  # message values over max_message_bytes, not read
    orphan_events: int = 0  # GenAI events whose span never came within trace_wait_s
    late_documents: int = 0  # retriever spans that came after their trace's GenAI spans left
    malformed: dict[str, int] = field(default_factory=dict)

    def count(self, problems: Problems) -> None:
        for reason, n in problems.reasons.items():
            self.malformed[reason] = self.malformed.get(reason, 0) + n


@dataclass(slots=True)
class _Trace:
    """What is held for one trace: its waiting GenAI spans, documents and early events."""

    deadline: float
    spans: dict[bytes, GenAISpan] = field(default_factory=dict)
    documents: list[str] = field(default_factory=list)
    early_events: dict[bytes, list[SpanEvent]] = field(default_factory=dict)  # span id -> events
    emitted: bool = False  # some GenAI span of this trace was already built
    held: int = 0  # retriever spans and log events of this trace counted in GenAITraces._held


class GenAITraces:
    """Builds one ``StreamRecord`` per GenAI span and hands it to ``consume_record``.

    Not thread-safe: call every method from one thread (the receiver's event loop).
    """

    def __init__(
        self,
        settings: GenAISettings,
        consume_record: Callable[[StreamRecord], None],
        *,
        collectors: Config | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._consume = consume_record
        self._config = collectors if collectors is not None else default_config()
        self._clock = clock
        self._schemas = SchemaCache()
        self._traces: OrderedDict[bytes, _Trace] = OrderedDict()  # by last arrival
        # Traces whose GenAI spans were built and that went quiet, remembered for another
        # trace_wait_s so that what comes for them late is counted rather than held.
        self._finished: OrderedDict[bytes, float] = OrderedDict()
        self._due: deque[tuple[float, bytes, bytes]] = deque()  # (deadline, trace, span) FIFO
        self._held = 0
        self.stats = GenAIStats()

    # --- intake (request handler) ---------------------------------------------------------

    def add_spans(self, resource_spans: Sequence[ResourceSpans]) -> int:
        """Hold the GenAI and retriever spans among ``resource_spans``; returns spans shed."""
        shed_before = self.stats.shed
        now = self._clock()
        for resource in resource_spans:
            problems = Problems()
            route = _route_of(resource.resource.attributes, self._settings.route_attribute)
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.stats.spans_seen += 1
                    self._add_span(span, route, now, problems)
            self.stats.count(problems)
        return self.stats.shed - shed_before

    def add_logs(self, resource_logs: Sequence[ResourceLogs]) -> int:
        """Hold the GenAI events among ``resource_logs``; returns log records shed."""
        shed_before = self.stats.shed_events
        now = self._clock()
        problems = Problems()
        for resource in resource_logs:
            for scope in resource.scope_logs:
                for record in scope.log_records:
                    self.stats.log_records_seen += 1
                    self._add_log(record, now, problems)
        self.stats.count(problems)
        return self.stats.shed_events - shed_before

    def _add_span(self, span: Span, route: str | None, now: float, problems: Problems) -> None:
        kind = _kind_of(span)
        if kind is None:
            return
        if len(span.trace_id) != 16 or len(span.span_id) != 8:
            problems.add("bad_ids")
            return
        if self._held >= self._settings.max_pending_spans:
            self.stats.shed += 1
            return
        try:
            if kind == "retriever":
                self._add_retriever(span, now, problems)
            else:
                self._add_genai(span, route, now, problems)
        except Exception as exc:  # a bad span must never fail the receiver's request
            problems.add("unreadable")
            _log_failure("a span could not be read", exc)

    def _add_genai(self, span: Span, route: str | None, now: float, problems: Problems) -> None:
        self.stats.genai_spans += 1
        attrs = self._attributes(span.attributes, problems)
        events = [e for e in (self._span_event(ev, problems) for ev in span.events) if e]
        route_value = attrs.get(self._settings.route_attribute)
        if not isinstance(route_value, str) or not route_value:
            route_value = OTHER_ROUTE
        trace = self._touch(span.trace_id, now)
        events += trace.early_events.pop(span.span_id, [])  # still counted in trace.held
        trace.spans[span.span_id] = GenAISpan(
            trace_id=span.trace_id,
            span_id=span.span_id,
            route=route or route_value,
            start_ns=span.start_time_unix_nano,
            end_ns=max(span.end_time_unix_nano, span.start_time_unix_nano),
            error=span.status.code == Status.STATUS_CODE_ERROR,
            attributes=attrs,
            events=events,
        )
        self._held += 1
        self._due.append((now + self._settings.trace_wait_s, span.trace_id, span.span_id))

    def _add_retriever(self, span: Span, now: float, problems: Problems) -> None:
        self.stats.retriever_spans += 1
        if self._is_finished(span.trace_id):
            self.stats.late_documents += 1
            return
        documents = _documents(span, self._attributes(span.attributes, problems), problems)
        trace = self._touch(span.trace_id, now)
        trace.documents.extend(documents)
        trace.held += 1
        self._held += 1

    def _add_log(self, record: LogRecord, now: float, problems: Problems) -> None:
        name = record.event_name or _event_name_attribute(record)
        if name not in _GENAI_EVENTS:
            return
        self.stats.genai_events += 1
        if len(record.trace_id) != 16 or len(record.span_id) != 8:
            problems.add("no_span_context")
            return
        if self._held >= self._settings.max_pending_spans:
            self.stats.shed_events += 1
            return
        if self._is_finished(record.trace_id):
            self.stats.orphan_events += 1
            return
        event = self._event(
            name,
            record.time_unix_nano or record.observed_time_unix_nano,
            record.attributes,
            record.body if record.HasField("body") else None,
            problems,
        )
        if event is None:
            return
        trace = self._touch(record.trace_id, now)
        pending = trace.spans.get(record.span_id)
        if pending is not None:
            pending.events.append(event)
        else:
            trace.early_events.setdefault(record.span_id, []).append(event)
        trace.held += 1
        self._held += 1

    def _span_event(self, event: Span.Event, problems: Problems) -> SpanEvent | None:
        if event.name not in _GENAI_EVENTS:
            return None
        return self._event(event.name, event.time_unix_nano, event.attributes, None, problems)

    def _event(
        self, name: str, time_ns: int, attributes: Any, body: Any, problems: Problems
    ) -> SpanEvent | None:
        try:
            if body is not None and body.ByteSize() > self._settings.max_message_bytes:
                self.stats.oversized += 1
                body = None
            return SpanEvent(
                name=name,
                time_ns=time_ns,
                attributes=self._attributes(attributes, problems),
                body=plain(body, problems) if body is not None else None,
            )
        except Exception as exc:
            problems.add("unreadable")
            _log_failure("an event could not be read", exc)
            return None

    def _attributes(self, attributes: Any, problems: Problems) -> dict[str, Any]:
        attrs = attribute_map(
            attributes, problems, max_message_bytes=self._settings.max_message_bytes
        )
        self.stats.oversized += sum(1 for v in attrs.values() if v is c.OVERSIZED)
        return attrs

    def _touch(self, trace_id: bytes, now: float) -> _Trace:
        deadline = now + self._settings.trace_wait_s
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = _Trace(deadline=deadline)
        else:
            trace.deadline = deadline
            self._traces.move_to_end(trace_id)
        return trace

    # --- output (timer) -------------------------------------------------------------------

    def flush(self) -> int:
        """Build the record of every GenAI span whose wait has passed; returns records built."""
        return self._drain(self._clock())

    def close(self) -> int:
        """Build every pending record now; returns records built."""
        return self._drain(float("inf"))

    def _drain(self, now: float) -> int:
        built = 0
        while self._due and self._due[0][0] <= now:
            _, trace_id, span_id = self._due.popleft()
            trace = self._traces.get(trace_id)
            span = trace.spans.pop(span_id, None) if trace is not None else None
            if trace is None or span is None:
                continue
            self._held -= 1
            trace.emitted = True
            built += self._emit(span, trace.documents)
        self._expire(now)
        return built

    def _emit(self, span: GenAISpan, documents: list[str]) -> int:
        problems = Problems()
        try:
            record = build_record(span, documents, self._config, self._schemas, problems)
        except Exception as exc:  # one bad span must not stop the others
            problems.add("unreadable")
            _log_failure("a GenAI span could not be turned into a record", exc)
            self.stats.count(problems)
            return 0
        self.stats.count(problems)
        self.stats.records += 1
        self._consume(record)
        return 1

    def _expire(self, now: float) -> None:
        self._expire_traces(now)
        while self._finished and next(iter(self._finished.values())) <= now:
            self._finished.popitem(last=False)

    def _expire_traces(self, now: float) -> None:
        """Forget traces nothing arrived for within ``trace_wait_s`` and that hold no span."""
        while self._traces:
            trace_id, trace = next(iter(self._traces.items()))
            if trace.deadline > now or trace.spans:
                return
            del self._traces[trace_id]
            if trace.emitted:
                self._finished[trace_id] = now + self._settings.trace_wait_s
                if len(self._finished) > self._settings.max_pending_spans:
                    self._finished.popitem(last=False)
            early = sum(len(events) for events in trace.early_events.values())
            self.stats.orphan_events += early
            self._held -= trace.held

    def _is_finished(self, trace_id: bytes) -> bool:
        return trace_id in self._finished and trace_id not in self._traces

    @property
    def pending(self) -> int:
        """Spans and events held now (what ``max_pending_spans`` bounds)."""
        return self._held


def _log_failure(what: str, exc: Exception) -> None:
    """Where it failed, never the message: an exception's text may quote the content."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    log.error("%s (%s at %s); its content is not logged", what, type(exc).__name__, where)


# --- classification -------------------------------------------------------------------------


def _kind_of(span: Span) -> str | None:
    """``genai``, ``retriever`` or None, from attribute keys and a few values: cheap."""
    operation: str | None = None
    request_type: str | None = None
    genai = retriever = False
    for kv in span.attributes:
        key = kv.key
        if key == c.OPERATION:
            operation = kv.value.string_value
        elif key == c.LLM_REQUEST_TYPE:
            request_type = kv.value.string_value
        elif key in (c.RETRIEVAL_DOCUMENTS, c.TRACELOOP_ENTITY_OUTPUT) or key.startswith(
            c.OPENINFERENCE_DOCUMENTS_PREFIX
        ):
            retriever = retriever or key != c.TRACELOOP_ENTITY_OUTPUT or "retriev" in span.name
        elif key in (c.INPUT_MESSAGES, c.OUTPUT_MESSAGES, c.REQUEST_MODEL):
            genai = True
    if operation == c.RETRIEVAL_OPERATION or retriever:
        return "retriever"
    if operation is not None:
        return "genai" if operation in c.INFERENCE_OPERATIONS else None
    if request_type is not None:
        return "genai" if request_type in _LEGACY_REQUEST_TYPES else None
    if any(e.name == c.DB_QUERY_RESULT_EVENT for e in span.events):
        return "retriever"
    return "genai" if genai else None


def _route_of(attributes: Any, key: str) -> str | None:
    for kv in attributes:
        if kv.key == key and kv.value.WhichOneof("value") == "string_value":
            return kv.value.string_value or None
    return None


def _event_name_attribute(record: LogRecord) -> str:
    """Older SDKs named the event in an ``event.name`` attribute."""
    for kv in record.attributes:
        if kv.key == "event.name":
            return str(kv.value.string_value)
    return ""


# --- retrieved documents ----------------------------------------------------------------------


def _documents(span: Span, attrs: dict[str, Any], problems: Problems) -> list[str]:
    found: list[str] = []
    documents = attrs.get(c.RETRIEVAL_DOCUMENTS)
    if isinstance(documents, str):
        try:
            documents = orjson.loads(documents)
        except orjson.JSONDecodeError:
            problems.add("bad_json")
            documents = None
    if isinstance(documents, list):
        found += [t for d in documents if (t := _document_text(d))]
    elif documents is not None and documents is not c.OVERSIZED:
        problems.add("wrong_type")
    for key in sorted(k for k in attrs if k.startswith(c.OPENINFERENCE_DOCUMENTS_PREFIX)):
        if key.endswith(".document.content") and isinstance(attrs[key], str):
            found.append(attrs[key])
    for event in span.events:
        if event.name == c.DB_QUERY_RESULT_EVENT:
            for kv in event.attributes:
                if kv.key == c.DB_QUERY_RESULT_DOCUMENT and kv.value.string_value:
                    found.append(kv.value.string_value)
    output = attrs.get(c.TRACELOOP_ENTITY_OUTPUT)
    if isinstance(output, str) and "retriev" in span.name:
        try:
            found += _page_contents(orjson.loads(output))
        except orjson.JSONDecodeError:
            problems.add("bad_json")
    return found


def _document_text(document: Any) -> str | None:
    if isinstance(document, str):
        return document
    if isinstance(document, dict):
        for key in ("content", "text", "page_content"):
            if isinstance(document.get(key), str) and document[key]:
                return str(document[key])
    return None


def _page_contents(value: Any) -> list[str]:
    """Every ``page_content`` / ``text`` string in a serialised LangChain/LlamaIndex output."""
    found: list[str] = []
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > c.MAX_DEPTH:
            continue
        if isinstance(item, dict):
            for key in ("page_content", "text"):
                if isinstance(item.get(key), str):
                    found.append(item[key])
            stack += [(v, depth + 1) for v in item.values() if isinstance(v, dict | list)]
        elif isinstance(item, list):
            stack += [(v, depth + 1) for v in reversed(item)]
    return found
