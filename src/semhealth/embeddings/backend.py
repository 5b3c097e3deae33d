"""The seam between the scorer and whatever turns texts into vectors.

Like httpx's transport, a backend is one call: ``embed(texts)``, plus ``aclose()``. The local
model, a remote scorer, text-embeddings-inference and OpenAI-compatible endpoints all fit it,
and the micro-batcher never knows which one it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

Vectors = NDArray[np.float32]  # one row per text, L2-normalised


class Embedder(Protocol):
    """Anything that turns texts into vectors: a backend, a batcher, a router over encoders."""

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Return a ``(len(texts), dim)`` float32 array of L2-normalised rows, in order."""
        ...


class Backend(Embedder, Protocol):
    """An encoder the batcher can drive.

    ``name`` identifies the encoder (it keys the embedding cache, so two encoders never
    share vectors); ``dim`` is the width of every row ``embed`` returns. ``embed`` raises
    ``BackendError`` (marked retryable or permanent) when a batch fails; ``aclose``
    releases the model or connection and is safe twice.
    """

    name: str
    dim: int

    async def aclose(self) -> None: ...


def normalize_rows(vectors: NDArray[np.floating]) -> Vectors:
    """Float32 copy of ``vectors`` with unit-length rows; all-zero rows stay zero.

    For backends whose model does not normalise (or normalised in half precision).
    """
    out = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    # A zero row has no direction; dividing by 1 leaves it zero instead of NaN.
    return np.divide(out, np.where(norms > 0.0, norms, 1.0), dtype=np.float32)
