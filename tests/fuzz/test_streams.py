"""Whole responses through ``StreamCollector``: every provider adapter behind its framing.

The streams are the scripted upstream's renderings of each provider's wire format (the
same bytes the SDK tests parse), re-cut with every line ending the framing allows, maybe
compressed, then fed in any chunking. Clean streams must give exactly the text and tool
calls that were scripted; damaged ones (bytes flipped, inserted, cut out, the stream cut
short) must never raise, and every stream gives the same record whatever its chunking.
"""

from __future__ import annotations

import gzip
import itertools
import re
import zlib
from dataclasses import dataclass, replace

import orjson
from hypothesis import given
from hypothesis import strategies as st

from semhealth.agent.demo.simulator._plan import make_plan
from semhealth.agent.demo.simulator._script import Script, ScriptRequest, ToolScript
from semhealth.agent.demo.simulator._wires import WIRES, Wire
from semhealth.collectors.collector import StreamCollector
from semhealth.collectors.config import Config, Limits, default_config
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import StreamRecord
from tests.fuzz.budget import examples

_CREATED_AT = re.compile(rb'"created_at":"[^"]*"')
T = 1_000_000  # every chunk arrives at the same time, so records compare whole
# Wires without streamed tool arguments send them as text (see the simulator's docstring).
ARGS_AS_TEXT = frozenset({"/api/generate", "/generate_stream", "/generate"})
SSE_ENDINGS = (b"\n", b"\r\n", b"\r")
NDJSON_ENDINGS = (b"\n", b"\r\n")


@dataclass(frozen=True)
class Response:
    """One scripted response as the upstream sends it, and what it says."""

    path: str
    content_type: str
    encoding: str | None
    body: bytes  # on the wire (compressed when ``encoding`` is set)
    request: bytes
    text: str
    tool: tuple[str, str] | None  # name, arguments


def pinned(body: bytes) -> bytes:
    """Ollama's lines carry the wall clock; pinned so a drawn example replays exactly."""
    return _CREATED_AT.sub(b'"created_at":"2025-01-01T00:00:00Z"', body)


texts = st.text(st.characters(codec="utf-8"), max_size=8)


@st.composite
def responses(draw: st.DrawFn) -> Response:
    wire: Wire = draw(st.sampled_from(WIRES))
    pieces = tuple(draw(st.lists(texts, max_size=6)))
    tool = None
    if draw(st.booleans()):
        arguments = orjson.dumps(draw(st.dictionaries(texts, texts, max_size=3))).decode()
        cuts = sorted(draw(st.lists(st.integers(0, len(arguments)), max_size=3)))
        bounds = [0, *cuts, len(arguments)]
        tool = ToolScript(
            name=draw(st.sampled_from(["lookup", "f", "get_weather"])),
            pieces=tuple(arguments[a:b] for a, b in itertools.pairwise(bounds)),
        )
    path = "/v1" + wire.suffix
    json = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    request = ScriptRequest(
        path=path, method="POST", headers={}, json=json, body=orjson.dumps(json)
    )
    # The plan's creation time is the clock's: pinned, so a drawn example replays exactly.
    plan = replace(make_plan(Script(pieces=pieces, tool_call=tool), request, "fz"), created=0)
    if wire.wants_stream(request):
        body = pinned(b"".join(step.data for step in wire.stream(plan)))
        content_type = wire.stream_content_type(request)
        if "eventstream" not in content_type:  # binary frames: their lengths and CRCs count
            ending = draw(
                st.sampled_from(NDJSON_ENDINGS if "ndjson" in content_type else SSE_ENDINGS)
            )
            body = body.replace(b"\n", ending)  # JSON inside never holds a raw newline
    else:
        body = pinned(orjson.dumps(wire.body(plan)))
        content_type = "application/json"
    encoding = draw(st.sampled_from([None, "gzip", "deflate"]))
    if encoding == "gzip":
        body = gzip.compress(body, mtime=0)
    elif encoding == "deflate":
        body = zlib.compress(body)
    arguments = "".join(tool.pieces) if tool else ""
    text = "".join(pieces)
    if wire.suffix in ARGS_AS_TEXT:
        text, expected_tool = text + arguments, None
    else:
        expected_tool = (tool.name, arguments) if tool else None
    return Response(path, content_type, encoding, body, request.body, text, expected_tool)


def exchange(response: Response) -> Exchange:
    return Exchange(
        method="POST",
        path=response.path,
        start_ns=0,
        status=200,
        content_type=response.content_type,
        content_encoding=response.encoding,
        response_ns=T,
        request_body=response.request,
    )


def collect(response: Response, body: bytes, points: list[int], config: Config) -> StreamRecord:
    collector = StreamCollector(exchange(response), config)
    bounds = [0, *sorted(points), len(body)]
    for a, b in itertools.pairwise(bounds):
        collector.feed(body[a:b], T)
    return collector.finish(T + 1)


def splits(size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, size), max_size=30) | st.just(list(range(1, size)))


@examples(ci=150)
@given(response=responses(), data=st.data())
def test_clean_stream_gives_the_scripted_text_and_tools_in_any_chunking(
    response: Response, data: st.DataObject
) -> None:
    config = default_config()
    points = data.draw(splits(len(response.body)))
    record = collect(response, response.body, points, config)
    assert repr(record) == repr(collect(response, response.body, [], config))
    assert record.output_text == response.text
    calls = [(c.name, c.arguments) for c in record.tool_calls]
    assert calls == ([response.tool] if response.tool else [])
    assert (record.malformed_frames, record.decode_errors) == (0, ())
    assert record.done and not record.truncated
    assert record.response_bytes == len(response.body)


@st.composite
def damaged(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` with up to four flips, insertions, cuts, or an early end."""
    out = bytearray(body)
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(out)))
        match draw(st.sampled_from(["flip", "insert", "cut", "end"])):
            case "flip" if at < len(out):
                out[at] ^= draw(st.integers(1, 255))
            case "insert":
                noise = st.sampled_from([b"\n", b"\r", b"\n\n", b"data: ", b"{", b"\xff"])
                out[at:at] = draw(noise | st.binary(max_size=4))
            case "cut":
                del out[at : at + draw(st.integers(1, 20))]
            case "end":
                del out[at:]
    return bytes(out)


def stopped(record: StreamRecord) -> bool:
    return record.truncated or "bad_encoding" in record.decode_errors


small_limits = st.builds(
    Limits,
    max_response_bytes=st.integers(1, 4000) | st.just(8 << 20),
    max_frame_bytes=st.integers(1, 300) | st.just(1 << 20),
)


@examples(ci=200)
@given(response=responses(), limits=small_limits, data=st.data())
def test_damaged_stream_never_raises_and_gives_one_record_in_any_chunking(
    response: Response, limits: Limits, data: st.DataObject
) -> None:
    body = data.draw(damaged(response.body))
    # Any path, so every adapter (and the sniffer, for unknown paths) meets every framing.
    path = data.draw(
        st.sampled_from([response.path, "/unknown", *("/v1" + w.suffix for w in WIRES)])
    )
    response = Response(path, response.content_type, response.encoding, body, response.request,
                        response.text, response.tool)  # fmt: skip
    config = Config(routes=default_config().routes, limits=limits)
    points = data.draw(splits(len(body)))
    record = collect(response, body, points, config)
    whole = collect(response, body, [], config)
    if response.encoding is not None and stopped(record) and stopped(whole):
        # Known difference: a damaged compressed body past max_response_bytes is cut at the
        # limit wherever zlib's output crosses it, but zlib finds the damage (often only the
        # checksum at the end) only in the input it reads, and it reads a whole chunk at
        # once. So one chunking records ``truncated``, another ``bad_encoding``.
        assert (
            record.output_text[: len(whole.output_text)]
            == whole.output_text[: len(record.output_text)]
        )
    else:
        assert repr(record) == repr(whole)
    assert record.response_bytes == len(body)
    assert set(record.decode_errors) <= {
        "frame_too_large", "incomplete", "bad_length", "bad_encoding",
        # AWS event-stream frames and Gemini's streamed JSON array
        "bad_prelude_crc", "bad_message_crc", "bad_headers", "bad_json", "trailing_data",
    }  # fmt: skip
