"""Giving back to the kernel the heap a process freed (glibc's ``malloc_trim``): the scorer's
model thread after its calls, a forwarding process once its traffic has stopped.

A model call allocates tensors whose shape changes with every batch (texts x longest text).
glibc raises its mmap threshold to the largest block freed, so after the first calls those
tensors come from its heaps, and the blocks they free, scattered between live ones, stay
resident. MiniLM on 2 CPU threads, in calls of 1 to 64 texts shaped as the scorer's batches,
went from 502 to 1,095 MiB over three waves of 2,000 texts, 564 MiB of it free inside malloc's
heaps (``mallinfo2``) and 164 MiB in use; with ``malloc_trim(0)`` after each call the same
waves ended at 540 MiB (2026-12-06, bench/fleet_scorer.py has the scorer's own figures).
``malloc_trim(0)`` hands back free pages wherever they lie in the heaps, not only at the top.
C libraries without it (musl, macOS) are left as they are.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

Trim = Callable[[], object]
# While calls keep coming, at most one trim this often: one took about 13 ms on a busy 2-core
# machine with a few hundred MiB free in the heaps, so this bounds its cost near 0.7 % of a
# core, and what the heap can hold above its floor to what 2 s of calls leave behind.
TRIM_EVERY_S = 2.0
# And one this long after the last call, so what a burst's last calls freed is given back too
# (an idle scorer otherwise keeps it until the next call).
IDLE_TRIM_S = 1.0


def c_library_trim(library: Any) -> Trim | None:
    """``malloc_trim(0)`` of ``library`` (a ``ctypes.CDLL``), or None where it has none."""
    trim = getattr(library, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return partial(trim, 0)


def process_trim() -> Trim | None:
    """``malloc_trim(0)`` of the C library this process runs on, or None."""
    try:
        return c_library_trim(ctypes.CDLL(None))  # the symbols the process already has
    except OSError:
        return None


class HeapTrim:
    """When a model's thread trims the heap: after a call once ``every_s`` passed since the
    last trim, and ``idle_s`` after the last call when that call was left untrimmed. The
    decisions run on the event loop; ``trim`` itself runs on the model's thread (ctypes lets
    the GIL go while it runs). ``trim`` None: never (a C library without one)."""

    def __init__(
        self,
        trim: Trim | None,
        *,
        every_s: float = TRIM_EVERY_S,
        idle_s: float = IDLE_TRIM_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trim = trim
        self.every_s = every_s
        self.idle_s = idle_s
        self._clock = clock
        self._last = -math.inf
        self._untrimmed = False  # a call ended since the last trim

    def after_call(self) -> bool:
        """A call just ended: True when a trim is due now."""
        if self._trim is None:
            return False
        now = self._clock()
        if now - self._last >= self.every_s:
            self._last, self._untrimmed = now, False
            return True
        self._untrimmed = True
        return False

    def when_idle(self) -> bool:
        """``idle_s`` after the last call: True when its heap was not trimmed since."""
        if not self._untrimmed:
            return False
        self._last, self._untrimmed = self._clock(), False
        return True

    def trim(self) -> None:
        if self._trim is not None:
            self._trim()
