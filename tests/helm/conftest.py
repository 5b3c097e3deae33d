from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helm import chart


@pytest.fixture(scope="session")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chart.chart_copy(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="session")
def rendered(chart_dir: Path) -> dict[str, dict[str, str]]:
    """Every value set rendered once per run: name -> template path -> text."""
    return {name: chart.render(chart_dir, values) for name, values in chart.VALUE_SETS.items()}


@pytest.fixture(scope="session")
def manifests(rendered: dict[str, dict[str, str]]) -> dict[str, list[dict[str, Any]]]:
    return {name: chart.objects(texts) for name, texts in rendered.items()}
