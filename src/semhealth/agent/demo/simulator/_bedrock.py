"""Amazon Bedrock Runtime: ``ConverseStream`` in AWS event-stream frames, ``Converse`` whole,
and ``InvokeModelWithResponseStream`` carrying the Anthropic Messages events of a Claude
model, base64 in ``chunk`` events (what ``boto3``'s ``bedrock-runtime`` client parses)."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from semhealth.agent.demo.simulator._anthropic import anthropic_stream
from semhealth.agent.demo.simulator._plan import Plan, Step, error_message, json_object_or_empty
from semhealth.collectors import event_message

EVENTSTREAM_TYPE = "application/vnd.amazon.eventstream"
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERRORS = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return event_message(name, orjson.dumps(payload))


def converse_stream(plan: Plan) -> list[Step]:
    steps = [Step(0.0, _event("messageStart", {"role": "assistant"}), "open")]
    block = 0
    if plan.text or plan.tool is None:
        for at, piece in plan.text:
            delta = {"contentBlockIndex": 0, "delta": {"text": piece}}
            steps.append(Step(at, _event("contentBlockDelta", delta), "delta"))
        steps.append(
            Step(plan.text_end_s, _event("contentBlockStop", {"contentBlockIndex": 0}), "meta")
        )
        block = 1
    if plan.tool is not None:
        start = {
            "contentBlockIndex": block,
            "start": {"toolUse": {"toolUseId": f"tooluse_{plan.tool_id}", "name": plan.tool.name}},
        }
        steps.append(Step(plan.tool_start_s, _event("contentBlockStart", start), "meta"))
        for at, piece in plan.tool_args:
            delta = {"contentBlockIndex": block, "delta": {"toolUse": {"input": piece}}}
            steps.append(Step(at, _event("contentBlockDelta", delta), "delta"))
        stop = {"contentBlockIndex": block}
        steps.append(Step(plan.end_s, _event("contentBlockStop", stop), "meta"))
    steps.append(
        Step(plan.end_s, _event("messageStop", {"stopReason": _STOP[plan.finish]}), "close")
    )
    steps.append(Step(plan.end_s, _event("metadata", _metadata(plan)), "close"))
    return steps


def converse_body(plan: Plan) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if plan.text or plan.tool is None:
        content.append({"text": plan.full_text})
    if plan.tool is not None:
        tool = {
            "toolUseId": f"tooluse_{plan.tool_id}",
            "name": plan.tool.name,
            "input": json_object_or_empty(plan.tool.arguments),
        }
        content.append({"toolUse": tool})
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": _STOP[plan.finish],
        **_metadata(plan),
    }


def invoke_stream(plan: Plan) -> list[Step]:
    """A Claude model's own events, each base64 in a ``chunk`` event."""
    return [
        Step(step.at_s, _event("chunk", {"bytes": _base64(_sse_data(step.data))}), step.kind)
        for step in anthropic_stream(plan)
    ]


def bedrock_error(status: int, etype: str) -> dict[str, Any]:
    return {"__type": _ERRORS.get(status, etype), "message": error_message(status, etype)}


def _metadata(plan: Plan) -> dict[str, Any]:
    usage = {
        "inputTokens": plan.input_tokens,
        "outputTokens": plan.output_tokens,
        "totalTokens": plan.input_tokens + plan.output_tokens,
    }
    return {"usage": usage, "metrics": {"latencyMs": int(plan.end_s * 1000)}}


def _sse_data(event: bytes) -> bytes:
    return event.split(b"data: ", 1)[1].rstrip(b"\n")


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
