"""The Google Gemini wire format (Gemini API and Vertex AI): streamed as SSE with
``alt=sse`` (CRLF line ends, as Google sends them) or, without it, as one JSON array written
element by element; whole from ``:generateContent``.

Gemini sends a function call whole, in one part: it goes out at the time of the script's
last argument piece (one delta)."""

from __future__ import annotations

from typing import Any

import orjson

from semhealth.agent.demo.simulator._plan import Plan, Step, error_message, json_object_or_empty
from semhealth.agent.demo.simulator._script import ScriptRequest

_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
SSE_TYPE = "text/event-stream"
ARRAY_TYPE = "application/json; charset=UTF-8"


def wants_sse(request: ScriptRequest) -> bool:
    return "alt=sse" in request.query


def gemini_stream_type(request: ScriptRequest) -> str:
    return SSE_TYPE if wants_sse(request) else ARRAY_TYPE


def gemini_stream(plan: Plan) -> list[Step]:
    sse = wants_sse(plan.request)
    pieces: list[tuple[float, dict[str, Any]]] = [(at, {"text": piece}) for at, piece in plan.text]
    if plan.tool is not None:
        pieces.append((plan.end_s, _function_call(plan)))
    steps: list[Step] = []
    for i, (at, part) in enumerate(pieces):
        last = i == len(pieces) - 1
        steps.append(Step(at, _element(_response(plan, [part], last), i, sse), "delta"))
    if not pieces:
        steps.append(Step(plan.end_s, _element(_response(plan, [], True), 0, sse), "close"))
    if not sse:
        steps.append(Step(plan.end_s, b"]", "close"))
    return steps


def gemini_body(plan: Plan) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": plan.full_text}] if plan.text else []
    if plan.tool is not None:
        parts.append(_function_call(plan))
    return _response(plan, parts, done=True)


def gemini_error(status: int, etype: str) -> dict[str, Any]:
    return {
        "error": {
            "code": status,
            "message": error_message(status, etype),
            "status": _STATUS.get(status, "UNKNOWN"),
        }
    }


def _element(obj: dict[str, Any], index: int, sse: bool) -> bytes:
    if sse:
        return b"data: " + orjson.dumps(obj) + b"\r\n\r\n"
    return (b"[" if index == 0 else b"\n,\r\n") + orjson.dumps(obj)


def _function_call(plan: Plan) -> dict[str, Any]:
    assert plan.tool is not None
    args = json_object_or_empty(plan.tool.arguments)
    return {"functionCall": {"name": plan.tool.name, "args": args}}


def _response(plan: Plan, parts: list[dict[str, Any]], done: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if done:
        candidate["finishReason"] = _FINISH[plan.finish]
    usage: dict[str, Any] = {"promptTokenCount": plan.input_tokens}
    if done:
        # Gemini counts thoughts apart: candidates are the answer's tokens only.
        thoughts = plan.reasoning_tokens or 0
        usage["candidatesTokenCount"] = plan.output_tokens - thoughts
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        usage["totalTokenCount"] = plan.input_tokens + plan.output_tokens
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": plan.model,
        "responseId": f"resp_{plan.serial}",
    }
