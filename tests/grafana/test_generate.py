"""The committed dashboards are what the code builds, in both places they are committed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.grafana.dashboards import COMMITTED, GRAFANA, NAMES, REPO, generate


def test_the_generator_builds_every_committed_dashboard_and_no_other() -> None:
    assert tuple(generate().dashboards()) == NAMES
    for folder in COMMITTED:
        assert sorted(path.name for path in folder.glob("*.json")) == sorted(NAMES)


@pytest.mark.parametrize("folder", COMMITTED, ids=["grafana", "helm"])
@pytest.mark.parametrize("name", NAMES)
def test_committed_json_is_byte_for_byte_what_the_code_builds(folder: Path, name: str) -> None:
    built = generate().dashboards()[name]
    assert (folder / name).read_text() == built, "run: python3 grafana/generate.py"


def test_the_chart_ships_the_same_files_as_grafana() -> None:
    for name in NAMES:
        assert (COMMITTED[0] / name).read_bytes() == (COMMITTED[1] / name).read_bytes()


def test_building_twice_gives_the_same_text() -> None:
    assert generate().dashboards() == generate().dashboards()


def test_check_finds_nothing_stale_in_the_committed_files() -> None:
    checked = subprocess.run(
        [sys.executable, str(GRAFANA / "generate.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (checked.returncode, checked.stderr) == (0, "")


def test_check_names_an_edited_and_a_missing_file(tmp_path: Path) -> None:
    outputs = (tmp_path / "grafana", tmp_path / "helm")
    module = generate()
    module.write(outputs)
    assert module.stale(outputs) == []
    edited = outputs[0] / NAMES[0]
    edited.write_text(edited.read_text().replace("Overview", "Overveiw", 1))
    (outputs[1] / NAMES[2]).unlink()
    assert module.stale(outputs) == [edited, outputs[1] / NAMES[2]]
