from __future__ import annotations

import numpy as np
import pytest

from semhealth.embeddings.cache import Cache


def row(value: float) -> np.ndarray:
    return np.full(4, value, dtype=np.float32)


def test_the_key_depends_on_the_text() -> None:
    assert Cache.key("minilm", "a") != Cache.key("minilm", "b")


def test_the_key_depends_on_the_encoder() -> None:
    assert Cache.key("minilm", "a") != Cache.key("use", "a")


def test_the_key_is_a_sha256_digest_not_the_text() -> None:
    key = Cache.key("minilm", "a secret prompt")
    assert len(key) == 32
    assert b"secret" not in key


def test_the_key_accepts_a_lone_surrogate() -> None:
    assert len(Cache.key("minilm", "broken \ud800")) == 32


def test_a_stored_row_is_found_again() -> None:
    cache = Cache(4)
    cache.put(b"k", row(1.0))
    found = cache.get(b"k")
    assert found is not None
    np.testing.assert_array_equal(found, row(1.0))


def test_hits_and_misses_are_counted() -> None:
    cache = Cache(4)
    cache.put(b"k", row(1.0))
    cache.get(b"k")
    cache.get(b"k")
    cache.get(b"other")
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (2, 1, 1)


def test_the_least_recently_used_entry_is_evicted() -> None:
    cache = Cache(2)
    cache.put(b"a", row(1.0))
    cache.put(b"b", row(2.0))
    cache.get(b"a")  # b is now the least recently used
    cache.put(b"c", row(3.0))
    assert cache.get(b"b") is None
    assert cache.get(b"a") is not None
    assert len(cache) == 2


def test_zero_entries_keeps_nothing() -> None:
    cache = Cache(0)
    cache.put(b"k", row(1.0))
    assert cache.get(b"k") is None


def test_a_stored_row_is_a_read_only_copy() -> None:
    cache = Cache(2)
    batch = np.stack([row(1.0), row(2.0)])
    cache.put(b"k", batch[0])
    batch[0] = 9.0
    found = cache.get(b"k")
    assert found is not None
    np.testing.assert_array_equal(found, row(1.0))
    with pytest.raises(ValueError):
        found[0] = 5.0


def test_clear_empties_the_cache() -> None:
    cache = Cache(2)
    cache.put(b"k", row(1.0))
    cache.clear()
    assert len(cache) == 0
