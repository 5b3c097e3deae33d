from __future__ import annotations

import pytest

from semhealth.collectors.config import FRAMINGS
from semhealth.collectors.framing import detect_framing, make_decoder
from semhealth.collectors.json_body import JSONBodyDecoder
from semhealth.collectors.length_prefixed import LengthPrefixedDecoder
from semhealth.collectors.ndjson import NDJSONDecoder
from semhealth.collectors.sse import SSEDecoder


@pytest.mark.parametrize(
    ("content_type", "framing"),
    [
        ("text/event-stream", "sse"),
        ("text/event-stream; charset=utf-8", "sse"),
        ("Text/Event-Stream", "sse"),
        ("  text/event-stream ;charset=UTF-8", "sse"),
        ("application/x-ndjson", "ndjson"),
        ("application/ndjson", "ndjson"),
        ("application/jsonl", "ndjson"),
        ("application/x-jsonl", "ndjson"),
        ("application/jsonlines", "ndjson"),
        ("application/x-jsonlines", "ndjson"),
        ("application/stream+json", "ndjson"),
        ("application/x-ndjson; charset=utf-8", "ndjson"),
        ("application/json", "json"),
        ("application/json; charset=utf-8", "json"),
        ("application/problem+json", "json"),
        ("text/plain", "json"),
        ("", "json"),
        (None, "json"),
    ],
)
def test_detect_framing_maps_media_type(content_type: str | None, framing: str) -> None:
    assert detect_framing(content_type) == framing


@pytest.mark.parametrize(
    "content_type",
    [
        "application/grpc",
        "application/grpc+proto",
        "application/connect+json",
        "application/json-seq",
    ],
)
def test_detect_framing_does_not_claim_envelopes_it_cannot_decode(content_type: str) -> None:
    assert detect_framing(content_type) == "json"


@pytest.mark.parametrize(
    ("framing", "decoder_type"),
    [
        ("sse", SSEDecoder),
        ("ndjson", NDJSONDecoder),
        ("length_prefixed", LengthPrefixedDecoder),
        ("json", JSONBodyDecoder),
    ],
)
def test_make_decoder_builds_the_named_decoder(framing: str, decoder_type: type) -> None:
    assert isinstance(make_decoder(framing, 1024), decoder_type)


def test_make_decoder_covers_every_configurable_framing() -> None:
    for framing in FRAMINGS:
        if framing != "auto":
            assert make_decoder(framing, 1024).errors == []


def test_make_decoder_passes_the_frame_limit() -> None:
    decoder = make_decoder("json", 4)
    decoder.feed(b"12345", 0)
    assert [e.reason for e in decoder.errors] == ["frame_too_large"]


def test_make_decoder_refuses_auto() -> None:
    with pytest.raises(ValueError, match="detect_framing"):
        make_decoder("auto", 1024)


def test_make_decoder_refuses_unknown_framing() -> None:
    with pytest.raises(ValueError, match="unknown framing 'grpc'"):
        make_decoder("grpc", 1024)


@pytest.mark.parametrize("framing", ["sse", "ndjson", "length_prefixed", "json"])
def test_decoders_refuse_a_limit_below_one_byte(framing: str) -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        make_decoder(framing, 0)


def test_aws_event_streams_get_their_own_decoder() -> None:
    assert detect_framing("application/vnd.amazon.eventstream") == "aws_eventstream"


def test_gemini_json_is_a_streamed_array_and_other_json_one_body() -> None:
    assert detect_framing("application/json; charset=UTF-8", "gemini") == "json_array"
    assert detect_framing("application/json", "vertex_ai") == "json_array"
    assert detect_framing("application/json", "openai_chat") == "json"
