"""A plain, non-streamed response body: one frame holding all of it.

The body is only whole at end of stream, so the frame comes from ``close``; its
``t`` is the arrival of the body's last byte. A body over ``max_frame_bytes``
gives ``frame_too_large`` (offset 0, where the frame starts) and no frame, and
nothing more is held once the limit is passed. An empty body is no frame.
"""

from __future__ import annotations

from semhealth.collectors.frames import DecodeError, Frame


class JSONBodyDecoder:
    """Sans-IO decoder that frames a whole response body as one message."""

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be at least 1, got {max_frame_bytes}")
        self._max = max_frame_bytes
        self._errors: list[DecodeError] = []
        self._parts: list[bytes] = []
        self._size = 0
        self._last_t = 0
        self._too_large = False
        self._closed = False

    @property
    def errors(self) -> list[DecodeError]:
        return list(self._errors)

    def feed(self, chunk: bytes, t: int) -> list[Frame]:
        if self._too_large or self._closed or not chunk:
            return []
        self._size += len(chunk)
        if self._size > self._max:
            self._errors.append(DecodeError("frame_too_large", 0))
            self._too_large = True
            self._parts.clear()
            return []
        self._parts.append(chunk)
        self._last_t = t
        return []

    def close(self, t: int) -> list[Frame]:
        if self._closed:
            return []
        self._closed = True
        if not self._parts:
            return []
        body = b"".join(self._parts)
        self._parts.clear()
        return [Frame(data=body, t=self._last_t)]
