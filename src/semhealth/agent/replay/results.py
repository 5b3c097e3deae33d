"""What a replay produces, as plain data: one ``RecordResult`` per record and the alert
transitions the rules would have made. ``semhealth replay`` writes these as JSONL and the
HTML report draws them. They hold numbers and bounded labels only, never text from a
request or a response.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordResult:
    """One replayed exchange, judged. ``time`` is its start in Unix seconds (the recording's
    wall clock); ``None`` fields are signals the record could not give."""

    id: str  # the exchange id from the recording, or trace/span id for OTLP input
    source_file: str
    line: int  # 1-based line (JSONL), entry index (HAR) or span ordinal (OTLP JSON)
    time: float
    source: str  # proxy | otlp
    route: str
    model: str
    provider: str
    prompt_class: str
    status: int
    error_type: str  # "" for a success
    duration_s: float
    ttft_s: float | None = None
    ttfb_s: float | None = None
    continuity_index_s: float | None = None
    max_gap_s: float | None = None
    stalls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    # One (result, reasons) per output that had to be structured: "valid", "syntax", ...
    validity: tuple[tuple[str, tuple[str, ...]], ...] = ()
    context_relevance: float | None = None
    answer_relevance: float | None = None
    relevance_skipped: str | None = None  # why relevance was not scored (no_query, ...)
    # False: the input had no per-chunk arrival times (a HAR body), so TTFT and continuity
    # are None rather than invented.
    chunk_times: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertTransition:
    """An alert changing state during the replayed span: ``pending``, ``firing`` or
    ``resolved`` at ``time`` (Unix seconds), with the value that decided it."""

    rule: str
    state: str
    time: float
    labels: dict[str, str] = field(default_factory=dict)
    value: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputProblem:
    """A line or entry of an input file that could not be replayed, and why, in words."""

    source_file: str
    line: int
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRun:
    """Everything one ``semhealth replay`` produced."""

    files: tuple[str, ...]
    results: tuple[RecordResult, ...]
    alerts: tuple[AlertTransition, ...]
    problems: tuple[InputProblem, ...]
    threshold: float = 0.75  # the context-relevance threshold the default rule pages on
    start: float | None = None  # the replayed span, Unix seconds
    end: float | None = None
