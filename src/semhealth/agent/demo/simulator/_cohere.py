"""The Cohere v2 chat wire format (``/v2/chat``), streamed and whole."""

from __future__ import annotations

from typing import Any

from semhealth.agent.demo.simulator._plan import Plan, Step, error_message, sse

_FINISH = {"stop": "COMPLETE", "length": "MAX_TOKENS", "tool_calls": "TOOL_CALL"}


def _event(obj: dict[str, Any]) -> bytes:
    return sse(obj, obj["type"])


def cohere_stream(plan: Plan) -> list[Step]:
    start = {
        "type": "message-start",
        "id": f"msg_{plan.serial}",
        "delta": {"message": {"role": "assistant"}},
    }
    steps = [Step(0.0, _event(start), "open")]
    if plan.text or plan.tool is None:
        opened = {
            "type": "content-start",
            "index": 0,
            "delta": {"message": {"content": {"type": "text", "text": ""}}},
        }
        steps.append(Step(0.0, _event(opened), "open"))
        for at, piece in plan.text:
            delta = {
                "type": "content-delta",
                "index": 0,
                "delta": {"message": {"content": {"text": piece}}},
            }
            steps.append(Step(at, _event(delta), "delta"))
        steps.append(Step(plan.text_end_s, _event({"type": "content-end", "index": 0}), "meta"))
    if plan.tool is not None:
        call = {
            "id": f"call_{plan.tool_id}",
            "type": "function",
            "function": {"name": plan.tool.name, "arguments": ""},
        }
        opened = {"type": "tool-call-start", "index": 0, "delta": {"message": {"tool_calls": call}}}
        steps.append(Step(plan.tool_start_s, _event(opened), "meta"))
        for at, piece in plan.tool_args:
            arguments = {"tool_calls": {"function": {"arguments": piece}}}
            delta = {"type": "tool-call-delta", "index": 0, "delta": {"message": arguments}}
            steps.append(Step(at, _event(delta), "delta"))
        steps.append(Step(plan.end_s, _event({"type": "tool-call-end", "index": 0}), "meta"))
    end = {
        "type": "message-end",
        "delta": {"finish_reason": _FINISH[plan.finish], "usage": _usage(plan)},
    }
    steps.append(Step(plan.end_s, _event(end), "close"))
    return steps


def cohere_body(plan: Plan) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    if plan.text or plan.tool is None:
        message["content"] = [{"type": "text", "text": plan.full_text}]
    if plan.tool is not None:
        message["tool_calls"] = [
            {
                "id": f"call_{plan.tool_id}",
                "type": "function",
                "function": {"name": plan.tool.name, "arguments": plan.tool.arguments},
            }
        ]
    return {
        "id": f"msg_{plan.serial}",
        "finish_reason": _FINISH[plan.finish],
        "message": message,
        "usage": _usage(plan),
    }


def cohere_error(status: int, etype: str) -> dict[str, Any]:
    return {"id": "err", "message": error_message(status, etype)}


def _usage(plan: Plan) -> dict[str, Any]:
    counts = {"input_tokens": plan.input_tokens, "output_tokens": plan.output_tokens}
    return {"billed_units": dict(counts), "tokens": dict(counts)}
