"""The chat adapter's token path (``token_text``) is an optimisation only: for every chunk,
the events are those of the general walk, whether the token path takes the chunk or not."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.collectors.adapters.openai_chat import OpenAIChatAdapter, token_text
from semhealth.collectors.events import AdapterEvent, ContentDelta, Malformed
from semhealth.collectors.frames import Frame
from tests.collectors.adapters.chat_chunks import CHUNK, MODEL, TOKEN


class _Walk(OpenAIChatAdapter):
    """The chat adapter with the token path taken out: the general walk alone."""

    def _events(self, chunk: dict[str, Any], t: int) -> list[AdapterEvent]:
        return super(OpenAIChatAdapter, self)._events(chunk, t)


def _events(adapter: OpenAIChatAdapter, chunks: list[dict[str, Any]]) -> list[AdapterEvent]:
    out: list[AdapterEvent] = []
    for t, chunk in enumerate(chunks):
        out += adapter.feed(Frame(data=orjson.dumps(chunk).decode(), t=t))
    return out


@settings(max_examples=600, deadline=None)
@given(chunks=st.lists(CHUNK, min_size=1, max_size=4))
def test_a_stream_gives_the_events_of_the_general_walk(chunks: list[dict[str, Any]]) -> None:
    assert _events(OpenAIChatAdapter(), chunks) == _events(_Walk(), chunks)


@settings(max_examples=300, deadline=None)
@given(chunk=CHUNK)
def test_a_chunk_the_token_path_takes_is_one_content_delta(chunk: dict[str, Any]) -> None:
    text = token_text(chunk, MODEL)
    walk = _Walk()
    walk._model = MODEL  # the model was reported by an earlier chunk
    events = walk.feed(Frame(data=orjson.dumps(chunk).decode(), t=7))
    if text is not None:
        assert events == [ContentDelta(text, 7)]


def test_a_plain_token_chunk_takes_the_token_path() -> None:
    assert token_text(TOKEN, MODEL) == "Hi"


def test_the_first_chunk_of_a_model_is_walked_so_the_model_is_reported() -> None:
    assert token_text(TOKEN, None) is None


@pytest.mark.parametrize("index", [True, False, 0.0], ids=repr)
def test_an_index_that_is_no_integer_is_walked_and_reported_malformed(index: object) -> None:
    chunk = {**TOKEN, "choices": [{**TOKEN["choices"][0], "index": index}]}
    assert token_text(chunk, MODEL) is None
    adapter = OpenAIChatAdapter()
    adapter._model = MODEL
    assert adapter.feed(Frame(data=orjson.dumps(chunk).decode(), t=0)) == [Malformed("shape")]
