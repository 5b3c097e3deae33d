"""One exchange's analysis, sans-IO: literal response bytes in, one ``StreamRecord`` out."""

from __future__ import annotations

import dataclasses
import gzip
import tracemalloc
import zlib
from collections.abc import Iterable

import orjson
import pytest

from semhealth.collectors.collector import StreamCollector, check_record, match_route
from semhealth.collectors.config import Analysis, Config, Limits, Route
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import RequestFacts, StreamRecord
from semhealth.collectors.validity import SchemaCache

SSE = "text/event-stream"
T0 = 1_000_000_000  # request head received; chunks arrive after it
END = T0 + 900_000_000

# A streamed POST /v1/chat/completions with stream_options.include_usage (ids shortened).
OPENAI_CHAT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,'
    b'"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"role":"assistant",'
    b'"content":""},"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,'
    b'"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":"Bonjour"},'
    b'"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,'
    b'"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":" \xe2\x80\x94 '
    b'\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8b"},"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,'
    b'"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{},'
    b'"finish_reason":"stop"}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,'
    b'"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":19,'
    b'"completion_tokens":10,"total_tokens":29}}\n\n'
    b"data: [DONE]\n\n"
)
OPENAI_TEXT = "Bonjour \u2014 \u4f60\u597d \U0001f44b"

# A streamed POST /v1/messages.
ANTHROPIC = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_01","type":"message",'
    b'"role":"assistant","content":[],"model":"claude-sonnet-4-20250514","stop_reason":null,'
    b'"usage":{"input_tokens":25,"output_tokens":1}}}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b"event: ping\n"
    b'data: {"type": "ping"}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    b'"text":"Hello"}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    b'"text":" world"}}\n\n'
    b"event: content_block_stop\n"
    b'data: {"type":"content_block_stop","index":0}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
    b'"usage":{"output_tokens":15}}\n\n'
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n\n'
)

# Anthropic reports overload mid-stream, after the 200 head went out.
ANTHROPIC_OVERLOADED = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_02","type":"message",'
    b'"role":"assistant","content":[],"model":"claude-sonnet-4-20250514","stop_reason":null,'
    b'"usage":{"input_tokens":25,"output_tokens":1}}}\n\n'
    b"event: error\n"
    b'data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
)

OPENAI_SERVER_ERROR = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,'
    b'"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
    b'data: {"error":{"message":"The server had an error","type":"server_error","code":null}}\n\n'
)

CHAT_REQUEST = orjson.dumps(
    {
        "model": "gpt-4o",
        "stream": True,
        "messages": [{"role": "user", "content": "Say hello in French and Chinese."}],
    }
)


def _exchange(
    path: str = "/v1/chat/completions",
    *,
    status: int = 200,
    content_type: str | None = SSE,
    content_encoding: str | None = None,
    request_body: bytes | None = CHAT_REQUEST,
    request_skip: str | None = None,
) -> Exchange:
    return Exchange(
        method="POST",
        path=path,
        start_ns=T0,
        status=status,
        content_type=content_type,
        content_encoding=content_encoding,
        response_ns=T0 + 1_000,
        request_body=request_body,
        request_skip=request_skip,
    )


def _collect(
    chunks: Iterable[bytes], exchange: Exchange | None = None, config: Config | None = None
) -> StreamRecord:
    collector = StreamCollector(exchange or _exchange(), config or Config())
    for i, chunk in enumerate(chunks):
        collector.feed(chunk, T0 + 1_000_000 * (i + 1))
    return collector.finish(END)


def _bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def _deflate(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(wbits=wbits)
    return compressor.compress(data) + compressor.flush()


# ------------------------------------------------------------------ routes


ROUTES = Config(
    routes=(
        Route(name="v1_any", match="/v1/*"),
        Route(name="v1_chat", match="/v1/chat/*", provider="anthropic_messages"),
        Route(name="custom", match="/custom/stream", provider="ollama", framing="ndjson"),
    )
)


def test_first_matching_route_wins() -> None:
    collector = StreamCollector(_exchange("/v1/chat/completions"), ROUTES)
    assert collector.route == "v1_any"


def test_route_match_ignores_the_query_string() -> None:
    assert match_route(ROUTES.routes, "/custom/stream") is ROUTES.routes[2]
    collector = StreamCollector(_exchange("/custom/stream?alt=sse&x=1"), ROUTES)
    assert collector.route == "custom"


def test_unmatched_path_is_route_other() -> None:
    collector = StreamCollector(_exchange("/healthz"), ROUTES)
    assert collector.route == "other"
    assert match_route(ROUTES.routes, "/healthz") is None


def test_provider_and_framing_come_from_the_route() -> None:
    # The route says NDJSON/Ollama even though the response claims to be SSE.
    collector = StreamCollector(_exchange("/custom/stream", content_type=SSE), ROUTES)
    assert (collector.provider, collector.framing) == ("ollama", "ndjson")


def test_auto_route_detects_provider_from_path_and_framing_from_content_type() -> None:
    collector = StreamCollector(_exchange("/v1/chat/completions", content_type=SSE), ROUTES)
    assert (collector.provider, collector.framing) == ("openai_chat", "sse")
    plain = StreamCollector(
        _exchange("/v1/messages", content_type="application/json; charset=utf-8"), ROUTES
    )
    assert (plain.provider, plain.framing) == ("anthropic_messages", "json")


def test_default_routes_pick_the_provider_by_path() -> None:
    collector = StreamCollector(
        _exchange("/api/chat", content_type="application/x-ndjson"), Config()
    )
    assert collector.route == "ollama_chat"
    assert (collector.provider, collector.framing) == ("ollama", "ndjson")


# ------------------------------------------------------------------ one stream


def test_openai_stream_becomes_a_record() -> None:
    record = _collect([OPENAI_CHAT])
    assert record.route == "chat_completions"
    assert record.provider == "openai_chat"
    assert record.model == "gpt-4o-2024-08-06"
    assert record.output_text == OPENAI_TEXT
    assert len(record.delta_ns) == 2
    assert (record.usage.input_tokens, record.usage.output_tokens) == (19, 10)
    assert record.finish_reason == "stop"
    assert record.done
    assert record.streamed
    assert record.error_type is None
    assert record.response_bytes == len(OPENAI_CHAT)
    assert record.decode_errors == ()
    assert record.request.model == "gpt-4o"


def test_stream_fed_byte_by_byte_gives_the_same_record() -> None:
    collector = StreamCollector(_exchange(), Config())
    collector.feed(OPENAI_CHAT, T0 + 5)
    whole = collector.finish(END)
    collector = StreamCollector(_exchange(), Config())
    for byte in _bytewise(OPENAI_CHAT):
        collector.feed(byte, T0 + 5)
    assert collector.finish(END) == whole


def test_delta_times_are_the_arrival_of_the_chunk_that_carried_them() -> None:
    first, second = OPENAI_CHAT.split(b"\n\n", 2)[:2]
    rest = OPENAI_CHAT[len(first) + len(second) + 4 :]
    record = _collect([first + b"\n\n" + second + b"\n\n", rest])
    assert record.delta_ns == (T0 + 1_000_000, T0 + 2_000_000)
    assert record.first_byte_ns == T0 + 1_000_000
    assert record.ttft_s == pytest.approx(0.001)


# ------------------------------------------------------------------ content encodings


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip.compress(OPENAI_CHAT)),
        ("x-gzip", gzip.compress(OPENAI_CHAT)),
        ("deflate", _deflate(OPENAI_CHAT, zlib.MAX_WBITS)),  # RFC 9110: zlib-wrapped
        ("deflate", _deflate(OPENAI_CHAT, -zlib.MAX_WBITS)),  # what some servers send: raw
    ],
    ids=["gzip", "x-gzip", "deflate-zlib", "deflate-raw"],
)
def test_compressed_stream_is_analysed_decompressed(encoding: str, body: bytes) -> None:
    record = _collect([body[:7], body[7:]], _exchange(content_encoding=encoding))
    assert record.output_text == OPENAI_TEXT
    assert record.done
    assert record.decode_errors == ()
    assert record.response_bytes == len(body)  # counted on the wire, compressed


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip.compress(OPENAI_CHAT)),
        ("deflate", _deflate(OPENAI_CHAT, zlib.MAX_WBITS)),
        ("deflate", _deflate(OPENAI_CHAT, -zlib.MAX_WBITS)),
    ],
    ids=["gzip", "deflate-zlib", "deflate-raw"],
)
def test_compressed_stream_fed_byte_by_byte_gives_the_same_record(
    encoding: str, body: bytes
) -> None:
    exchange = _exchange(content_encoding=encoding)
    collector = StreamCollector(exchange, Config())
    collector.feed(body, T0 + 5)
    whole = collector.finish(END)
    collector = StreamCollector(exchange, Config())
    for byte in _bytewise(body):
        collector.feed(byte, T0 + 5)
    assert collector.finish(END) == whole
    assert whole.output_text == OPENAI_TEXT


def test_corrupt_gzip_stops_analysis_with_bad_encoding() -> None:
    record = _collect(
        [b"\x1f\x8b\x08\x00 not really gzip at all"], _exchange(content_encoding="gzip")
    )
    assert record.decode_errors == ("bad_encoding",)
    assert record.output_text == ""


@pytest.fixture(scope="module")
def gzip_bomb() -> list[bytes]:
    """200 MiB of zeros, gzip-compressed (about 200 KiB), in 64 KiB wire chunks."""
    compressor = zlib.compressobj(1, wbits=31)
    zeros = bytes(1 << 20)
    body = b"".join(compressor.compress(zeros) for _ in range(200)) + compressor.flush()
    return [body[i : i + 65536] for i in range(0, len(body), 65536)]


def test_gzip_bomb_never_inflates_past_the_response_limit(gzip_bomb: list[bytes]) -> None:
    limit = 1 << 20
    config = Config(limits=Limits(max_response_bytes=limit, max_frame_bytes=1 << 16))
    tracemalloc.start()
    try:
        record = _collect(gzip_bomb, _exchange(content_encoding="gzip"), config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert record.truncated
    assert record.response_bytes == sum(map(len, gzip_bomb))
    # The limit, one sliced copy of it and the decoders' own bounded buffers; never 200 MiB.
    assert peak < 4 * limit, f"peak {peak} bytes"


def test_response_over_the_limit_is_truncated_and_analysis_stops() -> None:
    events = OPENAI_CHAT.split(b"\n\n")
    head = b"\n\n".join(events[:2]) + b"\n\n"  # the role chunk and "Bonjour"
    config = Config(limits=Limits(max_response_bytes=len(head) + 10))
    record = _collect([head, OPENAI_CHAT[len(head) :]], config=config)
    assert record.truncated
    assert record.output_text == "Bonjour"
    assert not record.done
    assert record.usage.output_tokens is None
    assert record.response_bytes == len(OPENAI_CHAT)


def test_response_exactly_at_the_limit_is_not_truncated() -> None:
    config = Config(limits=Limits(max_response_bytes=len(OPENAI_CHAT)))
    record = _collect([OPENAI_CHAT], config=config)
    assert not record.truncated
    assert record.done


def test_unsupported_encoding_is_a_decode_error_not_a_crash() -> None:
    record = _collect([b"\x8b\x05\x80garbage-brotli"], _exchange(content_encoding="br"))
    assert record.decode_errors == ("unsupported_encoding",)
    assert record.output_text == ""
    assert record.delta_ns == ()
    assert record.response_bytes == len(b"\x8b\x05\x80garbage-brotli")
    assert record.first_byte_ns == T0 + 1_000_000


# ------------------------------------------------------------------ request and outcome


def test_request_not_copied_gives_unanalysed_facts_with_the_reason() -> None:
    record = _collect([OPENAI_CHAT], _exchange(request_body=None, request_skip="oversized"))
    assert record.request == RequestFacts(analysed=False, skip_reason="oversized")
    assert record.prompt_class == "short"
    assert record.model == "gpt-4o-2024-08-06"  # still known from the response


def test_http_error_status_is_the_error_type() -> None:
    body = b'{"error":{"message":"boom","type":"server_error","code":null}}'
    record = _collect([body], _exchange(status=500, content_type="application/json"))
    assert record.error_type == "500"
    assert record.status == 500


@pytest.mark.parametrize(
    ("path", "stream", "expected"),
    [
        ("/v1/messages", ANTHROPIC_OVERLOADED, "overloaded_error"),
        ("/v1/chat/completions", OPENAI_SERVER_ERROR, "server_error"),
    ],
    ids=["anthropic", "openai"],
)
def test_error_event_in_a_2xx_stream_gives_the_providers_error_type(
    path: str, stream: bytes, expected: str
) -> None:
    record = _collect([stream], _exchange(path))
    assert record.status == 200
    assert record.error_type == expected


def test_error_type_from_the_proxy_wins_over_the_stream() -> None:
    collector = StreamCollector(_exchange("/v1/messages"), Config())
    collector.feed(ANTHROPIC_OVERLOADED, T0 + 1)
    record = collector.finish(END, upstream_aborted=True, error_type="upstream_timeout")
    assert record.error_type == "upstream_timeout"
    assert record.upstream_aborted


def test_unknown_path_records_the_sniffed_provider() -> None:
    record = _collect([ANTHROPIC], _exchange("/proxy/llm", request_body=b"{}"))
    assert record.route == "other"
    assert record.provider == "anthropic_messages"
    assert record.output_text == "Hello world"
    assert record.model == "claude-sonnet-4-20250514"
    assert record.done


def test_unknown_path_with_an_unrecognisable_body_stays_unknown() -> None:
    record = _collect([b'{"hello": "world"}'], _exchange("/proxy/llm", content_type=None))
    assert record.provider == "unknown"
    assert record.output_text == ""
    assert not record.streamed


# ------------------------------------------------------------------ the checked record

JSON_MODE_REQUEST = orjson.dumps(
    {
        "model": "gpt-4o",
        "stream": True,
        "response_format": {"type": "json_object"},
        "messages": [{"role": "user", "content": "Give me the risk as JSON."}],
    }
)


def _chat_stream(*pieces: str, done: bool = True) -> list[bytes]:
    chunks = [
        b"data: "
        + orjson.dumps({"model": "gpt-4o", "choices": [{"index": 0, "delta": {"content": piece}}]})
        + b"\n\n"
        for piece in pieces
    ]
    return chunks + ([b"data: [DONE]\n\n"] if done else [])


def _json_exchange() -> Exchange:
    return _exchange(request_body=JSON_MODE_REQUEST)


def test_finish_hands_out_the_records_continuity_and_validity() -> None:
    record = _collect(_chat_stream('{"risk"', ': "low"}'), _json_exchange())
    assert record.continuity is not None
    assert record.continuity.deltas == 2
    assert record.continuity.max_gap_s == pytest.approx(0.001)
    assert [v.result for v in record.validity] == ["valid"]


def test_the_stall_threshold_is_the_configs() -> None:
    config = Config(analysis=Analysis(stall_threshold_s=0.0005))
    record = _collect(_chat_stream("a", "b", "c"), config=config)
    assert record.continuity is not None
    assert record.continuity.stalls == 2  # two 1 ms gaps, both over 0.5 ms


def test_a_routes_contract_is_checked_where_the_record_is_built() -> None:
    contract = {"type": "object", "properties": {"risk": {"const": "high"}}}
    route = Route(
        name="loans", match="*/chat/completions", provider="openai_chat",
        contract="risk.yaml", contract_schema=contract,
    )  # fmt: skip
    record = _collect(_chat_stream('{"risk": "low"}'), _json_exchange(), Config(routes=(route,)))
    assert [(v.result, v.reasons) for v in record.validity] == [("contract", ("const",))]


def test_a_route_compares_equal_with_or_without_its_loaded_contract() -> None:
    plain = Route(name="loans", match="*", contract="risk.yaml")
    loaded = Route(
        name="loans", match="*", contract="risk.yaml", contract_schema={"type": "object"}
    )
    assert plain == loaded
    assert "contract_schema" not in repr(loaded)  # a schema may be long: it follows from the path


def test_collectors_share_one_schema_cache_unless_given_their_own() -> None:
    cache = SchemaCache()
    collector = StreamCollector(_json_exchange(), Config(), schemas=cache)
    collector.feed(b"".join(_chat_stream('{"a": 1}')), T0 + 1)
    collector.finish(END)
    contract = {"type": "object"}
    route = Route(name="r", match="*", provider="openai_chat", contract_schema=contract)
    for _ in range(2):
        collector = StreamCollector(_json_exchange(), Config(routes=(route,)), schemas=cache)
        collector.feed(b"".join(_chat_stream('{"a": 1}')), T0 + 1)
        collector.finish(END)
    assert (cache.misses, cache.hits) == (1, 1)


def test_a_client_that_left_mid_stream_is_client_aborted_with_no_continuity_or_validity() -> None:
    collector = StreamCollector(_json_exchange(), Config())
    for i, chunk in enumerate(_chat_stream('{"risk"', ': "lo', done=False)):
        collector.feed(chunk, T0 + 1_000_000 * (i + 1))
    record = collector.finish(END, client_aborted=True)
    assert record.error_type == "client_aborted"
    assert record.client_aborted
    assert record.status == 200  # what the client had been sent still shows in status_class
    assert record.continuity is None
    assert record.validity == ()
    assert record.output_text == '{"risk": "lo'  # still there for whoever needs it


def test_a_shed_stream_has_no_continuity_or_validity() -> None:
    collector = StreamCollector(_json_exchange(), Config())
    collector.feed(b"".join(_chat_stream('{"a"', ": 1}")), T0 + 1)
    record = collector.finish(END, shed=True)
    assert (record.continuity, record.validity) == (None, ())
    assert record.error_type is None


@pytest.mark.parametrize(
    ("status", "error_type", "client_aborted", "expected"),
    [
        (502, "upstream_unreachable", False, "upstream_unreachable"),
        (504, "upstream_timeout", False, "upstream_timeout"),
        (499, None, True, "client_aborted"),
    ],
    ids=["unreachable", "timeout", "client-left-first"],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/somewhere/else"])
def test_an_exchange_the_upstream_never_answered_becomes_a_record(
    path: str, status: int, error_type: str | None, client_aborted: bool, expected: str
) -> None:
    exchange = Exchange(
        method="POST", path=path, start_ns=T0, status=status, content_type=None,
        content_encoding=None, response_ns=None, request_body=JSON_MODE_REQUEST,
    )  # fmt: skip
    collector = StreamCollector(exchange, Config())
    record = collector.finish(END, error_type=error_type, client_aborted=client_aborted)
    assert record.status == status
    assert record.error_type == expected
    assert record.client_aborted is client_aborted
    assert record.response_ns is None and record.first_byte_ns is None
    assert record.delta_ns == () and record.response_bytes == 0
    assert not record.streamed
    assert record.validity == ()
    assert record.continuity is None or record.continuity.index_s is None
    assert record.duration_s == pytest.approx(0.9)
    assert record.model == "gpt-4o"  # from the request, which is still read


@pytest.mark.parametrize(
    "finish",
    [{}, {"client_aborted": True}, {"shed": True}, {"upstream_aborted": True}],
    ids=["whole", "client_left", "shed", "upstream_died"],
)
@pytest.mark.parametrize("json_mode", [True, False], ids=["json_mode", "plain"])
def test_finish_checks_the_record_as_check_record_does(
    finish: dict[str, bool], json_mode: bool
) -> None:
    exchange = _json_exchange() if json_mode else _exchange()
    cache = SchemaCache()
    collector = StreamCollector(exchange, Config(), schemas=cache)
    for i, chunk in enumerate(_chat_stream('{"a"', ": 1", "}")):
        collector.feed(chunk, T0 + 7_000_000 * (i + 1) ** 2)
    record = collector.finish(END, **finish)
    unchecked = dataclasses.replace(record, continuity=None, validity=())
    checked = check_record(
        unchecked, stall_threshold_s=Analysis().stall_threshold_s, contract=None, schemas=cache
    )
    assert checked == record
