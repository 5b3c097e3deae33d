"""Per-stream state while a response flows, and the frozen record it becomes.

``StreamState`` is mutable and lives only inside the collector pipeline;
``StreamRecord`` is what leaves it. The record keeps output text only so that
validity and relevance scoring can read it: it is never logged or exported.
Its ``continuity`` and ``validity`` are filled where the record is built
(``semhealth.collectors.collector.check_record``), so its consumers only read them.

Clock: every ``*_ns`` field is ``time.monotonic_ns()`` taken by the agent's
tap. ``start_ns`` is when the proxy received the request head; the others
are when the chunk carrying that fact arrived from the upstream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from semhealth.collectors.events import (
    AdapterEvent,
    ContentDelta,
    Done,
    Finish,
    Malformed,
    ModelReport,
    ProviderToolCall,
    ReasoningDelta,
    StreamError,
    ToolCallDelta,
    UsageReport,
)

# The results the record carries, measured where it is built (continuity.py, validity.py):
# declared here, beside the record, so those modules import the record and not the reverse.
ValidityKind = Literal["valid", "truncated", "syntax", "schema", "contract", "schema_error"]


@dataclass(frozen=True, slots=True)
class Continuity:
    """Timing summary of one stream, in seconds. Gap fields are None with fewer than two deltas."""

    ttft_s: float | None
    deltas: int
    index_s: float | None
    p50_gap_s: float | None
    p95_gap_s: float | None
    max_gap_s: float | None
    stalls: int


@dataclass(frozen=True, slots=True)
class ValidityResult:
    """The verdict on one structured output.

    ``target`` is ``content`` for the message text, ``tool:<name>`` for the arguments of a
    call to a tool the request declared, and a bare ``tool`` for a call to a tool it did
    not declare (that name is model output, so it is never repeated).
    """

    result: ValidityKind
    target: str = "content"
    reasons: tuple[str, ...] = ()
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class StructureRequest:
    """Structure the request asked the output to have.

    ``kind``: ``json_object`` (JSON mode, no schema), ``json_schema``
    (OpenAI ``response_format`` / Responses ``text.format``) or ``tool_input``
    (a tool's parameters / ``input_schema``; ``name`` is the tool's name).
    """

    kind: str
    schema: dict[str, Any] | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What request extraction learned from the request body.

    ``analysed`` is False when the body was not looked at; ``skip_reason`` says why
    (``oversized``, ``not_json``, ``empty``, ``shape``).
    """

    model: str | None = None
    query: str | None = None
    context: tuple[str, ...] = ()
    structure: tuple[StructureRequest, ...] = ()
    stream: bool = False
    input_tokens_estimate: int = 0
    analysed: bool = False
    skip_reason: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None  # reasoning tokens included
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class TraceRef:
    """The span a record judges: W3C trace and span ids as lowercase hex (32 and 16 digits).

    From a request's ``traceparent`` header (the client's span) or from the OTLP span the
    record was built from. Evaluation results are parented to it; it is never a label.
    """

    trace_id: str
    span_id: str


SOURCES = ("proxy", "otlp")


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """Everything semhealth knows about one request/response, once it has ended."""

    route: str
    provider: str
    model: str
    prompt_class: str
    request: RequestFacts
    status: int
    start_ns: int
    end_ns: int
    response_ns: int | None = None  # upstream response head received
    first_byte_ns: int | None = None  # first body chunk received
    first_delta_ns: int | None = None  # first content or tool-argument delta
    delta_ns: tuple[int, ...] = ()  # arrival of every content/tool-argument delta, in order
    first_reasoning_ns: int | None = None  # first reasoning delta (thinking), not in delta_ns
    output_text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    provider_tools: tuple[str, ...] = ()  # kinds of the tools the provider ran, in order
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    done: bool = False  # the provider's explicit end-of-stream marker was seen
    streamed: bool = False  # the response was a stream (SSE / NDJSON / frames), not one body
    error_type: str | None = None
    ratelimit_source: str | None = None
    client_aborted: bool = False
    upstream_aborted: bool = False
    shed: bool = False  # the tap dropped some of this stream's chunks under load
    truncated: bool = False  # analysis stopped at limits.max_response_bytes
    malformed_frames: int = 0
    decode_errors: tuple[str, ...] = ()
    response_bytes: int = 0
    # Where the record came from: "proxy" (the tap; every *_ns from one monotonic clock) or
    # "otlp" (a GenAI span; *_ns are the span's Unix-epoch times, and what the span did not
    # record, such as per-chunk arrivals, is absent rather than invented).
    source: str = "proxy"
    trace: TraceRef | None = None
    response_id: str | None = None  # the provider's id for the response, where it gave one
    # Filled by check_record. None: the stream's timing says nothing about the model (the
    # client went away, the tap shed chunks); its index is None with fewer than two deltas.
    continuity: Continuity | None = None
    # One verdict per output that had to be structured; () when none had to be, or when the
    # text is not the model's whole output (error response, client gone, shed, truncated).
    validity: tuple[ValidityResult, ...] = ()

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: request received -> first content delta arrived."""
        if self.first_delta_ns is None:
            return None
        return (self.first_delta_ns - self.start_ns) / 1e9

    @property
    def reasoning_ttft_s(self) -> float | None:
        """Time to first reasoning token: request received -> first reasoning delta arrived."""
        if self.first_reasoning_ns is None:
            return None
        return (self.first_reasoning_ns - self.start_ns) / 1e9

    @property
    def ttfb_s(self) -> float | None:
        """Time to first chunk: request received -> first response body byte arrived."""
        if self.first_byte_ns is None:
            return None
        return (self.first_byte_ns - self.start_ns) / 1e9


class StreamState:
    """Mutable running state of one response; folds adapter events, then ``finish`` freezes it."""

    __slots__ = (
        "_model",
        "_text",
        "_tools",
        "delta_ns",
        "done",
        "errors",
        "finish_reason",
        "first_reasoning_ns",
        "malformed",
        "provider_tools",
        "usage_in",
        "usage_out",
        "usage_reasoning",
    )

    def __init__(self) -> None:
        self._text: list[str] = []
        self._tools: dict[int, list[Any]] = {}  # index -> [id, name, [argument fragments]]
        self._model: str | None = None
        self.delta_ns: list[int] = []
        self.usage_in: int | None = None
        self.usage_out: int | None = None
        self.usage_reasoning: int | None = None
        self.first_reasoning_ns: int | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.errors: list[str] = []
        self.malformed = 0
        self.provider_tools: list[str] = []

    @property
    def model(self) -> str | None:
        return self._model

    def content(self, text: str, t: int) -> None:
        """A ``ContentDelta``'s text and time, from the token shortcut (``apply`` inlines
        the same, a call saved on nearly every event)."""
        if text:
            self._text.append(text)
            self.delta_ns.append(t)

    def apply(self, event: AdapterEvent) -> None:
        if type(event) is ContentDelta:  # nearly every event: spared the match below
            if event.text:
                self._text.append(event.text)
                self.delta_ns.append(event.t)
            return
        match event:
            case ContentDelta(text=text, t=t):
                if text:
                    self._text.append(text)
                    self.delta_ns.append(t)
            case ToolCallDelta(index=index, t=t, id=call_id, name=name, arguments=args):
                slot = self._tools.setdefault(index, [None, None, []])
                if call_id:
                    slot[0] = call_id
                if name:
                    slot[1] = name
                if args:
                    slot[2].append(args)
                    self.delta_ns.append(t)
            case ProviderToolCall(kind=kind):
                self.provider_tools.append(kind)
            case ReasoningDelta(t=t):
                if self.first_reasoning_ns is None:
                    self.first_reasoning_ns = t
            case UsageReport(input_tokens=tin, output_tokens=tout, reasoning_tokens=treason):
                if tin is not None:
                    self.usage_in = tin
                if tout is not None:
                    self.usage_out = tout
                if treason is not None:
                    self.usage_reasoning = treason
            case ModelReport(model=model):
                self._model = model
            case Finish(reason=reason):
                self.finish_reason = reason
            case StreamError(type=etype):
                self.errors.append(etype)
            case Done():
                self.done = True
            case Malformed():
                self.malformed += 1

    @property
    def output_text(self) -> str:
        return "".join(self._text)

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(index=i, id=slot[0], name=slot[1], arguments="".join(slot[2]))
            for i, slot in sorted(self._tools.items())
        )
