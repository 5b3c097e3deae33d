"""One response's analysis: bytes in, one ``StreamRecord`` out.

``StreamCollector`` composes the stages for one request/response exchange:
content decoding (gzip/deflate), framing (SSE, NDJSON, ...), the provider
adapter, and the running ``StreamState``. It is sans-IO and never raises on
bad input: whatever goes wrong becomes part of the record.

``finish`` hands out a checked record: ``check_record`` fills in its continuity
and validity, so whoever consumes it (the recorder, the relevance stage) only reads.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import zlib
from collections.abc import Iterable
from typing import Any

from semhealth.collectors.adapters.registry import detect_provider, make_adapter
from semhealth.collectors.config import Config, Extract, Route
from semhealth.collectors.continuity import continuity_of
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.frames import Decoder
from semhealth.collectors.framing import detect_framing, make_decoder
from semhealth.collectors.record import (
    Continuity,
    RequestFacts,
    StreamRecord,
    StreamState,
    TraceRef,
    Usage,
)
from semhealth.collectors.request import extract_request, unanalysed
from semhealth.collectors.sse import SSEDecoder
from semhealth.collectors.validity import SchemaCache, validate_record

OTHER_ROUTE = "other"
_STREAM_FRAMINGS = frozenset({"sse", "ndjson", "length_prefixed", "aws_eventstream"})
CLIENT_ABORTED = "client_aborted"

# Collectors built without a cache of their own share this one: validators are compiled
# once per schema in the process, whichever stream brought it (the cache is thread-safe).
_SHARED_SCHEMAS = SchemaCache()


# W3C Trace Context, version-format: lowercase hex only. Version 00 is exactly these four
# fields; a later version may append fields after a "-", which a version-00 parser ignores.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16
_MAX_TRACEPARENT = 512  # far above any real header; a longer value is not parsed at all


def parse_traceparent(value: str | None) -> TraceRef | None:
    """The span a W3C ``traceparent`` header names, or None when it names none.

    None for: no header; a value that is not ``version-traceid-parentid-flags`` in lowercase
    hex; version ``ff`` (invalid by the spec); version ``00`` with anything after the flags;
    an all-zero trace id or span id. Never raises.
    """
    if value is None or len(value) > _MAX_TRACEPARENT:
        return None
    match = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if match is None:
        return None
    version, trace_id, span_id, _flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE_ID or span_id == _ZERO_SPAN_ID:
        return None
    return TraceRef(trace_id=trace_id, span_id=span_id)


def match_route(routes: Iterable[Route], path: str) -> Route | None:
    """The first route whose glob matches ``path`` (query string excluded)."""
    for route in routes:
        if fnmatch.fnmatchcase(path, route.match):
            return route
    return None


class _Inflater:
    """Incremental gzip/deflate decoding, bounded so a compressed bomb cannot grow memory."""

    def __init__(self, encoding: str) -> None:
        # wbits 47 = auto-detect zlib or gzip header; raw deflate is tried when zlib fails.
        self._obj = zlib.decompressobj(47 if encoding == "gzip" else zlib.MAX_WBITS)
        self._raw_fallback = encoding == "deflate"
        # zlib rejects a raw stream only at its 2-byte header, which may span chunks:
        # the bytes already fed are kept so the raw decoder can start from the beginning.
        self._head = b""
        self.failed = False

    def decode(self, chunk: bytes, budget: int) -> bytes:
        if self.failed:
            return b""
        try:
            out = self._obj.decompress(chunk, max(budget, 1))
        except zlib.error:
            if self._raw_fallback and len(self._head) < 2:
                self._raw_fallback = False
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.decode(self._head + chunk, budget)
            self.failed = True
            return b""
        if self._raw_fallback and len(self._head) < 2:
            self._head += chunk[: 2 - len(self._head)]
        return out


class StreamCollector:
    """Analysis of one exchange. ``feed`` body chunks in order, then ``finish`` once.

    ``schemas`` compiles the JSON Schemas that outputs are checked against; one per
    process is enough (the default is shared).
    """

    def __init__(
        self, exchange: Exchange, config: Config, *, schemas: SchemaCache | None = None
    ) -> None:
        self._exchange = exchange
        self._limits = config.limits
        self._analysis = config.analysis
        self._schemas = schemas if schemas is not None else _SHARED_SCHEMAS
        path = exchange.path.split("?", 1)[0]
        route = match_route(config.routes, path)
        self._contract = route.contract_schema if route else None
        self.route = route.name if route else OTHER_ROUTE
        provider = route.provider if route else "auto"
        if provider == "auto":
            provider = detect_provider(path, exchange.content_type)
        self.provider = provider
        framing = route.framing if route else "auto"
        if framing == "auto":
            framing = detect_framing(exchange.content_type, provider)
        self.framing = framing
        # A JSON array is a stream where the method streams (Gemini's :streamGenerateContent).
        self._streamed = framing in _STREAM_FRAMINGS or (
            framing == "json_array" and path.endswith(":streamGenerateContent")
        )
        self._decoder: Decoder = make_decoder(framing, self._limits.max_frame_bytes)
        self._adapter = make_adapter(provider)
        # The token shortcut: a chunk that is one whole SSE event holding one content token
        # goes from the decoder to the adapter as bytes and into the state as text, with no
        # frame, event or list in between. Over the bench's token chunks in a tight loop,
        # decoder to state cost 5.0-5.2 µs a chunk frame by frame and 2.4 this way.
        self._sse = self._decoder if isinstance(self._decoder, SSEDecoder) else None
        self._state = StreamState()
        self._extract = route.extract if route else Extract()
        self._inflater: _Inflater | None = None
        self._errors: list[str] = []
        encoding = (exchange.content_encoding or "identity").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._inflater = _Inflater("deflate" if encoding == "deflate" else "gzip")
        elif encoding != "identity":
            self._errors.append("unsupported_encoding")
        self._analysing = encoding in ("identity", "gzip", "x-gzip", "deflate")
        self._analysed_bytes = 0
        self._wire_bytes = 0
        self._first_byte_ns: int | None = None
        self.truncated = False

    def feed(self, chunk: bytes, t: int) -> None:
        if self._first_byte_ns is None:
            self._first_byte_ns = t
        self._wire_bytes += len(chunk)
        if not self._analysing:
            return
        budget = self._limits.max_response_bytes - self._analysed_bytes
        if self._inflater is not None:
            chunk = self._inflater.decode(chunk, budget + 1)
            if self._inflater.failed:
                self._stop("bad_encoding")
                return
        if len(chunk) > budget:
            chunk = chunk[:budget]
            self.truncated = True
        self._analysed_bytes += len(chunk)
        if chunk:
            sse = self._sse
            if sse is not None and (data := sse.whole_event(chunk)) is not None:
                text = self._adapter.token(data)
                if text is None:
                    self._consume((sse.frame(data, t),))
                else:
                    self._state.content(text, t)
            else:
                self._consume(self._decoder.feed(chunk, t))
        if self.truncated:
            self._analysing = False

    def _stop(self, reason: str) -> None:
        self._errors.append(reason)
        self._analysing = False

    def _consume(self, frames: Iterable[object]) -> None:
        adapt, apply = self._adapter.feed, self._state.apply
        for frame in frames:
            for event in adapt(frame):  # type: ignore[arg-type]
                apply(event)

    def finish(
        self,
        end_ns: int,
        *,
        client_aborted: bool = False,
        upstream_aborted: bool = False,
        shed: bool = False,
        error_type: str | None = None,
    ) -> StreamRecord:
        """Close the decoders and freeze everything known into a checked record."""
        if self._analysing:
            self._consume(self._decoder.close(end_ns))
        exchange, state = self._exchange, self._state
        # A sniffing adapter learns the provider from the response itself.
        self.provider = getattr(self._adapter, "provider", None) or self.provider
        facts, prompt_class = self._request_facts()
        errors = [*self._errors, *(e.reason for e in self._decoder.errors)]
        delta_ns = tuple(state.delta_ns)
        first_delta_ns = delta_ns[0] if delta_ns else None
        ttft_s = None if first_delta_ns is None else (first_delta_ns - exchange.start_ns) / 1e9
        record = StreamRecord(
            route=self.route,
            provider=self.provider,
            model=state.model or facts.model or "unknown",
            prompt_class=prompt_class,
            request=facts,
            status=exchange.status,
            start_ns=exchange.start_ns,
            end_ns=end_ns,
            response_ns=exchange.response_ns,
            first_byte_ns=self._first_byte_ns,
            first_delta_ns=first_delta_ns,
            delta_ns=delta_ns,
            first_reasoning_ns=state.first_reasoning_ns,
            output_text=state.output_text,
            tool_calls=state.tool_calls(),
            provider_tools=tuple(state.provider_tools),
            usage=Usage(state.usage_in, state.usage_out, state.usage_reasoning),
            finish_reason=state.finish_reason,
            done=state.done,
            streamed=self._streamed,
            error_type=error_type or _error_type(exchange.status, state.errors, client_aborted),
            ratelimit_source=exchange.ratelimit_source,
            client_aborted=client_aborted,
            upstream_aborted=upstream_aborted,
            shed=shed,
            truncated=self.truncated,
            malformed_frames=state.malformed,
            decode_errors=tuple(errors),
            response_bytes=self._wire_bytes,
            trace=parse_traceparent(exchange.traceparent),
            continuity=_continuity(
                delta_ns,
                ttft_s,
                self._analysis.stall_threshold_s,
                left_early=client_aborted or shed,
            ),
        )
        # What check_record does, building the record once where nothing had to be structured.
        validity = validate_record(record, contract=self._contract, cache=self._schemas)
        return dataclasses.replace(record, validity=tuple(validity)) if validity else record

    def _request_facts(self) -> tuple[RequestFacts, str]:
        exchange = self._exchange
        if exchange.request_body is None:
            return unanalysed(
                exchange.request_skip,
                body_bytes=exchange.request_bytes,
                long_context_tokens=self._analysis.long_context_tokens,
            )
        return extract_request(
            exchange.request_body,
            self.provider,
            self._extract,
            long_context_tokens=self._analysis.long_context_tokens,
            path=exchange.path,
        )


def check_record(
    record: StreamRecord,
    *,
    stall_threshold_s: float,
    contract: dict[str, Any] | None,
    schemas: SchemaCache,
) -> StreamRecord:
    """``record`` with its ``continuity`` and ``validity`` filled in.

    Continuity is left out (None) when the stream's timing is not the model's: the client
    went away mid-stream, or the tap shed some of its chunks. ``validate_record`` leaves out
    the outputs it cannot judge in the same way. A stall is a gap longer than
    ``stall_threshold_s``; ``contract`` is the route's, if it has one.
    """
    continuity = _continuity(
        record.delta_ns,
        record.ttft_s,
        stall_threshold_s,
        left_early=record.client_aborted or record.shed,
    )
    validity = tuple(validate_record(record, contract=contract, cache=schemas))
    return dataclasses.replace(record, continuity=continuity, validity=validity)


def _continuity(
    delta_ns: tuple[int, ...], ttft_s: float | None, stall_threshold_s: float, *, left_early: bool
) -> Continuity | None:
    """None when the stream's timing is partial: the client left, or the tap shed chunks."""
    return None if left_early else continuity_of(delta_ns, ttft_s, stall_threshold_s)


def _error_type(status: int, stream_errors: list[str], client_aborted: bool) -> str | None:
    """A client that left is ``client_aborted``, whatever it had been sent (``status_class``
    still says what that was); then HTTP errors by status code, and an error inside a 2xx
    stream by the provider's type."""
    if client_aborted:
        return CLIENT_ABORTED
    if status >= 400:
        return str(status)
    if stream_errors:
        return stream_errors[0]
    return None
