"""A streamed top-level JSON array, one frame per element.

This is how Google's Gemini API streams ``:streamGenerateContent`` without
``alt=sse``: ``[{...}\\n,\\r\\n{...}\\n,\\r\\n{...}]``, the array's bytes cut
anywhere. Each element is a frame as soon as its last byte arrives, so its
``t`` is the arrival of the chunk holding that byte. ``Frame.data`` is the
element's bytes exactly as sent, without the comma and whitespace around it,
unparsed: the adapters parse, and decide what an element that is not an object
means. Nested arrays, strings and scalars are elements like objects are.

Only the structure needed to find element boundaries is read: strings with
their backslash escapes, and the depth of brackets and braces (of either kind:
crossed brackets end an element where its depth returns to zero and the frame
then fails to parse in the adapter). A scalar element (number, ``true``,
``false``, ``null``) is a run of ``[-+.0-9A-Za-z]`` bytes starting with a byte
that can start one; as it has no closing byte it is a frame when the byte after
it arrives, with the ``t`` of its own last byte.

A body that is not an array is accepted too, since Gemini answers errors, and
``:generateContent`` answers, with one object: a top-level object is one frame
when its closing brace arrives; any other body (a string, a number, a text or
HTML error page) is one frame at ``close``, its leading and trailing JSON
whitespace left out, like the whole-body decoder frames it. An empty or
all-whitespace stream is no frame and no error.

Errors, never raised (``DecodeError.offset`` is a byte offset in the stream):

- ``frame_too_large``: an element (or the whole non-array body) is over
  ``max_frame_bytes``. It is reported at the element's first byte and dropped;
  only its structure is tracked, nothing of it is held, and framing resumes
  after it, at the next comma or closing bracket of the array.
- ``bad_json``: a byte that cannot start or continue the array's structure
  where it stands (anything but a comma or ``]`` after an element, a missing
  element after ``[`` or a comma). Nothing further is framed.
- ``trailing_data``: anything but whitespace after the top-level array or
  object. Nothing further is framed.
- ``incomplete``: at ``close`` the array or top-level object is unfinished.
  It is reported at the first byte of the unfinished element, or at the end of
  the stream when the stream stopped between elements; a partial element is
  never a frame.
"""

from __future__ import annotations

import re

from semhealth.collectors.frames import DecodeError, Frame

# From the first byte on, a string's rest up to and including its closing quote;
# group 1 is the quote, group 2 a backslash cut off from what it escapes by the
# chunk's end. Possessive, so a chunk is scanned once, without backtracking.
_STRING_REST = re.compile(rb'(?:[^"\\]++|\\.)*+(?:(")|(\\)?\Z)', re.DOTALL)
# Inside an element: the next bracket, or the next whole string (groups as above),
# jumping over everything else in one step.
_TOKEN = re.compile(rb'[\[\]{}]|"(?:[^"\\]++|\\.)*+(?:(")|(\\)?\Z)', re.DOTALL)
_SPACE = re.compile(rb"[ \t\r\n]*+")
_SCALAR = re.compile(rb"[-+.0-9A-Za-z]*+")
_SCALAR_START = frozenset(b"-0123456789tfn")
_JSON_SPACE = b" \t\r\n"
_OPEN = frozenset(b"[{")
_QUOTE = 0x22
_COMMA = 0x2C
_LBRACKET = 0x5B
_RBRACKET = 0x5D
_LBRACE = 0x7B

# Where the scan stands.
_START = 0  # before the top-level value
_FIRST = 1  # after "[": an element or "]"
_NEXT = 2  # after ",": an element
_ELEMENT = 3  # inside an element that is a container or a string
_SCALAR_ELEMENT = 4  # inside a scalar element
_AFTER = 5  # after an element: "," or "]"
_DONE = 6  # after the top-level array or object: whitespace only
_BODY = 7  # a body that is neither array nor object: held whole until close
_STOPPED = 8  # after bad_json or trailing_data: input ignored


def _match_end(pattern: re.Pattern[bytes], buf: bytes, pos: int) -> int:
    """End of ``pattern``'s match at ``pos``; the patterns it is used with match the empty run."""
    m = pattern.match(buf, pos)
    return pos if m is None else m.end()


class JSONArrayDecoder:
    """Sans-IO decoder of a streamed JSON array; see the module docstring for the rules."""

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be at least 1, got {max_frame_bytes}")
        self._max = max_frame_bytes
        self._errors: list[DecodeError] = []
        self._closed = False
        self._state = _START
        self._offset = 0  # stream offset of the next chunk's first byte
        # The element being read: its pieces so far, their size, its stream offset,
        # when its latest byte came, and whether it was dropped for its size.
        self._parts: list[bytes] = []
        self._size = 0
        self._start = 0
        self._last_t = 0
        self._dropped = False
        # Its structure where the last chunk ended.
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._top_level = False  # the element is the top-level object, not an array's element
        # A non-array, non-object body: its size up to its last non-whitespace byte.
        self._body_size = 0

    @property
    def errors(self) -> list[DecodeError]:
        return list(self._errors)

    def feed(self, chunk: bytes, t: int) -> list[Frame]:
        if self._closed or self._state == _STOPPED or not chunk:
            return []
        out: list[Frame] = []
        base = self._offset
        self._offset += len(chunk)
        n = len(chunk)
        i = 0
        seg = 0  # where the open element's bytes in this chunk begin
        while i < n:
            state = self._state
            if state == _ELEMENT:
                end = self._scan(chunk, i)
                if end < 0:
                    break
                self._finish(chunk, seg, end, t, out)
                self._state = _DONE if self._top_level else _AFTER
                i = end
            elif state == _SCALAR_ELEMENT:
                end = _match_end(_SCALAR, chunk, i)
                if end == n:
                    break
                self._finish(chunk, seg, end, t, out)
                self._state = _AFTER
                i = end
            elif state == _BODY:
                break
            else:
                i = _match_end(_SPACE, chunk, i)
                if i == n:
                    break
                byte = chunk[i]
                if state == _AFTER:
                    if byte == _COMMA:
                        self._state = _NEXT
                    elif byte == _RBRACKET:
                        self._state = _DONE
                    else:
                        self._stop("bad_json", base + i)
                        break
                    i += 1
                elif state == _DONE:
                    self._stop("trailing_data", base + i)
                    break
                elif state == _START and byte == _LBRACKET:
                    self._state = _FIRST
                    i += 1
                elif state == _START and byte != _LBRACE:
                    self._begin(base + i, _BODY)
                    seg = i
                    break
                elif state == _FIRST and byte == _RBRACKET:
                    self._state = _DONE
                    i += 1
                elif byte in _OPEN or byte == _QUOTE:
                    self._begin(base + i, _ELEMENT)
                    self._top_level = state == _START
                    self._depth = 0 if byte == _QUOTE else 1
                    self._in_string = byte == _QUOTE
                    seg = i
                    i += 1
                elif byte in _SCALAR_START:
                    self._begin(base + i, _SCALAR_ELEMENT)
                    seg = i
                else:
                    self._stop("bad_json", base + i)
                    break
        if self._state == _BODY:
            self._hold_body(chunk[seg:], t)
        elif self._state in (_ELEMENT, _SCALAR_ELEMENT) and seg < n:
            self._hold(chunk[seg:], t)
        return out

    def close(self, t: int) -> list[Frame]:
        """End of stream: it completes a non-array body; anything else open is ``incomplete``."""
        if self._closed:
            return []
        self._closed = True
        out: list[Frame] = []
        state = self._state
        if state == _BODY:
            if not self._dropped:
                body = b"".join(self._parts)[: self._body_size]
                out.append(Frame(data=body, t=self._last_t))
        elif state in (_ELEMENT, _SCALAR_ELEMENT):
            self._errors.append(DecodeError("incomplete", self._start))
        elif state in (_FIRST, _NEXT, _AFTER):
            self._errors.append(DecodeError("incomplete", self._offset))
        self._parts.clear()
        return out

    def _begin(self, offset: int, state: int) -> None:
        self._state = state
        self._start = offset
        self._size = 0
        self._dropped = False
        self._escape = False

    def _scan(self, buf: bytes, i: int) -> int:
        """Follow the open element through ``buf`` from ``i``: the index past its end, or -1."""
        if self._in_string:
            if self._escape:
                # The byte a backslash at the end of the last chunk escapes.
                self._escape = False
                i += 1
            m = _STRING_REST.match(buf, i)
            assert m is not None  # the pattern matches any bytes
            if m.group(1) is None:
                self._escape = m.group(2) is not None
                return -1
            i = m.end()
            self._in_string = False
            if self._depth == 0:
                return i  # the element is a string
        depth = self._depth
        search = _TOKEN.search
        while True:
            m = search(buf, i)
            if m is None:
                self._depth = depth
                return -1
            byte = buf[m.start()]
            i = m.end()
            if byte == _QUOTE:
                if m.group(1) is None:
                    self._in_string = True
                    self._escape = m.group(2) is not None
                    self._depth = depth
                    return -1
            elif byte in _OPEN:
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    self._depth = 0
                    return i

    def _hold(self, piece: bytes, t: int) -> None:
        """Keep an unfinished element's piece, or only count it once the element is too large."""
        self._size += len(piece)
        self._last_t = t
        if self._dropped:
            return
        if self._size > self._max:
            self._drop()
            return
        self._parts.append(piece)

    def _finish(self, chunk: bytes, seg: int, end: int, t: int, out: list[Frame]) -> None:
        """The element ends at ``chunk[end]``; its bytes in this chunk start at ``seg``."""
        if end > seg:
            self._last_t = t
        # A scalar may have ended with the last chunk: then its frame keeps that chunk's t.
        if not self._dropped:
            if self._size + end - seg > self._max:
                self._drop()
            else:
                piece = chunk[seg:end]
                data = b"".join((*self._parts, piece)) if self._parts else piece
                out.append(Frame(data=data, t=self._last_t))
        self._parts.clear()
        self._size = 0
        self._dropped = False

    def _hold_body(self, piece: bytes, t: int) -> None:
        """Keep a piece of a non-array body; whitespace at its end is not yet known to be in it."""
        size = self._size
        self._size = size + len(piece)
        rest = len(piece.rstrip(_JSON_SPACE))
        if rest:
            self._body_size = size + rest
            self._last_t = t
            if self._body_size > self._max and not self._dropped:
                self._drop()
        # Past the limit any later byte is trailing whitespace or makes the body too large,
        # so nothing more is needed.
        if not self._dropped and size <= self._max:
            self._parts.append(piece)

    def _drop(self) -> None:
        self._errors.append(DecodeError("frame_too_large", self._start))
        self._dropped = True
        self._parts.clear()

    def _stop(self, reason: str, offset: int) -> None:
        self._errors.append(DecodeError(reason, offset))
        self._state = _STOPPED
        self._parts.clear()
