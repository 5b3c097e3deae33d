"""Query-aware selection of windows (``relevance.selected``), as properties over generated texts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from semhealth.embeddings.relevance import selected

FILLER = ("alpha", "bravo", "canteen", "delta", "echo", "foxtrot", "garden", "hotel", "india")
QUERY = ("vpn", "password", "reset", "laptop", "expired")

pieces = st.sampled_from([*FILLER, *QUERY, " ", "数据", "连接", "池", ".", "\n", "42"])
texts = st.lists(pieces, max_size=40).map("".join)


@given(query=texts, chunks=st.lists(texts, max_size=24), keep=st.integers(0, 30))
def test_selection_keeps_at_most_keep_indices_in_ascending_order(
    query: str, chunks: list[str], keep: int
) -> None:
    kept = selected(query, chunks, keep)
    assert kept == sorted(set(kept))
    assert all(0 <= index < len(chunks) for index in kept)
    assert len(kept) == (len(chunks) if keep == 0 else min(keep, len(chunks)))


@given(query=texts, chunks=st.lists(texts, max_size=24), keep=st.integers(0, 30))
def test_selection_gives_the_same_windows_for_the_same_request(
    query: str, chunks: list[str], keep: int
) -> None:
    assert selected(query, chunks, keep) == selected(query, tuple(chunks), keep)


@st.composite
def phrase_windows(draw: st.DrawFn) -> tuple[str, list[str], int, int]:
    """(query, windows of one length, the window holding the query phrase, keep)."""
    phrase = draw(st.lists(st.sampled_from(QUERY), min_size=1, max_size=4, unique=True))
    size = draw(st.integers(len(phrase) + 2, 30))
    count = draw(st.integers(2, 12))
    holder = draw(st.integers(0, count - 1))
    out = []
    for index in range(count):
        words = draw(st.lists(st.sampled_from(FILLER), min_size=size, max_size=size))
        if index == holder:
            at = draw(st.integers(0, size - len(phrase)))
            words[at : at + len(phrase)] = phrase
        else:
            # Some of the query's words, each at most once: never all of them.
            some = draw(st.lists(st.sampled_from(phrase), max_size=len(phrase) - 1, unique=True))
            spots = draw(st.permutations(range(size)))
            for word, spot in zip(some, spots, strict=False):
                words[spot] = word
        out.append(" ".join(words))
    return " ".join(phrase), out, holder, draw(st.integers(1, count))


@given(case=phrase_windows())
def test_selection_keeps_the_window_holding_the_query_phrase(
    case: tuple[str, list[str], int, int],
) -> None:
    query, cut, holder, keep = case
    assert holder in selected(f"How do I {query}?", cut, keep)
