"""The rules exported as Prometheus rule groups: the PromQL text, and promtool proving it.

The promtool unit tests shipped in ``tests/alerts/promtool/`` run against the export of the
default rules; the tests here also check those files stay honest (real bucket boundaries and
label names, annotations the agent renders identically) and generate a few more promtool
tests for what the defaults do not exercise (escaping, the baseline's sample guard, means).
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from semhealth.agent.telemetry import buckets
from semhealth.agent.telemetry import instruments as m
from semhealth.alerts.durations import parse_duration
from semhealth.alerts.errors import RuleError
from semhealth.alerts.model import Baseline, Rule, Thresholds
from semhealth.alerts.prometheus import render_rules, rule_groups
from semhealth.alerts.rules import load_rules
from semhealth.alerts.templates import render
from tests.agent.prometheus_server import require_binary

PROMTOOL_DIR = Path(__file__).parent / "promtool"

# --------------------------------------------------------------------------- rules under test


@functools.cache
def default_rules() -> tuple[Rule, ...]:
    """The rules the agent ships (``alerts/defaults.yaml``), as the agent loads them."""
    return load_rules(defaults=True)


def _rule(**fields: Any) -> Rule:
    base: dict[str, Any] = {
        "name": "Probe",
        "signal": "context_relevance_score",
        "aggregation": "p50",
        "window_s": 300.0,
        "op": "<",
        "threshold": 0.75,
    }
    return Rule(**{**base, **fields})


def _exprs(rule: Rule) -> list[str]:
    return [out["expr"] for out in rule_groups([rule])["groups"][0]["rules"]]


def _expr(rule: Rule) -> str:
    (expr,) = _exprs(rule)
    return expr


# --------------------------------------------------------------------------- PromQL text

RELEVANCE_P50 = (
    "histogram_quantile(0.5, sum by (le, route) "
    "(rate(semantic_health_context_relevance_score_bucket[5m])))"
)


def test_quantile_is_histogram_quantile_over_bucket_rates_by_le_and_group() -> None:
    assert _expr(_rule(group_by=("route",))) == f"{RELEVANCE_P50} < 0.75"


def test_quantile_without_group_by_sums_by_le_only() -> None:
    assert _expr(_rule(aggregation="p99", op=">", threshold=0.5)) == (
        "histogram_quantile(0.99, sum by (le) "
        "(rate(semantic_health_context_relevance_score_bucket[5m]))) > 0.5"
    )


def test_mean_divides_the_rate_of_the_sum_by_the_rate_of_the_count() -> None:
    rule = _rule(signal="stream_max_gap", aggregation="mean", op=">=", threshold=2.0,
                 window_s=600.0, group_by=("route",))  # fmt: skip
    assert _expr(rule) == (
        "sum by (route) (rate(semantic_health_stream_max_gap_seconds_sum[10m])) / "
        "sum by (route) (rate(semantic_health_stream_max_gap_seconds_count[10m])) >= 2"
    )


def test_ratio_counts_a_group_without_good_events_as_zero() -> None:
    rule = _rule(signal="model_output_validity_rate", aggregation="ratio", threshold=0.99,
                 group_by=("route",))  # fmt: skip
    every = "sum by (route) (rate(semantic_health_outputs_total[5m]))"
    good = 'sum by (route) (rate(semantic_health_outputs_total{result="valid"}[5m]))'
    assert _expr(rule) == f"({good} or (0 * {every})) / {every} < 0.99"


def test_ratio_good_matcher_may_match_an_empty_label() -> None:
    rule = _rule(signal="request_success_rate", aggregation="ratio", op="<=", threshold=0.9)
    assert _expr(rule).startswith(
        '(sum(rate(semantic_health_requests_total{error_type=""}[5m])) or '
    )


def test_min_samples_adds_an_increase_guard_on_the_group_labels() -> None:
    rule = _rule(group_by=("route",), min_samples=20)
    guard = (
        "and on (route) (sum by (route) "
        "(increase(semantic_health_context_relevance_score_count[5m])) >= 20)"
    )
    assert _expr(rule) == f"{RELEVANCE_P50} < 0.75\n{guard}"


def test_min_samples_of_a_ratio_counts_the_counter_itself() -> None:
    rule = _rule(signal="model_output_validity_rate", aggregation="ratio", min_samples=5)
    assert _expr(rule).endswith(
        "\nand on () (sum(increase(semantic_health_outputs_total[5m])) >= 5)"
    )


def test_min_samples_of_one_needs_no_guard() -> None:
    assert "increase" not in _expr(_rule(min_samples=1))


def test_relative_rule_divides_by_the_same_aggregation_over_the_window_before() -> None:
    rule = _rule(group_by=("route",), threshold=-0.05, min_samples=20,
                 baseline=Baseline(window_s=3600.0))  # fmt: skip
    baseline = RELEVANCE_P50.replace("[5m]", "[1h] offset 5m")
    count = "semantic_health_context_relevance_score_count"
    assert _expr(rule) == (
        f"({RELEVANCE_P50} / {baseline} - 1) < -0.05\n"
        f"and on (route) (sum by (route) (increase({count}[5m])) >= 20)\n"
        f"and on (route) (sum by (route) (increase({count}[1h] offset 5m)) >= 20)"
    )


def test_peer_relative_rule_divides_by_the_peer_over_the_same_window() -> None:
    rule = _rule(
        threshold=-0.05,
        group_by=("route",),
        min_samples=20,
        match={"variant": "canary"},
        baseline=Baseline(peer={"variant": "stable"}),
    )

    def p50(variant: str) -> str:
        return RELEVANCE_P50.replace("_bucket[5m]", f'_bucket{{variant="{variant}"}}[5m]')

    def count(variant: str) -> str:
        metric = f'semantic_health_context_relevance_score_count{{variant="{variant}"}}'
        return f"sum by (route) (increase({metric}[5m]))"

    assert _expr(rule) == (
        f"({p50('canary')} / {p50('stable')} - 1) < -0.05\n"
        f"and on (route) ({count('canary')} >= 20)\n"
        f"and on (route) ({count('stable')} >= 20)"
    )
    assert "offset" not in _expr(rule)


def test_relative_ratio_parenthesises_both_quotients() -> None:
    rule = _rule(signal="model_output_validity_rate", aggregation="ratio", threshold=-0.01,
                 baseline=Baseline(window_s=1800.0))  # fmt: skip
    every = "sum(rate(semantic_health_outputs_total[5m]))"
    good = 'sum(rate(semantic_health_outputs_total{result="valid"}[5m]))'
    current = f"({good} or (0 * {every})) / {every}"
    before = current.replace("[5m]", "[30m] offset 5m")
    assert _expr(rule) == f"(({current}) / ({before}) - 1) < -0.01"


def test_genai_labels_come_out_under_the_rule_label_names() -> None:
    rule = _rule(signal="time_to_first_token", aggregation="p95", op=">", threshold=0.08,
                 group_by=("model", "provider"))  # fmt: skip
    rate = "rate(gen_ai_server_time_to_first_token_seconds_bucket[5m])"
    relabelled = (
        f'label_replace(label_replace({rate}, "model", "$1", "gen_ai_response_model", "(.*)"), '
        '"provider", "$1", "gen_ai_provider_name", "(.*)")'
    )
    assert _expr(rule) == (
        f"histogram_quantile(0.95, sum by (le, model, provider) ({relabelled})) > 0.08"
    )


def test_genai_labels_the_series_names_alike_need_no_relabelling() -> None:
    rule = _rule(signal="operation_duration", aggregation="p95", op=">", threshold=1.0,
                 group_by=("route", "prompt_class"))  # fmt: skip
    assert "label_replace" not in _expr(rule)


def test_match_uses_the_series_label_names() -> None:
    rule = _rule(signal="operation_duration", aggregation="mean", op=">", threshold=1.0,
                 match={"model": "gpt-4o", "route": "/chat"})  # fmt: skip
    assert _expr(rule).startswith(
        'sum(rate(gen_ai_client_operation_duration_seconds_sum{gen_ai_response_model="gpt-4o", '
        'route="/chat"}[5m]))'
    )


def test_label_values_are_escaped_as_promql_strings() -> None:
    rule = _rule(match={"route": 'say "hi"\\\n'})
    assert '{route="say \\"hi\\"\\\\\\n"}' in _expr(rule)


LATENCY = Thresholds(label="prompt_class", values={"short": 0.05, "long_context": 0.18})


def _latency(**fields: Any) -> Rule:
    return _rule(signal="operation_duration", aggregation="p95", op=">", **fields)


def test_thresholds_per_value_become_one_rule_each_with_its_matcher() -> None:
    exprs = _exprs(_latency(threshold=LATENCY))
    assert [expr.rsplit(" ", 1)[1] for expr in exprs] == ["0.05", "0.18"]
    assert 'prompt_class="short"' in exprs[0]
    assert 'prompt_class="long_context"' in exprs[1]


def test_thresholds_group_by_their_label() -> None:
    (expr, _) = _exprs(_latency(threshold=LATENCY, group_by=("route",)))
    assert "sum by (le, route, prompt_class)" in expr


def test_thresholds_default_excludes_the_listed_values() -> None:
    thresholds = Thresholds(label="prompt_class", values=LATENCY.values, default=1.0)
    exprs = _exprs(_latency(threshold=thresholds))
    assert len(exprs) == 3
    assert 'prompt_class!~"short|long_context"' in exprs[2]
    assert exprs[2].endswith(" > 1")


def test_thresholds_default_regex_escapes_metacharacters() -> None:
    thresholds = Thresholds(label="route", values={"/v1/chat.completions": 0.1, "a|b": 0.2},
                            default=1.0)  # fmt: skip
    default = _exprs(_latency(threshold=thresholds))[2]
    # The regex is /v1/chat\.completions|a\|b; the PromQL string doubles its backslashes.
    assert 'route!~"/v1/chat\\\\.completions|a\\\\|b"' in default


def test_thresholds_variants_state_their_value_as_a_label() -> None:
    rules = rule_groups([_latency(threshold=LATENCY, labels={"severity": "warning"})])
    labels = [out["labels"] for out in rules["groups"][0]["rules"]]
    assert labels == [
        {"severity": "warning", "prompt_class": "short"},
        {"severity": "warning", "prompt_class": "long_context"},
    ]


def test_thresholds_with_a_matched_value_export_only_that_value() -> None:
    thresholds = Thresholds(label="prompt_class", values=LATENCY.values, default=1.0)
    (expr,) = _exprs(_latency(threshold=thresholds, match={"prompt_class": "short"}))
    assert expr.count('prompt_class="short"') == 1
    assert expr.endswith(" > 0.05")


def test_alerting_rule_carries_for_labels_and_annotations_verbatim() -> None:
    annotations = {"summary": "{{ $labels.route }} at {{ $value | humanize }}"}
    rule = _rule(for_s=90.0, labels={"severity": "page"}, annotations=annotations)
    (out,) = rule_groups([rule])["groups"][0]["rules"]
    assert out == {
        "alert": "Probe",
        "expr": _expr(_rule()),
        "for": "1m30s",
        "labels": {"severity": "page"},
        "annotations": annotations,
    }


def test_keep_firing_for_is_written_only_when_set() -> None:
    (kept,) = rule_groups([_rule(keep_firing_for_s=600.0)])["groups"][0]["rules"]
    (plain,) = rule_groups([_rule()])["groups"][0]["rules"]
    assert kept["keep_firing_for"] == "10m"
    assert "keep_firing_for" not in plain


def test_group_takes_its_name_and_interval() -> None:
    groups = rule_groups([_rule()], group_name="llm", interval_s=30.0)["groups"]
    assert [(group["name"], group["interval"]) for group in groups] == [("llm", "30s")]


def test_unknown_signal_is_a_rule_error_naming_the_rule() -> None:
    with pytest.raises(RuleError) as caught:
        rule_groups([_rule(), _rule(signal="vibes")])
    assert [issue.path for issue in caught.value.issues] == ["rules[1].signal"]


def test_aggregation_the_signal_lacks_is_a_rule_error() -> None:
    with pytest.raises(RuleError, match=r"rules\[0\]\.aggregation: .* no aggregation 'ratio'"):
        rule_groups([_rule(aggregation="ratio")])


def test_label_the_signal_lacks_is_a_rule_error_at_its_key() -> None:
    with pytest.raises(RuleError) as caught:
        rule_groups([_rule(group_by=("tenant",), match={"region": "eu"})])
    assert [str(issue).split(" (fix")[0] for issue in caught.value.issues] == [
        "rules[0].group_by: context_relevance_score has no label 'tenant'",
        "rules[0].match: context_relevance_score has no label 'region'",
    ]


def test_render_starts_with_a_header_naming_the_command_and_source() -> None:
    text = render_rules(default_rules(), source="alerts/defaults.yaml")
    first = text.splitlines()[0]
    assert "semhealth rules export" in first
    assert "alerts/defaults.yaml" in first


def test_render_reads_back_as_the_rule_groups() -> None:
    assert yaml.safe_load(render_rules(default_rules())) == rule_groups(default_rules())


def test_render_writes_expressions_as_literal_blocks() -> None:
    assert "expr: |-\n      histogram_quantile(0.5, " in render_rules(default_rules())


def test_render_is_stable() -> None:
    assert render_rules(default_rules()).encode() == render_rules(default_rules()).encode()


_RENDER_ELSEWHERE = """
from semhealth.alerts.model import Baseline, Rule, Thresholds
from semhealth.alerts.prometheus import render_rules
rule = Rule(name="R", signal="operation_duration", aggregation="p95", window_s=300.0, op=">",
            threshold=Thresholds(label="prompt_class", values={"short": 0.05, "b": 1.0}, default=2.0),
            group_by=("model", "route"), match={"provider": "openai", "route": "/x"},
            min_samples=5, baseline=Baseline(window_s=3600.0),
            labels={"team": "ml", "severity": "page"}, annotations={"b": "2", "a": "1"})
print(render_rules([rule]), end="")
"""


def test_render_is_the_same_bytes_whatever_the_hash_seed() -> None:
    outputs = {
        subprocess.run(
            [sys.executable, "-c", _RENDER_ELSEWHERE], capture_output=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60,
        ).stdout
        for seed in ("1", "2")
    }  # fmt: skip
    assert len(outputs) == 1
    assert b"- alert: R\n" in outputs.pop()


def test_render_keeps_each_rule_keys_in_one_order() -> None:
    document = yaml.safe_load(render_rules(default_rules()))
    orders = {tuple(out) for out in document["groups"][0]["rules"]}
    assert orders == {("alert", "expr", "for", "labels", "annotations")}


# --------------------------------------------------------------------------- promtool support

# (minutes, observations a minute, observed value) for a histogram; (minutes, a minute) for a
# counter. Phases follow one another from t=0, one sample a minute.
HistogramPhase = tuple[int, int, float]
CounterPhase = tuple[int, int]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(round(value, 9))


def _values(increments: Sequence[tuple[int, float]]) -> str:
    """promtool's expanding notation for a counter growing ``per_minute`` for ``minutes``."""
    parts, last = [], 0.0
    for index, (minutes, per_minute) in enumerate(increments):
        if index == 0:
            parts.append(f"0+{_number(per_minute)}x{minutes}")
            last = per_minute * minutes
            continue
        start = last + per_minute
        parts.append(_number(start) + (f"+{_number(per_minute)}x{minutes - 1}" * (minutes > 1)))
        last = start + per_minute * (minutes - 1)
    return " ".join(parts)


def _selector(metric: str, labels: Mapping[str, str]) -> str:
    inner = ", ".join(f"{key}={orjson.dumps(value).decode()}" for key, value in labels.items())
    return f"{metric}{{{inner}}}"


def histogram(
    base: str, labels: Mapping[str, str], bounds: Sequence[float], phases: Sequence[HistogramPhase]
) -> list[dict[str, str]]:
    """A histogram's series as the agent exports them, for promtool's ``input_series``."""
    out = []
    for bound in (*bounds, math.inf):
        le = {**labels, "le": "+Inf" if bound == math.inf else str(bound)}
        grows = [(n, count * (value <= bound)) for n, count, value in phases]
        out.append({"series": _selector(f"{base}_bucket", le), "values": _values(grows)})
    totals = [(n, count * value) for n, count, value in phases]
    out.append({"series": _selector(f"{base}_sum", labels), "values": _values(totals)})
    counts = [(n, count) for n, count, _ in phases]
    out.append({"series": _selector(f"{base}_count", labels), "values": _values(counts)})
    return out


def counter(
    name: str, labels: Mapping[str, str], phases: Sequence[CounterPhase]
) -> list[dict[str, str]]:
    return [{"series": _selector(name, labels), "values": _values(phases)}]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool")
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
    )


def _export_with(tests: Sequence[Path], rules: Sequence[Rule], into: Path) -> None:
    for test in tests:
        shutil.copy(test, into / test.name)
    (into / "rules.yaml").write_text(render_rules(rules, source="the tests' rules"))


def test_series_helper_writes_promtool_expanding_notation() -> None:
    assert _values([(10, 6), (5, 2)]) == "0+6x10 62+2x4"


def test_series_helper_writes_one_sample_phase_alone() -> None:
    assert _values([(3, 1.5), (1, 10)]) == "0+1.5x3 14.5"


# --------------------------------------------------------------------------- promtool: shipped files

SHIPPED = sorted(PROMTOOL_DIR.glob("*.yaml"))
SHIPPED_IDS = [path.stem for path in SHIPPED]


def test_promtool_check_rules_accepts_the_export(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(render_rules(default_rules()))
    done = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout


def test_promtool_check_rules_accepts_every_kind_of_rule(tmp_path: Path) -> None:
    thresholds = Thresholds(label="model", values={"a.b": 0.5, 'q"': 0.7}, default=0.9)
    rules = [
        _rule(name="Quantile", group_by=("route", "model"), min_samples=20, for_s=60.0,
              keep_firing_for_s=300.0, labels={"severity": "page"}),
        _rule(name="Mean", signal="time_per_output_token", aggregation="mean", op=">",
              threshold=thresholds, group_by=("provider",), match={"route": 'x"\\y'}),
        _rule(name="Ratio", signal="request_success_rate", aggregation="ratio",
              threshold=-0.01, min_samples=50, baseline=Baseline(window_s=86400.0)),
    ]  # fmt: skip
    (tmp_path / "rules.yaml").write_text(render_rules(rules, interval_s=30.0))
    done = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


@pytest.mark.parametrize("test_file", SHIPPED, ids=SHIPPED_IDS)
def test_promtool_unit_tests_pass_on_the_export(test_file: Path, tmp_path: Path) -> None:
    _export_with([test_file], default_rules(), tmp_path)
    done = promtool("test", "rules", test_file.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@functools.cache
def _read(path: Path) -> Any:
    """A YAML file, parsed once per run (the C loader: the promtool files are long)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = _read(path)
    return loaded


def _alert_checks(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(test name, alert_rule_test entry) for every alert check in a shipped file."""
    return [
        (test["name"], check)
        for test in _load(path)["tests"]
        for check in test.get("alert_rule_test", ())
    ]


@pytest.mark.parametrize("rule", default_rules(), ids=lambda rule: rule.name)
def test_each_default_rule_has_a_promtool_test_firing_and_one_not(rule: Rule) -> None:
    checks = [check for path in SHIPPED for _, check in _alert_checks(path)]
    outcomes = {bool(check["exp_alerts"]) for check in checks if check["alertname"] == rule.name}
    assert outcomes == {True, False}


def _series_names(test: Mapping[str, Any]) -> list[tuple[str, dict[str, str]]]:
    pattern = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
    out = []
    for series in test["input_series"]:
        name, _, inner = series["series"].partition("{")
        labels = {key: orjson.loads(f'"{value}"') for key, value in pattern.findall(inner)}
        out.append((name, labels))
    return out


def _exported() -> dict[str, m.Spec]:
    def prometheus_name(spec: m.Spec) -> str:
        name = spec.name.replace(".", "_") + ("_seconds" if spec.unit == "s" else "")
        return name + "_total" if spec.kind == "counter" else name

    return {prometheus_name(spec): spec for spec in m.SPECS}


SCRAPE_LABELS = {"job", "instance"}


@pytest.mark.parametrize("test_file", SHIPPED, ids=SHIPPED_IDS)
def test_promtool_series_carry_only_labels_the_agent_exports(test_file: Path) -> None:
    exported = _exported()
    for test in _load(test_file)["tests"]:
        for name, labels in _series_names(test):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            spec = exported[base if base in exported else name]
            allowed = {key.replace(".", "_") for key in spec.attributes} | SCRAPE_LABELS
            assert set(labels) - {"le"} <= allowed, name


@pytest.mark.parametrize("test_file", SHIPPED, ids=SHIPPED_IDS)
def test_promtool_histograms_have_every_bucket_of_the_agent(test_file: Path) -> None:
    exported = _exported()
    for test in _load(test_file)["tests"]:
        found: dict[tuple[str, str], set[str]] = {}
        for name, labels in _series_names(test):
            if name.endswith("_bucket"):
                key = (name, repr(sorted((k, v) for k, v in labels.items() if k != "le")))
                found.setdefault(key, set()).add(labels["le"])
        for (name, _), les in found.items():
            bounds = exported[name.removesuffix("_bucket")].buckets
            assert bounds is not None
            assert les == {*(str(bound) for bound in bounds), "+Inf"}, name


# The measured value behind each firing check of the shipped files, worked out by hand from
# their series (histogram_quantile interpolates linearly inside the bucket holding the rank).
FIRING_VALUES: dict[tuple[str, str], float] = {
    ("context_relevance_low", "fires on a low median"): 0.65 + 0.025 * 0.5,
    ("output_validity_low", "fires when one output in ten fails"): 0.9,
    ("output_validity_low", "fires at 0 when no output is valid"): 0.0,
    ("stream_choppy", "fires on choppy streams"): 0.02 + 0.005 * 0.95,
    ("latency_slo", "fires on short prompts over 50ms"): 0.04 + 0.04 * 0.95,
    ("latency_slo", "fires on long-context prompts over 180ms"): 0.16 + 0.16 * 0.95,
    ("slow_first_token", "fires on a slow first token"): 0.1 + 0.15 * 0.95,
    # Baseline [20m, 80m]: 500 good scores in (0.85, 0.875], 100 bad in (0.775, 0.8].
    ("relevance_regression", "fires on a drop against the hour before"): (
        (0.775 + 0.025 * 0.5) / (0.85 + 0.025 * (300 - 100) / 500) - 1
    ),
    # Canary scores in (0.75, 0.775], stable ones in (0.85, 0.875], over the same 10 minutes.
    ("canary_relevance_drop", "fires when the canary is 10% below the stable variant"): (
        (0.75 + 0.025 * 0.5) / (0.85 + 0.025 * 0.5) - 1
    ),
    ("canary_answer_relevance_drop", "fires when the canary is 10% below the stable variant"): (
        (0.75 + 0.025 * 0.5) / (0.85 + 0.025 * 0.5) - 1
    ),
    (
        "canary_validity_drop",
        "fires when one canary output in ten fails and none of the stable ones do",
    ): (0.9 / 1.0 - 1),
}


def _firing(path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (name, check["alertname"], alert)
        for name, check in _alert_checks(path)
        for alert in check["exp_alerts"]
    ]


def test_promtool_firing_checks_all_have_their_value_worked_out() -> None:
    keys = {(path.stem, name) for path in SHIPPED for name, _, _ in _firing(path)}
    assert keys == set(FIRING_VALUES)


@pytest.mark.parametrize("test_file", SHIPPED, ids=SHIPPED_IDS)
def test_promtool_expected_annotations_are_what_the_agent_renders(test_file: Path) -> None:
    rules = {rule.name: rule for rule in default_rules()}
    for name, alertname, alert in _firing(test_file):
        rule = rules[alertname]
        value = FIRING_VALUES[(test_file.stem, name)]
        group = {label: alert["exp_labels"][label] for label in rule.group_labels}
        rendered = {
            key: render(template, value=value, labels=group)
            for key, template in rule.annotations.items()
        }
        assert alert["exp_annotations"] == rendered, name


@pytest.mark.parametrize("test_file", SHIPPED, ids=SHIPPED_IDS)
def test_promtool_expected_labels_are_the_agent_alert_labels(test_file: Path) -> None:
    rules = {rule.name: rule for rule in default_rules()}
    for name, alertname, alert in _firing(test_file):
        rule = rules[alertname]
        assert set(alert["exp_labels"]) == {*rule.labels, *rule.group_labels}, name


# --------------------------------------------------------------------------- promtool: generated


def _write_test(path: Path, tests: list[dict[str, Any]]) -> None:
    document = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=1_000_000))


def _run_generated(tmp_path: Path, rules: Sequence[Rule], tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yaml").write_text(render_rules(rules))
    _write_test(tmp_path / "test.yaml", tests)
    done = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


OUTPUTS = "semantic_health_outputs_total"


def _outputs(route: str, valid: int, invalid: int) -> list[dict[str, str]]:
    labels = {"job": "semhealth", "route": route, "model": "m", "provider": "openai_chat",
              "prompt_class": "short"}  # fmt: skip
    return [
        *counter(OUTPUTS, {**labels, "result": "valid"}, [(15, valid)]),
        *counter(OUTPUTS, {**labels, "result": "syntax"}, [(15, invalid)]),
    ]


def test_promtool_escaped_label_values_select_exactly_their_series(tmp_path: Path) -> None:
    # A route named like a regex, and one with a quote and a backslash. If "." were not
    # escaped, /v1/chatXcompletions would fall out of the default's !~ and never alert.
    odd = 'a"b\\c'
    thresholds = Thresholds(label="route", values={"/v1/chat.completions": 0.99, odd: 0.9},
                            default=0.5)  # fmt: skip
    rule = Rule(name="Validity", signal="model_output_validity_rate", aggregation="ratio",
                window_s=300.0, op="<", threshold=thresholds,
                annotations={"summary": '{{ $labels.route }} {{ printf "%.2f" $value }}'})  # fmt: skip
    series = [*_outputs("/v1/chat.completions", 19, 1), *_outputs(odd, 8, 2),
              *_outputs("/v1/chatXcompletions", 4, 6)]  # fmt: skip
    expected = [("/v1/chat.completions", "0.95"), ("/v1/chatXcompletions", "0.40"), (odd, "0.80")]
    exp_alerts = [
        {"exp_labels": {"route": route}, "exp_annotations": {"summary": f"{route} {value}"}}
        for route, value in expected
    ]
    test = {"interval": "1m", "input_series": series,
            "alert_rule_test": [{"eval_time": "10m", "alertname": "Validity",
                                 "exp_alerts": exp_alerts}]}  # fmt: skip
    _run_generated(tmp_path, [rule], [test])


RELEVANCE = "semantic_health_context_relevance_score"


def _scores(route: str, phases: Sequence[HistogramPhase]) -> list[dict[str, str]]:
    labels = {"job": "semhealth", "route": route, "model": "m", "provider": "openai_chat",
              "prompt_class": "short"}  # fmt: skip
    return histogram(RELEVANCE, labels, buckets.RELEVANCE, phases)


def test_promtool_relative_rule_needs_min_samples_in_the_baseline(tmp_path: Path) -> None:
    # Both routes drop from 0.8625 to 0.7875 at 70m. /busy had 10 scores a minute before;
    # /quiet one every 5 minutes, 12 in its baseline hour: too few to compare against.
    rule = Rule(name="Drop", signal="context_relevance_score", aggregation="p50",
                window_s=300.0, op="<", threshold=-0.05, min_samples=20, group_by=("route",),
                baseline=Baseline(window_s=3600.0))  # fmt: skip
    quiet: list[HistogramPhase] = [(5, 0, 0.86), *[(4, 0, 0.86), (1, 1, 0.86)] * 13, (5, 10, 0.79)]
    test = {"interval": "1m",
            "input_series": [*_scores("/busy", [(70, 10, 0.86), (5, 10, 0.79)]),
                             *_scores("/quiet", quiet)],
            "alert_rule_test": [{"eval_time": "75m", "alertname": "Drop",
                                 "exp_alerts": [{"exp_labels": {"route": "/busy"}}]}]}  # fmt: skip
    _run_generated(tmp_path, [rule], [test])


def test_promtool_mean_over_renamed_labels_alerts_under_rule_labels(tmp_path: Path) -> None:
    rule = Rule(name="SlowMean", signal="time_to_first_token", aggregation="mean",
                window_s=300.0, op=">", threshold=0.1, group_by=("model", "provider"),
                annotations={"summary": '{{ $labels.model }} {{ printf "%.2f" $value }}'})  # fmt: skip
    labels = {"job": "semhealth", "gen_ai_operation_name": "chat",
              "gen_ai_provider_name": "openai", "gen_ai_response_model": "gpt-4o",
              "route": "/chat", "prompt_class": "short"}  # fmt: skip
    series = [
        *histogram("gen_ai_server_time_to_first_token_seconds",
                   {**labels, "gen_ai_request_model": "gpt-4o"}, buckets.GEN_AI_TTFT_S,
                   [(15, 6, 0.5)]),
        *histogram("gen_ai_server_time_to_first_token_seconds",
                   {**labels, "gen_ai_request_model": "gpt-4o-latest"}, buckets.GEN_AI_TTFT_S,
                   [(15, 4, 0.25)]),
    ]  # fmt: skip
    exp = {"exp_labels": {"model": "gpt-4o", "provider": "openai"},
           "exp_annotations": {"summary": "gpt-4o 0.40"}}  # fmt: skip
    test = {"interval": "1m", "input_series": series,
            "alert_rule_test": [{"eval_time": "10m", "alertname": "SlowMean",
                                 "exp_alerts": [exp]}]}  # fmt: skip
    _run_generated(tmp_path, [rule], [test])


def test_durations_in_the_export_parse_back() -> None:
    document = rule_groups(default_rules())
    for out in document["groups"][0]["rules"]:
        assert parse_duration(out["for"]) is not None
