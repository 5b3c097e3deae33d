"""The real openai and anthropic SDKs see the same answers through the sidecar as directly,
and the records measure the timings the scripted upstream used."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import anthropic
import openai
import pytest

from semhealth.agent.demo.simulator import Script, ScriptRequest, ToolScript
from semhealth.collectors.continuity import measure_continuity
from tests.agent.conftest import running_stack

PIECES = ("The", " capital", " of", " France", " is", " Paris", ".")


def _same_script(_request: ScriptRequest) -> Script:
    return Script(pieces=PIECES, ttft_s=0.0, gaps_s=0.0, input_tokens=12, output_tokens=7)


def _scrub(chunk: Any) -> dict[str, Any]:
    """SDK objects minus the fields a server generates per response (ids, timestamps)."""
    data: dict[str, Any] = chunk.model_dump()
    for key in ("id", "created", "created_at", "system_fingerprint"):
        data.pop(key, None)
    if isinstance(data.get("message"), dict):
        data["message"].pop("id", None)
    return data


async def _openai_stream(base_url: str) -> list[dict[str, Any]]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="test-key", max_retries=0)
    stream = await client.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [_scrub(chunk) async for chunk in stream]
    await client.close()
    return chunks


async def test_openai_stream_through_sidecar_equals_direct() -> None:
    async with running_stack(_same_script) as stack:
        direct = await _openai_stream(stack.upstream.url)
        proxied = await _openai_stream(stack.agent.proxy_url)
        assert proxied == direct
        text = "".join(c["choices"][0]["delta"]["content"] or "" for c in proxied if c["choices"])
        assert text == "".join(PIECES)
        assert proxied[-1]["usage"]["completion_tokens"] == 7
        records = await stack.wait_records(1)
        assert records[0].output_text == "".join(PIECES)
        assert records[0].usage.output_tokens == 7
        assert records[0].usage.input_tokens == 12
        assert records[0].finish_reason == "stop"


async def test_openai_plain_call_through_sidecar_equals_direct() -> None:
    async def call(base_url: str) -> dict[str, Any]:
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="k", max_retries=0)
        completion = await client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "capital of France?"}]
        )
        await client.close()
        return _scrub(completion)

    async with running_stack(_same_script) as stack:
        direct = await call(stack.upstream.url)
        proxied = await call(stack.agent.proxy_url)
        assert proxied == direct
        assert proxied["usage"]["prompt_tokens"] == 12
        (record,) = await stack.wait_records(1)
        assert not record.streamed
        assert record.output_text == "".join(PIECES)
        assert record.request.query == "capital of France?"


async def test_openai_tool_call_arguments_are_recorded() -> None:
    args = ('{"city"', ': "Par', 'is"}')

    def script(_request: ScriptRequest) -> Script:
        return Script(
            pieces=(),
            tool_call=ToolScript(name="get_weather", pieces=args),
            finish_reason="tool_calls",
        )

    async with running_stack(script) as stack:
        client = openai.AsyncOpenAI(
            base_url=stack.agent.proxy_url + "/v1", api_key="k", max_retries=0
        )
        stream = await client.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "parameters": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                        },
                    },
                }
            ],
            stream=True,
        )
        received = "".join(
            [
                c.choices[0].delta.tool_calls[0].function.arguments or ""
                async for c in stream
                if c.choices and c.choices[0].delta.tool_calls
            ]
        )
        await client.close()
        assert received == "".join(args)
        (record,) = await stack.wait_records(1)
        assert record.tool_calls[0].name == "get_weather"
        assert record.tool_calls[0].arguments == "".join(args)
        assert record.finish_reason == "tool_calls"
        assert record.request.structure[0].kind == "tool_input"


async def _anthropic_stream(base_url: str) -> tuple[list[dict[str, Any]], Any]:
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="test-key", max_retries=0)
    events = []
    async with client.messages.stream(
        model="claude-test",
        max_tokens=100,
        system="You answer geography questions.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    ) as stream:
        async for event in stream:
            events.append(_scrub(event))
        final = await stream.get_final_message()
    await client.close()
    return events, final


async def test_anthropic_stream_through_sidecar_equals_direct() -> None:
    async with running_stack(_same_script) as stack:
        direct_events, direct_final = await _anthropic_stream(stack.upstream.url)
        proxied_events, proxied_final = await _anthropic_stream(stack.agent.proxy_url)
        assert proxied_events == direct_events
        assert proxied_final.content[0].text == "".join(PIECES)
        assert proxied_final.usage.output_tokens == direct_final.usage.output_tokens == 7
        records = await stack.wait_records(1)
        record = records[0]
        assert record.provider == "anthropic_messages"
        assert record.output_text == "".join(PIECES)
        assert record.usage.input_tokens == 12
        assert record.usage.output_tokens == 7
        assert record.request.context == ("You answer geography questions.",)
        assert record.done


async def test_anthropic_plain_call_through_sidecar() -> None:
    async with running_stack(_same_script) as stack:
        client = anthropic.AsyncAnthropic(
            base_url=stack.agent.proxy_url, api_key="k", max_retries=0
        )
        message = await client.messages.create(
            model="claude-test", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )
        await client.close()
        assert message.content[0].text == "".join(PIECES)
        (record,) = await stack.wait_records(1)
        assert record.output_text == "".join(PIECES)
        assert record.usage.output_tokens == 7


async def test_rate_limit_reaches_the_sdk_as_rate_limit_error() -> None:
    def limited(_request: ScriptRequest) -> Script:
        return Script(
            pieces=(),
            status=429,
            error="rate_limit_exceeded",
            headers={"X-RateLimit-Source": "gateway"},
        )

    async with running_stack(limited) as stack:
        client = openai.AsyncOpenAI(
            base_url=stack.agent.proxy_url + "/v1", api_key="k", max_retries=0
        )
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        await client.close()
        assert caught.value.response.headers["x-ratelimit-source"] == "gateway"
        (record,) = await stack.wait_records(1)
        assert (record.status, record.ratelimit_source) == (429, "gateway")


# The scripted upstream schedules each piece at a fixed offset from when it received the
# request, and the record's clock starts earlier, when the proxy received it: so no arrival can
# come before its scheduled offset (a strict bound, less 1 ms of timer granularity), while a
# loaded 2-core machine may make any of them late (a loose bound). The measures between
# arrivals get the same loose bound; the script's gaps (60 ms, one 400 ms stall over a 200 ms
# threshold) are far enough apart for it.
EARLY_S = 0.001
LATE_S = 0.1


@pytest.mark.parametrize("provider_path", ["openai", "anthropic"])
async def test_record_timings_match_the_scripted_upstream(provider_path: str) -> None:
    gaps = (0.06, 0.06, 0.06, 0.4, 0.06, 0.06)
    ttft = 0.15
    pieces = tuple(f"w{i} " for i in range(len(gaps) + 1))

    def script(_request: ScriptRequest) -> Script:
        return Script(pieces=pieces, ttft_s=ttft, gaps_s=gaps)

    async with running_stack(script, **{"analysis.stall_threshold_s": 0.2}) as stack:
        if provider_path == "openai":
            await _openai_stream(stack.agent.proxy_url)
        else:
            await _anthropic_stream(stack.agent.proxy_url)
        (record,) = await stack.wait_records(1)
    scheduled = list(itertools.accumulate(gaps, initial=ttft))
    arrived = [(t - record.start_ns) / 1e9 for t in record.delta_ns]
    assert len(arrived) == len(scheduled)
    for got, want in zip(arrived, scheduled, strict=True):
        assert want - EARLY_S <= got <= want + LATE_S
    continuity = measure_continuity(record, stall_threshold_s=0.2)
    assert continuity.ttft_s is not None
    assert ttft - EARLY_S <= continuity.ttft_s <= ttft + LATE_S
    assert continuity.index_s == pytest.approx(statistics.pstdev(gaps), abs=LATE_S / 2)
    assert continuity.max_gap_s == pytest.approx(0.4, abs=LATE_S)
    assert continuity.stalls == 1
