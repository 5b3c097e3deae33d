"""Newline-delimited JSON (NDJSON / JSON Lines), one frame per line.

Lines end in LF; a CR before it is dropped, and lines holding only JSON
whitespace are skipped. ``Frame.data`` is the line's bytes, unparsed: the
adapters parse. Servers often leave out the final newline, so an unterminated
last line is a frame at ``close``; its ``t`` is the arrival of its last byte,
since end of stream adds nothing to it.

A line longer than ``max_frame_bytes`` (not counting its CR LF) is skipped up to
the next LF with one ``frame_too_large`` error at the line's offset; only its
size is kept meanwhile.
"""

from __future__ import annotations

from semhealth.collectors.frames import DecodeError, Frame

_JSON_SPACE = b" \t\r"


class NDJSONDecoder:
    """Sans-IO NDJSON decoder; see the module docstring for the rules."""

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be at least 1, got {max_frame_bytes}")
        self._max = max_frame_bytes
        self._errors: list[DecodeError] = []
        self._closed = False
        # The unterminated line: its pieces, its size, where it starts, when its last byte came.
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._pending_t = 0
        self._offset = 0
        self._line_dropped = False

    @property
    def errors(self) -> list[DecodeError]:
        return list(self._errors)

    def feed(self, chunk: bytes, t: int) -> list[Frame]:
        if self._closed or not chunk:
            return []
        newline = chunk.find(b"\n")
        if newline < 0:
            self._hold(chunk, t)
            return []
        if self._line_dropped:
            self._offset += self._pending_size + newline + 1
            self._pending_size = 0
            self._line_dropped = False
            chunk = chunk[newline + 1 :]
        elif self._pending:
            chunk = b"".join((*self._pending, chunk))
            self._pending.clear()
            self._pending_size = 0
        lines = chunk.split(b"\n")
        tail = lines.pop()
        out: list[Frame] = []
        for line in lines:
            start = self._offset
            self._offset = start + len(line) + 1
            self._emit(line, start, t, out)
        if tail:
            self._hold(tail, t)
        return out

    def close(self, t: int) -> list[Frame]:
        """End of stream: an unterminated last line is still a line."""
        if self._closed:
            return []
        self._closed = True
        out: list[Frame] = []
        if self._pending:
            self._emit(b"".join(self._pending), self._offset, self._pending_t, out)
            self._pending.clear()
        return out

    def _hold(self, piece: bytes, t: int) -> None:
        self._pending_size += len(piece)
        if self._line_dropped:
            return
        # One byte of slack: a CR that turns out to end the line does not count.
        if self._pending_size > self._max + 1:
            self._errors.append(DecodeError("frame_too_large", self._offset))
            self._pending.clear()
            self._line_dropped = True
            return
        self._pending.append(piece)
        self._pending_t = t

    def _emit(self, line: bytes, start: int, t: int, out: list[Frame]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self._max:
            self._errors.append(DecodeError("frame_too_large", start))
        elif line.strip(_JSON_SPACE):
            out.append(Frame(data=line, t=t))
