"""Hypothesis strategies for OpenAI chat chunks: plain token chunks, chunks at the edge of
that shape (one or two fields changed or removed), and chunks of any shape. The token
shortcuts are held to the general path with them (``test_openai_token.py``,
``tests/collectors/test_token_shortcut.py``)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

MODEL = "gpt-4o-mini"
TOKEN = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "model": MODEL,
    "choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}],
}

# Values a field may take on the wire: the usual ones, and the ones that make a chunk
# something else (another shape, an error, a finish, a malformed value).
_ODD = st.sampled_from([None, "", "x", 0, 1, -1, True, False, 0.0, [], {}, ["a"], {"a": 1}])
_TEXT = st.one_of(st.sampled_from(["", "Hi", " there"]), _ODD)
_DELTA = st.fixed_dictionaries(
    {},
    optional={
        "content": _TEXT,
        "role": st.sampled_from(["assistant", None]),
        "refusal": _TEXT,
        "tool_calls": st.sampled_from([None, [], [{"index": 0, "function": {"name": "f"}}]]),
        "function_call": st.sampled_from([None, {"name": "f", "arguments": "{}"}]),
        "reasoning_content": _TEXT,
        "reasoning": _TEXT,
    },
)
_CHOICE = st.fixed_dictionaries(
    {},
    optional={
        "index": st.one_of(st.sampled_from([0, 1]), _ODD),
        "delta": st.one_of(_DELTA, _ODD),
        "message": st.sampled_from([{"content": "body"}, None]),
        "finish_reason": st.sampled_from([None, "stop", "length", "function_call", ""]),
        "logprobs": st.none(),
    },
)
_ANY_CHUNK = st.fixed_dictionaries(
    {},
    optional={
        "id": st.just("chatcmpl-1"),
        "object": st.sampled_from(
            ["chat.completion.chunk", "chat.completion", "error", "text_completion"]
        ),
        "model": st.one_of(st.sampled_from([MODEL, "other-model"]), _ODD),
        "choices": st.one_of(st.lists(st.one_of(_CHOICE, _ODD), max_size=2), _ODD),
        "usage": st.one_of(st.none(), st.just({"prompt_tokens": 3, "completion_tokens": 1})),
        "error": st.one_of(st.none(), st.just({"type": "server_error"})),
        "system_fingerprint": st.just("fp_1"),
    },
)
_DELETE = object()
# Token chunks with up to two fields changed or removed, so that most examples sit at the
# edge of the token path's shape, on one side of it or the other.
_PATHS = [("object",), ("model",), ("usage",), ("error",), ("choices",), ("choices", 0),
          ("choices", 0, "index"), ("choices", 0, "finish_reason"), ("choices", 0, "delta"),
          ("choices", 0, "message"), ("choices", 0, "delta", "content"),
          ("choices", 0, "delta", "refusal"), ("choices", 0, "delta", "tool_calls"),
          ("choices", 0, "delta", "function_call"), ("choices", 0, "delta", "reasoning"),
          ("choices", 0, "delta", "reasoning_content"), ("choices", 0, "delta", "role")]  # fmt: skip
_CHANGE = st.tuples(
    st.sampled_from(_PATHS),
    st.one_of(st.just(_DELETE), _ODD, _TEXT, st.sampled_from(["stop", "chat.completion", MODEL])),
)


def _child(parent: Any, key: str | int) -> Any:
    """``parent[key]`` where it is an object or an array, else None."""
    if isinstance(parent, dict) and isinstance(key, str):
        child = parent.get(key)
    elif isinstance(parent, list) and isinstance(key, int) and key < len(parent):
        child = parent[key]
    else:
        return None
    return child if isinstance(child, (dict, list)) else None


@st.composite
def _near_token(draw: st.DrawFn) -> dict[str, Any]:
    chunk: Any = orjson.loads(orjson.dumps(TOKEN))
    for path, shared in draw(st.lists(_CHANGE, max_size=2)):
        # A copy: the strategies hand out the same list and dict objects again and again.
        value = shared if shared is _DELETE else orjson.loads(orjson.dumps(shared))
        parent = chunk
        for key in path[:-1]:
            parent = _child(parent, key)
        last = path[-1]
        if isinstance(parent, dict) and isinstance(last, str):
            parent.pop(last, None)
            if value is not _DELETE:
                parent[last] = value
        elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            parent.pop(last)
            if value is not _DELETE:
                parent.insert(last, value)
    return chunk


CHUNK = st.one_of(_near_token(), _ANY_CHUNK)
