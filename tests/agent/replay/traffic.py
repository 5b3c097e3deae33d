"""Test traffic for record/replay: a scripted upstream that answers by the question asked,
and the real ``openai`` SDK sending a streamed chat, a JSON-mode call, a tool call and a
stream the client abandons halfway."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

import openai

from semhealth.agent.demo.simulator import Script, ScriptRequest, ToolScript
from semhealth.collectors import StreamRecord

CONTEXT = (
    "Paris is the capital and largest city of France, on the Seine. "
    "The Eiffel Tower was finished in 1889 for the World's Fair."
)
ANSWER = ("Paris", " is", " the", " capital", " of", " France", ".")
JSON_PIECES = ('{"city": ', '"Paris", ', '"country": ', '"France"}')
TOOL_ARGS = ('{"city"', ': "Par', 'is"}')


def script_for(request: ScriptRequest) -> Script:
    """By the last user message: what each kind of call gets, with set timings."""
    body = request.json or {}
    question = str(body.get("messages", [{}])[-1].get("content", ""))
    if "weather" in question:
        return Script(
            tool_call=ToolScript(name="get_weather", pieces=TOOL_ARGS),
            ttft_s=0.02,
            gaps_s=0.01,
        )
    if "JSON" in question:
        return Script(pieces=JSON_PIECES, ttft_s=0.02, gaps_s=0.01, input_tokens=30)
    if "slowly" in question:
        return Script(pieces=tuple(f" w{i}" for i in range(40)), ttft_s=0.01, gaps_s=0.05)
    return Script(pieces=ANSWER, ttft_s=0.03, gaps_s=(0.01, 0.02, 0.01, 0.03, 0.01, 0.02))


def _client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="test-key", max_retries=0)


def _messages(question: str) -> list[Any]:
    return [
        {"role": "system", "content": CONTEXT},
        {"role": "user", "content": question},
    ]


async def send_traffic(base_url: str) -> None:
    """Four calls, one after the other: streamed, JSON mode, a tool call, an abandoned stream."""
    client = _client(base_url)
    try:
        stream = await client.chat.completions.create(
            model="gpt-test",
            messages=_messages("What is the capital of France?"),
            stream=True,
            stream_options={"include_usage": True},
        )
        async for _chunk in stream:
            pass
        await client.chat.completions.create(
            model="gpt-test",
            messages=_messages("Answer in JSON: where is the Eiffel Tower?"),
            response_format={"type": "json_object"},
        )
        tools = await client.chat.completions.create(
            model="gpt-test",
            messages=_messages("What is the weather in Paris?"),
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "parameters": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                            "required": ["city"],
                        },
                    },
                }
            ],
            stream=True,
        )
        async for _chunk in tools:
            pass
        await _abandon(client)
    finally:
        await client.close()


async def _abandon(client: openai.AsyncOpenAI) -> None:
    """Read a few chunks of a long stream, then hang up."""
    stream = await client.chat.completions.create(
        model="gpt-test", messages=_messages("Tell me about Paris slowly."), stream=True
    )
    seen = 0
    async for _chunk in stream:
        seen += 1
        if seen == 5:
            break
    await stream.close()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0.1)


_CLOCK_FIELDS = ("start_ns", "end_ns", "response_ns", "first_byte_ns", "first_delta_ns")


def comparable(record: StreamRecord) -> dict[str, Any]:
    """Every field of ``record``, with times as offsets from its start (the live clock is
    monotonic, the replayed one the recording's wall clock)."""
    fields = dataclasses.asdict(record)
    start = record.start_ns
    for name in _CLOCK_FIELDS:
        if fields[name] is not None:
            fields[name] -= start
    fields["delta_ns"] = tuple(t - start for t in record.delta_ns)
    return fields


def key(record: StreamRecord) -> tuple[str, str]:
    """Which call a record is: its query and its output (distinct across the traffic)."""
    return (record.request.query or "", record.output_text)
