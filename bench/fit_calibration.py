"""Refit the shipped relevance calibrations and print how well each one separates.

For each encoder (by default every local encoder of the default embeddings config; add
others with ``--model NAME[=PATH]``) this:

1. scores every pair of ``embeddings/data/relevance_pairs.jsonl`` through the sidecar's own
   path (``open_scorer``: the local backend, the micro-batcher, ``RelevanceScorer``) with no
   calibration, so each raw score is exactly the uncalibrated ``context_relevance_score``
   (one passage per pair: the query/passage cosine);
2. fits a Platt calibration on ``split == "fit"`` (the languages of ``--langs``);
3. measures it on ``split == "heldout"``, pooled and per language;
4. writes ``embeddings/calibrations/<encoder>.json`` with the fit's metadata and the held-out
   figures (``--dry-run`` writes nothing), and prints the README's tables.

    python bench/fit_calibration.py                     # about a minute on 2 cores
    python bench/fit_calibration.py --dry-run
    python bench/fit_calibration.py --model mml12=/models/paraphrase-multilingual-MiniLM-L12-v2
    python bench/fit_calibration.py --langs en          # an encoder that only gets English
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
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

from semhealth.embeddings.calibration import (
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
from semhealth.embeddings.config import Config, Encoder, Local, default_config
from semhealth.embeddings.scoring import open_scorer

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "embeddings" / "data" / "relevance_pairs.jsonl"
OUT = ROOT / "embeddings" / "calibrations"
KINDS = ("relevant", "paraphrase", "hard_negative", "unrelated")
BOOTSTRAP_DRAWS = 1000

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
class Fitted:
    name: str
    calibration: Calibration
    raw: Floats
    calibrated: Floats
    seconds: float


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
    extra: Sequence[str], device: str, threads: int | None
) -> list[tuple[str, Local]]:
    """(calibration name, model settings): the default config's local encoders, then ``extra``."""
    chosen: list[tuple[str, Local]] = []
    for encoder in default_config().encoders:
        if encoder.backend == "local":
            local = replace(encoder.local, device=device, threads=threads)
            chosen.append((encoder.local.model, local))
    for spec in extra:
        name, _, path = spec.partition("=")
        chosen.append((name, Local(model=path or name, device=device, threads=threads)))
    return chosen


async def raw_scores(local: Local, pairs: Pairs) -> Floats:
    """Each pair's uncalibrated context_relevance_score, through the sidecar's scorer."""
    config = Config(encoders=(Encoder(local=local),))
    async with open_scorer(config, calibration=identity_calibration(local.model)) as scorer:
        results = await asyncio.gather(
            *(
                scorer.score(query, [context])
                for query, context in zip(pairs.queries, pairs.contexts, strict=True)
            )
        )
    return np.array([result.context_raw for result in results], dtype=np.float64)


def fit_one(
    name: str, local: Local, pairs: Pairs, langs: Sequence[str], source: str, sha256: str
) -> Fitted:
    started = time.perf_counter()
    raw = asyncio.run(raw_scores(local, pairs))
    seconds = time.perf_counter() - started
    served = np.isin(pairs.langs, list(langs))
    fit = served & (pairs.splits == "fit")
    calibration = fit_calibration(
        raw[fit],
        pairs.labels[fit],
        encoder=name,
        fitted_on=f"{source} split=fit lang={','.join(langs)}",
        data_sha256=sha256,
    )
    calibrated = calibration.apply(raw)
    heldout = served & (pairs.splits == "heldout")
    groups = {"all": heldout, **{lang: heldout & (pairs.langs == lang) for lang in langs}}
    metrics = {
        **calibration.metrics,
        "heldout": {
            group: heldout_metrics(raw, calibrated, pairs, mask) for group, mask in groups.items()
        },
    }
    return Fitted(name, replace(calibration, metrics=metrics), raw, calibrated, seconds)


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


def groups(fitted: Fitted, pairs: Pairs, langs: Sequence[str]) -> list[tuple[str, Mask]]:
    heldout = pairs.splits == "heldout"
    served = np.isin(pairs.langs, list(langs))
    pooled = ("+".join(langs), heldout & served)
    return [pooled, *((lang, heldout & (pairs.langs == lang)) for lang in langs)]


def separation_table(results: Sequence[Fitted], pairs: Pairs, langs: Sequence[str]) -> str:
    rows = []
    for fitted in results:
        for lang, mask in groups(fitted, pairs, langs):
            labels = pairs.labels[mask]
            kinds = pairs.kinds[mask]
            raw, cal = fitted.raw[mask], fitted.calibrated[mask]
            low, high = auc_interval(raw, labels)
            rel, irr = labels == 1, labels == 0
            rows.append(
                [
                    fitted.name,
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


def distribution_table(results: Sequence[Fitted], pairs: Pairs, langs: Sequence[str]) -> str:
    rows = []
    for fitted in results:
        for lang, mask in groups(fitted, pairs, langs):
            labels = pairs.labels[mask]
            raw, cal = fitted.raw[mask], fitted.calibrated[mask]
            rows.append(
                [
                    fitted.name,
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
                fitted.name,
                f"{calibration.a:.3f}",
                f"{calibration.b:.3f}",
                "n/a" if raw_at is None else f"{raw_at:.3f}",
                str(calibration.n_fit),
                f"{fitted.seconds:.1f}",
            ]
        )
    header = ["encoder", "a", "b", f"raw cosine at {THRESHOLD}", "fit pairs", "scoring s"]
    return table(header, rows)


def _source(data: Path) -> str:
    # Relative to the repository when it is the shipped set: the file must not name a machine.
    resolved = data.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else data.name


def write(fitted: Fitted, out: Path) -> Path:
    path = out / f"{shipped_name(fitted.name)}.json"
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
    parser.add_argument("--langs", default="en,zh", help="languages the encoders serve (en,zh)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the report, write nothing")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # packaged weights only; never a model hub
    langs = [lang.strip() for lang in args.langs.split(",") if lang.strip()]
    data: Path = args.data
    sha256 = hashlib.sha256(data.read_bytes()).hexdigest()
    pairs = load_pairs(data)
    results = [
        fit_one(name, local, pairs, langs, _source(data), sha256)
        for name, local in encoders_to_fit(args.model, args.device, args.threads)
    ]
    print(f"data: {data.name}, sha256 {sha256[:16]}, {len(pairs.labels)} pairs; held-out split\n")
    print(separation_table(results, pairs, langs), end="\n\n")
    print(distribution_table(results, pairs, langs), end="\n\n")
    print(fit_table(results))
    if not args.dry_run:
        for fitted in results:
            print(f"wrote {write(fitted, args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
