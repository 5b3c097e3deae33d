"""``semhealth run --record`` then ``semhealth replay`` for Amazon Bedrock's binary streams.

AWS event-stream frames are bytes, not text: the recording must keep every byte (CRCs
included) so that the replay decodes the same frames, and a frame that was corrupt on the wire
is still the one counted corrupt. ``boto3``'s ``bedrock-runtime`` client is the caller, through
the sidecar as ``semhealth run`` starts it (forwarder and analysis processes); the replay runs
in its own process. Each replayed record must say what boto3 itself read: the usage, the
tool's verdict and the exception that ended a stream in the replay's results (which hold no
text), and the text and the tool's arguments in the records the same recording rebuilds.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from botocore.exceptions import EventStreamError

from semhealth.agent.demo.simulator import (
    RawScript,
    Script,
    ScriptRequest,
    SimulatedUpstream,
    ToolScript,
)
from semhealth.agent.replay.inputs import read_file
from semhealth.agent.replay.pipeline import build_records
from semhealth.collectors.eventstream import event_message, exception_message
from semhealth.collectors.record import StreamRecord
from tests.agent.conftest import agent_config
from tests.agent.replay.test_record_replay import replay_cli
from tests.agent.test_planes import _until, sidecar
from tests.agent.test_provider_sdks import _bedrock as _client

PIECES = ("The", " capital", " is", " Paris", ".")
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
TOOLS = {"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json": WEATHER_SCHEMA}}}]}
THROTTLED = (
    event_message("messageStart", b'{"role":"assistant"}'),
    event_message("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"Par"}}'),
    exception_message("throttlingException", b'{"message":"slow down"}'),
)
_GOOD = event_message("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"Hi"}}')
# One bit of the last byte flipped: the message CRC no longer matches.
CORRUPT = (
    event_message("messageStart", b'{"role":"assistant"}'),
    _GOOD[:-1] + bytes([_GOOD[-1] ^ 1]),
    _GOOD,
    event_message("messageStop", b'{"stopReason":"end_turn"}'),
)


def _script(request: ScriptRequest) -> Script | RawScript:
    if "throttled" in request.path:
        return RawScript(chunks=THROTTLED, content_type="application/vnd.amazon.eventstream")
    if "corrupt" in request.path:
        return RawScript(chunks=CORRUPT, content_type="application/vnd.amazon.eventstream")
    if "weather" in request.path:
        return Script(
            tool_call=ToolScript(name="get_weather", pieces=('{"city"', ': "Paris"}')),
            ttft_s=0.02,
            gaps_s=0.01,
            input_tokens=30,
            output_tokens=9,
        )
    return Script(pieces=PIECES, ttft_s=0.02, gaps_s=0.01, input_tokens=12, output_tokens=5)


def _converse(base_url: str, model: str, **request: Any) -> list[dict[str, Any]]:
    response = _client(base_url).converse_stream(
        modelId=model,
        messages=[{"role": "user", "content": [{"text": "What is the capital of France?"}]}],
        **request,
    )
    return list(response["stream"])


def _invoke(base_url: str) -> list[dict[str, Any]]:
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    }
    response = _client(base_url).invoke_model_with_response_stream(
        modelId="anthropic.claude-test-v1:0", body=json.dumps(body)
    )
    return [json.loads(event["chunk"]["bytes"]) for event in response["body"]]


def _traffic(proxy: str) -> dict[str, Any]:
    """What boto3 read of each kind of stream, through the sidecar."""
    seen: dict[str, Any] = {
        "text": _converse(proxy, "text-model"),
        "tool": _converse(proxy, "weather-model", toolConfig=TOOLS),
        "invoke": _invoke(proxy),
    }
    try:
        _converse(proxy, "throttled-model")
    except EventStreamError as error:
        seen["throttled"] = error.response["Error"]["Code"]
    seen["corrupt"] = _raw_corrupt(proxy)
    return seen


def _raw_corrupt(proxy: str) -> int:
    """A corrupt frame makes botocore raise; the client gets the bytes as they came."""
    import urllib.request

    request = urllib.request.Request(
        proxy + "/model/corrupt-model/converse-stream", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return len(response.read())


async def _record_then_replay(
    tmp_path: Path,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, StreamRecord]]:
    path = tmp_path / "bedrock.jsonl"
    upstream = SimulatedUpstream(_script)
    await upstream.start()
    upstream_url = upstream.url
    try:
        async with sidecar(upstream.url, "--record", str(path)) as running:
            seen = await asyncio.to_thread(_traffic, running.proxy)

            async def recorded() -> bool:
                metrics = await running.metrics()
                return metrics.get("semhealth_recorded_exchanges_total", 0) >= 5

            await _until(recorded)
    finally:
        await upstream.shutdown()
    _stdout, results = await replay_cli(path, tmp_path / "results.jsonl")
    built = build_records(read_file(str(path)), agent_config(upstream_url))
    assert built.problems == []
    records = [replayed.record for replayed in built.records]
    return seen, results, {record.model: record for record in records}


async def test_bedrock_binary_streams_replay_to_what_boto3_read(tmp_path: Path) -> None:
    seen, results, records = await _record_then_replay(tmp_path)
    replayed = {result["model"]: result for result in results}
    assert len(results) == 5 and set(replayed) == set(records)

    text = replayed["text-model"]
    (usage,) = [e["metadata"]["usage"] for e in seen["text"] if "metadata" in e]
    assert (text["provider"], text["error_type"]) == ("bedrock_converse", "")
    assert (text["input_tokens"], text["output_tokens"]) == (
        usage["inputTokens"],
        usage["outputTokens"],
    )
    assert text["ttft_s"] is not None
    assert records["text-model"].output_text == "".join(
        e["contentBlockDelta"]["delta"]["text"] for e in seen["text"] if "contentBlockDelta" in e
    )

    tool = replayed["weather-model"]
    assert tool["validity"] == [["valid", []]]  # (result, reasons) per output: no text
    assert [(v.target, v.result) for v in records["weather-model"].validity] == [
        ("tool:get_weather", "valid")
    ]
    boto_args = "".join(
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in seen["tool"]
        if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {})
    )
    assert [(c.name, c.arguments) for c in records["weather-model"].tool_calls] == [
        ("get_weather", boto_args)
    ]

    invoke = replayed["anthropic.claude-test-v1:0"]
    assert invoke["provider"] == "bedrock_invoke"
    assert records["anthropic.claude-test-v1:0"].output_text == "".join(
        e["delta"]["text"] for e in seen["invoke"] if e["type"] == "content_block_delta"
    )

    assert seen["throttled"] == "throttlingException"
    assert replayed["throttled-model"]["error_type"] == "throttlingException"
    assert records["throttled-model"].output_text == "Par"

    corrupt = records["corrupt-model"]
    assert seen["corrupt"] == sum(len(frame) for frame in CORRUPT)
    assert corrupt.response_bytes == seen["corrupt"]
    assert corrupt.decode_errors == ("bad_message_crc",)
    assert (corrupt.output_text, corrupt.finish_reason) == ("Hi", "stop")
