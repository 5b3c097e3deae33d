"""Every configuration the manual, the README and examples/ show passes `semhealth config check`
as written: no issue, no warning. (The "Remote encoders behind a key" block and the
configuration reference's `shadow: null`, both in the README then, once did not: audit B9, B10.)

A fenced YAML block is a configuration when its top-level keys are all sections of the
configuration schema; Kubernetes manifests, Helm values and rule files are not. A block that
shows one section is checked with the upstream given the way an injected sidecar gets it,
``SEMHEALTH_UPSTREAM__URL``, and the variable a block's ``api_key_env`` names is set.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from semhealth.agent.config import check_config_file, schema_text
from tests.docs.runbooks import REPO

_FENCE = re.compile(r"^([ \t]*)```ya?ml[^\n]*\n(.*?)^\1```", re.S | re.M)
_SECTIONS = frozenset(json.loads(schema_text())["properties"])
ENV = {"SEMHEALTH_UPSTREAM__URL": "http://127.0.0.1:8000", "OPENAI_API_KEY": "sk-test"}


def _examples() -> list[tuple[str, str]]:
    """(where, text) of every configuration block of the Markdown pages, and every example file."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text("utf-8")
        for block in _FENCE.finditer(text):
            indent, body = block.group(1), block.group(2)
            body = re.sub(f"(?m)^{indent}", "", body)
            data = yaml.safe_load(body)
            if isinstance(data, dict) and data and set(data) <= _SECTIONS:
                line = text.count("\n", 0, block.start()) + 1
                found.append((f"{page.relative_to(REPO)}:{line}", body))
    for example in sorted((REPO / "examples").glob("*.yaml")):
        found.append((str(example.relative_to(REPO)), example.read_text("utf-8")))
    return found


EXAMPLES = _examples()


def test_the_configuration_examples_are_found() -> None:
    # The block detection above finds what it must, or the test below would check nothing.
    pages = {where.split(":")[0] for where, _ in EXAMPLES}
    assert {
        "docs/getting-started/sidecar.md",
        "docs/guides/alerts.md",
        "docs/guides/shadow-and-canary.md",
        "examples/semhealth.yaml",
    } <= pages


@pytest.mark.parametrize(("where", "text"), EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_every_configuration_example_passes_config_check_without_a_warning(
    tmp_path: Path, where: str, text: str
) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(text, "utf-8")
    assert [str(issue) for issue in check_config_file(str(path), ENV)] == []
