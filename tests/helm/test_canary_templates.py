"""The canary gates the chart ships for the rollout controllers our users run: the Argo Rollouts
(Cluster)AnalysisTemplate and the Flagger MetricTemplates validate strictly against the
controllers' own CRD schemas (../shared/crds), as do the Rollout and Canary the README shows
using them; their queries are the exported Canary* rules' comparison with the controller's
variant values; the values' tolerance and minimum samples reach them."""

from __future__ import annotations

import gzip
import io
import re
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from semhealth.agent.cli import main as semhealth_main
from tests.helm import canary, chart

ENABLED: dict[str, Any] = {
    "canary": {"argoRollouts": {"enabled": True}, "flagger": {"enabled": True}},
}
# Signal in the templates -> the exported rule with the same comparison.
RULES = {
    "context-relevance": "CanaryRelevanceDrop",
    "answer-relevance": "CanaryAnswerRelevanceDrop",
    "validity": "CanaryValidityDrop",
}


@pytest.fixture(scope="module")
def gates(chart_dir: Path) -> list[dict[str, Any]]:
    return canary.gate_objects(chart.render(chart_dir, ENABLED))


def _exported_rules() -> dict[str, dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert semhealth_main(["rules", "export", "--format", "prometheus"]) == 0
    groups = yaml.safe_load(out.getvalue())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _from_rule(expr: str, canary_selector: str, stable_selector: str) -> str:
    """The rule's expression as a gate asks it: the alert's threshold left to the controller,
    the variants replaced, the worst route taken."""
    expr, removed = re.subn(r" < -0\.05\n", " ", expr)
    assert removed == 1, expr
    expr = expr.replace('variant="canary"', canary_selector)
    expr = expr.replace('variant="stable"', stable_selector)
    return " ".join(f"min(({expr}))".split())


# ------------------------------------------------------------------------------ the CRDs


def test_the_gates_validate_strictly_against_the_controllers_crds(
    gates: list[dict[str, Any]], manifests: dict[str, list[dict[str, Any]]]
) -> None:
    every = gates + [
        o for items in manifests.values() for o in items if o["kind"] in canary.CRD_FILES
    ]
    assert {o["kind"] for o in every} == {
        "AnalysisTemplate",
        "ClusterAnalysisTemplate",
        "MetricTemplate",
    }
    assert [canary.crd_errors(o) for o in every] == [[] for _ in every]


def test_strict_crd_validation_catches_a_misspelt_field(gates: list[dict[str, Any]]) -> None:
    template = chart.one(gates, "AnalysisTemplate")
    metric = dict(template["spec"]["metrics"][0], successCondtion="true")
    broken = {**template, "spec": {**template["spec"], "metrics": [metric]}}
    assert any("successCondtion" in error for error in canary.crd_errors(broken))
    flagger = chart.one(gates, "MetricTemplate", "semhealth-canary-validity")
    broken = {
        **flagger,
        "spec": {**flagger["spec"], "provider": {"type": "prometheus", "adress": "x"}},
    }
    assert any("adress" in error for error in canary.crd_errors(broken))


def test_the_readme_rollout_and_canary_validate_and_use_the_gates(
    gates: list[dict[str, Any]],
) -> None:
    rollout, flagger_canary = canary.readme_examples()
    assert canary.crd_errors(rollout) == []
    assert canary.crd_errors(flagger_canary) == []
    template = chart.one(gates, "AnalysisTemplate")
    step = rollout["spec"]["strategy"]["canary"]["analysis"]
    # The chart's release namespace is not the Rollout's: the cluster-scoped template.
    assert step["templates"] == [
        {"templateName": template["metadata"]["name"], "clusterScope": True}
    ]
    given = {arg["name"]: arg["valueFrom"]["podTemplateHashValue"] for arg in step["args"]}
    assert given == {"canary-hash": "Latest", "stable-hash": "Stable"}
    required = {arg["name"] for arg in template["spec"]["args"] if "value" not in arg}
    assert required <= set(given)
    names = {o["metadata"]["name"] for o in gates if o["kind"] == "MetricTemplate"}
    used = flagger_canary["spec"]["analysis"]["metrics"]
    assert {m["templateRef"]["name"] for m in used} == names
    assert {m["templateRef"]["namespace"] for m in used} == {chart.NAMESPACE}
    assert {m["thresholdRange"]["min"] for m in used} == {-0.05}
    # The annotation that picks Flagger's app label as the variant, on the target's Pods.
    pod_template = canary.README_DEPLOYMENT["spec"]["template"]
    assert pod_template["metadata"]["annotations"]["semhealth.io/variant-label"] == "app"


# ------------------------------------------------------------------------------ the queries


def test_argo_queries_are_the_exported_rules_with_the_rollouts_hashes(
    gates: list[dict[str, Any]],
) -> None:
    rules = _exported_rules()
    template = chart.one(gates, "AnalysisTemplate")
    metrics = {m["name"]: m for m in template["spec"]["metrics"]}
    assert set(metrics) == set(RULES)
    route = 'route=~"{{args.route}}"'
    for signal, rule in RULES.items():
        query = metrics[signal]["provider"]["prometheus"]["query"]
        assert query == _from_rule(
            rules[rule]["expr"],
            f'variant="{{{{args.canary-hash}}}}", {route}',
            f'variant="{{{{args.stable-hash}}}}", {route}',
        )
        assert rules[rule]["labels"]["action"] == "rollback"


def test_flagger_queries_are_the_exported_rules_with_target_and_primary(
    gates: list[dict[str, Any]],
) -> None:
    rules = _exported_rules()
    scope = 'namespace="{{ namespace }}"'
    for signal, rule in RULES.items():
        template = chart.one(gates, "MetricTemplate", f"semhealth-canary-{signal}")
        expected = _from_rule(
            rules[rule]["expr"],
            f'variant="{{{{ target }}}}", {scope}',
            f'variant="{{{{ target }}}}-primary", {scope}',
        ).replace("[10m]", "[{{ interval }}]")
        assert template["spec"]["query"] == expected
        assert template["spec"]["provider"] == {
            "type": "prometheus",
            "address": "http://prometheus-operated.monitoring.svc:9090",
        }


def test_argo_conditions_leave_no_data_inconclusive(gates: list[dict[str, Any]]) -> None:
    """Argo's expr and Python agree on these conditions; evaluated here as Argo would on the
    measurement's vector: a failure below the tolerance, a success above, neither (so
    Inconclusive, never Successful) for an empty vector or NaN."""
    for metric in chart.one(gates, "AnalysisTemplate")["spec"]["metrics"]:
        assert canary.argo_phase(metric, [-0.10]) == "Failed"
        assert canary.argo_phase(metric, [-0.02]) == "Successful"
        assert canary.argo_phase(metric, [-0.05]) == "Successful"
        assert canary.argo_phase(metric, []) == "Inconclusive"
        assert canary.argo_phase(metric, [float("nan")]) == "Inconclusive"
        assert (metric["failureLimit"], metric["inconclusiveLimit"]) == (0, 1)
        assert (metric["interval"], metric["count"]) == ("5m", 3)


# ------------------------------------------------------------------------------ the values


def test_values_reach_the_gates(manifests: dict[str, list[dict[str, Any]]]) -> None:
    items = manifests["cert-manager-own-issuer"]
    template = chart.one(items, "ClusterAnalysisTemplate", "llm-gates")
    assert "namespace" not in template["metadata"]
    (metric,) = template["spec"]["metrics"]
    assert metric["name"] == "context-relevance"
    assert metric["successCondition"] == "len(result) == 1 and result[0] >= -0.03"
    assert metric["failureCondition"] == "len(result) == 1 and result[0] < -0.03"
    assert (metric["interval"], metric["count"], metric["failureLimit"]) == ("2m", 5, 1)
    assert metric["inconclusiveLimit"] == 3
    query = metric["provider"]["prometheus"]["query"]
    assert "[15m]" in query and ">= 50)" in query and "[10m]" not in query
    assert metric["provider"]["prometheus"]["address"] == "http://prometheus.monitoring:9090"
    assert {"name": "route", "value": "chat|search"} in template["spec"]["args"]
    (flagger,) = chart.by_kind(items, "MetricTemplate")
    assert flagger["metadata"]["name"] == "llm-gates-context-relevance"
    assert flagger["metadata"]["annotations"]["semhealth.io/threshold-range-min"] == "-0.03"
    assert ">= 50)" in flagger["spec"]["query"]
    other = manifests["alerts-only-self-signed"]
    namespaced = chart.one(other, "AnalysisTemplate", "llm-gates")
    assert namespaced["metadata"]["namespace"] == chart.NAMESPACE
    assert [m["name"] for m in namespaced["spec"]["metrics"]] == ["answer-relevance", "validity"]


def test_the_gates_are_off_by_default(manifests: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {o["kind"] for o in manifests["defaults"]}
    assert not kinds & chart.ROLLOUT_CONTROLLER_KINDS


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"canary": {"tolerance": 0}}, "tolerance"),
        ({"canary": {"tolerance": 1.5}}, "tolerance"),
        ({"canary": {"minSamples": 0}}, "minSamples"),
        ({"canary": {"argoRollouts": {"window": "ten minutes"}}}, "window"),
        ({"canary": {"flagger": {"nmae": "x"}}}, "nmae"),
        ({"canary": {"prometheusAddress": "prometheus:9090"}}, "prometheusAddress"),
    ],
)
def test_the_schema_names_a_bad_canary_value(values: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        chart.load(chart.CHART_DIR).validate_schema(values)


def test_the_vendored_crds_are_the_shared_ones() -> None:
    if not canary.SHARED_CRDS.is_dir():
        pytest.skip("../shared/crds is not beside this checkout (a clean clone)")
    for vendored in sorted(canary.CRDS.glob("*.yaml.gz")):
        shared = canary.SHARED_CRDS / vendored.name.removesuffix(".gz")
        assert gzip.decompress(vendored.read_bytes()) == shared.read_bytes(), vendored.name
