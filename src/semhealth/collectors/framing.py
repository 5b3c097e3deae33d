"""Choosing a framing decoder: from a route's ``framing`` or the response's Content-Type.

``detect_framing`` maps media types as follows (type and subtype are
case-insensitive; parameters such as ``charset`` are ignored):

========================================================  =================
``text/event-stream``                                     ``sse``
``application/vnd.amazon.eventstream``                    ``aws_eventstream``
``application/x-ndjson``, ``application/ndjson``,         ``ndjson``
``application/jsonl``, ``application/x-jsonl``,
``application/jsonlines``, ``application/x-jsonlines``,
``application/stream+json``
``application/json`` from Gemini or Vertex AI             ``json_array``
anything else, or no Content-Type                         ``json``
========================================================  =================

Gemini's ``:streamGenerateContent`` without ``alt=sse`` streams one JSON array, element by
element, as ``application/json``: the ``json_array`` decoder frames each element as it
completes (a single object, ``:generateContent``'s body or an error, is one frame).

Deliberately not detected:

- ``length_prefixed``: no registered media type is a bare 4-byte big-endian
  length. gRPC (``application/grpc*``) and Connect streaming
  (``application/connect+*``) frame with a flags byte plus the length (5
  bytes), and AWS event streams have their own decoder. A route that does speak the
  bare framing sets ``framing: length_prefixed``.
- ``application/json-seq`` (RFC 7464): records start with an RS byte and may
  span lines, so the NDJSON decoder would mis-frame them.

Those fall to ``json``, which at worst frames the body once, up to the limit.
"""

from __future__ import annotations

from semhealth.collectors.eventstream import EventStreamDecoder
from semhealth.collectors.frames import Decoder
from semhealth.collectors.json_array import JSONArrayDecoder
from semhealth.collectors.json_body import JSONBodyDecoder
from semhealth.collectors.length_prefixed import LengthPrefixedDecoder
from semhealth.collectors.ndjson import NDJSONDecoder
from semhealth.collectors.sse import SSEDecoder

_AWS_EVENTSTREAM = "application/vnd.amazon.eventstream"
_JSON_ARRAY_PROVIDERS = frozenset({"gemini", "vertex_ai"})
_NDJSON_TYPES = frozenset(
    {
        "application/x-ndjson",
        "application/ndjson",
        "application/jsonl",
        "application/x-jsonl",
        "application/jsonlines",
        "application/x-jsonlines",
        "application/stream+json",
    }
)


def detect_framing(content_type: str | None, provider: str | None = None) -> str:
    """The framing name (one of ``config.FRAMINGS`` except ``auto``) for a Content-Type value
    (and the provider, whose JSON may be a streamed array)."""
    if content_type is None:
        return "json"
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == "text/event-stream":
        return "sse"
    if media_type in _NDJSON_TYPES:
        return "ndjson"
    if media_type == _AWS_EVENTSTREAM:
        return "aws_eventstream"
    if media_type == "application/json" and provider in _JSON_ARRAY_PROVIDERS:
        return "json_array"
    return "json"


def make_decoder(framing: str, max_frame_bytes: int) -> Decoder:
    """A fresh decoder for one stream.

    ``auto`` must be resolved with ``detect_framing`` first; it and unknown
    names raise ``ValueError``, which the validated configuration never lets
    through to a live stream.
    """
    match framing:
        case "sse":
            return SSEDecoder(max_frame_bytes)
        case "ndjson":
            return NDJSONDecoder(max_frame_bytes)
        case "length_prefixed":
            return LengthPrefixedDecoder(max_frame_bytes)
        case "json":
            return JSONBodyDecoder(max_frame_bytes)
        case "aws_eventstream":
            return EventStreamDecoder(max_frame_bytes)
        case "json_array":
            return JSONArrayDecoder(max_frame_bytes)
        case "auto":
            raise ValueError("framing 'auto' must be resolved with detect_framing() first")
        case _:
            raise ValueError(
                f"unknown framing {framing!r}; expected one of sse, ndjson, "
                "length_prefixed, json, aws_eventstream, json_array"
            )
