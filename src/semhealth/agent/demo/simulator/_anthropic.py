"""The Anthropic messages wire format, streamed and whole."""

from __future__ import annotations

from typing import Any

from semhealth.agent.demo.simulator._plan import (
    Plan,
    Step,
    error_message,
    json_object_or_empty,
    sse,
)

_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _anthropic_message(plan: Plan, content: list[Any], done: bool) -> dict[str, Any]:
    return {
        "id": f"msg_{plan.serial}",
        "type": "message",
        "role": "assistant",
        "model": plan.model,
        "content": content,
        "stop_reason": _ANTHROPIC_STOP[plan.finish] if done else None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": plan.input_tokens,
            "output_tokens": plan.output_tokens if done else 1,
        },
    }


def anthropic_stream(plan: Plan) -> list[Step]:
    start = {"type": "message_start", "message": _anthropic_message(plan, [], done=False)}
    steps = [Step(0.0, sse(start, "message_start"), "open")]
    ping = Step(0.0, sse({"type": "ping"}, "ping"), "open")
    index = 0
    if plan.text or plan.tool is None:
        text = _anthropic_block(plan, 0, {"type": "text", "text": ""}, 0.0, plan.text, "text_delta")
        steps += [text[0], ping, *text[1:]]  # the real API pings right after the first block opens
        index = 1
    else:
        steps.append(ping)
    if plan.tool is not None:
        block = {
            "type": "tool_use",
            "id": f"toolu_{plan.tool_id}",
            "name": plan.tool.name,
            "input": {},
        }
        steps += _anthropic_block(
            plan, index, block, plan.tool_start_s, plan.tool_args, "input_json_delta"
        )
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": _ANTHROPIC_STOP[plan.finish], "stop_sequence": None},
        "usage": {"output_tokens": plan.output_tokens},
    }
    steps.append(Step(plan.end_s, sse(delta, "message_delta"), "close"))
    steps.append(Step(plan.end_s, sse({"type": "message_stop"}, "message_stop"), "close"))
    return steps


def _anthropic_block(
    plan: Plan,
    index: int,
    block: dict[str, Any],
    start_s: float,
    pieces: tuple[tuple[float, str], ...],
    delta_type: str,
) -> list[Step]:
    key = "text" if delta_type == "text_delta" else "partial_json"
    start = {"type": "content_block_start", "index": index, "content_block": block}
    steps = [Step(start_s, sse(start, "content_block_start"), "open" if index == 0 else "meta")]
    for at, piece in pieces:
        delta = {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": delta_type, key: piece},
        }
        steps.append(Step(at, sse(delta, "content_block_delta"), "delta"))
    end = pieces[-1][0] if pieces else start_s
    stop = {"type": "content_block_stop", "index": index}
    steps.append(Step(end, sse(stop, "content_block_stop"), "meta"))
    return steps


def anthropic_body(plan: Plan) -> dict[str, Any]:
    content: list[Any] = []
    if plan.text or plan.tool is None:
        content.append({"type": "text", "text": plan.full_text})
    if plan.tool is not None:
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{plan.tool_id}",
                "name": plan.tool.name,
                "input": json_object_or_empty(plan.tool.arguments),
            }
        )
    return _anthropic_message(plan, content, done=True)


def anthropic_error(status: int, etype: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": etype, "message": error_message(status, etype)}}
