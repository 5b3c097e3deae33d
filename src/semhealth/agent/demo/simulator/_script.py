"""Scripts: what one simulated response says and when, in provider-neutral terms."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

FINISH_REASONS = ("stop", "length", "tool_calls")

_EMPTY_HEADERS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolScript:
    """One tool call: its name and its JSON arguments, streamed as ``pieces``.

    ``id`` is the call id the wire shows (``call_...``/``toolu_...``); None derives one.
    """

    name: str
    pieces: tuple[str, ...] = ()
    id: str | None = None

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    """What one response does, in provider-neutral terms; each wire format renders it.

    Deltas are the text ``pieces`` then the tool's argument pieces. ``ttft_s`` is the delay
    from the response head to the first delta; ``gaps_s`` the delay before each later delta
    (a tuple of exactly ``delta_count - 1`` values, or one float for all). ``finish_reason``
    is ``stop``, ``length`` or ``tool_calls`` (None: ``tool_calls`` when a tool is scripted,
    else ``stop``). ``input_tokens`` None estimates from the request body size;
    ``output_tokens`` None counts the deltas; ``reasoning_tokens``, the part of them the model
    spent reasoning, is reported where the wire format has a field for it. A ``status``
    outside 2xx answers a provider-shaped error body of type ``error`` (None: the usual type
    for the status) after ``ttft_s``. ``die_after`` closes the TCP connection after that many
    deltas, without the stream's end markers (a non-streamed body is cut in half). ``model``
    None echoes the request's model.
    """

    pieces: tuple[str, ...] = ()
    ttft_s: float = 0.0
    gaps_s: tuple[float, ...] | float = 0.0
    tool_call: ToolScript | None = None
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    status: int = 200
    error: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY_HEADERS)
    die_after: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        # Frozen means frozen: a caller's dict must not change the script afterwards.
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        _check_timing(self.ttft_s, self.gaps_s, self.delta_count, self.die_after)
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}")
        if not 100 <= self.status <= 599:
            raise ValueError(f"status must be an HTTP status (100-599), got {self.status}")

    @property
    def delta_count(self) -> int:
        return len(self.pieces) + (len(self.tool_call.pieces) if self.tool_call else 0)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def finish(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_call is not None else "stop"

    def delta_offsets(self) -> tuple[float, ...]:
        """Seconds from the response head to each delta, in order."""
        return timing_offsets(self.ttft_s, self.gaps_s, self.delta_count)


@dataclass(frozen=True, slots=True, kw_only=True)
class RawScript:
    """A byte-exact response, whatever the path: ``chunks`` written one per ``write``.

    The first chunk goes ``ttft_s`` after the head, each later one ``gaps_s`` after the one
    before (tuple of ``len(chunks) - 1``, or one float). ``die_after`` closes the connection
    after that many chunks. One chunk goes out with a ``Content-Length``, several chunked
    (unless ``headers`` set a ``Content-Length``), as real servers send a whole body and a
    stream.
    """

    chunks: tuple[bytes, ...]
    ttft_s: float = 0.0
    gaps_s: tuple[float, ...] | float = 0.0
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY_HEADERS)
    content_type: str = "application/octet-stream"
    die_after: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        _check_timing(self.ttft_s, self.gaps_s, len(self.chunks), self.die_after)
        if not 100 <= self.status <= 599:
            raise ValueError(f"status must be an HTTP status (100-599), got {self.status}")


@dataclass(frozen=True, slots=True)
class ScriptRequest:
    """A request as the simulator received it. ``json`` is the parsed body, or None."""

    path: str
    method: str
    headers: Mapping[str, str]
    json: Any
    body: bytes
    query: str = ""  # the query string, undecoded (Gemini's ``alt=sse`` chooses a framing)


ScriptFor = Callable[[ScriptRequest], Script | RawScript]
"""Decides the response to one request; called on the event loop, so it must not block."""


def _check_timing(
    ttft_s: float, gaps_s: tuple[float, ...] | float, count: int, die_after: int | None
) -> None:
    gaps = (gaps_s,) if isinstance(gaps_s, float | int) else gaps_s
    if ttft_s < 0 or any(g < 0 for g in gaps):
        raise ValueError("ttft_s and gaps_s must not be negative")
    if not isinstance(gaps_s, float | int) and len(gaps_s) != max(count - 1, 0):
        raise ValueError(
            f"gaps_s has {len(gaps_s)} values; {count} deltas need {max(count - 1, 0)}"
        )
    if die_after is not None and die_after < 0:
        raise ValueError("die_after must not be negative")


def timing_offsets(
    ttft_s: float, gaps_s: tuple[float, ...] | float, count: int
) -> tuple[float, ...]:
    if count == 0:
        return ()
    gaps = [float(gaps_s)] * (count - 1) if isinstance(gaps_s, float | int) else list(gaps_s)
    return tuple(itertools.accumulate(gaps, initial=ttft_s))
