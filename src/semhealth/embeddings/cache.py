"""An LRU of embeddings keyed by the SHA-256 of (encoder name, text).

Repeated system prompts and shared documents reach the model once. The cache holds
digests and vectors only, never text, and is bounded by entries. It is used from one
event loop, so it needs no lock.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Vector = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class CacheStats:
    entries: int
    max_entries: int
    hits: int
    misses: int


class Cache:
    """Least-recently-used vectors, at most ``max_entries`` of them (0 keeps none)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max(0, max_entries)
        self._rows: OrderedDict[bytes, Vector] = OrderedDict()
        self._hits = 0
        self._misses = 0

    @staticmethod
    def key(encoder: str, text: str) -> bytes:
        # The encoder is part of the key: two models never share a vector.
        digest = hashlib.sha256(encoder.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
        digest.update(text.encode("utf-8", "surrogatepass"))
        return digest.digest()

    def get(self, key: bytes) -> Vector | None:
        row = self._rows.get(key)
        if row is None:
            self._misses += 1
            return None
        self._rows.move_to_end(key)
        self._hits += 1
        return row

    def put(self, key: bytes, row: Vector) -> None:
        if self.max_entries == 0:
            return
        # A copy, read-only: a row of a batch would keep the whole batch alive.
        stored = np.array(row, dtype=np.float32, copy=True)
        stored.flags.writeable = False
        self._rows[key] = stored
        self._rows.move_to_end(key)
        while len(self._rows) > self.max_entries:
            self._rows.popitem(last=False)

    def clear(self) -> None:
        self._rows.clear()

    def stats(self) -> CacheStats:
        return CacheStats(
            entries=len(self._rows),
            max_entries=self.max_entries,
            hits=self._hits,
            misses=self._misses,
        )

    def __len__(self) -> int:
        return len(self._rows)
