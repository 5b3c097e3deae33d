"""Every wire format the tap understands, end to end through the real proxy."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest

from semhealth.agent.demo.simulator import Script, ScriptRequest
from tests.agent.conftest import running_stack
from tests.agent.otlp_receiver import GrpcReceiver

PIECES = ("Paris", " is", " the", " capital", ".")

CASES: list[tuple[str, dict[str, Any], str, bool]] = [
    # path, request body, provider, streamed
    ("/v1/responses", {"model": "m", "input": "capital of France?", "stream": True},
     "openai_responses", True),
    ("/v1/responses", {"model": "m", "input": "capital of France?"}, "openai_responses", False),
    ("/v1/chat/completions", {"model": "m", "stream": True, "stream_options": {"include_usage": True},
     "messages": [{"role": "user", "content": "capital of France?"}]}, "openai_chat", True),
    ("/v1/messages", {"model": "m", "max_tokens": 9, "stream": True,
     "messages": [{"role": "user", "content": "capital of France?"}]}, "anthropic_messages", True),
    ("/api/chat", {"model": "llama3", "messages": [{"role": "user", "content": "capital of France?"}]},
     "ollama", True),
    ("/api/generate", {"model": "llama3", "prompt": "capital of France?", "stream": False},
     "ollama", False),
    ("/generate_stream", {"inputs": "capital of France?", "parameters": {}}, "tgi", True),
    ("/generate", {"inputs": "capital of France?", "parameters": {"details": True}}, "tgi", False),
]  # fmt: skip


def _script(_request: ScriptRequest) -> Script:
    return Script(pieces=PIECES, gaps_s=0.005, input_tokens=9, output_tokens=5)


@pytest.mark.parametrize(("path", "body", "provider", "streamed"), CASES)
async def test_format_is_relayed_and_recorded(
    path: str, body: dict[str, Any], provider: str, streamed: bool
) -> None:
    async with running_stack(_script) as stack:
        async with aiohttp.ClientSession() as client:
            async with client.post(stack.agent.proxy_url + path, json=body) as r:
                assert r.status == 200
                via_proxy = await r.read()
            async with client.post(stack.upstream.url + path, json=body) as r:
                direct = await r.read()
        (record,) = await stack.wait_records(1)
    assert len(via_proxy) == len(direct)  # ids and timestamps differ; framing and size do not
    assert record.provider == provider
    assert record.streamed is streamed
    assert record.output_text == "".join(PIECES)
    assert record.request.query == "capital of France?"
    assert record.done
    assert record.malformed_frames == 0
    assert record.decode_errors == ()
    if streamed:
        assert len(record.delta_ns) == len(PIECES)
    if provider != "tgi":  # TGI streams report no prompt token count
        assert record.usage.input_tokens == 9
    assert record.usage.output_tokens == 5


CANARY = "zebra-canary-7f3c1d"


async def test_prompt_and_answer_text_never_reach_logs_metrics_or_exports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def leaky(_request: ScriptRequest) -> Script:
        return Script(pieces=(CANARY, " answer"), status=200)

    caplog.set_level(logging.DEBUG)
    receiver = GrpcReceiver()
    await receiver.start()
    otlp = {"telemetry.otlp.endpoint": receiver.endpoint, "telemetry.otlp.interval_s": 60}
    async with running_stack(leaky, **otlp) as stack:
        async with aiohttp.ClientSession() as client:
            for path, body in [
                ("/v1/chat/completions", {"model": "m", "stream": True, "messages": [
                    {"role": "system", "content": f"context {CANARY}"},
                    {"role": "user", "content": f"query {CANARY}"}]}),
                ("/v1/messages", {"model": "m", "max_tokens": 5, "stream": True,
                                  "messages": [{"role": "user", "content": CANARY}]}),
                ("/v1/chat/completions", {"model": "m", "messages": f"{CANARY} not a list"}),
                ("/v1/unknown", {"q": CANARY}),
            ]:  # fmt: skip
                async with client.post(stack.agent.proxy_url + path, json=body) as r:
                    await r.read()
            records = await stack.wait_records(4)
            async with client.get(stack.agent.admin_url + "/metrics") as r:
                metrics = await r.text()
        await asyncio.to_thread(stack.agent.telemetry.provider.force_flush)
    await receiver.shutdown()
    exported = b"".join(request.SerializeToString() for request in receiver.requests)
    assert any(CANARY in record.output_text for record in records)  # the canary did flow
    assert exported  # and the exporter did push
    assert CANARY not in caplog.text
    assert CANARY not in metrics
    assert CANARY.encode() not in exported
