"""The scripted upstream speaks each wire format as the real SDKs parse it, with the set timings."""

# ruff: noqa: RUF001 -- Chinese queries carry full-width punctuation on purpose.

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pydantic
import pytest
from anthropic.types import RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDictProxy
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

from semhealth.agent.demo.simulator import (
    CORPUS,
    DemoProfile,
    RawScript,
    Script,
    ScriptRequest,
    SimulatedUpstream,
    ToolScript,
    best_entry,
    demo_script,
    query_text,
)

PIECES = ("The", " capital", " of", " France", " is", " Paris", ".")
WEATHER_ARGS = ('{"ci', 'ty": ', '"Paris"', "}")
WEATHER_TOOL_CHAT: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
USER: Any = [{"role": "user", "content": "What is the capital of France?"}]


class Harness:
    """Starts upstreams and SDK clients for a test, and closes them all afterwards."""

    def __init__(self) -> None:
        self._upstreams: list[SimulatedUpstream] = []
        self._clients: list[openai.AsyncOpenAI | anthropic.AsyncAnthropic] = []

    async def __call__(self, script: Any) -> SimulatedUpstream:
        """A started SimulatedUpstream for a script, or for a function of the request."""
        upstream = SimulatedUpstream(script if callable(script) else lambda _r: script)
        await upstream.start()
        self._upstreams.append(upstream)
        return upstream

    def openai(self, upstream: SimulatedUpstream) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=upstream.url + "/v1", api_key="x", max_retries=0)
        self._clients.append(client)
        return client

    def anthropic(self, upstream: SimulatedUpstream) -> anthropic.AsyncAnthropic:
        client = anthropic.AsyncAnthropic(base_url=upstream.url, api_key="x", max_retries=0)
        self._clients.append(client)
        return client

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        for upstream in self._upstreams:
            await upstream.shutdown()


@pytest.fixture
async def serve() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.close()


async def _post(url: str, body: Any) -> tuple[int, CIMultiDictProxy[str], bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, response.headers, await response.read()


def _sse_events(raw: bytes) -> list[tuple[str, str]]:
    """(event, data) of each SSE message in a complete body."""
    events = []
    for block in raw.decode().split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        if "data" in fields:
            events.append((fields.get("event", "").strip(), fields["data"].lstrip(" ")))
    return events


# --------------------------------------------------------------------------- OpenAI chat


async def test_openai_chat_stream_assembles_the_pieces_and_reports_usage(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, input_tokens=12))
    client = serve.openai(upstream)
    stream = await client.chat.completions.create(
        model="gpt-test", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(PIECES)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (12, len(PIECES))
    assert chunks[-1].model == "gpt-test"


async def test_openai_chat_stream_without_include_usage_sends_no_usage(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES))
    stream = await serve.openai(upstream).chat.completions.create(
        model="m", messages=USER, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None and c.choices for c in chunks)


async def test_openai_chat_without_stream_returns_one_completion(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, input_tokens=9, output_tokens=30))
    completion = await serve.openai(upstream).chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].message.content == "".join(PIECES)
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (9, 30)


async def test_openai_chat_stream_tool_call_arguments_assemble(serve: Harness) -> None:
    upstream = await serve(Script(tool_call=ToolScript(name="get_weather", pieces=WEATHER_ARGS)))
    async with serve.openai(upstream).chat.completions.stream(
        model="m", messages=USER, tools=[WEATHER_TOOL_CHAT]
    ) as stream:
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert (call.function.name, call.function.arguments) == ("get_weather", "".join(WEATHER_ARGS))


async def test_openai_chat_text_then_tool_call_stream_both(serve: Harness) -> None:
    tool = ToolScript(name="get_weather", pieces=WEATHER_ARGS, id="abc")
    upstream = await serve(Script(pieces=("Let me check.",), tool_call=tool))
    async with serve.openai(upstream).chat.completions.stream(
        model="m", messages=USER, tools=[WEATHER_TOOL_CHAT]
    ) as stream:
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Let me check."
    assert message.tool_calls is not None
    assert message.tool_calls[0].id == "call_abc"


async def test_openai_chat_without_stream_carries_the_tool_call(serve: Harness) -> None:
    upstream = await serve(Script(tool_call=ToolScript(name="get_weather", pieces=WEATHER_ARGS)))
    completion = await serve.openai(upstream).chat.completions.create(
        model="m", messages=USER, tools=[WEATHER_TOOL_CHAT]
    )
    calls = completion.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].type == "function"
    assert calls[0].function.arguments == "".join(WEATHER_ARGS)


async def test_openai_chat_length_finish_is_reported(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES[:3], finish_reason="length"))
    completion = await serve.openai(upstream).chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].finish_reason == "length"


async def test_every_chat_chunk_validates_strictly_against_the_sdk_type(serve: Harness) -> None:
    tool = ToolScript(name="get_weather", pieces=WEATHER_ARGS)
    upstream = await serve(Script(pieces=PIECES, tool_call=tool))
    body = {
        "model": "m",
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    _, _, raw = await _post(upstream.url + "/v1/chat/completions", body)
    events = _sse_events(raw)
    assert events[-1] == ("", "[DONE]")
    for _, data in events[:-1]:
        ChatCompletionChunk.model_validate_json(data, strict=True)


# --------------------------------------------------------------------------- OpenAI Responses


async def test_responses_stream_yields_the_text_and_usage(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, input_tokens=5))
    async with serve.openai(upstream).responses.stream(
        model="m", input="capital of France?"
    ) as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == "".join(PIECES)
    assert final.status == "completed"
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (5, len(PIECES))


async def test_responses_stream_function_call_arguments_assemble(serve: Harness) -> None:
    upstream = await serve(Script(tool_call=ToolScript(name="get_weather", pieces=WEATHER_ARGS)))
    tool: Any = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    async with serve.openai(upstream).responses.stream(
        model="m", input="x", tools=[tool]
    ) as stream:
        deltas = [
            e.delta async for e in stream if e.type == "response.function_call_arguments.delta"
        ]
        final = await stream.get_final_response()
    call = final.output[0]
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert call.arguments == "".join(deltas) == "".join(WEATHER_ARGS)


async def test_responses_stream_events_are_numbered_in_order(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, tool_call=ToolScript(name="f", pieces=("{}",))))
    stream = await serve.openai(upstream).responses.create(model="m", input="x", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"


async def test_responses_without_stream_returns_a_response_object(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES))
    response = await serve.openai(upstream).responses.create(model="m", input="x")
    assert response.output_text == "".join(PIECES)
    assert response.status == "completed"


async def test_responses_length_finish_ends_incomplete(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES[:2], finish_reason="length"))
    stream = await serve.openai(upstream).responses.create(model="m", input="x", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details is not None
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


async def test_every_responses_event_validates_strictly_against_the_sdk_type(
    serve: Harness,
) -> None:
    tool = ToolScript(name="get_weather", pieces=WEATHER_ARGS)
    upstream = await serve(Script(pieces=PIECES, tool_call=tool))
    _, _, raw = await _post(upstream.url + "/v1/responses", {"model": "m", "stream": True})
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
    for event, data in _sse_events(raw):
        parsed = adapter.validate_json(data, strict=True)
        assert parsed.type == event


# --------------------------------------------------------------------------- Anthropic


async def test_anthropic_stream_yields_text_and_tool_use_input(serve: Harness) -> None:
    tool = ToolScript(name="get_weather", pieces=WEATHER_ARGS)
    upstream = await serve(Script(pieces=PIECES, tool_call=tool, input_tokens=20))
    async with serve.anthropic(upstream).messages.stream(
        model="claude-test",
        max_tokens=100,
        messages=USER,
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "".join(PIECES)
    assert final.stop_reason == "tool_use"
    tool_use = final.content[1]
    assert tool_use.type == "tool_use"
    assert (tool_use.name, tool_use.input) == ("get_weather", {"city": "Paris"})
    assert (final.usage.input_tokens, final.usage.output_tokens) == (20, len(PIECES) + 4)


async def test_anthropic_stream_of_a_tool_call_alone_opens_with_the_tool_block(
    serve: Harness,
) -> None:
    upstream = await serve(Script(tool_call=ToolScript(name="get_weather", pieces=WEATHER_ARGS)))
    async with serve.anthropic(upstream).messages.stream(
        model="c", max_tokens=100, messages=USER
    ) as stream:
        final = await stream.get_final_message()
    (tool_use,) = final.content
    assert tool_use.type == "tool_use"
    assert tool_use.input == {"city": "Paris"}


async def test_anthropic_without_stream_returns_one_message(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, finish_reason="length"))
    message = await serve.anthropic(upstream).messages.create(
        model="claude-test", max_tokens=100, messages=USER
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == "".join(PIECES)
    assert message.stop_reason == "max_tokens"


async def test_every_anthropic_event_validates_strictly_against_the_sdk_type(
    serve: Harness,
) -> None:
    tool = ToolScript(name="get_weather", pieces=WEATHER_ARGS)
    upstream = await serve(Script(pieces=PIECES, tool_call=tool))
    _, _, raw = await _post(upstream.url + "/v1/messages", {"model": "c", "stream": True})
    events = _sse_events(raw)
    assert [e for e, _ in events[:3]] == ["message_start", "content_block_start", "ping"]
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
    for event, data in events:
        if event != "ping":
            assert adapter.validate_json(data, strict=True).type == event


# --------------------------------------------------------------------------- errors


async def test_rate_limit_raises_the_openai_sdk_rate_limit_error(serve: Harness) -> None:
    headers = {"X-RateLimit-Source": "upstream", "retry-after": "1"}
    upstream = await serve(Script(status=429, headers=headers))
    with pytest.raises(openai.RateLimitError) as caught:
        await serve.openai(upstream).chat.completions.create(model="m", messages=USER)
    assert caught.value.response.headers["x-ratelimit-source"] == "upstream"
    assert caught.value.response.headers["retry-after"] == "1"
    assert caught.value.code == "rate_limit_exceeded"


async def test_rate_limit_raises_the_anthropic_sdk_rate_limit_error(serve: Harness) -> None:
    upstream = await serve(Script(status=429, headers={"X-RateLimit-Source": "upstream"}))
    with pytest.raises(anthropic.RateLimitError) as caught:
        await serve.anthropic(upstream).messages.create(model="c", max_tokens=10, messages=USER)
    assert caught.value.response.headers["x-ratelimit-source"] == "upstream"
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "simulated rate_limit_error (HTTP 429)"},
    }


async def test_server_error_type_is_the_scripted_one(serve: Harness) -> None:
    upstream = await serve(Script(status=529, error="overloaded_error"))
    with pytest.raises(anthropic.APIStatusError) as caught:
        await serve.anthropic(upstream).messages.create(model="c", max_tokens=10, messages=USER)
    assert caught.value.status_code == 529
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "overloaded_error"


async def test_ollama_and_tgi_errors_have_their_own_shapes(serve: Harness) -> None:
    upstream = await serve(Script(status=503))
    _, _, ollama = await _post(upstream.url + "/api/chat", {"model": "m"})
    _, _, tgi = await _post(upstream.url + "/generate", {"inputs": "x"})
    assert orjson.loads(ollama) == {"error": "simulated overloaded_error (HTTP 503)"}
    assert orjson.loads(tgi)["error_type"] == "overloaded_error"


# --------------------------------------------------------------------------- timing


# The simulator schedules each piece at a fixed offset from when it received the request,
# which is after the test's clock read before sending: no piece can arrive before its offset
# on that clock (less 1 ms of timer granularity), while a loaded 2-core machine may make any
# piece late, so the upper bound is loose.
EARLY_S = 0.001
LATE_S = 0.1


def _on_schedule(arrived: list[float], scheduled: list[float]) -> None:
    assert len(arrived) == len(scheduled)
    for got, want in zip(arrived, scheduled, strict=True):
        assert want - EARLY_S <= got <= want + LATE_S


async def test_streamed_deltas_arrive_on_the_scripted_schedule(serve: Harness) -> None:
    ttft, gap, count = 0.1, 0.05, 12
    upstream = await serve(
        Script(pieces=tuple(f"w{i} " for i in range(count)), ttft_s=ttft, gaps_s=gap)
    )
    client = serve.openai(upstream)
    sent = time.monotonic()
    stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
    arrivals = [time.monotonic() async for c in stream if c.choices and c.choices[0].delta.content]
    _on_schedule([t - sent for t in arrivals], [ttft + i * gap for i in range(count)])


async def test_uneven_gaps_are_kept_in_order(serve: Harness) -> None:
    gaps = (0.02, 0.15, 0.02)
    upstream = await serve(Script(pieces=("a", "b", "c", "d"), gaps_s=gaps))
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "messages": USER}
        sent = time.monotonic()
        async with session.post(upstream.url + "/api/chat", json=body) as response:
            arrivals = []
            async for _line in response.content:
                arrivals.append(time.monotonic())
    scheduled = list(itertools.accumulate(gaps, initial=0.0))
    _on_schedule([t - sent for t in arrivals[:4]], scheduled)


async def test_non_streamed_body_waits_for_the_whole_generation(serve: Harness) -> None:
    upstream = await serve(Script(pieces=("a", "b", "c"), ttft_s=0.1, gaps_s=0.05))
    start = time.monotonic()
    await serve.openai(upstream).chat.completions.create(model="m", messages=USER)
    assert time.monotonic() - start >= 0.2


# --------------------------------------------------------------------------- die_after


async def test_die_after_breaks_the_openai_stream_after_that_many_deltas(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, gaps_s=0.005, die_after=3))
    received: list[str] = []
    stream = await serve.openai(upstream).chat.completions.create(
        model="m", messages=USER, stream=True
    )
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "".join(PIECES[:3])


async def test_die_after_all_deltas_still_withholds_the_end_markers(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, die_after=len(PIECES)))
    received = b""
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "stream": True}
        async with session.post(upstream.url + "/v1/messages", json=body) as response:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in response.content.iter_any():
                    received += chunk
    assert b"content_block_delta" in received
    assert b"message_stop" not in received


async def test_die_after_zero_sends_the_preamble_only(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, die_after=0))
    received = b""
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "stream": True}
        async with session.post(upstream.url + "/v1/chat/completions", json=body) as response:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in response.content.iter_any():
                    received += chunk
    assert b'"role":"assistant"' in received
    assert b"Paris" not in received


async def test_die_after_cuts_a_non_streamed_body(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, die_after=1))
    with pytest.raises(openai.APIConnectionError):
        await serve.openai(upstream).chat.completions.create(model="m", messages=USER)


# --------------------------------------------------------------------------- Ollama, TGI


async def test_ollama_chat_streams_ndjson_ending_with_done(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, input_tokens=4))
    status, headers, raw = await _post(
        upstream.url + "/api/chat", {"model": "llama3", "messages": USER}
    )
    lines = [orjson.loads(line) for line in raw.splitlines()]
    assert status == 200
    assert headers["Content-Type"] == "application/x-ndjson"
    assert "".join(line["message"]["content"] for line in lines) == "".join(PIECES)
    assert [line["done"] for line in lines] == [False] * len(PIECES) + [True]
    final = lines[-1]
    assert (final["prompt_eval_count"], final["eval_count"], final["done_reason"]) == (4, 7, "stop")
    assert final["model"] == "llama3"


async def test_ollama_chat_sends_the_tool_call_whole(serve: Harness) -> None:
    upstream = await serve(Script(tool_call=ToolScript(name="get_weather", pieces=WEATHER_ARGS)))
    _, _, raw = await _post(upstream.url + "/api/chat", {"model": "m", "messages": USER})
    lines = [orjson.loads(line) for line in raw.splitlines()]
    call = lines[0]["message"]["tool_calls"][0]["function"]
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}


async def test_ollama_answers_one_body_when_stream_is_false(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, finish_reason="length"))
    body = {"model": "m", "prompt": "x", "stream": False}
    _, _, raw = await _post(upstream.url + "/api/generate", body)
    answer = orjson.loads(raw)
    assert (answer["response"], answer["done"], answer["done_reason"]) == (
        "".join(PIECES),
        True,
        "length",
    )


async def test_ollama_generate_streams_response_pieces(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES))
    _, _, raw = await _post(upstream.url + "/api/generate", {"model": "m", "prompt": "x"})
    lines = [orjson.loads(line) for line in raw.splitlines()]
    assert [line["response"] for line in lines[:-1]] == list(PIECES)
    assert lines[-1]["done"] is True


async def test_tgi_generate_stream_sends_token_events_then_details(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, input_tokens=3))
    _, _, raw = await _post(upstream.url + "/generate_stream", {"inputs": "x"})
    events = [orjson.loads(data) for _, data in _sse_events(raw)]
    tokens = [e["token"] for e in events if not e["token"]["special"]]
    assert "".join(t["text"] for t in tokens) == "".join(PIECES)
    assert all(e["generated_text"] is None for e in events[:-1])
    assert events[-1]["generated_text"] == "".join(PIECES)
    assert events[-1]["details"]["finish_reason"] == "eos_token"
    assert events[-1]["details"]["generated_tokens"] == len(PIECES)


async def test_tgi_length_finish_ends_on_the_last_real_token(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES, finish_reason="length"))
    _, _, raw = await _post(upstream.url + "/generate_stream", {"inputs": "x"})
    last = orjson.loads(_sse_events(raw)[-1][1])
    assert (last["token"]["text"], last["details"]["finish_reason"]) == (".", "length")


async def test_tgi_generate_answers_one_body_with_details_when_asked(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES))
    body = {"inputs": "x", "parameters": {"details": True}}
    _, _, raw = await _post(upstream.url + "/generate", body)
    answer = orjson.loads(raw)
    assert answer["generated_text"] == "".join(PIECES)
    assert answer["details"]["finish_reason"] == "eos_token"


# --------------------------------------------------------------------------- raw, routing


async def test_raw_script_sends_the_exact_bytes_in_its_chunks(serve: Harness) -> None:
    chunks = (b"data: a\n\n", b"\xff\x00", b"tail")
    upstream = await serve(RawScript(chunks=chunks, content_type="text/event-stream", status=207))
    async with (
        aiohttp.ClientSession() as session,
        session.get(upstream.url + "/anything/at/all") as response,
    ):
        received = [chunk async for chunk in response.content.iter_any()]
        assert response.status == 207
        assert response.headers["Content-Type"] == "text/event-stream"
    assert b"".join(received) == b"".join(chunks)


async def test_raw_script_of_one_chunk_has_a_content_length(serve: Harness) -> None:
    upstream = await serve(RawScript(chunks=(b'{"ok": true}',), content_type="application/json"))
    async with aiohttp.ClientSession() as session, session.get(upstream.url + "/x") as response:
        assert response.headers["Content-Length"] == "12"
        assert "Transfer-Encoding" not in response.headers
        assert await response.read() == b'{"ok": true}'


async def test_raw_script_die_after_closes_the_connection(serve: Harness) -> None:
    upstream = await serve(RawScript(chunks=(b"one", b"two", b"three"), die_after=2))
    received = b""
    async with aiohttp.ClientSession() as session, session.get(upstream.url + "/x") as response:
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in response.content.iter_any():
                received += chunk
    assert received == b"onetwo"


async def test_script_on_an_unknown_path_is_not_found(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES))
    status, _, raw = await _post(upstream.url + "/v1/embeddings", {})
    assert status == 404
    assert orjson.loads(raw)["error"]["type"] == "not_found_error"


async def test_a_failing_script_for_answers_500_and_is_kept(serve: Harness) -> None:
    def broken(_request: ScriptRequest) -> Script:
        raise KeyError("missing")

    upstream = await serve(broken)
    status, _, _ = await _post(upstream.url + "/v1/chat/completions", {})
    assert status == 500
    assert isinstance(upstream.failures[0], KeyError)


async def test_received_keeps_each_request(serve: Harness) -> None:
    upstream = await serve(Script(pieces=PIECES))
    await _post(upstream.url + "/v1/chat/completions?x=1", {"model": "m", "stream": False})
    (request,) = upstream.received
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.json == {"model": "m", "stream": False}
    assert orjson.loads(request.body) == request.json
    assert request.headers["Content-Type"] == "application/json"


async def test_a_client_hanging_up_ends_the_scripted_stream(serve: Harness) -> None:
    upstream = await serve(Script(pieces=("a",) * 100, gaps_s=0.05))
    async with aiohttp.ClientSession() as session:
        response = await session.post(upstream.url + "/api/generate", json={"prompt": "x"})
        await response.content.readline()
        response.close()
    for _ in range(100):
        if upstream.open_responses == 0:
            break
        await asyncio.sleep(0.01)
    assert upstream.open_responses == 0


# --------------------------------------------------------------------------- script checks


def test_a_gaps_tuple_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="3 deltas need 2"):
        Script(pieces=("a", "b", "c"), gaps_s=(0.1,))


def test_negative_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        RawScript(chunks=(b"x",), ttft_s=-1.0)


def test_an_unknown_finish_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="finish_reason"):
        Script(pieces=("a",), finish_reason="end_turn")


def test_tool_argument_pieces_are_deltas_after_the_text() -> None:
    script = Script(
        pieces=("a", "b"), tool_call=ToolScript(name="f", pieces=("{", "}")), ttft_s=1.0, gaps_s=0.5
    )
    assert script.delta_offsets() == (1.0, 1.5, 2.0, 2.5)
    assert script.finish == "tool_calls"


def test_headers_of_a_script_do_not_change_with_the_callers_dict() -> None:
    headers = {"retry-after": "1"}
    script = Script(status=429, headers=headers)
    headers["retry-after"] = "99"
    assert script.headers["retry-after"] == "1"


# --------------------------------------------------------------------------- lifecycle


async def test_shutdown_is_safe_without_start_and_twice() -> None:
    upstream = SimulatedUpstream(lambda _r: Script())
    await upstream.shutdown()
    await upstream.start()
    await upstream.shutdown()
    await upstream.shutdown()
    with pytest.raises(RuntimeError):
        _ = upstream.url


async def test_a_fresh_instance_starts_after_one_shut_down() -> None:
    for _ in range(2):
        upstream = SimulatedUpstream(lambda _r: Script(pieces=("ok",)))
        await upstream.start()
        status, _, _ = await _post(upstream.url + "/v1/chat/completions", {})
        await upstream.shutdown()
        assert status == 200


async def test_shutdown_ends_a_stalled_stream(serve: Harness) -> None:
    upstream = SimulatedUpstream(
        lambda _r: Script(pieces=("a", "b"), gaps_s=30.0), shutdown_timeout_s=0.1
    )
    await upstream.start()
    async with aiohttp.ClientSession() as session:
        response = await session.post(upstream.url + "/api/generate", json={"prompt": "x"})
        await response.content.readline()
        await asyncio.wait_for(upstream.shutdown(), timeout=5)
        response.close()
    assert upstream.open_responses == 0


# --------------------------------------------------------------------------- demo_script


def _request(body: dict[str, Any], path: str = "/v1/chat/completions") -> ScriptRequest:
    raw = orjson.dumps(body)
    return ScriptRequest(path=path, method="POST", headers={}, json=body, body=raw)


def _chat(question: str, **extra: Any) -> ScriptRequest:
    return _request({"model": "m", "messages": [{"role": "user", "content": question}], **extra})


def _gaps(script: Script) -> tuple[float, ...]:
    assert isinstance(script.gaps_s, tuple)  # demo scripts give every gap
    return script.gaps_s


CALM = DemoProfile(
    rate_limit_rate=0.0,
    malformed_json_rate=0.0,
    truncated_json_rate=0.0,
    schema_violation_rate=0.0,
)


@pytest.mark.parametrize("entry", CORPUS, ids=[e.topic for e in CORPUS])
def test_demo_answer_is_about_the_question(entry: Any) -> None:
    script = demo_script(_chat(entry.question), random.Random(1), CALM)
    assert script.text == entry.answer
    assert script.finish == "stop"


def test_demo_answer_to_an_unknown_question_is_a_fallback_in_its_language() -> None:
    english = demo_script(_chat("zzz qqq"), random.Random(1), CALM)
    chinese = demo_script(_chat("宇宙飞船怎么造"), random.Random(1), CALM)
    assert "rephrase" in english.text
    assert "抱歉" in chinese.text


def test_demo_chinese_answers_stream_a_few_characters_a_piece() -> None:
    script = demo_script(_chat("大熊猫吃什么？"), random.Random(2), CALM)
    assert all(1 <= len(piece) <= 3 for piece in script.pieces)


def test_demo_timings_follow_the_profile() -> None:
    profile = DemoProfile(rate_limit_rate=0.0, stall_rate=0.0)
    scripts = [demo_script(_chat(CORPUS[0].question), random.Random(i), profile) for i in range(40)]
    ttfts = sorted(s.ttft_s for s in scripts)
    assert 0.08 < ttfts[len(ttfts) // 2] < 0.3
    gaps = [g for s in scripts for g in _gaps(s)]
    assert all(0.001 <= g < 0.1 for g in gaps)


def test_demo_stall_is_a_one_to_two_second_gap() -> None:
    script = demo_script(
        _chat(CORPUS[0].question),
        random.Random(3),
        DemoProfile(stall_rate=1.0, rate_limit_rate=0.0),
    )
    assert sum(1 for g in _gaps(script) if 1.0 <= g <= 2.0) == 1


def test_demo_rate_limit_answers_429_from_the_upstream() -> None:
    script = demo_script(_chat("x"), random.Random(1), DemoProfile(rate_limit_rate=1.0))
    assert script.status == 429
    assert script.headers["X-RateLimit-Source"] == "upstream"


def test_demo_json_schema_request_gets_a_fitting_object() -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string"},
            "n": {"type": "integer"},
            "ok": {"type": "boolean"},
        },
        "required": ["answer", "n"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    script = demo_script(_chat(CORPUS[1].question, response_format=fmt), random.Random(5), CALM)
    value = orjson.loads(script.text)
    assert isinstance(value["answer"], str)
    assert isinstance(value["n"], int)
    assert isinstance(value["ok"], bool)


def test_demo_json_is_mostly_valid_and_sometimes_broken() -> None:
    request = _chat(CORPUS[2].question, response_format={"type": "json_object"})
    outcomes = {"valid": 0, "broken": 0, "length": 0}
    for seed in range(200):
        script = demo_script(request, random.Random(seed), DemoProfile(rate_limit_rate=0.0))
        try:
            orjson.loads(script.text)
            outcomes["valid"] += 1
        except orjson.JSONDecodeError:
            outcomes["length" if script.finish == "length" else "broken"] += 1
    assert outcomes["valid"] > 140
    assert outcomes["broken"] > 0
    assert outcomes["length"] > 0


def test_demo_tool_request_gets_a_tool_call_with_json_arguments() -> None:
    request = _chat(CORPUS[0].question, tools=[WEATHER_TOOL_CHAT])
    script = demo_script(request, random.Random(4), CALM)
    assert script.pieces == ()
    assert script.tool_call is not None
    assert script.tool_call.name == "get_weather"
    assert set(orjson.loads(script.tool_call.arguments)) == {"city"}
    assert script.finish == "tool_calls"


def test_demo_tool_choice_none_answers_in_text() -> None:
    request = _chat(CORPUS[0].question, tools=[WEATHER_TOOL_CHAT], tool_choice="none")
    assert demo_script(request, random.Random(4), CALM).tool_call is None


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"stall_rate": 1.5}, "stall_rate must be between 0 and 1"),
        ({"gap_min_s": 0.05, "gap_max_s": 0.01}, "gap_min_s <= gap_max_s"),
        ({"ttft_median_s": 0.0}, "ttft_median_s must be positive"),
    ],
)
def test_demo_profile_refuses_impossible_settings(
    settings_: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DemoProfile(**settings_)  # type: ignore[arg-type]


def test_demo_script_is_reproducible_from_the_seed() -> None:
    request = _chat(CORPUS[3].question)
    assert demo_script(request, random.Random(9)) == demo_script(request, random.Random(9))


@pytest.mark.parametrize(
    ("body", "query"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document"}, {"type": "text", "text": "q"}],
                    }
                ]
            },
            "q",
        ),
        ({"input": "q"}, "q"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "q"}]}]}, "q"),
        ({"prompt": "q"}, "q"),
        ({"inputs": "q"}, "q"),
        ({"messages": "nonsense"}, ""),
    ],
)
def test_query_text_reads_every_simulated_request_shape(body: dict[str, Any], query: str) -> None:
    assert query_text(body) == query


def test_best_entry_matches_chinese_by_character_pairs() -> None:
    entry = best_entry("绿茶用什么水温泡")
    assert entry is not None
    assert entry.topic == "green_tea"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "messages",
        "input",
        "prompt",
        "tools",
        "response_format",
        "text",
        "format",
        "tool_choice",
        "parameters",
    ]
)


@settings(max_examples=150, deadline=None)
@given(body=st.dictionaries(_keys, _json, max_size=5), seed=st.integers(0, 2**16))
def test_demo_script_answers_any_request_body(body: dict[str, Any], seed: int) -> None:
    script = demo_script(_request(body), random.Random(seed))
    assert script.status in (200, 429)
    assert script.delta_count > 0 or script.status == 429
