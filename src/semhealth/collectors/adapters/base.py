"""What every provider adapter is, and the guarded JSON access they share.

An adapter turns the frames of one response into provider-neutral events
(``semhealth.collectors.events``). One instance serves one response and may
keep a little state (which block is a tool call, which model was reported).

Adapters never raise on bad input. Inside, a parse step raises ``FrameError``
the moment a frame stops matching the provider's shape; ``FrameAdapter.feed``
turns it into a single ``Malformed`` event, so one bad frame is counted once
and whatever else it carried is dropped with it. Reasons are short classes
(``json``, ``shape``), never content.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from semhealth.collectors.events import AdapterEvent, Malformed, ModelReport, UsageReport
from semhealth.collectors.frames import Frame

JsonObject = dict[str, Any]

JSON = "json"  # the frame is not JSON
SHAPE = "shape"  # JSON, but not the shape the provider sends

# Error types may end up as a label; a provider that put free text there must not blow it up.
_MAX_ERROR_TYPE = 64


class Adapter(Protocol):
    """Turns one response's frames, in order, into adapter events."""

    def feed(self, frame: Frame) -> list[AdapterEvent]: ...

    def token(self, data: bytes) -> str | None:
        """The text of a frame whose data (as bytes) is one content token and nothing else,
        exactly as ``feed`` would read it (``[ContentDelta(text)]``, the adapter's state
        unchanged); None, with nothing changed, for any other frame, which then goes to
        ``feed``. A shortcut for the frames nearly every token stream is made of."""
        ...


class FrameError(Exception):
    """Internal: the frame being parsed is malformed. Never leaves an adapter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FrameAdapter(ABC):
    """Base of the JSON adapters: blank frames are skipped, malformed ones become ``Malformed``."""

    def __init__(self) -> None:
        self._model: str | None = None

    def feed(self, frame: Frame) -> list[AdapterEvent]:
        # Keep-alive blank lines carry nothing; they are not malformed. (Only a frame that
        # starts blank is stripped: copying every token's frame to look cost 0.15 µs.)
        data = frame.data
        if not data or (data[:1].isspace() and not data.strip()):
            return []
        try:
            return self._parse(frame)
        except FrameError as exc:
            return [Malformed(exc.reason)]

    def token(self, data: bytes) -> str | None:
        return None  # no shortcut: every frame goes to feed

    @abstractmethod
    def _parse(self, frame: Frame) -> list[AdapterEvent]:
        """Events of one non-blank frame; raises ``FrameError`` on a malformed one."""

    def _note_model(self, model: str | None, out: list[AdapterEvent]) -> None:
        # Providers repeat the model in every chunk: report it once, and again only on a change.
        if model and model != self._model:
            self._model = model
            out.append(ModelReport(model))


def load_json(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise FrameError(JSON) from exc


def load_object(data: str | bytes) -> JsonObject:
    return as_object(load_json(data))


def dump_json(value: object) -> str:
    """Re-serialise a parsed value (tool input given as an object rather than a string)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        # orjson reads deeper nesting than it writes; such a value is not a real tool input.
        raise FrameError(SHAPE) from exc


def as_object(value: object) -> JsonObject:
    if isinstance(value, dict):
        return value
    raise FrameError(SHAPE)


def objects(values: list[Any]) -> Iterator[JsonObject]:
    """The items of a JSON array that must hold objects."""
    for value in values:
        yield as_object(value)


def opt_str(obj: JsonObject, key: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise FrameError(SHAPE)


def opt_int(obj: JsonObject, key: str) -> int | None:
    """A non-negative integer field (counts, indices); JSON booleans are not integers here."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise FrameError(SHAPE)


def opt_bool(obj: JsonObject, key: str) -> bool | None:
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise FrameError(SHAPE)


def opt_object(obj: JsonObject, key: str) -> JsonObject | None:
    value = obj.get(key)
    return None if value is None else as_object(value)


def opt_list(obj: JsonObject, key: str) -> list[Any] | None:
    value = obj.get(key)
    if value is None or isinstance(value, list):
        return value
    raise FrameError(SHAPE)


def usage_report(
    input_tokens: int | None, output_tokens: int | None, reasoning_tokens: int | None = None
) -> list[AdapterEvent]:
    """A ``UsageReport`` when at least one count is known, else nothing."""
    if input_tokens is None and output_tokens is None and reasoning_tokens is None:
        return []
    return [
        UsageReport(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            reasoning_tokens=reasoning_tokens,
        )
    ]


def add_counts(*counts: int | None) -> int | None:
    """The sum of the counts a provider gave, None when it gave none (absent is not zero)."""
    known = [count for count in counts if count is not None]
    return sum(known) if known else None


def error_type(
    error: object, default: str = "error", keys: tuple[str, ...] = ("type", "code")
) -> str:
    """The machine-readable class of an error object: its ``type``, else its ``code``
    (another provider may name other ``keys``: Google's ``status``).

    The message is never read. A bare string error (Ollama, TGI, some proxies)
    is a message, so it yields ``default``.
    """
    if isinstance(error, dict):
        for key in keys:
            value = error.get(key)
            if isinstance(value, str) and value:
                return value[:_MAX_ERROR_TYPE]
            if isinstance(value, int) and not isinstance(value, bool):
                return str(value)
    return default
