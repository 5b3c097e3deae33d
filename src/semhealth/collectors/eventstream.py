"""AWS event streams (``application/vnd.amazon.eventstream``), one frame per message.

Amazon Bedrock Runtime streams ConverseStream and InvokeModelWithResponseStream
this way. A message is a 12-byte prelude (total length, headers length, and a
CRC32 of those 8 bytes, all big-endian uint32), the headers, the payload, and a
CRC32 of everything before it; the total length counts all of it, so the
shortest message is 16 bytes.

``Frame.data`` is the payload's bytes, unparsed: the adapters parse.
``Frame.event`` comes from the ``:message-type`` header:

- ``event`` (or no ``:message-type`` at all): the ``:event-type`` header,
  e.g. ``contentBlockDelta`` or ``chunk``;
- ``exception``: ``"exception:"`` and the ``:exception-type`` header, e.g.
  ``exception:throttlingException``;
- ``error``: ``"error:"`` and the ``:error-code`` header;
- anything else: the message type itself.

A missing header counts as ``""``. Only string headers (type 7) name anything;
the other types are parsed only to find where the next header starts.

Errors, each at the offset where its message starts:

- ``bad_prelude_crc`` and ``bad_length`` (a total length under 16, or headers
  longer than the message holds): the length cannot be trusted, so no later
  message can be found and the decoder ignores the rest of its input.
- ``bad_message_crc`` and ``bad_headers``: the length held, so only that
  message is dropped.
- ``frame_too_large`` (headers and payload over ``max_frame_bytes``): the
  message is dropped and its bytes are counted off as they arrive, never held.
- ``incomplete``: the stream ended inside a message, an oversized one included
  (that one then has both errors).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping

from semhealth.collectors.frames import DecodeError, Frame

_PRELUDE = struct.Struct(">III")
_UINT16 = struct.Struct(">H")
_UINT32 = struct.Struct(">I")
_PRELUDE_CRC_END = 8  # the prelude CRC covers the two lengths before it
_OVERHEAD = _PRELUDE.size + _UINT32.size  # prelude plus message CRC
_STRING = 7
# Value sizes of the fixed-size header types; byte arrays (6) and strings (7)
# carry their own uint16 length.
_FIXED_SIZES = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
_VARIABLE = frozenset({6, _STRING})


class EventStreamDecoder:
    """Sans-IO AWS event stream decoder; see the module docstring for the rules."""

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be at least 1, got {max_frame_bytes}")
        self._max = max_frame_bytes
        self._errors: list[DecodeError] = []
        self._buf = bytearray()
        self._offset = 0  # stream offset of self._buf[0]
        # Bytes of an oversized message still to come, and where that message started.
        self._skip = 0
        self._skip_start = 0
        self._broken = False
        self._closed = False

    @property
    def errors(self) -> list[DecodeError]:
        return list(self._errors)

    def feed(self, chunk: bytes, t: int) -> list[Frame]:
        if self._broken or self._closed or not chunk:
            return []
        piece = memoryview(chunk)
        if self._skip:
            dropped = min(self._skip, len(piece))
            self._skip -= dropped
            self._offset += dropped
            piece = piece[dropped:]
        self._buf += piece
        out: list[Frame] = []
        # The view must be let go before the bytearray can shrink.
        with memoryview(self._buf) as view:
            pos = self._decode(view, t, out)
        if self._broken:
            self._buf.clear()
        elif pos:
            # bytearray drops a prefix by moving its start, not by copying what is left.
            del self._buf[:pos]
            self._offset += pos
        return out

    def close(self, t: int) -> list[Frame]:
        """End of stream: a partial message left over is reported, never emitted."""
        if self._closed:
            return []
        self._closed = True
        if self._skip:
            self._errors.append(DecodeError("incomplete", self._skip_start))
        elif self._buf:
            self._errors.append(DecodeError("incomplete", self._offset))
        self._buf.clear()
        return []

    def _decode(self, view: memoryview, t: int, out: list[Frame]) -> int:
        """Frame every whole message in ``view``; returns how many bytes were used up."""
        pos = 0
        end = len(view)
        while end - pos >= _PRELUDE.size:
            start = self._offset + pos
            total, headers_length, prelude_crc = _PRELUDE.unpack_from(view, pos)
            if zlib.crc32(view[pos : pos + _PRELUDE_CRC_END]) != prelude_crc:
                self._break("bad_prelude_crc", start)
                return pos
            if total < _OVERHEAD or headers_length > total - _OVERHEAD:
                self._break("bad_length", start)
                return pos
            if total - _OVERHEAD > self._max:
                self._errors.append(DecodeError("frame_too_large", start))
                if total > end - pos:
                    self._skip = total - (end - pos)
                    self._skip_start = start
                    return end
            elif total > end - pos:
                break
            else:
                self._read_message(
                    view[pos : pos + total], headers_length, prelude_crc, start, t, out
                )
            pos += total
        return pos

    def _break(self, reason: str, start: int) -> None:
        self._errors.append(DecodeError(reason, start))
        self._broken = True

    def _read_message(
        self,
        message: memoryview,
        headers_length: int,
        prelude_crc: int,
        start: int,
        t: int,
        out: list[Frame],
    ) -> None:
        body_end = len(message) - _UINT32.size
        (message_crc,) = _UINT32.unpack_from(message, body_end)
        # The prelude CRC, already checked, is the CRC of its first 8 bytes: carry on from it.
        if zlib.crc32(message[_PRELUDE_CRC_END:body_end], prelude_crc) != message_crc:
            self._errors.append(DecodeError("bad_message_crc", start))
            return
        headers_end = _PRELUDE.size + headers_length
        headers = _string_headers(message[_PRELUDE.size : headers_end])
        if headers is None:
            self._errors.append(DecodeError("bad_headers", start))
            return
        out.append(Frame(data=bytes(message[headers_end:body_end]), t=t, event=_event(headers)))


def _string_headers(block: memoryview) -> dict[str, str] | None:
    """The string-valued headers in ``block``, or ``None`` where the block does not parse."""
    headers: dict[str, str] = {}
    pos = 0
    end = len(block)
    try:
        while pos < end:
            name_end = pos + 1 + block[pos]
            if name_end >= end:  # no room left for the type byte
                return None
            name = str(block[pos + 1 : name_end], "utf-8")
            kind = block[name_end]
            pos = name_end + 1
            if kind in _VARIABLE:
                (size,) = _UINT16.unpack_from(block, pos)
                pos += _UINT16.size
            elif kind in _FIXED_SIZES:
                size = _FIXED_SIZES[kind]
            else:
                return None
            if pos + size > end:
                return None
            if kind == _STRING:
                headers[name] = str(block[pos : pos + size], "utf-8")
            pos += size
    except (struct.error, UnicodeDecodeError):
        return None
    return headers


def _event(headers: Mapping[str, str]) -> str:
    message_type = headers.get(":message-type", "event")
    if message_type == "event":
        return headers.get(":event-type", "")
    if message_type == "exception":
        return "exception:" + headers.get(":exception-type", "")
    if message_type == "error":
        return "error:" + headers.get(":error-code", "")
    return message_type


def encode_event_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event stream message with string ``headers``, in order, and ``payload``.

    For tests and simulated upstreams. A header name over 255 bytes or a value
    over 65535 bytes cannot be written and raises ``ValueError``.
    """
    block = b"".join(_string_header(name, value) for name, value in headers.items())
    total = _OVERHEAD + len(block) + len(payload)
    lengths = _UINT32.pack(total) + _UINT32.pack(len(block))
    body = lengths + _UINT32.pack(zlib.crc32(lengths)) + block + payload
    return body + _UINT32.pack(zlib.crc32(body))


def event_message(event_type: str, payload: bytes) -> bytes:
    """An ``event`` message of ``event_type`` with a JSON payload, as Bedrock sends it."""
    return encode_event_message(
        {
            ":event-type": event_type,
            ":content-type": "application/json",
            ":message-type": "event",
        },
        payload,
    )


def exception_message(exception_type: str, payload: bytes) -> bytes:
    """An ``exception`` message of ``exception_type`` with a JSON payload, as Bedrock sends it."""
    return encode_event_message(
        {
            ":exception-type": exception_type,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        payload,
    )


def _string_header(name: str, value: str) -> bytes:
    raw_name = name.encode()
    raw_value = value.encode()
    if len(raw_name) > 0xFF:
        raise ValueError(f"header name is {len(raw_name)} bytes, over 255")
    if len(raw_value) > 0xFFFF:
        raise ValueError(f"header {name!r} value is {len(raw_value)} bytes, over 65535")
    return (
        bytes((len(raw_name),))
        + raw_name
        + bytes((_STRING,))
        + _UINT16.pack(len(raw_value))
        + raw_value
    )
