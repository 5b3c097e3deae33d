"""What the proxy knew of one exchange when its response began: the one type both planes share.

Its own module, so that the forwarding process (the relay, the tap wire) imports it without
the analysis it feeds: framing, adapters, validity and their libraries load in the analysis
process only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Exchange:
    """Facts the proxy knew when the response head arrived. Clock: ``time.monotonic_ns``.

    An exchange that never got a response from the upstream has the proxy's own status
    (502, 504; 499 when the client left first), ``response_ns`` and ``content_type`` None.
    """

    method: str
    path: str
    start_ns: int
    status: int
    content_type: str | None
    content_encoding: str | None
    response_ns: int | None
    request_body: bytes | None  # None when the body was not copied for analysis
    request_skip: str | None = None  # why request_body is None: "oversized", ...
    # The size of a body that was not copied (oversized), as far as it had come when the
    # response began: its prompt class is estimated from it.
    request_bytes: int = 0
    ratelimit_source: str | None = None
    # The request's W3C ``traceparent`` header as sent, unparsed: the relay only copies it
    # (one header lookup per exchange); ``parse_traceparent`` judges it in analysis.
    traceparent: str | None = None
    # Request headers, (name, value) as sent, when the proxy was told to copy them (live
    # shadowing resends them); None otherwise. Never in a repr: they may identify a client.
    request_headers: tuple[tuple[str, str], ...] | None = field(default=None, repr=False)
