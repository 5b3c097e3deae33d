"""``semhealth run --record``'s settings: plain data, light to import (the CLI parser and
the forwarding processes read them without loading the recorder)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BYTES = 100 << 20
DEFAULT_KEEP = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordSettings:
    """Where and how much ``--record`` writes."""

    path: str
    max_bytes: int = DEFAULT_MAX_BYTES  # one file's cap; past it the file rotates
    keep: int = DEFAULT_KEEP  # rotated files kept (FILE.1 .. FILE.keep)
    queue_size: int = 10_000  # exchanges waiting for the writer; more are shed
