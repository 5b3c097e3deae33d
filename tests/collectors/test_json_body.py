from __future__ import annotations

import itertools
import tracemalloc

import orjson
from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.frames import DecodeError, Frame
from semhealth.collectors.json_body import JSONBodyDecoder

BIG = 1 << 20

# Recorded from a non-streamed POST /v1/chat/completions.
OPENAI_CHAT_BODY = (
    b'{\n  "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",\n  "object": "chat.completion",\n'
    b'  "created": 1741569952,\n  "model": "gpt-4o-2024-08-06",\n  "choices": [\n    {\n'
    b'      "index": 0,\n      "message": {\n        "role": "assistant",\n'
    b'        "content": "Bonjour \xf0\x9f\x91\x8b \xe4\xbd\xa0\xe5\xa5\xbd",\n'
    b'        "refusal": null,\n        "annotations": []\n      },\n      "logprobs": null,\n'
    b'      "finish_reason": "stop"\n    }\n  ],\n  "usage": {\n    "prompt_tokens": 19,\n'
    b'    "completion_tokens": 10,\n    "total_tokens": 29\n  },\n'
    b'  "service_tier": "default",\n  "system_fingerprint": "fp_fc9f1d7035"\n}\n'
)


def decode(
    chunks: list[bytes], max_frame_bytes: int = BIG
) -> tuple[list[Frame], list[DecodeError]]:
    decoder = JSONBodyDecoder(max_frame_bytes)
    frames: list[Frame] = []
    for i, chunk in enumerate(chunks):
        frames += decoder.feed(chunk, i)
    frames += decoder.close(len(chunks))
    return frames, decoder.errors


def test_body_is_one_frame_at_close() -> None:
    decoder = JSONBodyDecoder(BIG)
    assert decoder.feed(OPENAI_CHAT_BODY[:100], 1) == []
    assert decoder.feed(OPENAI_CHAT_BODY[100:], 2) == []
    frames = decoder.close(3)
    assert frames == [Frame(data=OPENAI_CHAT_BODY, t=2)]
    assert orjson.loads(frames[0].data)["choices"][0]["message"]["content"] == (
        "Bonjour \U0001f44b \u4f60\u597d"
    )


def test_frame_t_is_arrival_of_last_chunk() -> None:
    decoder = JSONBodyDecoder(BIG)
    decoder.feed(b"{", 10)
    decoder.feed(b"}", 20)
    assert [f.t for f in decoder.close(30)] == [20]


def test_empty_body_gives_no_frame() -> None:
    assert decode([]) == ([], [])
    assert decode([b"", b""]) == ([], [])


def test_body_over_limit_gives_error_and_no_frame() -> None:
    assert decode([b'{"a":', b'"0123456789"}'], max_frame_bytes=16) == (
        [],
        [DecodeError("frame_too_large", 0)],
    )


def test_body_at_exactly_the_limit_is_kept() -> None:
    assert decode([b'{"a":"1234567"}'], max_frame_bytes=15)[0][0].data == b'{"a":"1234567"}'


def test_body_over_limit_is_not_buffered() -> None:
    decoder = JSONBodyDecoder(1024)
    piece = b"b" * 65536
    tracemalloc.start()
    try:
        for _ in range(256):
            decoder.feed(piece, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert decoder.errors == [DecodeError("frame_too_large", 0)]


def test_feed_after_close_is_ignored() -> None:
    decoder = JSONBodyDecoder(BIG)
    decoder.feed(b"{}", 1)
    assert len(decoder.close(2)) == 1
    assert (decoder.feed(b"[]", 3), decoder.close(4)) == ([], [])


@given(st.binary(max_size=300), st.integers(1, 400), st.data())
def test_any_chunking_gives_the_same_result_as_one_chunk(
    body: bytes, max_frame_bytes: int, data: st.DataObject
) -> None:
    points = sorted(set(data.draw(st.lists(st.integers(0, len(body)), max_size=20))))
    bounds = [0, *points, len(body)]
    chunks = [body[a:b] for a, b in itertools.pairwise(bounds)]
    whole, whole_errors = decode([body], max_frame_bytes)
    split, split_errors = decode(chunks, max_frame_bytes)
    assert [f.data for f in split] == [f.data for f in whole]
    assert split_errors == whole_errors
    assert [f.data for f in whole] == ([body] if body and len(body) <= max_frame_bytes else [])
