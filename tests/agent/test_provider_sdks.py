"""The providers' own SDKs through the sidecar: ``google-genai`` (Gemini), ``boto3``'s
``bedrock-runtime`` (ConverseStream and InvokeModelWithResponseStream in AWS event-stream
frames), ``cohere`` (v2 chat) and ``openai.AzureOpenAI``, against the scripted upstream
speaking each wire format. Each SDK sees exactly what it sees going direct (botocore's own
event-stream parser reading what the relay forwarded proves the frames arrive intact), and
each record is the one the script implies: a known provider, its usage, its tool calls with
one verdict each, and its time to first token.

Every SDK runs its synchronous client on a thread of its own, as a real client runs in a
process of its own: an SDK's per-event work (cohere builds a pydantic adapter for every event
it parses) must not hold the relay's event loop, or the relay would time the first token late
by that much and the test would measure the client instead of the sidecar."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import anthropic
import boto3
import cohere
import openai
import pytest
from botocore.config import Config as BotoConfig
from google import genai
from google.genai import types as genai_types
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.demo.simulator import RawScript, Script, ScriptRequest, ToolScript
from semhealth.collectors.eventstream import event_message, exception_message
from semhealth.collectors.record import StreamRecord
from tests.agent.conftest import running_stack

PIECES = ("The", " capital", " of", " France", " is", " Paris", ".")
QUESTION = "What is the capital of France?"
SYSTEM = "You answer geography questions."
GAP_S = 0.03
TTFT_S = 0.05
WEATHER_ARGS = ('{"city"', ': "Par', 'is"}')
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


def _answer(_request: ScriptRequest) -> Script:
    return Script(pieces=PIECES, ttft_s=TTFT_S, gaps_s=GAP_S, input_tokens=12, output_tokens=7)


def _weather(_request: ScriptRequest) -> Script:
    return Script(
        tool_call=ToolScript(name="get_weather", pieces=WEATHER_ARGS),
        ttft_s=TTFT_S,
        gaps_s=GAP_S,
        input_tokens=30,
        output_tokens=9,
    )


_PER_RESPONSE = frozenset({"id", "response_id", "sdk_http_response"})


def _scrub(value: Any, keys: frozenset[str] = _PER_RESPONSE) -> Any:
    """The SDK's objects minus what the server makes up per response (ids, the HTTP head
    with its Date)."""
    if isinstance(value, dict):
        return {k: _scrub(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_scrub(v, keys) for v in value]
    return value


def _assert_timed(record: StreamRecord) -> None:
    """TTFT from the script (the first delta at TTFT_S after the head), deltas streamed."""
    assert record.ttft_s is not None
    assert TTFT_S <= record.ttft_s < TTFT_S + 0.5
    assert record.streamed
    assert record.continuity is not None


# --------------------------------------------------------------------------- Gemini


def _gemini_chunks(base_url: str, **config: Any) -> list[dict[str, Any]]:
    client = genai.Client(
        api_key="test-key", http_options=genai_types.HttpOptions(base_url=base_url)
    )
    stream = client.models.generate_content_stream(
        model="gemini-test",
        contents=QUESTION,
        config=genai_types.GenerateContentConfig(system_instruction=SYSTEM, **config),
    )
    chunks = [_scrub(chunk.model_dump(mode="json")) for chunk in stream]
    client.close()
    return chunks


async def _gemini_stream(base_url: str, **config: Any) -> list[dict[str, Any]]:
    return await asyncio.to_thread(_gemini_chunks, base_url, **config)


async def test_gemini_sse_stream_through_the_sidecar_equals_direct() -> None:
    async with running_stack(_answer) as stack:
        direct = await _gemini_stream(stack.upstream.url)
        proxied = await _gemini_stream(stack.agent.proxy_url)
        (record,) = await stack.wait_records(1)
    assert proxied == direct
    assert "".join(c["candidates"][0]["content"]["parts"][0]["text"] for c in proxied) == "".join(
        PIECES
    )
    assert stack.upstream.received[-1].query == "alt=sse"
    assert record.provider == "gemini"
    assert record.route == "generate_content"
    assert record.output_text == "".join(PIECES)
    assert (record.usage.input_tokens, record.usage.output_tokens) == (12, 7)
    assert record.finish_reason == "stop" and record.done
    assert record.request.query == QUESTION
    assert record.request.context == (SYSTEM,)
    assert record.model == "gemini-test"
    _assert_timed(record)
    assert len(record.delta_ns) == len(PIECES)


def _reasoning_tokens(stack: Any, provider_name: str) -> float:
    """The reasoning histogram's sum on the sidecar's own ``/metrics`` rendering."""
    for family in text_string_to_metric_families(
        stack.agent.telemetry.render_prometheus().decode()
    ):
        if family.name == "gen_ai_client_inference_usage_reasoning_output_tokens":
            return sum(
                s.value
                for s in family.samples
                if s.name.endswith("_sum") and s.labels["gen_ai_provider_name"] == provider_name
            )
    raise AssertionError("no reasoning token family on /metrics")


async def test_gemini_thoughts_are_reasoning_tokens_inside_the_output_tokens() -> None:
    def thinking(_request: ScriptRequest) -> Script:
        return Script(pieces=PIECES, ttft_s=TTFT_S, input_tokens=12, output_tokens=27,
                      reasoning_tokens=20)  # fmt: skip

    async with running_stack(thinking) as stack:
        (chunk, *_) = reversed(await _gemini_stream(stack.agent.proxy_url))
        (record,) = await stack.wait_records(1)
        assert _reasoning_tokens(stack, "gcp.gemini") == 20
    usage = chunk["usage_metadata"]
    assert (usage["candidates_token_count"], usage["thoughts_token_count"]) == (7, 20)
    assert (record.usage.output_tokens, record.usage.reasoning_tokens) == (27, 20)


async def test_gemini_function_call_is_checked_against_its_declaration() -> None:
    tool = genai_types.Tool(
        function_declarations=[
            genai_types.FunctionDeclaration(
                name="get_weather", parameters_json_schema=WEATHER_SCHEMA
            )
        ]
    )
    async with running_stack(_weather) as stack:
        chunks = await _gemini_stream(stack.agent.proxy_url, tools=[tool])
        (record,) = await stack.wait_records(1)
    call = chunks[-1]["candidates"][0]["content"]["parts"][0]["function_call"]
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    assert [(c.name, json.loads(c.arguments)) for c in record.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert [(v.target, v.result) for v in record.validity] == [("tool:get_weather", "valid")]


async def test_gemini_json_array_stream_is_forwarded_whole_and_framed_per_element() -> None:
    path = "/v1beta/models/gemini-test:streamGenerateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": QUESTION}]}]}
    async with running_stack(_answer) as stack, aiohttp.ClientSession() as client:
        bodies = []
        for base in (stack.upstream.url, stack.agent.proxy_url):
            async with client.post(base + path, json=body) as response:
                assert response.headers["Content-Type"].startswith("application/json")
                bodies.append(await response.read())
        (record,) = await stack.wait_records(1)
    assert _scrub(json.loads(bodies[0]), frozenset({"responseId"})) == _scrub(
        json.loads(bodies[1]), frozenset({"responseId"})
    )
    assert bodies[1].startswith(b"[{") and b"\n,\r\n" in bodies[1] and bodies[1].endswith(b"]")
    assert len(json.loads(bodies[1])) == len(PIECES)
    assert record.provider == "gemini"
    assert record.output_text == "".join(PIECES)
    assert record.usage.output_tokens == 7
    assert record.decode_errors == () and record.malformed_frames == 0
    _assert_timed(record)
    assert len(record.delta_ns) == len(PIECES)  # each element when it arrived, not at the end


async def test_vertex_ai_paths_are_gemini_under_the_vertex_provider_name() -> None:
    path = (
        "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-test"
        ":streamGenerateContent?alt=sse"
    )
    body = {"contents": [{"role": "user", "parts": [{"text": QUESTION}]}]}
    async with running_stack(_answer) as stack, aiohttp.ClientSession() as client:
        async with client.post(stack.agent.proxy_url + path, json=body) as response:
            await response.read()
        (record,) = await stack.wait_records(1)
        metrics = stack.agent.telemetry.render_prometheus().decode()
    assert record.provider == "vertex_ai" and record.output_text == "".join(PIECES)
    assert 'gen_ai_provider_name="gcp.vertex_ai"' in metrics


async def test_a_gemini_error_body_is_counted_with_its_kind() -> None:
    def exhausted(_request: ScriptRequest) -> Script:
        return Script(status=429)

    async with running_stack(exhausted) as stack:
        with pytest.raises(genai.errors.ClientError) as caught:
            await _gemini_stream(stack.agent.proxy_url)
        (record,) = await stack.wait_records(1)
    assert caught.value.code == 429 and caught.value.status == "RESOURCE_EXHAUSTED"
    assert record.provider == "gemini" and record.status == 429
    assert record.error_type == "429"


# --------------------------------------------------------------------------- Bedrock


def _bedrock(base_url: str) -> Any:
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=base_url,
        region_name="us-east-1",
        aws_access_key_id="AKIDTEST",
        aws_secret_access_key="secret",
        config=BotoConfig(retries={"max_attempts": 1, "mode": "standard"}),
    )


def _converse_events(base_url: str, **request: Any) -> list[dict[str, Any]]:
    response = _bedrock(base_url).converse_stream(
        modelId="anthropic.claude-test-v1:0",
        system=[{"text": SYSTEM}],
        messages=[{"role": "user", "content": [{"text": QUESTION}]}],
        **request,
    )
    return list(response["stream"])


async def _both(call: Callable[[str], Any], stack: Any) -> tuple[Any, Any]:
    direct = await asyncio.to_thread(call, stack.upstream.url)
    proxied = await asyncio.to_thread(call, stack.agent.proxy_url)
    return direct, proxied


async def test_bedrock_converse_stream_through_the_sidecar_equals_direct() -> None:
    async with running_stack(_answer) as stack:
        direct, proxied = await _both(_converse_events, stack)
        (record,) = await stack.wait_records(1)
    assert proxied == direct
    text = "".join(
        e["contentBlockDelta"]["delta"]["text"] for e in proxied if "contentBlockDelta" in e
    )
    assert text == "".join(PIECES)
    assert record.provider == "bedrock_converse" and record.route == "converse"
    assert record.model == "anthropic.claude-test-v1:0"  # from the path, percent-decoded
    assert record.output_text == "".join(PIECES)
    assert (record.usage.input_tokens, record.usage.output_tokens) == (12, 7)
    assert record.finish_reason == "stop" and record.done
    assert record.request.query == QUESTION and record.request.context == (SYSTEM,)
    assert record.decode_errors == ()
    _assert_timed(record)
    assert len(record.delta_ns) == len(PIECES)


async def test_bedrock_tool_use_input_is_checked_against_its_input_schema() -> None:
    tools = {
        "tools": [
            {
                "toolSpec": {
                    "name": "get_weather",
                    "inputSchema": {"json": WEATHER_SCHEMA},
                }
            }
        ]
    }

    def call(base_url: str) -> list[dict[str, Any]]:
        return _converse_events(base_url, toolConfig=tools)

    async with running_stack(_weather) as stack:
        proxied = await asyncio.to_thread(call, stack.agent.proxy_url)
        (record,) = await stack.wait_records(1)
    assert proxied[-2]["messageStop"]["stopReason"] == "tool_use"
    assert [(c.name, c.arguments) for c in record.tool_calls] == [
        ("get_weather", "".join(WEATHER_ARGS))
    ]
    assert [(v.target, v.result) for v in record.validity] == [("tool:get_weather", "valid")]
    assert record.finish_reason == "tool_calls"


async def test_bedrock_invoke_stream_of_a_claude_model_reads_its_anthropic_events() -> None:
    body = json.dumps(
        {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": 100,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": QUESTION}],
        }
    )

    def call(base_url: str) -> list[dict[str, Any]]:
        response = _bedrock(base_url).invoke_model_with_response_stream(
            modelId="anthropic.claude-test-v1:0", body=body
        )
        return [json.loads(e["chunk"]["bytes"]) for e in response["body"]]

    async with running_stack(_answer) as stack:
        direct, proxied = await _both(call, stack)
        (record,) = await stack.wait_records(1)
    assert _scrub(proxied) == _scrub(direct)
    assert proxied[0]["type"] == "message_start"
    assert record.provider == "bedrock_invoke" and record.route == "invoke_model"
    assert record.output_text == "".join(PIECES)
    assert (record.usage.input_tokens, record.usage.output_tokens) == (12, 7)
    assert record.request.query == QUESTION
    _assert_timed(record)


async def test_a_bedrock_exception_event_ends_the_record_with_its_kind() -> None:
    frames = (
        event_message("messageStart", b'{"role":"assistant"}'),
        event_message("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"Par"}}'),
        exception_message("throttlingException", b'{"message":"slow down"}'),
    )

    def throttled(_request: ScriptRequest) -> RawScript:
        return RawScript(chunks=frames, content_type="application/vnd.amazon.eventstream")

    async with running_stack(throttled) as stack:
        with pytest.raises(Exception) as caught:
            await asyncio.to_thread(_converse_events, stack.agent.proxy_url)
        (record,) = await stack.wait_records(1)
    assert "throttlingException" in str(caught.value)  # botocore read the frame we forwarded
    assert record.provider == "bedrock_converse"
    assert record.error_type == "throttlingException"
    assert record.output_text == "Par"


async def test_a_corrupted_bedrock_frame_is_counted_and_forwarded_unchanged() -> None:
    good = event_message("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"Hi"}}')
    bad = bytearray(good)
    bad[-6] ^= 0xFF  # inside the payload: the message CRC no longer matches
    frames = (good, bytes(bad), event_message("messageStop", b'{"stopReason":"end_turn"}'))

    def corrupted(_request: ScriptRequest) -> RawScript:
        return RawScript(chunks=frames, content_type="application/vnd.amazon.eventstream")

    path = "/model/m/converse-stream"
    async with running_stack(corrupted) as stack, aiohttp.ClientSession() as client:
        async with client.post(stack.agent.proxy_url + path, json={}) as response:
            received = await response.read()
        (record,) = await stack.wait_records(1)
    assert received == b"".join(frames)
    assert record.decode_errors == ("bad_message_crc",)
    assert record.output_text == "Hi" and record.finish_reason == "stop"


# --------------------------------------------------------------------------- Cohere


def _cohere_events(base_url: str, **request: Any) -> list[dict[str, Any]]:
    client = cohere.ClientV2(api_key="test-key", base_url=base_url)
    events = [
        _scrub(event.dict())
        for event in client.chat_stream(
            model="command-test",
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": QUESTION},
            ],
            **request,
        )
    ]
    return events


async def _cohere_stream(base_url: str, **request: Any) -> list[dict[str, Any]]:
    return await asyncio.to_thread(_cohere_events, base_url, **request)


async def test_cohere_chat_stream_through_the_sidecar_equals_direct() -> None:
    async with running_stack(_answer) as stack:
        direct = await _cohere_stream(stack.upstream.url)
        proxied = await _cohere_stream(stack.agent.proxy_url)
        (record,) = await stack.wait_records(1)
    assert proxied == direct
    assert [e["type"] for e in proxied][-1] == "message-end"
    assert record.provider == "cohere_chat" and record.route == "chat"
    assert record.output_text == "".join(PIECES)
    assert (record.usage.input_tokens, record.usage.output_tokens) == (12, 7)
    assert record.finish_reason == "stop" and record.done
    assert record.request.query == QUESTION and record.request.context == (SYSTEM,)
    _assert_timed(record)
    assert len(record.delta_ns) == len(PIECES)


async def test_cohere_tool_call_arguments_are_checked_against_the_tool() -> None:
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA},
    }
    async with running_stack(_weather) as stack:
        await _cohere_stream(stack.agent.proxy_url, tools=[tool])
        (record,) = await stack.wait_records(1)
    assert [(c.name, c.arguments) for c in record.tool_calls] == [
        ("get_weather", "".join(WEATHER_ARGS))
    ]
    assert [(v.target, v.result) for v in record.validity] == [("tool:get_weather", "valid")]
    assert record.finish_reason == "tool_calls"


# --------------------------------------------------------------------------- Azure OpenAI


def _azure_chunks(base_url: str) -> list[dict[str, Any]]:
    client = openai.AzureOpenAI(
        azure_endpoint=base_url, api_key="test-key", api_version="2024-10-21", max_retries=0
    )
    stream = client.chat.completions.create(
        model="my-deployment",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [_scrub(chunk.model_dump(), frozenset({"id", "created"})) for chunk in stream]
    client.close()
    return chunks


async def _azure_stream(base_url: str) -> list[dict[str, Any]]:
    return await asyncio.to_thread(_azure_chunks, base_url)


async def test_azure_openai_deployment_paths_are_understood() -> None:
    async with running_stack(_answer) as stack:
        direct = await _azure_stream(stack.upstream.url)
        proxied = await _azure_stream(stack.agent.proxy_url)
        (record,) = await stack.wait_records(1)
    assert proxied == direct
    assert stack.upstream.received[-1].path == "/openai/deployments/my-deployment/chat/completions"
    assert record.provider == "azure_openai_chat" and record.route == "chat_completions"
    assert record.output_text == "".join(PIECES)
    assert (record.usage.input_tokens, record.usage.output_tokens) == (12, 7)
    _assert_timed(record)


async def test_openai_reasoning_tokens_reach_metrics_through_the_azure_sdk() -> None:
    def thinking(_request: ScriptRequest) -> Script:
        return Script(pieces=PIECES, ttft_s=TTFT_S, input_tokens=12, output_tokens=27,
                      reasoning_tokens=20)  # fmt: skip

    async with running_stack(thinking) as stack:
        chunks = await _azure_stream(stack.agent.proxy_url)
        (record,) = await stack.wait_records(1)
        assert _reasoning_tokens(stack, "azure.ai.openai") == 20
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 20
    assert (record.usage.output_tokens, record.usage.reasoning_tokens) == (27, 20)


# --------------------------------------------------------------------------- provider-run tools


def _anthropic_sse(*events: dict[str, Any]) -> tuple[bytes, ...]:
    return tuple(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


_SEARCHED = _anthropic_sse(
    {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
     "model": "claude-test", "content": [], "stop_reason": None, "stop_sequence": None,
     "usage": {"input_tokens": 12, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "server_tool_use",
     "id": "srvtoolu_1", "name": "web_search", "input": {}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta",
     "partial_json": '{"query": "capital of France"}'}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {
     "type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}},
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Paris."}},
    {"type": "content_block_stop", "index": 2},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
     "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
)  # fmt: skip


def _claude_searching(base_url: str) -> list[dict[str, Any]]:
    client = anthropic.Anthropic(api_key="test-key", base_url=base_url, max_retries=0)
    with client.messages.stream(
        model="claude-test",
        max_tokens=64,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
    ) as stream:
        return [event.model_dump() for event in stream]


async def test_a_tool_the_provider_ran_is_counted_by_kind_and_never_judged() -> None:
    def searched(_request: ScriptRequest) -> RawScript:
        return RawScript(chunks=_SEARCHED, ttft_s=TTFT_S, gaps_s=0.01,
                         content_type="text/event-stream")  # fmt: skip

    async with running_stack(searched) as stack:
        direct, proxied = await _both(_claude_searching, stack)
        (record,) = await stack.wait_records(1)
        metrics = stack.agent.telemetry.render_prometheus().decode()
    assert proxied == direct
    assert record.provider == "anthropic_messages" and record.output_text == "Paris."
    assert record.provider_tools == ("web_search",)
    assert record.tool_calls == () and record.validity == ()
    (calls,) = [
        s
        for family in text_string_to_metric_families(metrics)
        if family.name == "semantic_health_provider_tool_calls"
        for s in family.samples
        if s.name.endswith("_total")
    ]
    assert (calls.labels["tool_kind"], calls.labels["provider"], calls.value) == (
        "web_search",
        "anthropic_messages",
        1.0,
    )
