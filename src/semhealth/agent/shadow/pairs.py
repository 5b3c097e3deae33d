"""One primary/shadow pair, compared: what the client got against what the candidate said
to the same request.

``compare`` is pure: tokens, JSON, tool calls and each side's service figures, from the two
``StreamRecord``s. ``agreement`` adds the semantic half through the relevance scorer: the
candidate's answer scored as an answer to the primary's (calibrated answer relevance,
0..1). A ``PairResult`` holds numbers, bounded labels and JSON paths, never text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from semhealth.agent.shadow.diff import (
    Call,
    JSONDiff,
    Segmenter,
    TokenDiff,
    ToolDiff,
    json_diff,
    token_diff,
    tool_diff,
)
from semhealth.agent.telemetry.recorder import error_type
from semhealth.collectors import StreamRecord
from semhealth.embeddings import Scorer

PairKind = Literal["exact", "differs", "candidate_error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """One side's service figures."""

    status: int
    error_type: str  # "" for a success
    ttft_s: float | None
    continuity_index_s: float | None
    stalls: int
    input_tokens: int | None
    output_tokens: int | None
    valid: bool | None  # every structured output valid; None when none had to be


@dataclass(frozen=True, slots=True, kw_only=True)
class PairResult:
    exchange_id: str
    route: str
    result: PairKind
    primary: Side
    shadow: Side
    tokens: TokenDiff | None = None  # None when the candidate failed
    json: JSONDiff | None = None  # when the request asked for a JSON answer
    tools: ToolDiff | None = None  # when either side called a tool
    agreement: float | None = None  # set by ``agreement``


def side_of(record: StreamRecord) -> Side:
    continuity = record.continuity
    return Side(
        status=record.status,
        error_type=error_type(record),
        ttft_s=record.ttft_s,
        continuity_index_s=continuity.index_s if continuity is not None else None,
        stalls=continuity.stalls if continuity is not None else 0,
        input_tokens=record.usage.input_tokens,
        output_tokens=record.usage.output_tokens,
        valid=all(v.result == "valid" for v in record.validity) if record.validity else None,
    )


def _failed(record: StreamRecord) -> bool:
    return bool(error_type(record)) or record.upstream_aborted or record.truncated


def compare(
    exchange_id: str, primary: StreamRecord, shadow: StreamRecord, segment: Segmenter
) -> PairResult:
    """The pair measures of two records of the same request. A candidate that failed
    (error status, cut stream) is ``candidate_error`` and has no content measures."""
    ours, theirs = side_of(primary), side_of(shadow)
    if _failed(shadow):
        return PairResult(
            exchange_id=exchange_id,
            route=primary.route,
            result="candidate_error",
            primary=ours,
            shadow=theirs,
        )
    tokens = token_diff(primary.output_text, shadow.output_text, segment)
    tools = None
    if primary.tool_calls or shadow.tool_calls:
        tools = tool_diff(
            [Call(c.name, c.arguments) for c in primary.tool_calls],
            [Call(c.name, c.arguments) for c in shadow.tool_calls],
        )
    wants_json = any(s.kind in ("json_object", "json_schema") for s in primary.request.structure)
    exact = tokens.exact and (tools is None or (tools.same_tools and tools.same_arguments))
    return PairResult(
        exchange_id=exchange_id,
        route=primary.route,
        result="exact" if exact else "differs",
        tokens=tokens,
        json=json_diff(primary.output_text, shadow.output_text) if wants_json else None,
        tools=tools,
        primary=ours,
        shadow=theirs,
    )


async def agreement(
    pair: PairResult, primary: StreamRecord, shadow: StreamRecord, scorer: Scorer
) -> PairResult:
    """``pair`` with the answers' semantic agreement, when both have text to compare."""
    if pair.result == "candidate_error":
        return pair
    if not primary.output_text.strip() or not shadow.output_text.strip():
        return pair
    if pair.tokens is not None and pair.tokens.exact:
        return replace(pair, agreement=1.0)  # the same words: nothing to embed
    scores = await scorer.score(primary.output_text, (), shadow.output_text)
    return replace(pair, agreement=scores.answer)
