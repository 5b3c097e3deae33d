"""The recording format: what ``semhealth run --record FILE`` writes and ``semhealth replay``
reads. It holds prompt and response text (opt-in only; the file is created mode 0600).

JSONL, UTF-8, one exchange per line, written when the exchange closes (so lines are in
close order, not start order; replay sorts). Each line is one JSON object:

    v                    1 (this format's version; a reader refuses versions it does not know)
    id                   the exchange's id (32 hex digits, unique per recording)
    time                 wall-clock start, Unix seconds (float): when the proxy received the
                         request head
    method, path         the request line (path includes the query string)
    status               the response status (the proxy's own 499/502/504 when the upstream
                         never answered)
    content_type         response Content-Type, or null
    content_encoding     response Content-Encoding, or null
    ratelimit_source     response X-RateLimit-Source, or null
    traceparent          the request's W3C traceparent (only when it had one)
    response_offset_ns   response head arrival, ns after ``time``; null without a response
    request              the request body: {"text": "..."} when it is UTF-8, {"base64": "..."}
                         otherwise; null when the body was not copied for analysis
    request_skip         why ``request`` is null ("oversized", ...), else null
    request_bytes        the size of an oversized body that ``request`` leaves out (only then):
                         its prompt class is estimated from it
    chunks               the response body as the collectors received it, in arrival order:
                         [offset_ns, "text"] or [offset_ns, {"base64": "..."}] per chunk
                         (a chunk that is not UTF-8 on its own, e.g. gzip or a split
                         character, is base64)
    elided_bytes         body bytes received past the recording's per-exchange cap (the
                         analysis cap, ``collectors.limits.max_response_bytes``, plus the
                         chunk that crossed it): counted, not stored
    outcome              how the exchange closed: {"end_offset_ns": int, "client_aborted":
                         bool, "upstream_aborted": bool, "error_type": str|null, "shed": bool}
                         (``shed``: the tap dropped some chunks under load, so ``chunks`` is
                         not the whole body)

Times are integer nanosecond offsets from the start, taken on the tap's monotonic clock, so
replay rebuilds every duration exactly: feeding ``chunks`` and ``outcome`` to a
``StreamCollector`` gives the record the live agent built.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import orjson

from semhealth.agent.wire import Outcome
from semhealth.collectors import Exchange

VERSION = 1

# Exchange grows a ``traceparent`` field when the proxy reads the request's header; until
# then (and for Exchanges built without one) the recording has none.
_EXCHANGE_FIELDS = frozenset(Exchange.__dataclass_fields__)


class FormatError(ValueError):
    """A line that is not a recorded exchange; the message names the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedExchange:
    """One line of a recording, decoded. ``chunks`` offsets are ns after the start."""

    id: str
    time: float
    method: str
    path: str
    status: int
    content_type: str | None
    content_encoding: str | None
    ratelimit_source: str | None
    traceparent: str | None
    response_offset_ns: int | None
    request_body: bytes | None
    request_skip: str | None
    request_bytes: int = 0  # an oversized body's size (its prompt class), else 0
    chunks: tuple[tuple[int, bytes], ...]
    elided_bytes: int
    end_offset_ns: int
    client_aborted: bool
    upstream_aborted: bool
    error_type: str | None
    shed: bool

    def exchange(self, start_ns: int) -> Exchange:
        """The Exchange the tap had, on a clock where the exchange started at ``start_ns``."""
        fields: dict[str, Any] = {
            "method": self.method,
            "path": self.path,
            "start_ns": start_ns,
            "status": self.status,
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "response_ns": None
            if self.response_offset_ns is None
            else start_ns + self.response_offset_ns,
            "request_body": self.request_body,
            "request_skip": self.request_skip,
            "request_bytes": self.request_bytes,
            "ratelimit_source": self.ratelimit_source,
        }
        if "traceparent" in _EXCHANGE_FIELDS:
            fields["traceparent"] = self.traceparent
        return Exchange(**fields)

    def outcome(self, start_ns: int) -> Outcome:
        return Outcome(
            end_ns=start_ns + self.end_offset_ns,
            client_aborted=self.client_aborted,
            upstream_aborted=self.upstream_aborted,
            error_type=self.error_type,
        )


def _bytes_out(data: bytes) -> str | dict[str, str]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def encode_exchange(
    *,
    exchange_id: str,
    wall_start: float,
    exchange: Exchange,
    chunks: list[tuple[int, bytes]],
    elided_bytes: int,
    outcome: Outcome,
    shed: bool,
) -> bytes:
    """One recording line (with its newline). ``chunks`` carry the tap's arrival times."""
    start = exchange.start_ns
    line: dict[str, Any] = {
        "v": VERSION,
        "id": exchange_id,
        "time": wall_start,
        "method": exchange.method,
        "path": exchange.path,
        "status": exchange.status,
        "content_type": exchange.content_type,
        "content_encoding": exchange.content_encoding,
        "ratelimit_source": exchange.ratelimit_source,
    }
    traceparent = getattr(exchange, "traceparent", None)
    if traceparent:
        line["traceparent"] = traceparent
    line["response_offset_ns"] = (
        None if exchange.response_ns is None else exchange.response_ns - start
    )
    body = exchange.request_body
    line["request"] = None if body is None else _body_out(body)
    line["request_skip"] = exchange.request_skip
    if exchange.request_bytes:
        line["request_bytes"] = exchange.request_bytes
    line["chunks"] = [[t - start, _bytes_out(chunk)] for t, chunk in chunks]
    line["elided_bytes"] = elided_bytes
    line["outcome"] = {
        "end_offset_ns": outcome.end_ns - start,
        "client_aborted": outcome.client_aborted,
        "upstream_aborted": outcome.upstream_aborted,
        "error_type": outcome.error_type,
        "shed": shed,
    }
    return orjson.dumps(line) + b"\n"


def _body_out(body: bytes) -> dict[str, str]:
    out = _bytes_out(body)
    return {"text": out} if isinstance(out, str) else out


def decode_line(line: bytes) -> RecordedExchange:
    """A recording line -> the exchange; ``FormatError`` (naming the field) if it is not one."""
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise FormatError(f"not JSON ({_json_problem(line, exc)})") from None
    if not isinstance(data, dict):
        raise FormatError("not a JSON object")
    version = data.get("v")
    if version != VERSION:
        raise FormatError(f"field 'v' is {version!r}; this semhealth reads version {VERSION}")
    fields: dict[str, Any] = {
        "id": _field(data, "id", str),
        "time": float(_field(data, "time", (int, float))),
        "method": _field(data, "method", str),
        "path": _field(data, "path", str),
        "status": _field(data, "status", int),
        "content_type": _optional(data, "content_type", str),
        "content_encoding": _optional(data, "content_encoding", str),
        "ratelimit_source": _optional(data, "ratelimit_source", str),
        "traceparent": _optional(data, "traceparent", str),
        "response_offset_ns": _optional(data, "response_offset_ns", int),
        "request_body": _request_in(data.get("request")),
        "request_skip": _optional(data, "request_skip", str),
        "request_bytes": _optional(data, "request_bytes", int) or 0,
        "chunks": _chunks_in(_field(data, "chunks", list)),
        "elided_bytes": _optional(data, "elided_bytes", int) or 0,
    }
    outcome = _field(data, "outcome", dict)
    return RecordedExchange(
        **fields,
        end_offset_ns=_field(outcome, "end_offset_ns", int, "outcome."),
        client_aborted=bool(outcome.get("client_aborted")),
        upstream_aborted=bool(outcome.get("upstream_aborted")),
        error_type=_optional(outcome, "error_type", str, "outcome."),
        shed=bool(outcome.get("shed")),
    )


def _json_problem(line: bytes, exc: orjson.JSONDecodeError) -> str:
    if exc.pos >= len(line.rstrip()) - 1:
        return "the line ends early: truncated?"
    return f"at character {exc.pos}"


def _field(data: dict[str, Any], key: str, kind: Any, prefix: str = "") -> Any:
    value = data.get(key)
    if value is None or not isinstance(value, kind) or isinstance(value, bool):
        raise FormatError(f"field '{prefix}{key}' is missing or not of type {_kind_name(kind)}")
    return value


def _optional(data: dict[str, Any], key: str, kind: Any, prefix: str = "") -> Any:
    value = data.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise FormatError(f"field '{prefix}{key}' is not of type {_kind_name(kind)}")
    return value


def _kind_name(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "integer", float: "number", str: "string", list: "list", dict: "object"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _request_in(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return str(value["text"]).encode("utf-8")
        if isinstance(value.get("base64"), str):
            return _b64(value["base64"], "request.base64")
    raise FormatError('field \'request\' is not null, {"text": ...} or {"base64": ...}')


def _chunks_in(items: list[Any]) -> tuple[tuple[int, bytes], ...]:
    chunks = []
    for index, item in enumerate(items):
        where = f"chunks[{index}]"
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int):
            raise FormatError(f"field '{where}' is not [offset_ns, body]")
        offset, body = item
        if isinstance(body, str):
            chunks.append((offset, body.encode("utf-8")))
        elif isinstance(body, dict) and isinstance(body.get("base64"), str):
            chunks.append((offset, _b64(body["base64"], where)))
        else:
            raise FormatError(f"field '{where}' has a body that is neither text nor base64")
    return tuple(chunks)


def _b64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise FormatError(f"field '{where}' is not valid base64") from None
