"""Incremental JSON syntax checker: follows a streamed output and knows, at the first bad
character, that it can no longer become a valid document.

``JSONChecker`` is sans-IO. ``feed`` it the decoded text deltas of one output as they
arrive, any number of times, then call ``finish`` once at the end:

- ``valid``: one whole RFC 8259 value, optionally surrounded by whitespace;
- ``incomplete``: everything seen is the start of some valid document, but the input
  ended inside it (or before it: an empty output is ``incomplete``);
- ``syntax``: some character can continue no valid document. ``error_offset`` is the
  index of that character (the first one that cannot), ``error_reason`` a short class.

Offsets are **characters of the decoded text** (Python ``str`` indices, i.e. code
points, counted over everything fed so far), not bytes. ``orjson.JSONDecodeError.pos``
uses the same unit when ``orjson.loads`` is given a ``str``.

The language accepted is exactly what ``orjson.loads`` accepts, so the verdict agrees
with the final parse:

- whitespace is only space, tab, CR and LF; a byte-order mark is an error;
- ``\\uXXXX`` escapes must form proper pairs: a lone high or low surrogate escape is an
  error, as orjson rejects it ("no low surrogate", "invalid high surrogate"). A literal
  surrogate code point in the text is an error as well (orjson refuses a ``str`` that is
  not valid UTF-8);
- nesting deeper than ``max_depth`` containers is an error (orjson's limit is 1024);
- a number whose value overflows a double is an error (orjson: "number is infinity when
  parsed as double"). Overflow is only known once the number has ended, so ``failed``
  turns true at its end, but ``error_offset`` is still the first character from which
  the overflow was certain (an exponent digit, or the character after the number).

Cost: linear in the input, each character looked at once; runs of string content,
digits and whitespace are consumed by compiled regular expressions rather than one
Python step per character. Once failed, ``feed`` returns at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import ClassVar, Literal

SyntaxVerdict = Literal["valid", "incomplete", "syntax"]

DEFAULT_MAX_DEPTH = 1024  # orjson's own limit: 1024 nested containers parse, 1025 do not

# Error classes (``error_reason``). Short, machine-readable, never content.
UNEXPECTED_CHARACTER = "unexpected_character"
CONTROL_CHARACTER = "control_character"
INVALID_ESCAPE = "invalid_escape"
LONE_SURROGATE = "lone_surrogate"
NUMBER_OUT_OF_RANGE = "number_out_of_range"
DEPTH_EXCEEDED = "depth_exceeded"
TRAILING_DATA = "trailing_data"

_WS_RUN = r"[ \t\r\n]*+"
# String content up to the next quote, bad character, split or unusual escape. Whole
# escapes are consumed in place; a surrogate escape only as a complete high+low pair.
_STRING_BODY_RUN = (
    r'(?:[^"\\\x00-\x1f\ud800-\udfff]++'
    r'|\\["\\/bfnrt]'
    r"|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4}"
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})*+"
)
_WS = re.compile(_WS_RUN)
_DIGITS = re.compile(r"[0-9]*+")
_STRING_BODY = re.compile(_STRING_BODY_RUN)
_NUMBER = re.compile(r"-?+(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][+-]?+[0-9]++)?+")
# After a number the regex matched, these may still belong to it (a split, or a bad
# character one step further): the character-level path decides.
_NUMBER_MAY_CONTINUE = frozenset(".eE0123456789+-")
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_HIGH_SURROGATE_LEAD = frozenset("89abAB")  # second hex digit after "d"
_LOW_SURROGATE_LEAD = frozenset("cdefCDEF")
_PAIR_SECOND_START = ("\\", "u", "dD")  # what must follow a high surrogate escape
_LITERALS = {"t": "true", "f": "false", "n": "null"}


def _fast_lanes(nesting: bool) -> tuple[re.Pattern[str], ...]:
    """Patterns that take whole runs of valid, complete values in one match.

    They accept only a subset of JSON whose every match is complete and cannot overflow
    (strings; numbers of at most 200 integer digits and a two-digit exponent, followed by a
    delimiter; literals; with ``nesting``, containers holding only those), so where a lane
    stops the character-level modes take over and find the exact error offset. Returns
    (value, member, array_run, object_run).
    """
    ws = _WS_RUN
    string = f'"{_STRING_BODY_RUN}"'
    number = (
        r"-?+(?:0|[1-9][0-9]{0,199}+)(?:\.[0-9]++)?+(?:[eE][+-]?+[0-9]{1,2}+)?+"
        r"(?=[ \t\r\n,\]}])"
    )
    scalar = f"(?:{string}|{number}|true|false|null)"
    unit = scalar
    if nesting:
        flat_array = rf"\[{ws}(?:{scalar}(?:{ws},{ws}{scalar})*+{ws})?+\]"
        pair = f"{string}{ws}:{ws}{scalar}"
        flat_object = rf"\{{{ws}(?:{pair}(?:{ws},{ws}{pair})*+{ws})?+\}}"
        unit = f"(?:{scalar}|{flat_array}|{flat_object})"
    member = f"{string}{ws}:{ws}{unit}"
    return (
        re.compile(ws + unit),
        re.compile(ws + member),
        re.compile(f"(?:{ws},{ws}{unit})*+"),
        re.compile(f"(?:{ws},{ws}{member})*+"),
    )


# Below this many characters left in a chunk (a typical token-sized delta) a lane rarely
# completes a value, and trying costs more than the character-level modes.
_LANE_MIN = 12
# Lanes where one more container level is allowed, and where it is not (at max_depth).
_NESTING_LANES = _fast_lanes(nesting=True)
_SCALAR_LANES = _fast_lanes(nesting=False)

# Parser modes: what the next significant character must be.
_VALUE = 0  # any value (document start, after ':' or after ',' in an array)
_ARRAY_FIRST = 1  # a value or ']' (just after '[')
_OBJECT_FIRST = 2  # a key or '}' (just after '{')
_KEY = 3  # a key (after ',' in an object)
_COLON = 4
_AFTER_VALUE = 5  # ',' or the closing bracket of the innermost container
_TRAILING = 6  # the top-level value is complete: only whitespace may follow
_STRING = 7
_ESCAPE = 8
_NUMBER_MODE = 9
_LITERAL = 10

# Number sub-states, named for what was seen last.
_N_START = 0
_N_MINUS = 1
_N_ZERO = 2
_N_INT = 3
_N_DOT = 4
_N_FRAC = 5
_N_E = 6
_N_E_SIGN = 7
_N_EXP = 8
_PAST_ANY_CHUNK = 1 << 62
# The state after a digit, per state from _N_ZERO on (a digit cannot follow a leading zero).
_DIGIT_NEXT = (None, None, None, _N_INT, _N_FRAC, _N_FRAC, _N_EXP, _N_EXP, _N_EXP)
_N_ENDABLE = frozenset((_N_ZERO, _N_INT, _N_FRAC, _N_EXP))

# Decimal magnitude (floor(log10|x|)) above which a double is certainly infinite and
# below which it is certainly finite; in between, float() decides.
_SURELY_INFINITE = 309
_SURELY_FINITE = 307


class JSONChecker:
    """Sans-IO incremental RFC 8259 syntax checker for one streamed output."""

    __slots__ = (
        "_base",
        "_complete",
        "_error_offset",
        "_error_reason",
        "_escape",
        "_finished",
        "_is_key",
        "_literal",
        "_literal_index",
        "_max_depth",
        "_mode",
        "_number_parts",
        "_number_start",
        "_number_state",
        "_stack",
    )

    def __init__(self, *, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be at least 1, got {max_depth}")
        self._max_depth = max_depth
        self._base = 0  # characters fed before the current chunk
        self._mode = _VALUE
        self._stack: list[bool] = []  # True: object, False: array
        self._complete = False
        self._finished = False
        self._error_offset: int | None = None
        self._error_reason: str | None = None
        self._is_key = False
        self._escape = ""  # the escape split across feeds so far, backslash first
        self._literal = ""
        self._literal_index = 0
        self._number_state = _N_START
        self._number_start = 0  # absolute offset of the number's first character
        self._number_parts: list[str] = []  # pieces of a number split across feeds

    @property
    def failed(self) -> bool:
        return self._error_offset is not None

    @property
    def error_offset(self) -> int | None:
        """Index, in characters fed, of the first character that cannot continue any valid
        document. None while the input is (the start of) a valid document: an input that
        merely ended early is ``incomplete`` and has no error offset."""
        return self._error_offset

    @property
    def error_reason(self) -> str | None:
        return self._error_reason

    @property
    def complete(self) -> bool:
        """A whole top-level value was seen. A bare top-level number only completes at the
        next whitespace or at ``finish``, as more digits could still follow."""
        return self._complete

    @property
    def consumed(self) -> int:
        """Characters fed so far, counted even after a failure or ``finish``."""
        return self._base

    def feed(self, text: str) -> None:
        """Follow the next piece of the output. Only counted once failed or finished."""
        end = len(text)
        if self._error_offset is not None or self._finished:
            self._base += end
            return
        pos = 0
        steps = self._STEPS
        while pos < end:
            pos = steps[self._mode](self, text, pos)
        if self._mode == _NUMBER_MODE and self._error_offset is None:
            self._number_parts.append(text[max(self._number_start - self._base, 0) :])
        self._base += end

    def finish(self) -> SyntaxVerdict:
        """End of input: the verdict. Later calls return the same; later feeds are ignored."""
        if not self._finished:
            self._finished = True
            if self._mode == _NUMBER_MODE and self._number_state in _N_ENDABLE:
                self._end_number("".join(self._number_parts), self._base)
        if self._error_offset is not None:
            return "syntax"
        return "valid" if self._complete else "incomplete"

    # -- failure and structure ------------------------------------------------------------

    def _fail(self, offset: int, reason: str) -> int:
        """Record the failure at absolute ``offset``; returns a position past any chunk, which
        ends ``feed``'s loop."""
        self._error_offset = offset
        self._error_reason = reason
        return _PAST_ANY_CHUNK

    def _value_done(self) -> None:
        if self._stack:
            self._mode = _AFTER_VALUE
        else:
            self._mode = _TRAILING
            self._complete = True

    def _open(self, text: str, pos: int, is_object: bool) -> int:
        if len(self._stack) >= self._max_depth:
            return self._fail(self._base + pos, DEPTH_EXCEEDED)
        self._stack.append(is_object)
        self._mode = _OBJECT_FIRST if is_object else _ARRAY_FIRST
        return pos + 1

    def _close(self, pos: int) -> int:
        self._stack.pop()
        self._value_done()
        return pos + 1

    # -- modes between tokens -------------------------------------------------------------

    def _lanes(self) -> tuple[re.Pattern[str], ...]:
        return _NESTING_LANES if len(self._stack) < self._max_depth else _SCALAR_LANES

    def _step_value(self, text: str, pos: int) -> int:
        if len(text) - pos >= _LANE_MIN:
            fast = self._lanes()[0].match(text, pos)
            if fast is not None:
                self._value_done()
                return fast.end()
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]  # always matches
        if pos == len(text):
            return pos
        char = text[pos]
        if char == '"':
            self._is_key = False
            self._mode = _STRING
            return self._step_string(text, pos + 1)
        if char == "{":
            return self._open(text, pos, True)
        if char == "[":
            return self._open(text, pos, False)
        if char == "-" or "0" <= char <= "9":
            return self._start_number(text, pos)
        literal = _LITERALS.get(char)
        if literal is not None:
            return self._start_literal(text, pos, literal)
        return self._fail(self._base + pos, UNEXPECTED_CHARACTER)

    def _step_array_first(self, text: str, pos: int) -> int:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return pos
        if text[pos] == "]":
            return self._close(pos)
        return self._step_value(text, pos)

    def _step_object_first(self, text: str, pos: int) -> int:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return pos
        if text[pos] == "}":
            return self._close(pos)
        return self._step_key(text, pos)

    def _step_key(self, text: str, pos: int) -> int:
        if len(text) - pos >= _LANE_MIN:
            fast = self._lanes()[1].match(text, pos)
            if fast is not None:
                self._mode = _AFTER_VALUE
                return fast.end()
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return pos
        if text[pos] != '"':
            return self._fail(self._base + pos, UNEXPECTED_CHARACTER)
        self._is_key = True
        self._mode = _STRING
        return self._step_string(text, pos + 1)

    def _step_colon(self, text: str, pos: int) -> int:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return pos
        if text[pos] != ":":
            return self._fail(self._base + pos, UNEXPECTED_CHARACTER)
        self._mode = _VALUE
        return pos + 1

    def _step_after_value(self, text: str, pos: int) -> int:
        in_object = self._stack[-1]
        if len(text) - pos >= _LANE_MIN:
            run = self._lanes()[3 if in_object else 2]
            pos = run.match(text, pos).end()  # type: ignore[union-attr]
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return pos
        char = text[pos]
        if char == ",":
            self._mode = _KEY if in_object else _VALUE
            return pos + 1
        if char == ("}" if in_object else "]"):
            return self._close(pos)
        return self._fail(self._base + pos, UNEXPECTED_CHARACTER)

    def _step_trailing(self, text: str, pos: int) -> int:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return pos
        return self._fail(self._base + pos, TRAILING_DATA)

    # -- strings ------------------------------------------------------------------------------

    def _step_string(self, text: str, pos: int) -> int:
        pos = _STRING_BODY.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return pos
        char = text[pos]
        if char == '"':
            if self._is_key:
                self._mode = _COLON
            else:
                self._value_done()
            return pos + 1
        if char == "\\":
            # A split escape, or a bad one: the character-level path finds which.
            self._mode = _ESCAPE
            self._escape = "\\"
            return pos + 1
        reason = CONTROL_CHARACTER if char < " " else LONE_SURROGATE
        return self._fail(self._base + pos, reason)

    def _step_escape(self, text: str, pos: int) -> int:
        """One character of an escape split across feeds, or of a bad one."""
        sequence = self._escape + text[pos]
        reason = _escape_error(sequence)
        if reason is not None:
            return self._fail(self._base + pos, reason)
        if _escape_ends(sequence):
            self._mode = _STRING
        self._escape = sequence
        return pos + 1

    # -- literals -----------------------------------------------------------------------------

    def _start_literal(self, text: str, pos: int, literal: str) -> int:
        if text.startswith(literal, pos):
            self._value_done()
            return pos + len(literal)
        self._literal = literal
        self._literal_index = 0
        self._mode = _LITERAL
        return self._step_literal(text, pos)

    def _step_literal(self, text: str, pos: int) -> int:
        literal = self._literal
        index = self._literal_index
        end = len(text)
        while pos < end and index < len(literal):
            if text[pos] != literal[index]:
                return self._fail(self._base + pos, UNEXPECTED_CHARACTER)
            pos += 1
            index += 1
        self._literal_index = index
        if index == len(literal):
            self._value_done()
        return pos

    # -- numbers ------------------------------------------------------------------------------

    def _start_number(self, text: str, pos: int) -> int:
        match = _NUMBER.match(text, pos)
        if match is not None:
            end = match.end()
            if end < len(text) and text[end] not in _NUMBER_MAY_CONTINUE:
                return self._end_number(text[pos:end], self._base + end)
        self._mode = _NUMBER_MODE
        self._number_state = _N_START
        self._number_start = self._base + pos
        self._number_parts = []
        return self._step_number(text, pos)

    def _step_number(self, text: str, pos: int) -> int:
        """Character-level number grammar; runs of digits are taken by one regex match."""
        end = len(text)
        state = self._number_state
        while pos < end:
            char = text[pos]
            is_digit = "0" <= char <= "9"
            nxt = _number_next(state, char, is_digit)
            if nxt is None:
                if state in _N_ENDABLE:
                    self._number_state = state
                    start = max(self._number_start - self._base, 0)
                    number = "".join(self._number_parts) + text[start:pos]
                    self._number_parts = []
                    return self._end_number(number, self._base + pos)
                return self._fail(self._base + pos, UNEXPECTED_CHARACTER)
            state = nxt
            pos += 1
            if state in (_N_INT, _N_FRAC, _N_EXP):
                pos = _DIGITS.match(text, pos).end()  # type: ignore[union-attr]
        self._number_state = state
        return pos

    def _end_number(self, number: str, next_offset: int) -> int:
        """The number ended just before absolute ``next_offset``; reject it if it overflows."""
        start = next_offset - len(number)
        bad = _overflow_offset(number)
        if bad is not None:
            return self._fail(start + bad, NUMBER_OUT_OF_RANGE)
        self._value_done()
        return next_offset - self._base

    # One step per mode, indexed by mode; plain functions, so that a checker holds no
    # reference cycle through bound methods and is freed as soon as it is dropped.
    _STEPS: ClassVar[tuple[Callable[[JSONChecker, str, int], int], ...]] = (
        _step_value,
        _step_array_first,
        _step_object_first,
        _step_key,
        _step_colon,
        _step_after_value,
        _step_trailing,
        _step_string,
        _step_escape,
        _step_number,
        _step_literal,
    )


def _escape_error(sequence: str) -> str | None:
    """Why the last character of an escape ``sequence`` (backslash first) cannot continue
    it, or None. A high surrogate ``\\uD8XX`` must be followed at once by a low one."""
    index = len(sequence) - 1
    char = sequence[index]
    if index == 1:
        return None if char in _SIMPLE_ESCAPES or char == "u" else INVALID_ESCAPE
    if index in (6, 7, 8):
        return None if char in _PAIR_SECOND_START[index - 6] else LONE_SURROGATE
    if char not in _HEX:
        return INVALID_ESCAPE
    if index == 3 and sequence[2] in "dD" and char in _LOW_SURROGATE_LEAD:
        return LONE_SURROGATE  # a low surrogate with no high one before it
    if index == 9 and char not in _LOW_SURROGATE_LEAD:
        return LONE_SURROGATE  # a high surrogate followed by something else
    return None


def _escape_ends(sequence: str) -> bool:
    length = len(sequence)
    if length == 2:
        return sequence[1] != "u"
    if length == 6:
        return not (sequence[2] in "dD" and sequence[3] in _HIGH_SURROGATE_LEAD)
    return length == 12


def _number_next(state: int, char: str, is_digit: bool) -> int | None:
    """The number state after ``char``, or None when ``char`` does not continue the number."""
    if state == _N_START and char == "-":
        return _N_MINUS
    if state in (_N_START, _N_MINUS):
        return _N_ZERO if char == "0" else _N_INT if is_digit else None
    if is_digit:
        return _DIGIT_NEXT[state]
    if state in (_N_ZERO, _N_INT):
        return _N_DOT if char == "." else _N_E if char in "eE" else None
    if state == _N_FRAC:
        return _N_E if char in "eE" else None
    if state == _N_E:
        return _N_E_SIGN if char in "+-" else None
    return None


def _overflow_offset(number: str) -> int | None:
    """Where, inside ``number`` (or at ``len(number)``: the character after it), its value
    became certain to overflow a double; None when it does not overflow.

    Only a positive exponent makes overflow certain before the number ends: more exponent
    digits can only grow it, while more mantissa digits could still be followed by a
    negative exponent.
    """
    exp_at = max(number.find("e"), number.find("E"))
    if exp_at < 0:
        if len(number) < _SURELY_FINITE or not math.isinf(float(number)):
            return None
        return len(number)
    if not math.isinf(float(number)):
        return None
    mantissa = number[:exp_at]
    sign_at = exp_at + 1
    sign = number[sign_at] if number[sign_at] in "+-" else ""
    if sign == "-":
        return len(number)
    if sign == "+" and math.isinf(float(mantissa)):
        return sign_at  # "+" then any digits: still infinite
    return _first_overflowing_digit(number, mantissa, sign_at + len(sign))


def _first_overflowing_digit(number: str, mantissa: str, digits_at: int) -> int:
    """First exponent digit at which ``mantissa * 10**exponent`` overflows.

    Tracks the exponent's value and the mantissa's decimal magnitude, so each digit costs
    O(1) except within two orders of magnitude of the limit, where float() decides.
    """
    magnitude = Decimal(mantissa).adjusted()  # the number overflows, so mantissa != 0
    exponent = 0
    for index in range(digits_at, len(number)):
        previous = exponent
        exponent = exponent * 10 + ord(number[index]) - 48
        scale = magnitude + exponent
        if scale >= _SURELY_INFINITE:
            return index
        if (
            scale >= _SURELY_FINITE
            and exponent != previous
            and math.isinf(float(f"{mantissa}e{exponent}"))
        ):
            return index
    return len(number)
