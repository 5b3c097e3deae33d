"""Calibrated relevance: one encoder's raw cosine mapped to a score whose 0.75 is even odds.

Raw cosine means different things per model: all-MiniLM-L6-v2 puts many relevant English
pairs below 0.75, multilingual-e5-small puts most irrelevant pairs above it. A calibration
maps one encoder's cosine to a score built from the fitted probability that the context is
relevant, so a calibrated 0.75 means the same for every encoder and the default alert
threshold holds.

The map is Platt scaling, a logistic curve on the raw cosine::

    score = 1 / (1 + exp(-(a * cos + b)))      with a > 0

Why two parameters and not an isotonic step function or a spline:

- monotone by construction (a > 0), so ranking, and with it ROC AUC, is exactly the raw
  cosine's: calibration changes what a score means, never which context wins;
- smooth, so two nearly equal cosines never land on either side of a step;
- robust on a few hundred labelled pairs, where an isotonic fit memorises the sample's
  noise as steps and plateaus.

It is fitted by Newton's method (IRLS) on standardised cosines, so one small L2 prior on
the slope suits every encoder (one model's cosines span 0.2, another's 1.0). The prior,
and Platt's targets (``(N+ + 1) / (N+ + 2)`` and ``1 / (N- + 2)`` instead of 1 and 0), keep
the slope finite when a sample separates perfectly.

The logistic is fitted as the probability of relevance and its intercept then moved by
``logit(0.75) = ln 3`` (``EVEN_ODDS_SHIFT``): the score crosses the 0.75 threshold exactly
where a context becomes more likely relevant than not on the labelled data. Read as a
probability, a score is that of relevance when three contexts in four are relevant, as in
a healthy service's traffic. Why: the threshold is a decision, so it must sit at the
decision boundary. Left at "probability 0.75", it sat above it and called relevant pairs
irrelevant: on the held-out sets agreement with the labels at 0.75 rose from 0.856 to
0.876 (English) and 0.794 to 0.825 (Chinese) for e5, and in all but one cell for the other
encoders (USE's held-out Chinese fell; ``bench/fit_calibration.py``, README "Calibration").

Each encoder's fitted calibration ships as ``calibrations/<encoder>.json``
(``bench/fit_calibration.py`` refits them on ``data/relevance_pairs.jsonl``). A user refits
on their own labelled pairs with ``semhealth calibrate`` (``calibrate_from_jsonl``) and
points the encoder at the file; an encoder with neither falls back to the identity, with
a warning.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, overload

import numpy as np
import orjson
from numpy.typing import ArrayLike, NDArray

from semhealth.embeddings.errors import EmbeddingError

FORMAT = 1  # version of the JSON layout; bumped when a reader could misread a file
PLATT = "platt"
IDENTITY = "identity"
METHODS = (PLATT, IDENTITY)
THRESHOLD = 0.75  # the default alert's threshold on a calibrated score
# Moves a fitted probability's even odds (logit 0) onto the threshold (module docstring).
EVEN_ODDS_SHIFT = math.log(THRESHOLD / (1.0 - THRESHOLD))
DEFAULT_PRIOR = 0.01  # L2 on the slope of standardised cosines: keeps it finite, barely moves it
PERCENTILES = (10, 50, 90)
CALIBRATIONS_PACKAGE = "semhealth.embeddings.calibrations"
CJK_SUFFIX = ".cjk"  # <encoder>.cjk.json: the calibration of an encoder's CJK requests
# Hub names of the packaged models: the same weights, so the same calibration.
_HUB_PREFIXES = ("sentence-transformers/",)
_FILE_STEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MAX_NEWTON_STEPS = 100
_MAX_HALVINGS = 40

logger = logging.getLogger(__name__)

Floats = NDArray[np.float64]
# What a metrics value may hold: JSON, frozen (objects as read-only mappings, arrays as tuples).
Metric = float | int | str | bool | None | Mapping[str, "Metric"] | tuple["Metric", ...]


class CalibrationError(EmbeddingError):
    """A calibration could not be fitted, read or built; the message says which key or why."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """A monotone map from one encoder's raw cosine to a calibrated score in [0, 1].

    ``method`` is ``platt`` (``a``, ``b`` as in the module docstring, ``a > 0``) or
    ``identity`` (raw cosine clipped to [0, 1]: an encoder nobody calibrated).
    ``fitted_on`` says which data, ``n_fit`` how many pairs; ``metrics`` holds what the
    fit measured (ROC AUC, score distributions, shares at the threshold).
    Calling the calibration applies it, so it can be a ``RelevanceScorer``'s ``calibrate``.
    """

    encoder: str
    method: str
    a: float
    b: float
    fitted_on: str
    n_fit: int
    metrics: Mapping[str, Metric] = field(default_factory=dict, hash=False)
    data_sha256: str = ""  # of the labelled data, so a refit on other data shows
    fitted_at: str = ""  # ISO 8601 date (UTC)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise CalibrationError(
                f"unknown calibration method '{self.method}' (use one of: {', '.join(METHODS)})"
            )
        if self.method == PLATT and not (math.isfinite(self.a) and self.a > 0):
            raise CalibrationError(
                f"a Platt calibration needs a finite slope a > 0, not {self.a!r}: "
                "a calibration must rank contexts as the raw cosine does"
            )
        if not math.isfinite(self.b):
            raise CalibrationError(f"the intercept b must be finite, not {self.b!r}")
        if self.n_fit < 0:
            raise CalibrationError(f"n_fit must be 0 or more, not {self.n_fit}")
        object.__setattr__(self, "metrics", _frozen_mapping(self.metrics))

    @overload
    def apply(self, cos: float) -> float: ...

    @overload
    def apply(self, cos: NDArray[Any]) -> Floats: ...

    def apply(self, cos: float | NDArray[Any]) -> float | Floats:
        """The calibrated score of each raw cosine; a float for a float, an array for an array."""
        if isinstance(cos, np.ndarray):
            return self._map(np.asarray(cos, dtype=np.float64))
        return float(self._map(np.asarray(cos, dtype=np.float64)))

    def __call__(self, cos: float) -> float:
        return self.apply(cos)

    def raw_at(self, score: float = THRESHOLD) -> float | None:
        """The raw cosine that calibrates to ``score`` (None when no cosine does)."""
        if not 0.0 < score < 1.0:
            return None
        if self.method == IDENTITY:
            return score
        return (math.log(score / (1.0 - score)) - self.b) / self.a

    def to_json(self) -> str:
        """The calibration as an indented JSON document (ends with a newline)."""
        document = {
            "format": FORMAT,
            "encoder": self.encoder,
            "method": self.method,
            "a": self.a,
            "b": self.b,
            "fitted_on": self.fitted_on,
            "data_sha256": self.data_sha256,
            "fitted_at": self.fitted_at,
            "n_fit": self.n_fit,
            "metrics": _plain(self.metrics),
        }
        return orjson.dumps(
            document, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE
        ).decode()

    @classmethod
    def from_json(cls, data: str | bytes) -> Calibration:
        """Parse ``to_json``'s document; ``CalibrationError`` names what is wrong."""
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise CalibrationError(
                f"a calibration file must be JSON (parser stopped at line {exc.lineno}, "
                f"column {exc.colno})"
            ) from exc
        if not isinstance(document, dict):
            raise CalibrationError(
                f"a calibration file must hold a JSON object, not {json_type(document)}"
            )
        return cls(**_fields(document))

    def _map(self, cos: Floats) -> Floats:
        if self.method == IDENTITY:
            return np.clip(cos, 0.0, 1.0)
        # tanh form of the logistic: no overflow for any cosine, however steep the slope.
        return np.asarray(0.5 * (1.0 + np.tanh(0.5 * (self.a * cos + self.b))), dtype=np.float64)


def identity_calibration(encoder: str) -> Calibration:
    """The calibration of an encoder nobody fitted: raw cosine clipped to [0, 1]."""
    return Calibration(encoder, IDENTITY, 1.0, 0.0, fitted_on="", n_fit=0)


def shipped_calibrations() -> tuple[str, ...]:
    """Encoders with a calibration shipped in the package, sorted."""
    folder = resources.files(CALIBRATIONS_PACKAGE)
    return tuple(
        sorted(
            entry.name[: -len(".json")]
            for entry in folder.iterdir()
            if entry.name.endswith(".json")
        )
    )


def load_calibration(encoder: str, path: str | Path | None = None) -> Calibration:
    """The calibration for ``encoder``: the file at ``path``, else the one the package ships.

    An encoder with no shipped calibration and no file gets the identity, and a warning:
    its scores are raw cosine, which the default threshold was not set for. A file that
    cannot be read or parsed raises ``CalibrationError`` (at start-up).
    """
    if path is not None:
        calibration = read_calibration(path)
        if calibration.encoder != encoder:
            logger.warning(
                "calibration file %s was fitted for encoder '%s', used here for '%s'",
                path,
                calibration.encoder,
                encoder,
            )
        return calibration
    stem = shipped_name(encoder)
    # A name that is a path (a local model folder) is never a shipped file's name.
    if _FILE_STEM.fullmatch(stem):
        resource = resources.files(CALIBRATIONS_PACKAGE) / f"{stem}.json"
        if resource.is_file():
            try:
                return Calibration.from_json(resource.read_bytes())
            except CalibrationError as exc:
                raise CalibrationError(f"shipped calibration {stem}.json: {exc}") from exc
    logger.warning(
        "no calibration for encoder '%s': its scores are raw cosine clipped to [0, 1], which "
        "the 0.75 threshold was not set for; fit one with `semhealth calibrate`",
        encoder,
    )
    return identity_calibration(encoder)


def load_cjk_calibration(encoder: str) -> Calibration | None:
    """The calibration shipped for ``encoder``'s requests with CJK text, or None.

    One encoder's cosines sit higher in Chinese than in English (e5: irrelevant pairs at
    0.85 against 0.81), so a calibration fitted on both under-scores one language and
    over-scores the other. ``calibrations/<encoder>.cjk.json`` is fitted on Chinese alone;
    ``<encoder>.json`` is then the fit for every other request.
    """
    stem = f"{shipped_name(encoder)}{CJK_SUFFIX}"
    if not _FILE_STEM.fullmatch(stem):
        return None
    resource = resources.files(CALIBRATIONS_PACKAGE) / f"{stem}.json"
    if not resource.is_file():
        return None
    try:
        return Calibration.from_json(resource.read_bytes())
    except CalibrationError as exc:
        raise CalibrationError(f"shipped calibration {stem}.json: {exc}") from exc


def shipped_name(encoder: str) -> str:
    """The file stem a shipped calibration of ``encoder`` has (hub prefixes removed)."""
    for prefix in _HUB_PREFIXES:
        if encoder.startswith(prefix):
            return encoder[len(prefix) :]
    return encoder


# -- fitting -----------------------------------------------------------------------------------


def fit_calibration(
    raw_scores: ArrayLike,
    labels: ArrayLike,
    *,
    encoder: str = "",
    fitted_on: str = "",
    data_sha256: str = "",
    fitted_at: str | None = None,
    prior: float = DEFAULT_PRIOR,
) -> Calibration:
    """Fit a Platt calibration to raw scores and 0/1 labels (1: the context is relevant).

    The fitted probability's even odds land on ``THRESHOLD`` (``EVEN_ODDS_SHIFT``): a pair
    scores at least 0.75 when the fit finds it more likely relevant than not.
    ``metrics`` gets the fit's own separation (ROC AUC, distributions, shares); report a
    held-out split next to it. Raises ``CalibrationError`` when the data cannot give an
    increasing map: a class is missing, all scores are equal, or they rank irrelevant
    pairs above relevant ones.
    """
    x, y = _checked(raw_scores, labels)
    if prior < 0 or not math.isfinite(prior):
        raise CalibrationError(f"the prior must be finite and 0 or more, not {prior!r}")
    a, even_odds_b = _platt(x, y, prior)
    b = even_odds_b + EVEN_ODDS_SHIFT
    if not a > 0:
        raise CalibrationError(
            f"the scores rank irrelevant pairs above relevant ones (ROC AUC "
            f"{roc_auc(x, y):.3f}); no increasing calibration fits them"
        )
    fitted = Calibration(
        encoder,
        PLATT,
        a,
        b,
        fitted_on=fitted_on,
        n_fit=int(x.size),
        data_sha256=data_sha256,
        fitted_at=fitted_at if fitted_at is not None else _today(),
    )
    metrics: dict[str, Metric] = {
        "threshold": THRESHOLD,
        "even_odds_at_threshold": True,
        "raw_at_threshold": fitted.raw_at(THRESHOLD),
        "prior": prior,
        "fit": {
            "raw": separation(x, y),
            "calibrated": separation(fitted.apply(x), y),
        },
    }
    return dataclasses.replace(fitted, metrics=metrics)


def _checked(raw_scores: ArrayLike, labels: ArrayLike) -> tuple[Floats, Floats]:
    x = np.asarray(raw_scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise CalibrationError(f"{x.size} scores but {y.size} labels")
    if not np.isfinite(x).all():
        raise CalibrationError(f"{int((~np.isfinite(x)).sum())} scores are not finite")
    if not np.isin(y, (0.0, 1.0)).all():
        raise CalibrationError("labels must be 0 (irrelevant) or 1 (relevant)")
    positives = int(y.sum())
    if positives == 0 or positives == y.size:
        raise CalibrationError(
            f"fitting needs relevant and irrelevant pairs; got {positives} relevant "
            f"and {y.size - positives} irrelevant"
        )
    if float(x.max() - x.min()) == 0.0:
        raise CalibrationError(f"all {x.size} scores are equal; no slope can be fitted")
    return x, y


def _platt(x: Floats, y: Floats, prior: float) -> tuple[float, float]:
    """Newton's method with step halving on the penalised log loss; returns raw-scale a, b."""
    mean, scale = float(x.mean()), float(x.std())
    z = (x - mean) / scale
    positives = float(y.sum())
    negatives = float(y.size) - positives
    # Platt's targets: a sample can separate perfectly, its population rarely does.
    target = np.where(y == 1.0, (positives + 1.0) / (positives + 2.0), 1.0 / (negatives + 2.0))
    params = np.array([0.0, math.log(float(target.mean()) / (1.0 - float(target.mean())))])
    loss = _loss(params, z, target, prior)
    for _ in range(_MAX_NEWTON_STEPS):
        step = _newton_step(params, z, target, prior)
        scale_step = 1.0
        for _ in range(_MAX_HALVINGS):
            candidate = params - scale_step * step
            candidate_loss = _loss(candidate, z, target, prior)
            if candidate_loss <= loss:
                break
            scale_step /= 2.0
        else:
            break  # no step lowers the loss: at the optimum, to rounding
        params, loss = candidate, candidate_loss
        if float(np.abs(scale_step * step).max()) < 1e-10:
            break
    slope, intercept = float(params[0]), float(params[1])
    return slope / scale, intercept - slope * mean / scale


def _loss(params: Floats, z: Floats, target: Floats, prior: float) -> float:
    s = params[0] * z + params[1]
    # log(1 + e^s) - t*s is the log loss of p = sigmoid(s), without overflow.
    return float(np.sum(np.logaddexp(0.0, s) - target * s) + 0.5 * prior * params[0] ** 2)


def _newton_step(params: Floats, z: Floats, target: Floats, prior: float) -> Floats:
    p = 0.5 * (1.0 + np.tanh(0.5 * (params[0] * z + params[1])))
    w = p * (1.0 - p)
    gradient = np.array([np.dot(p - target, z) + prior * params[0], np.sum(p - target)])
    hessian = np.array(
        [[np.dot(w, z * z) + prior, np.dot(w, z)], [np.dot(w, z), np.sum(w) + 1e-12]]
    )
    return np.asarray(np.linalg.solve(hessian, gradient), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Blend:
    """A calibrated blend: ``sigmoid(sum(weights * cosines) + bias)``, one cosine per encoder.

    Fitted like a calibration (``fit_blend``), on several encoders' raw scores of the same
    pairs; with one encoder it is a Platt calibration. Measured against single encoders in
    ``bench/fit_calibration.py`` (README, "Relevance profiles").
    """

    encoders: tuple[str, ...]
    weights: tuple[float, ...]
    bias: float

    def apply(self, cosines: ArrayLike) -> Floats:
        """Calibrated scores for rows of cosines, one column per encoder in ``encoders``."""
        x = np.asarray(cosines, dtype=np.float64).reshape(-1, len(self.weights))
        s = x @ np.asarray(self.weights, dtype=np.float64) + self.bias
        return np.asarray(0.5 * (1.0 + np.tanh(0.5 * s)), dtype=np.float64)


def fit_blend(
    cosines: ArrayLike, labels: ArrayLike, encoders: Sequence[str], prior: float = DEFAULT_PRIOR
) -> Blend:
    """Fit a ``Blend`` by penalised logistic regression (IRLS) on standardised cosines.

    Platt's targets and the L2 prior keep it finite on a separable sample, as for
    ``fit_calibration``. Raises ``CalibrationError`` when a class is missing or the columns
    do not match ``encoders``.
    """
    x = np.asarray(cosines, dtype=np.float64)
    x = x.reshape(x.shape[0], -1) if x.ndim else x.reshape(0, 1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if x.shape != (y.size, len(encoders)):
        raise CalibrationError(
            f"{x.shape[0]} rows of {x.shape[1]} cosines for {y.size} labels and "
            f"{len(encoders)} encoders"
        )
    positives = float(y.sum())
    negatives = float(y.size) - positives
    if positives == 0 or negatives == 0:
        raise CalibrationError("fitting a blend needs relevant and irrelevant pairs")
    mean, scale = x.mean(axis=0), np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
    z = np.column_stack([(x - mean) / scale, np.ones(y.size)])
    target = np.where(y == 1.0, (positives + 1.0) / (positives + 2.0), 1.0 / (negatives + 2.0))
    penalty = np.diag([prior] * len(encoders) + [0.0])
    params = np.zeros(z.shape[1])
    for _ in range(_MAX_NEWTON_STEPS):
        p = 0.5 * (1.0 + np.tanh(0.5 * (z @ params)))
        gradient = z.T @ (p - target) + penalty @ params
        hessian = (z * (p * (1.0 - p))[:, None]).T @ z + penalty + 1e-12 * np.eye(z.shape[1])
        step = np.linalg.solve(hessian, gradient)
        params = params - step
        if float(np.abs(step).max()) < 1e-10:
            break
    weights = params[:-1] / scale
    # Even odds on the threshold, as for a single encoder's calibration.
    bias = float(params[-1] - np.dot(params[:-1], mean / scale)) + EVEN_ODDS_SHIFT
    return Blend(tuple(encoders), tuple(float(w) for w in weights), bias)


def threshold_agreement(
    scores: ArrayLike, labels: ArrayLike, threshold: float = THRESHOLD
) -> float:
    """Share of pairs whose side of ``threshold`` matches the label (1: at or above it)."""
    x = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1) == 1
    return float(((x >= threshold) == y).mean()) if x.size else math.nan


# -- metrics -----------------------------------------------------------------------------------


def roc_auc(scores: ArrayLike, labels: ArrayLike) -> float:
    """ROC AUC by ranks (Mann-Whitney U): tied scores count one half; NaN without both classes."""
    x = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1) == 1
    positives = int(y.sum())
    negatives = int(y.size) - positives
    if positives == 0 or negatives == 0:
        return math.nan
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    # A group of tied scores shares the mean of the ranks it spans.
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    u = float(ranks[y].sum()) - positives * (positives + 1) / 2.0
    return u / (positives * negatives)


def share_at_least(scores: ArrayLike, threshold: float = THRESHOLD) -> float:
    """Share of scores at or above ``threshold``; NaN for no scores."""
    x = np.asarray(scores, dtype=np.float64).reshape(-1)
    return float((x >= threshold).mean()) if x.size else math.nan


def percentiles(scores: ArrayLike, points: Sequence[int] = PERCENTILES) -> dict[str, float]:
    """``{"p10": ..., "p50": ..., "p90": ...}`` of the scores; NaN for no scores."""
    x = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not x.size:
        return {f"p{point}": math.nan for point in points}
    values = np.percentile(x, list(points))
    return {f"p{point}": float(value) for point, value in zip(points, values, strict=True)}


def separation(
    scores: ArrayLike, labels: ArrayLike, threshold: float = THRESHOLD
) -> dict[str, Metric]:
    """How well scores separate relevant (1) from irrelevant (0) pairs, as a metrics entry."""
    x = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1) == 1
    return {
        "n": int(x.size),
        "roc_auc": roc_auc(x, y.astype(np.int64)),
        "relevant": _group(x[y], threshold),
        "irrelevant": _group(x[~y], threshold),
    }


def _group(x: Floats, threshold: float) -> dict[str, Metric]:
    return {
        "n": int(x.size),
        **percentiles(x),
        "share_at_least_threshold": share_at_least(x, threshold),
    }


# -- reading and writing -----------------------------------------------------------------------

_REQUIRED: Mapping[str, tuple[type, ...]] = MappingProxyType(
    {"encoder": (str,), "method": (str,), "a": (int, float), "b": (int, float), "n_fit": (int,)}
)
_OPTIONAL: Mapping[str, tuple[type, ...]] = MappingProxyType(
    {"fitted_on": (str,), "data_sha256": (str,), "fitted_at": (str,), "metrics": (dict,)}
)


def _fields(document: dict[str, Any]) -> dict[str, Any]:
    version = document.get("format")
    if version != FORMAT:
        raise CalibrationError(
            f"'format' is {version!r}; this semhealth reads calibration format {FORMAT}"
        )
    unknown = sorted(set(document) - {"format", *_REQUIRED, *_OPTIONAL})
    if unknown:
        raise CalibrationError(f"unknown keys: {', '.join(unknown)}")
    fields: dict[str, Any] = {}
    for key, types in (*_REQUIRED.items(), *_OPTIONAL.items()):
        if key not in document:
            if key in _REQUIRED:
                raise CalibrationError(f"'{key}' is missing")
            continue
        value = document[key]
        # bool is an int to Python, never a number here.
        if isinstance(value, bool) or not isinstance(value, types):
            raise CalibrationError(f"'{key}' must be {_type_names(types)}, not {json_type(value)}")
        fields[key] = float(value) if isinstance(value, int | float) and key != "n_fit" else value
    return fields


def read_calibration(path: str | Path) -> Calibration:
    """The calibration file at ``path`` (``semhealth calibrate``'s); ``CalibrationError`` names
    the file and what is wrong. ``load_calibration`` reads files with it, and the agent's
    configuration check too."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CalibrationError(
            f"cannot read calibration file {path}: {exc.strerror or type(exc).__name__}"
        ) from exc
    try:
        return Calibration.from_json(data)
    except CalibrationError as exc:
        raise CalibrationError(f"calibration file {path}: {exc}") from exc


def _frozen(value: Any) -> Metric:
    if isinstance(value, Mapping):
        return _frozen_mapping(value)
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, np.generic):
        return _frozen(value.item())
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise CalibrationError(f"a metric must be JSON data, not {type(value).__name__}")


def _frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Metric]:
    return MappingProxyType({str(key): _frozen(item) for key, item in value.items()})


def _plain(value: Metric) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; an undefined metric (one class missing) reads as null
    return value


def json_type(value: object) -> str:
    """How a JSON document's value is named in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _type_names(types: tuple[type, ...]) -> str:
    if dict in types:
        return "an object"
    if str in types:
        return "a string"
    if float in types:
        return "a number"
    return "an integer"


def _today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()
