"""Readers for what ``semhealth replay`` takes: recordings (``--record``'s JSONL), HAR 1.2
files from a browser or proxy capture, and OTLP JSON files as the Collector's file exporter
writes them (one ``ExportTraceServiceRequest`` or ``ExportLogsServiceRequest`` per line).

Each reader yields inputs in file order, and an ``InputProblem`` (file, line, what is
wrong) for each line or entry it cannot use, then goes on with the next: one bad line
never costs the rest of a file. The kind of a file is told from its content: a JSON
document with a ``log`` object is HAR; otherwise each line is judged on its own (a
recording line, or an OTLP request).

HAR bodies carry no per-chunk arrival times: a HAR exchange is replayed as one body
arriving at the first byte's time (``timings``), and its record has no deltas (TTFT and
continuity None, ``chunk_times`` False), never invented ones.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from semhealth.agent.replay.format import FormatError, RecordedExchange, decode_line
from semhealth.agent.replay.otlp_json import OTLPJSONError, otlp_request
from semhealth.agent.replay.results import InputProblem


@dataclass(frozen=True, slots=True)
class ExchangeInput:
    """One proxied exchange to rebuild with the collectors."""

    source_file: str
    line: int
    recorded: RecordedExchange
    chunk_times: bool = True  # False: the input had no per-chunk arrival times (HAR)


@dataclass(frozen=True, slots=True)
class OTLPInput:
    """One OTLP request: ``resource`` is its ``resource_spans`` or ``resource_logs``."""

    source_file: str
    line: int
    signal: str  # traces | logs
    resource: tuple[Any, ...]


Input = ExchangeInput | OTLPInput | InputProblem


def read_file(path: str) -> Iterator[Input]:
    """Every input of ``path``; ``OSError`` if it cannot be read at all."""
    with open(path, "rb") as file:
        head = file.read(4096)
        file.seek(0)
        if _looks_like_har(head):
            yield from _read_har(path, file.read())
            return
        for number, line in enumerate(file, start=1):
            if line.strip():
                yield _read_line(path, number, line)


def _looks_like_har(head: bytes) -> bool:
    """A HAR is one JSON document whose first key is ``log`` (browsers and proxies write it
    first, usually indented); a recording or OTLP line starts with another key."""
    text = head.lstrip()
    if not text.startswith(b"{"):
        return False
    first_key = text[1:].lstrip()
    return first_key.startswith(b'"log"')


def _read_line(path: str, number: int, line: bytes) -> Input:
    stripped = line.strip()
    if stripped.startswith(b'{"resource') or b'"resource' in stripped[:40]:
        try:
            signal, resource = otlp_request(stripped)
        except OTLPJSONError as exc:
            return InputProblem(source_file=path, line=number, error=str(exc))
        return OTLPInput(path, number, signal, resource)
    try:
        return ExchangeInput(path, number, decode_line(stripped))
    except FormatError as exc:
        return InputProblem(source_file=path, line=number, error=str(exc))


# -- HAR ---------------------------------------------------------------------------------------


class _HARError(ValueError):
    pass


def _read_har(path: str, data: bytes) -> Iterator[Input]:
    try:
        document = orjson.loads(data)
        entries = document["log"]["entries"]
        if not isinstance(entries, list):
            raise TypeError
    except orjson.JSONDecodeError as exc:
        yield InputProblem(source_file=path, line=1, error=f"HAR file is not JSON ({exc})")
        return
    except (KeyError, TypeError):
        yield InputProblem(source_file=path, line=1, error="HAR file has no log.entries list")
        return
    name = Path(path).name
    for index, entry in enumerate(entries, start=1):
        try:
            recorded = _har_exchange(entry, f"{name}#{index}")
        except _HARError as exc:
            yield InputProblem(source_file=path, line=index, error=f"HAR entry {index}: {exc}")
            continue
        yield ExchangeInput(path, index, recorded, chunk_times=False)


def _har_exchange(entry: Any, exchange_id: str) -> RecordedExchange:
    if not isinstance(entry, dict):
        raise _HARError("is not an object")
    request, response = entry.get("request"), entry.get("response")
    if not isinstance(request, dict) or not isinstance(response, dict):
        raise _HARError("has no request or response object")
    status = response.get("status")
    if not isinstance(status, int) or status <= 0:
        raise _HARError("has no response (status 0: the request failed or was blocked)")
    url = urlsplit(str(request.get("url", "")))
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    headers = _headers(response.get("headers"))
    content = _object(response.get("content"))
    body = _har_body(content)
    timings = _object(entry.get("timings"))
    head_ms = sum(_ms(timings, key) for key in ("blocked", "dns", "connect", "send", "wait"))
    total_ms = float(entry.get("time") or head_ms + _ms(timings, "receive"))
    head_ns, end_ns = round(head_ms * 1e6), round(max(total_ms, head_ms) * 1e6)
    return RecordedExchange(
        id=exchange_id,
        time=_started(entry.get("startedDateTime")),
        method=str(request.get("method", "GET")),
        path=path,
        status=status,
        content_type=headers.get("content-type") or content.get("mimeType") or None,
        # HAR stores the body decoded: whatever the wire's encoding was is undone.
        content_encoding=None,
        ratelimit_source=headers.get("x-ratelimit-source"),
        traceparent=_headers(request.get("headers")).get("traceparent"),
        response_offset_ns=head_ns,
        request_body=_post_data(request.get("postData")),
        request_skip=None,
        chunks=((head_ns, body),) if body else (),
        elided_bytes=0,
        end_offset_ns=end_ns,
        client_aborted=False,
        upstream_aborted=False,
        error_type=None,
        shed=False,
    )


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _headers(items: Any) -> dict[str, str]:
    if not isinstance(items, list):
        return {}
    return {
        str(item.get("name", "")).lower(): str(item.get("value", ""))
        for item in items
        if isinstance(item, dict)
    }


def _ms(timings: dict[str, Any], key: str) -> float:
    value = timings.get(key)
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


def _started(value: Any) -> float:
    if not isinstance(value, str):
        raise _HARError("has no startedDateTime")
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise _HARError(f"startedDateTime {value!r} is not an ISO 8601 time") from None


def _har_body(content: dict[str, Any]) -> bytes:
    text = content.get("text")
    if not isinstance(text, str):
        return b""
    if content.get("encoding") != "base64":
        return text.encode("utf-8")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _HARError("response.content.text is not valid base64") from None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _HARError(
            "response body is binary (base64 that is not UTF-8 text): not an LLM response"
        ) from None
    return raw


def _post_data(post: Any) -> bytes | None:
    if not isinstance(post, dict) or not isinstance(post.get("text"), str):
        return None
    text = post["text"]
    if post.get("encoding") == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise _HARError("request.postData.text is not valid base64") from None
    return str(text).encode("utf-8")
