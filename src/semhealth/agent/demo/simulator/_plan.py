"""A script resolved against one request (``Plan``), the timed writes every wire format
renders it into (``Step``), and the framing and error helpers the formats share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from semhealth.agent.demo.simulator._script import Script, ScriptRequest, ToolScript
from semhealth.collectors import model_from_path

StepKind = Literal["open", "delta", "meta", "close"]


@dataclass(frozen=True, slots=True)
class Step:
    """One write: ``at_s`` after the response head. ``close`` steps are the end markers."""

    at_s: float
    data: bytes
    kind: StepKind


@dataclass(frozen=True, slots=True)
class Plan:
    """A script resolved against one request: names, times, counts."""

    serial: str
    created: int
    model: str
    text: tuple[tuple[float, str], ...]
    tool: ToolScript | None
    tool_id: str
    tool_args: tuple[tuple[float, str], ...]
    end_s: float
    finish: str
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int | None
    request: ScriptRequest

    @property
    def full_text(self) -> str:
        return "".join(piece for _, piece in self.text)

    @property
    def tool_start_s(self) -> float:
        return self.tool_args[0][0] if self.tool_args else self.end_s

    @property
    def text_end_s(self) -> float:
        return self.text[-1][0] if self.text else self.tool_start_s


def make_plan(script: Script, request: ScriptRequest, serial: str) -> Plan:
    offsets = script.delta_offsets()
    split = len(script.pieces)
    body = request.json if isinstance(request.json, dict) else {}
    # Gemini and Bedrock name the model in the path, not the body.
    model = script.model or str(body.get("model") or model_from_path(request.path) or "sim-model")
    tool = script.tool_call
    return Plan(
        serial=serial,
        created=int(time.time()),
        model=model,
        text=tuple(zip(offsets[:split], script.pieces, strict=True)),
        tool=tool,
        tool_id=(tool.id if tool and tool.id else serial),
        tool_args=tuple(zip(offsets[split:], tool.pieces if tool else (), strict=True)),
        end_s=offsets[-1] if offsets else script.ttft_s,
        finish=script.finish,
        input_tokens=(
            script.input_tokens
            if script.input_tokens is not None
            else max(1, len(request.body) // 4)
        ),
        output_tokens=(
            script.output_tokens if script.output_tokens is not None else script.delta_count
        ),
        reasoning_tokens=script.reasoning_tokens,
        request=request,
    )


def sse(obj: Any, event: str | None = None) -> bytes:
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def ndjson(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


def body_of(plan: Plan) -> dict[str, Any]:
    return plan.request.json if isinstance(plan.request.json, dict) else {}


def error_message(status: int, etype: str) -> str:
    return f"simulated {etype} (HTTP {status})"


def default_error_type(status: int) -> str:
    known = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        422: "invalid_request_error",
        429: "rate_limit_error",
        503: "overloaded_error",
        529: "overloaded_error",
    }
    return known.get(status, "api_error" if status >= 500 else "invalid_request_error")


def json_object_or_empty(text: str) -> dict[str, Any]:
    # A non-streamed tool_use carries parsed input; arguments scripted as broken JSON have
    # no parsed form, and the real API only ever returns an object there.
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
