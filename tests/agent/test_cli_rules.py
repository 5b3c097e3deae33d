"""``semhealth rules``: the rules in force, exported for Prometheus from the same definitions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from semhealth.agent.cli import build_parser, main
from semhealth.agent.cli.run import overrides
from semhealth.alerts.prometheus import render_rules
from semhealth.alerts.rules import default_rule_entries, load_rules
from tests.agent.prometheus_server import require_binary

OVERRIDE = """\
upstream: {url: "http://127.0.0.1:9"}
alerts:
  rules:
    - name: ContextRelevanceLow
      threshold: 0.6
    - name: StreamChoppy
      enabled: false
    - name: AnswerRelevanceLow
      signal: answer_relevance_score
      aggregation: p50
      window: 10m
      op: "<"
      threshold: 0.5
      group_by: [route]
      labels: {severity: info, team: search}
      annotations: {summary: "answers drift on {{ $labels.route }}"}
"""


def _export(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["rules", "export", "--format", "prometheus", *args]) == 0
    return capsys.readouterr().out


def _alerts(text: str) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for rule in yaml.safe_load(text)["groups"][0]["rules"]:
        out.setdefault(rule["alert"], []).append(rule)
    return out


def test_export_without_a_config_is_the_shipped_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _export(capsys)
    assert out == render_rules(load_rules(), source="the shipped default rules")
    assert set(_alerts(out)) == {entry["name"] for entry in default_rule_entries()}


def test_export_follows_the_configs_overrides_and_new_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "semhealth.yaml"
    config.write_text(OVERRIDE)
    alerts = _alerts(_export(capsys, "--config", str(config)))
    assert "StreamChoppy" not in alerts
    (relevance,) = alerts["ContextRelevanceLow"]
    assert "< 0.6" in str(relevance["expr"])
    (added,) = alerts["AnswerRelevanceLow"]
    assert added["labels"] == {"severity": "info", "team": "search"}


def test_the_export_passes_promtool_check_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    promtool = require_binary("promtool")
    config = tmp_path / "semhealth.yaml"
    config.write_text(OVERRIDE)
    rules = tmp_path / "rules.yaml"
    assert main(["rules", "export", "--config", str(config), "-o", str(rules)]) == 0
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_export_of_a_bad_rule_exits_2_naming_the_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "semhealth.yaml"
    config.write_text(OVERRIDE.replace("threshold: 0.6", "threshold: 6"))
    assert main(["rules", "export", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}:5:" in err
    assert "alerts.rules[0].threshold" in err


def test_rules_defaults_prints_the_shipped_file_which_loads_as_the_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["rules", "defaults"]) == 0
    document = yaml.safe_load(capsys.readouterr().out)
    assert load_rules(defaults=False, entries=document["rules"]) == load_rules()


def test_alertmanager_flags_repeat_and_replace_the_configured_urls() -> None:
    args = build_parser().parse_args(
        ["run", "--alertmanager", "http://am-0:9093", "--alertmanager", "http://am-1:9093"]
    )
    assert overrides(args)["alerts.alertmanager.urls"] == ["http://am-0:9093", "http://am-1:9093"]
