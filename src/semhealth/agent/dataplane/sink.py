"""What the relay hands analysis: one handle per exchange, fed chunk copies, closed once.

Two sinks implement it: the in-process ``Tap`` (tests, the demo, embedding) and the
``WireTap`` that frames copies for the analysis process. Neither may block or raise into
the relay: a sink that cannot keep up sheds and counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from semhealth.collectors.collector import Exchange


@dataclass(slots=True, kw_only=True)
class Outcome:
    """How an exchange ended, from the relay's side."""

    end_ns: int
    client_aborted: bool = False
    upstream_aborted: bool = False
    error_type: str | None = None


class StreamTap(Protocol):
    def offer(self, chunk: bytes, t: int) -> None:
        """A copy of body bytes already written to the client, with their arrival time."""

    def close(self, outcome: Outcome) -> None:
        """The exchange ended; called once."""


class TapSink(Protocol):
    def open_stream(self, exchange: Exchange) -> StreamTap: ...

    def unanalysed(self, reason: str) -> None:
        """A request forwarded without its body copied for analysis (``oversized``)."""
