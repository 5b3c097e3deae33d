"""Self-hosted servers' wire formats: Ollama chat and generate (NDJSON), TGI (SSE).

Neither streams tool arguments as such; see the package docstring for how each degrades.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from semhealth.agent.demo.simulator._plan import Plan, Step, body_of, error_message, ndjson

# --------------------------------------------------------------------------- Ollama


def _ollama_created_at() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _ollama_final(plan: Plan) -> dict[str, Any]:
    ttft_ns = int((plan.text[0][0] if plan.text else plan.end_s) * 1e9)
    end_ns = int(plan.end_s * 1e9)
    return {
        "done": True,
        "done_reason": "length" if plan.finish == "length" else "stop",
        "total_duration": end_ns,
        "load_duration": 0,
        "prompt_eval_count": plan.input_tokens,
        "prompt_eval_duration": ttft_ns,
        "eval_count": plan.output_tokens,
        "eval_duration": end_ns - ttft_ns,
    }


def _ollama_tool_calls(plan: Plan) -> list[dict[str, Any]]:
    assert plan.tool is not None
    text = plan.tool.arguments
    try:
        arguments: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        arguments = text  # broken on purpose: pass the broken text through
    return [{"function": {"name": plan.tool.name, "arguments": arguments}}]


def _ollama_chat_line(plan: Plan, message: dict[str, Any], **extra: Any) -> bytes:
    line = {"model": plan.model, "created_at": _ollama_created_at(), "message": message}
    return ndjson({**line, "done": False, **extra})


def ollama_chat_stream(plan: Plan) -> list[Step]:
    steps = [
        Step(at, _ollama_chat_line(plan, {"role": "assistant", "content": p}), "delta")
        for at, p in plan.text
    ]
    if plan.tool is not None:
        message = {"role": "assistant", "content": "", "tool_calls": _ollama_tool_calls(plan)}
        steps.append(Step(plan.end_s, _ollama_chat_line(plan, message), "delta"))
    final = _ollama_chat_line(plan, {"role": "assistant", "content": ""}, **_ollama_final(plan))
    steps.append(Step(plan.end_s, final, "close"))
    return steps


def ollama_chat_body(plan: Plan) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": plan.full_text}
    if plan.tool is not None:
        message["tool_calls"] = _ollama_tool_calls(plan)
    line = {"model": plan.model, "created_at": _ollama_created_at(), "message": message}
    return {**line, **_ollama_final(plan)}


def _text_and_args(plan: Plan) -> tuple[tuple[float, str], ...]:
    """Text-only wires: the tool's argument pieces stream as text after the answer."""
    return plan.text + plan.tool_args


def _ollama_generate_line(plan: Plan, text: str, **extra: Any) -> bytes:
    line = {"model": plan.model, "created_at": _ollama_created_at(), "response": text}
    return ndjson({**line, "done": False, **extra})


def ollama_generate_stream(plan: Plan) -> list[Step]:
    steps = [Step(at, _ollama_generate_line(plan, p), "delta") for at, p in _text_and_args(plan)]
    steps.append(Step(plan.end_s, _ollama_generate_line(plan, "", **_ollama_final(plan)), "close"))
    return steps


def ollama_generate_body(plan: Plan) -> dict[str, Any]:
    text = "".join(p for _, p in _text_and_args(plan))
    line = {"model": plan.model, "created_at": _ollama_created_at(), "response": text}
    return {**line, **_ollama_final(plan)}


def plain_error(status: int, etype: str) -> dict[str, Any]:
    return {"error": error_message(status, etype)}


# --------------------------------------------------------------------------- TGI


def _tgi_details(plan: Plan) -> dict[str, Any]:
    reason = "length" if plan.finish == "length" else "eos_token"
    return {
        "finish_reason": reason,
        "generated_tokens": plan.output_tokens,
        "seed": None,
        "input_length": plan.input_tokens,
    }


def _tgi_event(index: int, text: str, special: bool, final: str | None, plan: Plan) -> bytes:
    token = {"id": 1000 + index, "text": text, "logprob": -0.25, "special": special}
    event = {
        "index": index,
        "token": token,
        "generated_text": final,
        "details": _tgi_details(plan) if final is not None else None,
        "top_tokens": None,
    }
    return b"data:" + orjson.dumps(event) + b"\n\n"


def tgi_stream(plan: Plan) -> list[Step]:
    pieces = _text_and_args(plan)
    text = "".join(p for _, p in pieces)
    ends_on_token = plan.finish == "length" and bool(pieces)
    steps = []
    for i, (at, piece) in enumerate(pieces, start=1):
        last = ends_on_token and i == len(pieces)
        steps.append(Step(at, _tgi_event(i, piece, False, text if last else None, plan), "delta"))
    if not ends_on_token:
        # A natural stop ends on the special end-of-sequence token, which carries the details.
        eos = _tgi_event(len(pieces) + 1, "</s>", True, text, plan)
        steps.append(Step(plan.end_s, eos, "close"))
    return steps


def tgi_body(plan: Plan) -> dict[str, Any]:
    body: dict[str, Any] = {"generated_text": "".join(p for _, p in _text_and_args(plan))}
    params = body_of(plan).get("parameters")
    if isinstance(params, dict) and params.get("details") is True:
        body["details"] = _tgi_details(plan)
    return body


def tgi_error(status: int, etype: str) -> dict[str, Any]:
    return {"error": error_message(status, etype), "error_type": etype}
