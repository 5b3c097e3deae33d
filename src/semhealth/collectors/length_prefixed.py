"""Length-prefixed binary frames: a 4-byte big-endian unsigned length, then that many bytes.

This is the bare framing only. gRPC and Connect put a flags byte before the
length (a 5-byte prefix) and AWS event streams count the prelude in the length;
neither is this framing.

A zero length is a frame with empty data: the framing allows it and the
adapter decides what it means. A length over ``max_frame_bytes`` leaves no way
to find the next frame, so the decoder records ``frame_too_large`` at the
prefix's offset and from then on ignores its input, holding nothing.
"""

from __future__ import annotations

import struct

from semhealth.collectors.frames import DecodeError, Frame

_PREFIX = struct.Struct(">I")


class LengthPrefixedDecoder:
    """Sans-IO decoder of 4-byte big-endian length-prefixed frames."""

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be at least 1, got {max_frame_bytes}")
        self._max = max_frame_bytes
        self._errors: list[DecodeError] = []
        self._buf = bytearray()
        self._offset = 0  # stream offset of self._buf[0]
        self._broken = False
        self._closed = False

    @property
    def errors(self) -> list[DecodeError]:
        return list(self._errors)

    def feed(self, chunk: bytes, t: int) -> list[Frame]:
        if self._broken or self._closed or not chunk:
            return []
        buf = self._buf
        buf += chunk
        out: list[Frame] = []
        pos = 0
        end = len(buf)
        while end - pos >= _PREFIX.size:
            (length,) = _PREFIX.unpack_from(buf, pos)
            if length > self._max:
                self._errors.append(DecodeError("frame_too_large", self._offset + pos))
                self._broken = True
                buf.clear()
                return out
            stop = pos + _PREFIX.size + length
            if stop > end:
                break
            out.append(Frame(data=bytes(buf[pos + _PREFIX.size : stop]), t=t))
            pos = stop
        if pos:
            del buf[:pos]
            self._offset += pos
        return out

    def close(self, t: int) -> list[Frame]:
        """End of stream: a partial frame left over is reported, never emitted."""
        if self._closed:
            return []
        self._closed = True
        if self._buf:
            self._errors.append(DecodeError("incomplete", self._offset))
            self._buf.clear()
        return []
