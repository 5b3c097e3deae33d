"""OpenAI wire formats: chat completions and the Responses API, streamed and whole."""

from __future__ import annotations

import itertools
from typing import Any

from semhealth.agent.demo.simulator._plan import Plan, Step, StepKind, body_of, error_message, sse

# --------------------------------------------------------------------------- chat completions


def _chat_chunk(plan: Plan, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": f"chatcmpl-{plan.serial}",
        "object": "chat.completion.chunk",
        "created": plan.created,
        "model": plan.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if _chat_include_usage(plan):
        chunk["usage"] = None  # the real API marks every chunk when usage is asked for
    return chunk


def _chat_include_usage(plan: Plan) -> bool:
    options = body_of(plan).get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _chat_usage(plan: Plan) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": plan.input_tokens,
        "completion_tokens": plan.output_tokens,
        "total_tokens": plan.input_tokens + plan.output_tokens,
    }
    if plan.reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": plan.reasoning_tokens}
    return usage


def chat_stream(plan: Plan) -> list[Step]:
    # As the real API: an answer that opens with a tool call has no content at all.
    role = {"role": "assistant", "content": "" if plan.text or not plan.tool else None}
    role["refusal"] = None
    steps = [Step(0.0, sse(_chat_chunk(plan, role)), "open")]
    steps += [Step(at, sse(_chat_chunk(plan, {"content": p})), "delta") for at, p in plan.text]
    if plan.tool is not None:
        head = {
            "index": 0,
            "id": f"call_{plan.tool_id}",
            "type": "function",
            "function": {"name": plan.tool.name, "arguments": ""},
        }
        steps.append(
            Step(plan.tool_start_s, sse(_chat_chunk(plan, {"tool_calls": [head]})), "meta")
        )
        for at, piece in plan.tool_args:
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            steps.append(Step(at, sse(_chat_chunk(plan, delta)), "delta"))
    steps.append(Step(plan.end_s, sse(_chat_chunk(plan, {}, plan.finish)), "close"))
    if _chat_include_usage(plan):
        usage = _chat_chunk(plan, {})
        usage["choices"] = []
        usage["usage"] = _chat_usage(plan)
        steps.append(Step(plan.end_s, sse(usage), "close"))
    steps.append(Step(plan.end_s, b"data: [DONE]\n\n", "close"))
    return steps


def chat_body(plan: Plan) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": plan.full_text if plan.text or plan.tool is None else None,
        "refusal": None,
    }
    if plan.tool is not None:
        message["tool_calls"] = [
            {
                "id": f"call_{plan.tool_id}",
                "type": "function",
                "function": {"name": plan.tool.name, "arguments": plan.tool.arguments},
            }
        ]
    return {
        "id": f"chatcmpl-{plan.serial}",
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish}
        ],
        "usage": _chat_usage(plan),
    }


def openai_error(status: int, etype: str) -> dict[str, Any]:
    code = "rate_limit_exceeded" if status == 429 else etype
    message = error_message(status, etype)
    return {"error": {"message": message, "type": etype, "param": None, "code": code}}


# --------------------------------------------------------------------------- Responses API


def _responses_object(plan: Plan, status: str, output: list[Any]) -> dict[str, Any]:
    body = body_of(plan)
    tools, text, instructions = body.get("tools"), body.get("text"), body.get("instructions")
    return {
        "id": f"resp_{plan.serial}",
        "object": "response",
        "created_at": plan.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": instructions if isinstance(instructions, str) else None,
        "max_output_tokens": None,
        "model": plan.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "temperature": 1.0,
        "text": text if isinstance(text, dict) else {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": tools if isinstance(tools, list) else [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None if status == "in_progress" else _responses_usage(plan),
        "metadata": {},
    }


def _responses_usage(plan: Plan) -> dict[str, Any]:
    return {
        "input_tokens": plan.input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": plan.output_tokens,
        "output_tokens_details": {"reasoning_tokens": plan.reasoning_tokens or 0},
        "total_tokens": plan.input_tokens + plan.output_tokens,
    }


def _responses_items(plan: Plan, final: bool) -> list[dict[str, Any]]:
    """The output items, as added (``final`` False) or as done."""
    items: list[dict[str, Any]] = []
    item_status = "incomplete" if plan.finish == "length" else "completed"
    if plan.text or plan.tool is None:
        text = plan.full_text if final else ""
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        items.append(
            {
                "id": f"msg_{plan.serial}",
                "type": "message",
                "status": item_status if final else "in_progress",
                "role": "assistant",
                "content": [part] if final else [],
            }
        )
    if plan.tool is not None:
        items.append(
            {
                "id": f"fc_{plan.serial}",
                "type": "function_call",
                "status": item_status if final else "in_progress",
                "arguments": plan.tool.arguments if final else "",
                "call_id": f"call_{plan.tool_id}",
                "name": plan.tool.name,
            }
        )
    return items


class _ResponsesEvents:
    """Collects Responses API events as steps, numbering them with ``sequence_number``."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self.steps: list[Step] = []

    def add(self, at_s: float, kind: StepKind, event: str, **fields: Any) -> None:
        data = sse({"type": event, "sequence_number": next(self._seq), **fields}, event)
        self.steps.append(Step(at_s, data, kind))


def responses_stream(plan: Plan) -> list[Step]:
    ev = _ResponsesEvents()
    opening = _responses_object(plan, "in_progress", [])
    ev.add(0.0, "open", "response.created", response=opening)
    ev.add(0.0, "open", "response.in_progress", response=opening)
    added, done = _responses_items(plan, final=False), _responses_items(plan, final=True)
    index = 0
    if plan.text or plan.tool is None:
        _responses_message_events(plan, ev, added[0], done[0])
        index = 1
    if plan.tool is not None:
        _responses_tool_events(plan, ev, index, added[index], done[index])
    final = "incomplete" if plan.finish == "length" else "completed"
    ev.add(plan.end_s, "close", f"response.{final}", response=_responses_object(plan, final, done))
    return ev.steps


def _responses_message_events(
    plan: Plan, ev: _ResponsesEvents, added: dict[str, Any], done: dict[str, Any]
) -> None:
    ids = {"item_id": added["id"], "output_index": 0, "content_index": 0}
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    ev.add(0.0, "open", "response.output_item.added", output_index=0, item=added)
    ev.add(0.0, "open", "response.content_part.added", **ids, part=empty)
    for at, piece in plan.text:
        ev.add(at, "delta", "response.output_text.delta", **ids, delta=piece, logprobs=[])
    end, text = plan.text_end_s, plan.full_text
    ev.add(end, "meta", "response.output_text.done", **ids, text=text, logprobs=[])
    ev.add(end, "meta", "response.content_part.done", **ids, part=done["content"][0])
    ev.add(end, "meta", "response.output_item.done", output_index=0, item=done)


def _responses_tool_events(
    plan: Plan, ev: _ResponsesEvents, index: int, added: dict[str, Any], done: dict[str, Any]
) -> None:
    ids = {"item_id": added["id"], "output_index": index}
    ev.add(plan.tool_start_s, "meta", "response.output_item.added", output_index=index, item=added)
    for at, piece in plan.tool_args:
        ev.add(at, "delta", "response.function_call_arguments.delta", **ids, delta=piece)
    args, name = done["arguments"], done["name"]
    end = plan.end_s
    ev.add(end, "meta", "response.function_call_arguments.done", **ids, arguments=args, name=name)
    ev.add(end, "meta", "response.output_item.done", output_index=index, item=done)


def responses_body(plan: Plan) -> dict[str, Any]:
    status = "incomplete" if plan.finish == "length" else "completed"
    return _responses_object(plan, status, _responses_items(plan, final=True))
