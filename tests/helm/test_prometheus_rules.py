"""The chart's PrometheusRule: its generated files are current, promtool accepts its groups,
the shipped promtool unit tests of the alerts pass on them, and the recording rules compute
what tests/helm/promtool/recording_rules.yaml says."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.helm import chart
from tests.servers import require_binary

ALERT_TESTS = sorted((chart.ROOT / "tests" / "alerts" / "promtool").glob("*.yaml"))
RECORDING_TESTS = sorted((Path(__file__).parent / "promtool").glob("*.yaml"))
RULE_SETS = [
    name
    for name, values in chart.VALUE_SETS.items()
    if values.get("prometheusRule", {}).get("enabled")
]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "helm_generate", chart.ROOT / "helm" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_current() -> None:
    """helm/generate.py regenerates the exported alerts, the recording rules and the values
    schema's copy of the agent's schema; the committed files must be exactly that."""
    for path, text in _generator().generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run python3 helm/generate.py"


def test_alerts_file_is_what_the_cli_exports() -> None:
    exported = subprocess.run(
        [sys.executable, "-m", "semhealth.agent.cli", "rules", "export", "--format", "prometheus"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert (chart.CHART_DIR / "files" / "prometheus-rules.yaml").read_text() == exported


def _groups(manifests: dict[str, list[dict[str, Any]]], value_set: str) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = chart.one(manifests[value_set], "PrometheusRule")["spec"][
        "groups"
    ]
    return groups


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool", "prometheus")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_rule_groups_hold_the_alerts_and_the_recording_rules(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    exported = yaml.safe_load((chart.CHART_DIR / "files" / "prometheus-rules.yaml").read_text())
    recording = yaml.safe_load((chart.CHART_DIR / "files" / "recording-rules.yaml").read_text())
    full = _groups(manifests, "cert-manager-own-issuer")
    assert full[0] == exported["groups"][0]  # the alerts, annotations' {{ $labels }} intact
    assert full[1] == {**recording["groups"][0], "interval": "1m"}
    assert [g["name"] for g in _groups(manifests, "cert-manager-cluster-issuer")] == [
        "semhealth-recording"
    ]
    assert [g["name"] for g in _groups(manifests, "alerts-only-self-signed")] == ["semhealth"]


def test_each_quantile_rule_computes_the_quantile_its_name_says() -> None:
    recording = yaml.safe_load((chart.CHART_DIR / "files" / "recording-rules.yaml").read_text())
    rules = recording["groups"][0]["rules"]
    named = [(rule, re.fullmatch(r"(.+):p(\d+)_5m", rule["record"])) for rule in rules]
    quantiles = [(rule, match) for rule, match in named if match is not None]
    histograms = sum(1 for rule in rules if rule["record"].endswith("_bucket:rate5m"))
    assert histograms > 0 and len(quantiles) == 3 * histograms  # p50, p95, p99 of each
    for rule, match in quantiles:
        family, percent = match.groups()
        bucket = f"{family}_bucket:rate5m"
        assert rule["expr"] == f"histogram_quantile({int(percent) / 100}, {bucket})", rule


def test_rules_configmap_holds_the_same_groups(manifests: dict[str, list[dict[str, Any]]]) -> None:
    items = manifests["cert-manager-own-issuer"]
    config_map = chart.one(items, "ConfigMap", "semhealth-rules")
    assert yaml.safe_load(config_map["data"]["prometheus-rules.yaml"]) == {
        "groups": _groups(manifests, "cert-manager-own-issuer")
    }


@pytest.mark.parametrize("value_set", RULE_SETS)
def test_promtool_check_rules_accepts_the_rendered_groups(
    manifests: dict[str, list[dict[str, Any]]], value_set: str, tmp_path: Path
) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": _groups(manifests, value_set)}))
    done = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("test_file", ALERT_TESTS + RECORDING_TESTS, ids=lambda p: p.stem)
def test_promtool_unit_tests_pass_on_the_charts_rules(
    manifests: dict[str, list[dict[str, Any]]], test_file: Path, tmp_path: Path
) -> None:
    groups = _groups(manifests, "cert-manager-own-issuer")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(test_file, tmp_path / test_file.name)
    done = _promtool("test", "rules", test_file.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_recording_rule_test_can_fail(
    manifests: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """promtool really compares: a wrong expected value fails the recording rules' test."""
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": _groups(manifests, "cert-manager-own-issuer")})
    )
    text = (Path(__file__).parent / "promtool" / "recording_rules.yaml").read_text()
    (tmp_path / "wrong.yaml").write_text(text.replace("value: 0.65", "value: 0.7"))
    assert _promtool("test", "rules", "wrong.yaml", cwd=tmp_path).returncode != 0
