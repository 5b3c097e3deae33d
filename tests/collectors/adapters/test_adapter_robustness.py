"""No input makes any adapter raise: garbage, arbitrary JSON, and mutated real frames."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.collectors.adapters.registry import ADAPTER_NAMES, make_adapter
from semhealth.collectors.events import ContentDelta, Malformed, ToolCallDelta
from semhealth.collectors.frames import Frame

# Field names the adapters look at, so arbitrary JSON reaches past the first check.
VOCABULARY = (
    "choices", "delta", "message", "content", "refusal", "tool_calls", "function", "function_call",
    "arguments", "name", "id", "index", "finish_reason", "usage", "prompt_tokens",
    "completion_tokens", "error", "object", "type", "code", "model", "text", "response", "output",
    "item", "output_index", "call_id", "status", "incomplete_details", "reason", "input_tokens",
    "output_tokens", "content_block", "partial_json", "stop_reason", "input", "done",
    "done_reason", "eval_count", "prompt_eval_count", "token", "special", "generated_text",
    "details", "generated_tokens", "input_length", "error_type",
)  # fmt: skip
EVENT_NAMES = (
    "", "message", "error", "ping", "message_start", "content_block_start", "content_block_delta",
    "message_delta", "message_stop", "response.created", "response.output_item.added",
    "response.output_text.delta", "response.function_call_arguments.delta", "response.completed",
    "response.incomplete", "response.failed",
)  # fmt: skip
TYPE_VALUES = (
    "chat.completion", "chat.completion.chunk", "text_completion", "response", "function_call",
    "message", "text", "tool_use", "text_delta", "input_json_delta", "output_text", "refusal",
    *EVENT_NAMES,
)  # fmt: skip

SEEDS: tuple[tuple[str, Any], ...] = (
    ("", {"object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {
        "content": "a", "tool_calls": [{"index": 0, "id": "c", "function": {"name": "f",
        "arguments": "{}"}}]}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 1,
        "completion_tokens": 2}}),
    ("", {"object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": {
        "content": "a", "refusal": None}, "finish_reason": "stop"}], "usage": None}),
    ("response.output_item.added", {"type": "response.output_item.added", "output_index": 1,
        "item": {"type": "function_call", "call_id": "c", "name": "f", "arguments": ""}}),
    ("response.completed", {"type": "response.completed", "response": {"model": "m",
        "status": "completed", "output": [{"type": "function_call"}], "usage": {
        "input_tokens": 1, "output_tokens": 2}, "incomplete_details": None}}),
    ("", {"object": "response", "status": "incomplete", "incomplete_details": {"reason": "x"},
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call", "name": "f", "arguments": "{}"}]}),
    ("message_start", {"type": "message_start", "message": {"model": "m", "usage": {
        "input_tokens": 1, "cache_read_input_tokens": 3, "output_tokens": 1}}}),
    ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
        "type": "tool_use", "id": "t", "name": "f", "input": {}}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {
        "type": "input_json_delta", "partial_json": "{"}}),
    ("", {"type": "message", "model": "m", "content": [{"type": "text", "text": "a"}, {
        "type": "tool_use", "id": "t", "name": "f", "input": {"a": [1]}}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 2}}),
    ("", {"model": "m", "message": {"content": "a", "tool_calls": [{"function": {"name": "f",
        "arguments": {"a": 1}}}]}, "done": True, "done_reason": "stop", "eval_count": 1}),
    ("", {"token": {"id": 1, "text": "a", "special": False}, "generated_text": "a", "details": {
        "finish_reason": "eos_token", "generated_tokens": 1, "input_length": 2}}),
    ("", [{"generated_text": "a", "details": {"finish_reason": "length"}}]),
)  # fmt: skip

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(TYPE_VALUES),
)
keys = st.one_of(st.sampled_from(VOCABULARY), st.text(max_size=8))
json_values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location inside a JSON value, as the keys/indices leading to it."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A copy of ``value`` with the item at ``path`` swapped for ``new``."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: replaced(v, rest, new) if k == head else v for k, v in value.items()}
    return [replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]


# Mostly a wrong scalar, sometimes a small container: the cheap cases that break parsers.
replacements = st.one_of(
    leaves, st.lists(leaves, max_size=2), st.dictionaries(keys, leaves, max_size=2)
)


@st.composite
def mutated_seeds(draw: st.DrawFn) -> tuple[str, Any]:
    """A real frame's JSON with one to three sub-values swapped for arbitrary ones."""
    event, value = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(value)))
        value = replaced(value, path, draw(replacements))
    return event, value


def check(events: list[Any], frame: Frame) -> None:
    for event in events:
        if isinstance(event, Malformed):
            assert event.reason in ("json", "shape")
        if isinstance(event, ContentDelta | ToolCallDelta):
            assert event.t == frame.t


# One adapter per example (drawn), rather than one test per adapter, keeps the file fast.
adapter_names = st.sampled_from(ADAPTER_NAMES)


@settings(deadline=None)
@given(
    name=adapter_names, data=st.one_of(st.text(), st.binary()), event=st.sampled_from(EVENT_NAMES)
)
def test_garbage_never_raises(name: str, data: str | bytes, event: str) -> None:
    frame = Frame(data=data, t=1, event=event)
    check(make_adapter(name).feed(frame), frame)


@settings(deadline=None)
@given(
    name=adapter_names,
    values=st.lists(json_values, min_size=1, max_size=5),
    event=st.sampled_from(EVENT_NAMES),
)
def test_arbitrary_json_never_raises(name: str, values: list[Any], event: str) -> None:
    adapter = make_adapter(name)
    for t, value in enumerate(values):
        frame = Frame(data=orjson.dumps(value), t=t, event=event)
        check(adapter.feed(frame), frame)


@settings(deadline=None)
@given(name=adapter_names, frames=st.lists(mutated_seeds(), min_size=1, max_size=6))
def test_mutated_real_frames_never_raise(name: str, frames: list[tuple[str, Any]]) -> None:
    adapter = make_adapter(name)
    for t, (event, value) in enumerate(frames):
        frame = Frame(data=orjson.dumps(value).decode(), t=t, event=event)
        check(adapter.feed(frame), frame)


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_deeply_nested_json_never_raises(name: str) -> None:
    deep = '{"message":{"content":"","tool_calls":[{"function":{"arguments":' + "[" * 400
    deep += "]" * 400 + "}}]},"
    deep += '"done":true,"type":"message","content":[{"type":"tool_use","input":' + "[" * 400
    deep += "]" * 400 + "}]}"
    frame = Frame(data=deep, t=1)
    check(make_adapter(name).feed(frame), frame)
