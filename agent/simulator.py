# ruff: noqa: RUF001 -- the built-in corpus is Chinese as well as English: full-width
# punctuation there is meant.
"""A scripted upstream LLM: a real aiohttp server on loopback that streams with set timings.

This is the one fake semhealth needs. Tests script exact responses and timings to check what
the proxy measures; ``semhealth demo`` plugs in ``demo_script`` for randomised, realistic
traffic. Per path suffix it speaks the real wire formats (what the ``openai`` and ``anthropic``
SDKs parse):

    */chat/completions   OpenAI chat completions   SSE ``data:`` chunks, ``[DONE]``
    */responses          OpenAI Responses API      SSE ``event:`` + ``data:``, ``sequence_number``
    */messages           Anthropic messages        SSE ``event:`` + ``data:``, ``ping``
    */api/chat           Ollama chat               NDJSON, streams unless ``"stream": false``
    */api/generate       Ollama generate           NDJSON, streams unless ``"stream": false``
    */generate_stream    TGI                       SSE token events, always streams
    */generate           TGI                       one JSON body

Timing model of one streamed answer: the response head goes out at once (t0); the stream's
opening frames (role chunk, ``response.created``, ``message_start``, ...) follow immediately;
content delta *i* is written at ``t0 + ttft_s + sum(gaps[:i])`` on the event loop's clock, each
in its own ``write`` (one HTTP chunk, one TCP send with TCP_NODELAY) so a proxy in between sees
it arrive on its own; closing frames follow the last delta. Sleeping to absolute times rather
than for relative durations keeps scheduling error from accumulating over a long stream.
A non-streamed answer is sent whole at the time the last delta would have been.

The tool arguments of a script are deltas too, after the text. Wires without streamed tool
arguments degrade as the real servers do: Ollama chat sends the whole tool call in one line
(at the last argument's time, counted as one delta); Ollama generate and TGI stream the
argument pieces as text.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal

import orjson
from aiohttp import web

logger = logging.getLogger(__name__)

FINISH_REASONS = ("stop", "length", "tool_calls")

_EMPTY_HEADERS: Mapping[str, str] = MappingProxyType({})


# --------------------------------------------------------------------------- scripts


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolScript:
    """One tool call: its name and its JSON arguments, streamed as ``pieces``.

    ``id`` is the call id the wire shows (``call_...``/``toolu_...``); None derives one.
    """

    name: str
    pieces: tuple[str, ...] = ()
    id: str | None = None

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    """What one response does, in provider-neutral terms; each wire format renders it.

    Deltas are the text ``pieces`` then the tool's argument pieces. ``ttft_s`` is the delay
    from the response head to the first delta; ``gaps_s`` the delay before each later delta
    (a tuple of exactly ``delta_count - 1`` values, or one float for all). ``finish_reason``
    is ``stop``, ``length`` or ``tool_calls`` (None: ``tool_calls`` when a tool is scripted,
    else ``stop``). ``input_tokens`` None estimates from the request body size;
    ``output_tokens`` None counts the deltas. A ``status`` outside 2xx answers a
    provider-shaped error body of type ``error`` (None: the usual type for the status) after
    ``ttft_s``. ``die_after`` closes the TCP connection after that many deltas, without the
    stream's end markers (a non-streamed body is cut in half). ``model`` None echoes the
    request's model.
    """

    pieces: tuple[str, ...] = ()
    ttft_s: float = 0.0
    gaps_s: tuple[float, ...] | float = 0.0
    tool_call: ToolScript | None = None
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    status: int = 200
    error: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY_HEADERS)
    die_after: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        # Frozen means frozen: a caller's dict must not change the script afterwards.
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        _check_timing(self.ttft_s, self.gaps_s, self.delta_count, self.die_after)
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}")
        if not 100 <= self.status <= 599:
            raise ValueError(f"status must be an HTTP status (100-599), got {self.status}")

    @property
    def delta_count(self) -> int:
        return len(self.pieces) + (len(self.tool_call.pieces) if self.tool_call else 0)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def finish(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_call is not None else "stop"

    def delta_offsets(self) -> tuple[float, ...]:
        """Seconds from the response head to each delta, in order."""
        return _offsets(self.ttft_s, self.gaps_s, self.delta_count)


@dataclass(frozen=True, slots=True, kw_only=True)
class RawScript:
    """A byte-exact response, whatever the path: ``chunks`` written one per ``write``.

    The first chunk goes ``ttft_s`` after the head, each later one ``gaps_s`` after the one
    before (tuple of ``len(chunks) - 1``, or one float). ``die_after`` closes the connection
    after that many chunks. One chunk goes out with a ``Content-Length``, several chunked
    (unless ``headers`` set a ``Content-Length``), as real servers send a whole body and a
    stream.
    """

    chunks: tuple[bytes, ...]
    ttft_s: float = 0.0
    gaps_s: tuple[float, ...] | float = 0.0
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY_HEADERS)
    content_type: str = "application/octet-stream"
    die_after: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        _check_timing(self.ttft_s, self.gaps_s, len(self.chunks), self.die_after)
        if not 100 <= self.status <= 599:
            raise ValueError(f"status must be an HTTP status (100-599), got {self.status}")


@dataclass(frozen=True, slots=True)
class ScriptRequest:
    """A request as the simulator received it. ``json`` is the parsed body, or None."""

    path: str
    method: str
    headers: Mapping[str, str]
    json: Any
    body: bytes


ScriptFor = Callable[[ScriptRequest], Script | RawScript]
"""Decides the response to one request; called on the event loop, so it must not block."""


def _check_timing(
    ttft_s: float, gaps_s: tuple[float, ...] | float, count: int, die_after: int | None
) -> None:
    gaps = (gaps_s,) if isinstance(gaps_s, float | int) else gaps_s
    if ttft_s < 0 or any(g < 0 for g in gaps):
        raise ValueError("ttft_s and gaps_s must not be negative")
    if not isinstance(gaps_s, float | int) and len(gaps_s) != max(count - 1, 0):
        raise ValueError(
            f"gaps_s has {len(gaps_s)} values; {count} deltas need {max(count - 1, 0)}"
        )
    if die_after is not None and die_after < 0:
        raise ValueError("die_after must not be negative")


def _offsets(ttft_s: float, gaps_s: tuple[float, ...] | float, count: int) -> tuple[float, ...]:
    if count == 0:
        return ()
    gaps = [float(gaps_s)] * (count - 1) if isinstance(gaps_s, float | int) else list(gaps_s)
    return tuple(itertools.accumulate(gaps, initial=ttft_s))


# --------------------------------------------------------------------------- plan & steps

_StepKind = Literal["open", "delta", "meta", "close"]


@dataclass(frozen=True, slots=True)
class _Step:
    """One write: ``at_s`` after the response head. ``close`` steps are the end markers."""

    at_s: float
    data: bytes
    kind: _StepKind


@dataclass(frozen=True, slots=True)
class _Plan:
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


def _make_plan(script: Script, request: ScriptRequest, serial: str) -> _Plan:
    offsets = script.delta_offsets()
    split = len(script.pieces)
    body = request.json if isinstance(request.json, dict) else {}
    model = script.model or str(body.get("model") or "sim-model")
    tool = script.tool_call
    return _Plan(
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
        request=request,
    )


def _sse(obj: Any, event: str | None = None) -> bytes:
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def _ndjson(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


def _body_of(plan: _Plan) -> dict[str, Any]:
    return plan.request.json if isinstance(plan.request.json, dict) else {}


def _error_message(status: int, etype: str) -> str:
    return f"simulated {etype} (HTTP {status})"


def _default_error_type(status: int) -> str:
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


# --------------------------------------------------------------------------- OpenAI chat


def _chat_chunk(plan: _Plan, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
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


def _chat_include_usage(plan: _Plan) -> bool:
    options = _body_of(plan).get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _chat_usage(plan: _Plan) -> dict[str, int]:
    return {
        "prompt_tokens": plan.input_tokens,
        "completion_tokens": plan.output_tokens,
        "total_tokens": plan.input_tokens + plan.output_tokens,
    }


def _chat_stream(plan: _Plan) -> list[_Step]:
    # As the real API: an answer that opens with a tool call has no content at all.
    role = {"role": "assistant", "content": "" if plan.text or not plan.tool else None}
    role["refusal"] = None
    steps = [_Step(0.0, _sse(_chat_chunk(plan, role)), "open")]
    steps += [_Step(at, _sse(_chat_chunk(plan, {"content": p})), "delta") for at, p in plan.text]
    if plan.tool is not None:
        head = {
            "index": 0,
            "id": f"call_{plan.tool_id}",
            "type": "function",
            "function": {"name": plan.tool.name, "arguments": ""},
        }
        steps.append(
            _Step(plan.tool_start_s, _sse(_chat_chunk(plan, {"tool_calls": [head]})), "meta")
        )
        for at, piece in plan.tool_args:
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            steps.append(_Step(at, _sse(_chat_chunk(plan, delta)), "delta"))
    steps.append(_Step(plan.end_s, _sse(_chat_chunk(plan, {}, plan.finish)), "close"))
    if _chat_include_usage(plan):
        usage = _chat_chunk(plan, {})
        usage["choices"] = []
        usage["usage"] = _chat_usage(plan)
        steps.append(_Step(plan.end_s, _sse(usage), "close"))
    steps.append(_Step(plan.end_s, b"data: [DONE]\n\n", "close"))
    return steps


def _chat_body(plan: _Plan) -> dict[str, Any]:
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


def _openai_error(status: int, etype: str) -> dict[str, Any]:
    code = "rate_limit_exceeded" if status == 429 else etype
    message = _error_message(status, etype)
    return {"error": {"message": message, "type": etype, "param": None, "code": code}}


# --------------------------------------------------------------------------- OpenAI Responses


def _responses_object(plan: _Plan, status: str, output: list[Any]) -> dict[str, Any]:
    body = _body_of(plan)
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


def _responses_usage(plan: _Plan) -> dict[str, Any]:
    return {
        "input_tokens": plan.input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": plan.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": plan.input_tokens + plan.output_tokens,
    }


def _responses_items(plan: _Plan, final: bool) -> list[dict[str, Any]]:
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
        self.steps: list[_Step] = []

    def add(self, at_s: float, kind: _StepKind, event: str, **fields: Any) -> None:
        data = _sse({"type": event, "sequence_number": next(self._seq), **fields}, event)
        self.steps.append(_Step(at_s, data, kind))


def _responses_stream(plan: _Plan) -> list[_Step]:
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
    plan: _Plan, ev: _ResponsesEvents, added: dict[str, Any], done: dict[str, Any]
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
    plan: _Plan, ev: _ResponsesEvents, index: int, added: dict[str, Any], done: dict[str, Any]
) -> None:
    ids = {"item_id": added["id"], "output_index": index}
    ev.add(plan.tool_start_s, "meta", "response.output_item.added", output_index=index, item=added)
    for at, piece in plan.tool_args:
        ev.add(at, "delta", "response.function_call_arguments.delta", **ids, delta=piece)
    args, name = done["arguments"], done["name"]
    end = plan.end_s
    ev.add(end, "meta", "response.function_call_arguments.done", **ids, arguments=args, name=name)
    ev.add(end, "meta", "response.output_item.done", output_index=index, item=done)


def _responses_body(plan: _Plan) -> dict[str, Any]:
    status = "incomplete" if plan.finish == "length" else "completed"
    return _responses_object(plan, status, _responses_items(plan, final=True))


# --------------------------------------------------------------------------- Anthropic


_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _anthropic_message(plan: _Plan, content: list[Any], done: bool) -> dict[str, Any]:
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


def _anthropic_stream(plan: _Plan) -> list[_Step]:
    start = {"type": "message_start", "message": _anthropic_message(plan, [], done=False)}
    steps = [_Step(0.0, _sse(start, "message_start"), "open")]
    ping = _Step(0.0, _sse({"type": "ping"}, "ping"), "open")
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
    steps.append(_Step(plan.end_s, _sse(delta, "message_delta"), "close"))
    steps.append(_Step(plan.end_s, _sse({"type": "message_stop"}, "message_stop"), "close"))
    return steps


def _anthropic_block(
    plan: _Plan,
    index: int,
    block: dict[str, Any],
    start_s: float,
    pieces: tuple[tuple[float, str], ...],
    delta_type: str,
) -> list[_Step]:
    key = "text" if delta_type == "text_delta" else "partial_json"
    start = {"type": "content_block_start", "index": index, "content_block": block}
    steps = [_Step(start_s, _sse(start, "content_block_start"), "open" if index == 0 else "meta")]
    for at, piece in pieces:
        delta = {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": delta_type, key: piece},
        }
        steps.append(_Step(at, _sse(delta, "content_block_delta"), "delta"))
    end = pieces[-1][0] if pieces else start_s
    stop = {"type": "content_block_stop", "index": index}
    steps.append(_Step(end, _sse(stop, "content_block_stop"), "meta"))
    return steps


def _anthropic_body(plan: _Plan) -> dict[str, Any]:
    content: list[Any] = []
    if plan.text or plan.tool is None:
        content.append({"type": "text", "text": plan.full_text})
    if plan.tool is not None:
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{plan.tool_id}",
                "name": plan.tool.name,
                "input": _json_object_or_empty(plan.tool.arguments),
            }
        )
    return _anthropic_message(plan, content, done=True)


def _json_object_or_empty(text: str) -> dict[str, Any]:
    # A non-streamed tool_use carries parsed input; arguments scripted as broken JSON have
    # no parsed form, and the real API only ever returns an object there.
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _anthropic_error(status: int, etype: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": etype, "message": _error_message(status, etype)}}


# --------------------------------------------------------------------------- Ollama


def _ollama_created_at() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _ollama_final(plan: _Plan) -> dict[str, Any]:
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


def _ollama_tool_calls(plan: _Plan) -> list[dict[str, Any]]:
    assert plan.tool is not None
    text = plan.tool.arguments
    try:
        arguments: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        arguments = text  # broken on purpose: pass the broken text through
    return [{"function": {"name": plan.tool.name, "arguments": arguments}}]


def _ollama_chat_line(plan: _Plan, message: dict[str, Any], **extra: Any) -> bytes:
    line = {"model": plan.model, "created_at": _ollama_created_at(), "message": message}
    return _ndjson({**line, "done": False, **extra})


def _ollama_chat_stream(plan: _Plan) -> list[_Step]:
    steps = [
        _Step(at, _ollama_chat_line(plan, {"role": "assistant", "content": p}), "delta")
        for at, p in plan.text
    ]
    if plan.tool is not None:
        message = {"role": "assistant", "content": "", "tool_calls": _ollama_tool_calls(plan)}
        steps.append(_Step(plan.end_s, _ollama_chat_line(plan, message), "delta"))
    final = _ollama_chat_line(plan, {"role": "assistant", "content": ""}, **_ollama_final(plan))
    steps.append(_Step(plan.end_s, final, "close"))
    return steps


def _ollama_chat_body(plan: _Plan) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": plan.full_text}
    if plan.tool is not None:
        message["tool_calls"] = _ollama_tool_calls(plan)
    line = {"model": plan.model, "created_at": _ollama_created_at(), "message": message}
    return {**line, **_ollama_final(plan)}


def _text_and_args(plan: _Plan) -> tuple[tuple[float, str], ...]:
    """Text-only wires: the tool's argument pieces stream as text after the answer."""
    return plan.text + plan.tool_args


def _ollama_generate_line(plan: _Plan, text: str, **extra: Any) -> bytes:
    line = {"model": plan.model, "created_at": _ollama_created_at(), "response": text}
    return _ndjson({**line, "done": False, **extra})


def _ollama_generate_stream(plan: _Plan) -> list[_Step]:
    steps = [_Step(at, _ollama_generate_line(plan, p), "delta") for at, p in _text_and_args(plan)]
    steps.append(_Step(plan.end_s, _ollama_generate_line(plan, "", **_ollama_final(plan)), "close"))
    return steps


def _ollama_generate_body(plan: _Plan) -> dict[str, Any]:
    text = "".join(p for _, p in _text_and_args(plan))
    line = {"model": plan.model, "created_at": _ollama_created_at(), "response": text}
    return {**line, **_ollama_final(plan)}


def _plain_error(status: int, etype: str) -> dict[str, Any]:
    return {"error": _error_message(status, etype)}


# --------------------------------------------------------------------------- TGI


def _tgi_details(plan: _Plan) -> dict[str, Any]:
    reason = "length" if plan.finish == "length" else "eos_token"
    return {
        "finish_reason": reason,
        "generated_tokens": plan.output_tokens,
        "seed": None,
        "input_length": plan.input_tokens,
    }


def _tgi_event(index: int, text: str, special: bool, final: str | None, plan: _Plan) -> bytes:
    token = {"id": 1000 + index, "text": text, "logprob": -0.25, "special": special}
    event = {
        "index": index,
        "token": token,
        "generated_text": final,
        "details": _tgi_details(plan) if final is not None else None,
        "top_tokens": None,
    }
    return b"data:" + orjson.dumps(event) + b"\n\n"


def _tgi_stream(plan: _Plan) -> list[_Step]:
    pieces = _text_and_args(plan)
    text = "".join(p for _, p in pieces)
    ends_on_token = plan.finish == "length" and bool(pieces)
    steps = []
    for i, (at, piece) in enumerate(pieces, start=1):
        last = ends_on_token and i == len(pieces)
        steps.append(_Step(at, _tgi_event(i, piece, False, text if last else None, plan), "delta"))
    if not ends_on_token:
        # A natural stop ends on the special end-of-sequence token, which carries the details.
        eos = _tgi_event(len(pieces) + 1, "</s>", True, text, plan)
        steps.append(_Step(plan.end_s, eos, "close"))
    return steps


def _tgi_body(plan: _Plan) -> dict[str, Any]:
    body: dict[str, Any] = {"generated_text": "".join(p for _, p in _text_and_args(plan))}
    params = _body_of(plan).get("parameters")
    if isinstance(params, dict) and params.get("details") is True:
        body["details"] = _tgi_details(plan)
    return body


def _tgi_error(status: int, etype: str) -> dict[str, Any]:
    return {"error": _error_message(status, etype), "error_type": etype}


# --------------------------------------------------------------------------- wire table


@dataclass(frozen=True, slots=True)
class _Wire:
    """How one path suffix renders a plan."""

    suffix: str
    stream: Callable[[_Plan], list[_Step]]
    body: Callable[[_Plan], dict[str, Any]]
    error: Callable[[int, str], dict[str, Any]]
    content_type: str
    streaming: Literal["flag", "unless_false", "always", "never"]
    request_id_header: str | None = None

    def wants_stream(self, request: ScriptRequest) -> bool:
        flag = request.json.get("stream") if isinstance(request.json, dict) else None
        match self.streaming:
            case "flag":
                return flag is True
            case "unless_false":
                return flag is not False
            case "always":
                return True
            case "never":
                return False


_SSE = "text/event-stream; charset=utf-8"
_NDJSON = "application/x-ndjson"

# Ordered so that a longer suffix wins over one it ends with (/api/generate before /generate).
_WIRES = (
    _Wire(
        "/chat/completions", _chat_stream, _chat_body, _openai_error, _SSE, "flag", "x-request-id"
    ),
    _Wire(
        "/responses",
        _responses_stream,
        _responses_body,
        _openai_error,
        _SSE,
        "flag",
        "x-request-id",
    ),
    _Wire(
        "/messages",
        _anthropic_stream,
        _anthropic_body,
        _anthropic_error,
        _SSE,
        "flag",
        "request-id",
    ),
    _Wire(
        "/api/chat", _ollama_chat_stream, _ollama_chat_body, _plain_error, _NDJSON, "unless_false"
    ),
    _Wire(
        "/api/generate",
        _ollama_generate_stream,
        _ollama_generate_body,
        _plain_error,
        _NDJSON,
        "unless_false",
    ),
    _Wire("/generate_stream", _tgi_stream, _tgi_body, _tgi_error, _SSE, "always"),
    _Wire("/generate", _tgi_stream, _tgi_body, _tgi_error, _SSE, "never"),
)


def _wire_for(path: str) -> _Wire | None:
    stripped = path.rstrip("/")
    return next((w for w in _WIRES if stripped.endswith(w.suffix)), None)


def _cut_index(steps: list[_Step], die_after: int | None) -> int:
    """How many steps go out before the connection is closed (all of them if it is not)."""
    if die_after is None:
        return len(steps)
    seen = 0
    for i, step in enumerate(steps):
        if step.kind == "close":
            return i
        if step.kind == "delta":
            if seen == die_after:
                return i
            seen += 1
            if seen == die_after:
                return i + 1
    return len(steps)


# --------------------------------------------------------------------------- server


class SimulatedUpstream:
    """The scripted upstream server. ``script_for`` decides each response from its request.

    ``received`` lists every request in arrival order. A ``script_for`` that raises is
    answered with a 500 and kept in ``failures`` so a test can see it.
    """

    def __init__(
        self,
        script_for: ScriptFor,
        *,
        shutdown_timeout_s: float = 1.0,
    ) -> None:
        self._script_for = script_for
        self._shutdown_timeout_s = shutdown_timeout_s
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._serials = itertools.count(1)
        self._open = 0
        self.received: list[ScriptRequest] = []
        self.failures: list[BaseException] = []

    @property
    def open_responses(self) -> int:
        """Requests being answered right now (a stream still being written counts)."""
        return self._open

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server, without a trailing slash."""
        if self._url is None:
            raise RuntimeError("SimulatedUpstream is not started")
        return self._url

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if self._runner is not None:
            raise RuntimeError("SimulatedUpstream is already started")
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that hangs up ends its scripted stream at once.
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=self._shutdown_timeout_s,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self._runner, self._url = runner, f"http://{shown}:{bound_port}"

    async def shutdown(self) -> None:
        runner, self._runner, self._url = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    def _next_serial(self) -> str:
        return f"sim{next(self._serials):06d}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self._open += 1
        try:
            return await self._answer(request)
        finally:
            self._open -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        script_request = ScriptRequest(
            path=request.path,
            method=request.method,
            headers=request.headers,
            json=_parse_json(body),
            body=body,
        )
        self.received.append(script_request)
        try:
            script = self._script_for(script_request)
        except Exception as exc:
            logger.exception("simulator script_for raised %s", type(exc).__name__)
            self.failures.append(exc)
            return web.json_response(_openai_error(500, "simulator_error"), status=500)
        if isinstance(script, RawScript):
            return await _serve_raw(request, script)
        wire = _wire_for(request.path)
        if wire is None:
            return web.json_response(_openai_error(404, "not_found_error"), status=404)
        serial = self._next_serial()
        if not 200 <= script.status < 300:
            return await _serve_error(request, wire, script, serial)
        plan = _make_plan(script, script_request, serial)
        if wire.wants_stream(script_request):
            headers = _headers(wire, script, serial, wire.content_type)
            steps = wire.stream(plan)
            return await _serve_steps(request, script.status, headers, steps, script.die_after)
        headers = _headers(wire, script, serial, "application/json")
        body = orjson.dumps(wire.body(plan))
        return await _serve_body(request, script, headers, body, plan.end_s)


def _parse_json(body: bytes) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _headers(wire: _Wire, script: Script, serial: str, content_type: str) -> dict[str, str]:
    headers = {"Content-Type": content_type, "Cache-Control": "no-cache"}
    if wire.request_id_header:
        headers[wire.request_id_header] = f"req_{serial}"
    headers.update(script.headers)
    return headers


async def _sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    delay = deadline - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


def _hang_up(request: web.Request) -> None:
    """Close the TCP connection under the response: no terminating chunk, no end markers."""
    if request.transport is not None:
        request.transport.close()


async def _serve_steps(
    request: web.Request,
    status: int,
    headers: Mapping[str, str],
    steps: list[_Step],
    die_after: int | None,
) -> web.StreamResponse:
    """Write each step at its time; with ``die_after``, hang up instead of ending the body."""
    response = web.StreamResponse(status=status, headers=headers)
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        for step in steps[: _cut_index(steps, die_after)]:
            await _sleep_until(loop, t0 + step.at_s)
            await response.write(step.data)
    except ConnectionError:
        return response  # the client went away; nothing left to tell it
    if die_after is not None:
        _hang_up(request)
    return response


async def _serve_body(
    request: web.Request, script: Script, headers: Mapping[str, str], body: bytes, at_s: float
) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    await _sleep_until(loop, loop.time() + at_s)
    response = web.StreamResponse(status=script.status, headers=headers)
    response.content_length = len(body)
    await response.prepare(request)
    try:
        if script.die_after is None:
            await response.write(body)
        else:
            await response.write(body[: len(body) // 2])
            _hang_up(request)
    except ConnectionError:
        pass  # the client went away
    return response


async def _serve_error(
    request: web.Request, wire: _Wire, script: Script, serial: str
) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    await _sleep_until(loop, loop.time() + script.ttft_s)
    etype = script.error or _default_error_type(script.status)
    headers = _headers(wire, script, serial, "application/json")
    return web.Response(
        body=orjson.dumps(wire.error(script.status, etype)), status=script.status, headers=headers
    )


async def _serve_raw(request: web.Request, script: RawScript) -> web.StreamResponse:
    offsets = _offsets(script.ttft_s, script.gaps_s, len(script.chunks))
    steps = [_Step(at, chunk, "delta") for at, chunk in zip(offsets, script.chunks, strict=True)]
    headers = {"Content-Type": script.content_type, **script.headers}
    has_length = any(name.lower() == "content-length" for name in headers)
    if len(script.chunks) == 1 and script.die_after is None and not has_length:
        # A body the server has whole goes out with its length, as real servers send it.
        headers["Content-Length"] = str(len(script.chunks[0]))
    return await _serve_steps(request, script.status, headers, steps, script.die_after)


# --------------------------------------------------------------------------- demo traffic


@dataclass(frozen=True, slots=True)
class CorpusEntry:
    """One built-in topic: a question, a document that answers it, and the answer."""

    topic: str
    lang: str  # "en" or "zh"
    question: str
    document: str
    answer: str


CORPUS: tuple[CorpusEntry, ...] = (
    CorpusEntry(
        topic="photosynthesis",
        lang="en",
        question="How does photosynthesis turn sunlight into chemical energy?",
        document=(
            "Photosynthesis takes place in chloroplasts. Chlorophyll absorbs red and blue "
            "light; the light reactions split water, release oxygen and make ATP and NADPH, "
            "which the Calvin cycle uses to fix carbon dioxide into sugars."
        ),
        answer=(
            "Photosynthesis captures sunlight with chlorophyll in the chloroplasts. The light "
            "reactions split water, releasing oxygen and storing energy in ATP and NADPH. "
            "The Calvin cycle then spends that energy to fix carbon dioxide into glucose, "
            "which is the chemical energy the plant lives on."
        ),
    ),
    CorpusEntry(
        topic="http_caching",
        lang="en",
        question="What do the Cache-Control max-age and ETag headers do in HTTP caching?",
        document=(
            "Cache-Control: max-age=N lets a cache reuse a response for N seconds without "
            "asking the origin. An ETag identifies a version of a resource; a client "
            "revalidates with If-None-Match and gets 304 Not Modified when nothing changed."
        ),
        answer=(
            "Cache-Control max-age tells caches how many seconds a response stays fresh, so "
            "they can serve it without contacting the server. Once it is stale, the ETag lets "
            "the client revalidate cheaply: it sends If-None-Match with the tag, and the "
            "server answers 304 Not Modified instead of the full body if nothing changed."
        ),
    ),
    CorpusEntry(
        topic="python_gil",
        lang="en",
        question="Why does the Python GIL limit multithreaded CPU-bound code?",
        document=(
            "CPython's global interpreter lock lets only one thread execute Python bytecode at "
            "a time. Threads release it around blocking I/O, so I/O-bound programs scale, but "
            "CPU-bound threads take turns. Multiprocessing or native extensions avoid it."
        ),
        answer=(
            "In CPython the global interpreter lock allows only one thread to run Python "
            "bytecode at any moment. I/O-bound threads release the lock while they wait, so "
            "they overlap well, but CPU-bound threads just take turns on one core. Use "
            "multiprocessing, or native code that releases the lock, to use several cores."
        ),
    ),
    CorpusEntry(
        topic="kubernetes_probes",
        lang="en",
        question="What is the difference between a liveness probe and a readiness probe?",
        document=(
            "Kubernetes restarts a container whose liveness probe fails. A failing readiness "
            "probe removes the pod from Service endpoints without restarting it, so traffic "
            "only reaches pods that are ready to serve."
        ),
        answer=(
            "A liveness probe answers whether the container is still healthy: when it fails, "
            "the kubelet restarts the container. A readiness probe answers whether the pod "
            "should receive traffic: when it fails, the pod is taken out of the Service "
            "endpoints but keeps running until it recovers."
        ),
    ),
    CorpusEntry(
        topic="sourdough",
        lang="en",
        question="How do I keep a sourdough starter healthy?",
        document=(
            "A sourdough starter is a culture of wild yeast and lactic acid bacteria. Feed it "
            "equal weights of flour and water, keep it at room temperature, and discard part "
            "of it before each feeding; refrigerate it if you bake only weekly."
        ),
        answer=(
            "Feed your starter regularly with equal weights of flour and water, discarding "
            "part of it first so it does not grow out of hand. At room temperature it wants "
            "a feeding once or twice a day; if you bake only weekly, keep it in the fridge and "
            "feed it a day before baking until it doubles and smells pleasantly sour."
        ),
    ),
    CorpusEntry(
        topic="great_wall",
        lang="zh",
        question="长城是什么时候修建的？有多长？",
        document=(
            "长城始建于春秋战国时期，秦始皇统一六国后将各国长城连接起来。现存的长城大多为明代修建，"
            "根据国家文物局的测量，历代长城总长度约为两万一千公里。"
        ),
        answer=(
            "长城最早修建于春秋战国时期，秦朝统一后把各段城墙连成一体。我们今天看到的大部分长城"
            "是明代重修的。根据国家文物局的测量，历代长城的总长度约为两万一千公里。"
        ),
    ),
    CorpusEntry(
        topic="giant_panda",
        lang="zh",
        question="大熊猫主要吃什么？生活在哪里？",
        document=(
            "大熊猫是中国特有的物种，主要分布在四川、陕西和甘肃的山区竹林中。大熊猫的食物百分之九十"
            "以上是竹子，每天要花十几个小时进食。"
        ),
        answer=(
            "大熊猫主要吃竹子，竹子占它们食物的百分之九十以上，它们每天要花十几个小时进食。"
            "野生大熊猫生活在中国四川、陕西和甘肃的山区竹林里。"
        ),
    ),
    CorpusEntry(
        topic="green_tea",
        lang="zh",
        question="绿茶应该用多少度的水冲泡？",
        document=(
            "绿茶属于不发酵茶，茶叶较嫩。冲泡绿茶的水温一般在八十度左右，水温过高会破坏维生素，"
            "使茶汤变黄、味道发苦。"
        ),
        answer=(
            "冲泡绿茶最好用八十度左右的水。绿茶是不发酵茶，芽叶比较嫩，水温太高会把茶叶烫熟，"
            "茶汤容易变黄发苦，也会损失维生素。可以先把开水晾一会儿再冲泡。"
        ),
    ),
    CorpusEntry(
        topic="high_speed_rail",
        lang="zh",
        question="中国高铁的最高运营速度是多少？",
        document=(
            "中国高速铁路网是世界上规模最大的高铁网络。京沪高铁上的复兴号列车以每小时三百五十公里"
            "的速度运营，是目前世界上商业运营速度最快的轮轨列车之一。"
        ),
        answer=(
            "中国高铁的最高商业运营速度是每小时三百五十公里，京沪高铁上的复兴号就按这个速度运行。"
            "中国的高铁网络也是世界上规模最大的。"
        ),
    ),
)

_FALLBACK = {
    "en": "I could not find anything about that in what I know; could you rephrase the question?",
    "zh": "抱歉，我没有找到与这个问题相关的信息，请换一种方式提问。",
}

_STOPWORDS = frozenset(
    ("the", "and", "for", "with", "what", "how", "does", "why", "that", "this", "are", "can")
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoProfile:
    """Settings of ``semhealth demo``: how the simulated upstream answers (``demo_script``) and
    what the traffic generator asks (``semhealth.agent.traffic``). Rates are per request, 0..1.

    The defaults give a healthy-looking service with enough trouble to move every signal
    within a minute of demo traffic.
    """

    # -- upstream timing
    ttft_median_s: float = 0.15  # TTFT is lognormal around this median ...
    ttft_sigma: float = 0.35  # ... with this shape: ~68% within x/÷1.4 (e^0.35) of it
    gap_min_s: float = 0.020  # each stream's typical inter-token gap is uniform in [min, max]
    gap_max_s: float = 0.040
    gap_jitter_s: float = 0.006  # Gaussian jitter of each gap around the stream's typical gap
    stall_rate: float = 0.05  # one gap of the stream becomes a stall ...
    stall_min_s: float = 1.0  # ... lasting uniformly between these
    stall_max_s: float = 2.0
    # -- upstream failures
    rate_limit_rate: float = 0.03  # 429 with X-RateLimit-Source: upstream, retry-after: 1
    malformed_json_rate: float = 0.08  # structured output with a JSON syntax error
    truncated_json_rate: float = 0.05  # structured output cut off, finish_reason length
    schema_violation_rate: float = 0.05  # parses, but a required field is missing
    # -- traffic mix: relative weights of the request kinds
    mix_chat_stream: float = 0.35  # OpenAI chat, streamed, with include_usage
    mix_chat_json: float = 0.15  # OpenAI chat in JSON mode or with a JSON Schema
    mix_chat_tool: float = 0.10  # OpenAI chat offering a function tool
    mix_responses: float = 0.20  # OpenAI Responses API
    mix_anthropic: float = 0.20  # Anthropic messages, streamed, documents attached
    # -- traffic content
    related_context_rate: float = 0.7  # the context is about the query's topic
    chinese_rate: float = 0.3  # the query and its context are in Chinese
    stream_rate: float = 0.85  # share of JSON-mode and Responses requests that stream
    openai_model: str = "gpt-4o-mini"
    anthropic_model: str = "claude-3-5-haiku-latest"
    request_timeout_s: float = 30.0  # client-side limit for one whole request

    def __post_init__(self) -> None:
        rates = [name for name in self.__slots__ if name.endswith("_rate")]
        for name in rates:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"DemoProfile.{name} must be between 0 and 1")
        if not 0.0 < self.gap_min_s <= self.gap_max_s or self.stall_min_s > self.stall_max_s:
            raise ValueError(
                "DemoProfile: need 0 < gap_min_s <= gap_max_s, stall_min_s <= stall_max_s"
            )
        if self.ttft_median_s <= 0:
            raise ValueError("DemoProfile.ttft_median_s must be positive")


def demo_script(
    request: ScriptRequest, rng: random.Random, profile: DemoProfile | None = None
) -> Script:
    """A realistic randomised answer to ``request``, drawn from ``rng``.

    The text answers the query from the built-in corpus (a polite fallback when nothing
    matches); JSON or a tool call when the request asks for one; timing and failures per
    ``profile`` (default ``DemoProfile()``).
    """
    profile = profile or DemoProfile()
    body = request.json if isinstance(request.json, dict) else {}
    model = str(body.get("model") or "sim-demo")
    if rng.random() < profile.rate_limit_rate:
        headers = {"X-RateLimit-Source": "upstream", "retry-after": "1"}
        return Script(status=429, error="rate_limit_error", headers=headers, model=model)
    query = query_text(body)
    entry = best_entry(query)
    answer = entry.answer if entry else _FALLBACK["zh" if _has_cjk(query) else "en"]
    pieces, tool_call, finish = _demo_content(profile, body, answer, rng)
    count = len(pieces) + (len(tool_call.pieces) if tool_call else 0)
    return Script(
        pieces=pieces,
        tool_call=tool_call,
        finish_reason=finish,
        ttft_s=rng.lognormvariate(math.log(profile.ttft_median_s), profile.ttft_sigma),
        gaps_s=_demo_gaps(profile, count, rng),
        model=model,
    )


def _demo_content(
    profile: DemoProfile, body: Mapping[str, Any], answer: str, rng: random.Random
) -> tuple[tuple[str, ...], ToolScript | None, str]:
    """Pieces, tool call and finish reason: a tool call, JSON, or plain text, as asked."""
    tool = _requested_tool(body)
    if tool is not None:
        name, schema = tool
        arguments, finish = _structured_text(profile, schema, answer, rng)
        call = ToolScript(name=name, pieces=_split_json(arguments, rng))
        return (), call, "tool_calls" if finish == "stop" else finish
    wanted = _requested_schema(body)
    if wanted is not None:
        text, finish = _structured_text(profile, wanted, answer, rng)
        return _split_json(text, rng), None, finish
    return _split_text(answer, rng), None, "stop"


def _demo_gaps(profile: DemoProfile, count: int, rng: random.Random) -> tuple[float, ...]:
    typical = rng.uniform(profile.gap_min_s, profile.gap_max_s)
    gaps = [max(0.001, rng.gauss(typical, profile.gap_jitter_s)) for _ in range(count - 1)]
    if gaps and rng.random() < profile.stall_rate:
        gaps[rng.randrange(len(gaps))] = rng.uniform(profile.stall_min_s, profile.stall_max_s)
    return tuple(gaps)


def query_text(body: Mapping[str, Any]) -> str:
    """The user's query in any of the simulated request shapes (last user turn, or prompt)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        return _content_text(users[-1].get("content")) if users else ""
    inputs = body.get("input")
    if isinstance(inputs, list):
        users = [m for m in inputs if isinstance(m, dict) and m.get("role") == "user"]
        return _content_text(users[-1].get("content")) if users else ""
    for key in ("input", "prompt", "inputs"):
        if isinstance(body.get(key), str):
            return str(body[key])
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [b.get("text") for b in content if isinstance(b, dict)]
        # A query sent with documents is the text block after them: the last one.
        texts = [p for p in parts if isinstance(p, str)]
        return texts[-1] if texts else ""
    return ""


def _has_cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def _terms(text: str) -> set[str]:
    """Words for alphabetic text, character bigrams for Chinese (which has no spaces)."""
    words = {w for w in re.findall(r"[a-z0-9][a-z0-9-]+", text.lower()) if w not in _STOPWORDS}
    cjk = [ch for ch in text if "\u4e00" <= ch <= "\u9fff"]
    bigrams = {a + b for a, b in itertools.pairwise(cjk)}
    return words | bigrams


def best_entry(query: str) -> CorpusEntry | None:
    """The corpus entry whose question and document share most terms with ``query``."""
    terms = _terms(query)
    scored = [(len(terms & _terms(e.question + " " + e.document)), e) for e in CORPUS]
    score, entry = max(scored, key=lambda pair: pair[0])
    return entry if score > 0 else None


def _split_text(text: str, rng: random.Random) -> tuple[str, ...]:
    """Token-like pieces: words with their trailing space, or 1-3 Chinese characters."""
    if _has_cjk(text):
        pieces, i = [], 0
        while i < len(text):
            step = rng.randint(1, 3)
            pieces.append(text[i : i + step])
            i += step
        return tuple(pieces)
    return tuple(re.findall(r"\S+\s*", text))


def _split_json(text: str, rng: random.Random) -> tuple[str, ...]:
    pieces, i = [], 0
    while i < len(text):
        step = rng.randint(3, 8)
        pieces.append(text[i : i + step])
        i += step
    return tuple(pieces)


def _dict_at(obj: Any, key: str) -> dict[str, Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def _requested_schema(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON output the request asks for: its schema, ``{}`` for plain JSON mode, or None."""
    fmt = _dict_at(body, "response_format") or _dict_at(_dict_at(body, "text"), "format")
    if fmt.get("type") in ("json_object", "json_schema"):
        return _dict_at(_dict_at(fmt, "json_schema") or fmt, "schema")
    grammar = _dict_at(_dict_at(body, "parameters"), "grammar")  # TGI
    if grammar.get("type") == "json":
        return _dict_at(grammar, "value")
    ollama = body.get("format")
    if ollama == "json" or isinstance(ollama, dict):
        return ollama if isinstance(ollama, dict) else {}
    return None


def _requested_tool(body: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """Name and parameter schema of the first tool offered, unless tools are switched off."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    spec = _dict_at(tools[0], "function") or (tools[0] if isinstance(tools[0], dict) else {})
    name = spec.get("name")
    if not isinstance(name, str):
        return None
    return name, _dict_at(spec, "parameters") or _dict_at(spec, "input_schema")


def _structured_text(
    profile: DemoProfile, schema: dict[str, Any], answer: str, rng: random.Random
) -> tuple[str, str]:
    """JSON text for ``schema`` and its finish reason: mostly valid, sometimes broken."""
    value = _sample(schema, answer, rng, 0) if schema else {"answer": answer}
    roll = rng.random()
    if isinstance(value, dict) and roll < profile.schema_violation_rate:
        required = [k for k in schema.get("required", ()) if k in value]
        value.pop(rng.choice(required) if required else next(iter(value), ""), None)
    text = orjson.dumps(value).decode()
    roll = rng.random()
    if roll < profile.truncated_json_rate and len(text) > 4:
        return text[: rng.randint(len(text) // 3, len(text) * 4 // 5)], "length"
    if roll < profile.truncated_json_rate + profile.malformed_json_rate:
        broken = text[:-1] + ",}" if text.endswith("}") else text.replace('"', "", 1)
        return broken, "stop"
    return text, "stop"


def _sample(schema: Any, answer: str, rng: random.Random, depth: int) -> Any:
    """A value that fits the JSON Schema ``schema`` (the common keywords), built from ``answer``."""
    if not isinstance(schema, dict):
        return answer
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        if depth >= 4 or not isinstance(props, dict):
            return {}
        return {key: _sample(sub, answer, rng, depth + 1) for key, sub in props.items()}
    if kind == "array":
        return [
            _sample(schema.get("items"), answer, rng, depth + 1) for _ in range(rng.randint(1, 3))
        ]
    samples: dict[Any, Callable[[], Any]] = {
        "integer": lambda: rng.randint(1, 100),
        "number": lambda: round(rng.random(), 2),
        "boolean": lambda: rng.random() < 0.5,
        "null": lambda: None,
    }
    make = samples.get(kind)
    return make() if make else " ".join(answer.split()[: rng.randint(3, 12)])
