"""Every rendered object validates strictly: Kubernetes' own kinds against the schemas of the
oldest and newest Kubernetes the chart claims (kubernetes-validate), the prometheus-operator
kinds against its typed models (cloudcoil), where a field the model does not know fails too."""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from cloudcoil.models.prometheus_operator import v1 as monitoring

from tests.helm import chart

MODELS: dict[str, Any] = {
    "ServiceMonitor": monitoring.ServiceMonitor,
    "PodMonitor": monitoring.PodMonitor,
    "PrometheusRule": monitoring.PrometheusRule,
}


def _kubernetes_objects(
    manifests: dict[str, list[dict[str, Any]]],
) -> list[tuple[str, dict[str, Any]]]:
    skip = (
        chart.PROMETHEUS_OPERATOR_KINDS | chart.CERT_MANAGER_KINDS | chart.ROLLOUT_CONTROLLER_KINDS
    )
    return [(name, o) for name, items in manifests.items() for o in items if o["kind"] not in skip]


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_the_claimed_versions_are_the_ones_validated() -> None:
    """The docs claim what the tests validate, and kubernetes-validate has both versions'
    schemas (a newer release adds versions: then move the claim up with it)."""
    oldest, newest = chart.KUBE_VERSIONS
    assert _minor(newest) <= _minor(kubernetes_validate.latest_version())
    assert f'kubeVersion: ">={oldest}.0-0"' in (chart.CHART_DIR / "Chart.yaml").read_text()
    assert (
        f"**Kubernetes {oldest} to {newest}**" in (chart.CHART_DIR.parent / "README.md").read_text()
    )


@pytest.mark.parametrize("kube_version", chart.KUBE_VERSIONS)
def test_every_kubernetes_object_validates_strictly(
    manifests: dict[str, list[dict[str, Any]]], kube_version: str
) -> None:
    objects = _kubernetes_objects(manifests)
    kinds = {o["kind"] for _, o in objects}
    assert kinds >= {
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
        "Secret",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "MutatingWebhookConfiguration",
    }
    failures = []
    for value_set, item in objects:
        try:
            kubernetes_validate.validate(item, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{value_set}: {item['kind']}/{item['metadata']['name']}: {exc}")
    assert failures == []


def test_strict_validation_catches_an_unknown_field(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """The check above can fail: a misspelt field is an error in strict mode."""
    deployment = chart.one(manifests["defaults"], "Deployment", "obs-semhealth-scorer")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, chart.KUBE_VERSIONS[0], strict=True)


def _strict_model(item: dict[str, Any]) -> list[str]:
    """Validate ``item`` with its model; also report fields the model would silently drop."""
    model = MODELS[item["kind"]].model_validate(item)
    back = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return _dropped(item, back, item["kind"])


def _dropped(given: Any, kept: Any, where: str) -> list[str]:
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [where]
        return [
            problem
            for key, value in given.items()
            for problem in (
                [f"{where}.{key}"]
                if key not in kept
                else _dropped(value, kept[key], f"{where}.{key}")
            )
        ]
    if isinstance(given, list):
        if not isinstance(kept, list) or len(given) != len(kept):
            return [where]
        return [
            p
            for i, (a, b) in enumerate(zip(given, kept, strict=True))
            for p in _dropped(a, b, f"{where}[{i}]")
        ]
    return []


def test_prometheus_operator_objects_validate_against_the_models(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    seen = set()
    problems = []
    for value_set, items in manifests.items():
        for item in items:
            if item["kind"] in MODELS:
                seen.add(item["kind"])
                problems += [f"{value_set}: {p}" for p in _strict_model(item)]
    assert seen == set(MODELS)
    assert problems == []


def test_the_model_check_catches_an_unknown_field(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    monitor = chart.one(manifests["cert-manager-own-issuer"], "PodMonitor")
    endpoint = {**monitor["spec"]["podMetricsEndpoints"][0], "scrapeEvery": "15s"}
    broken = {**monitor, "spec": {**monitor["spec"], "podMetricsEndpoints": [endpoint]}}
    assert _strict_model(broken) == ["PodMonitor.spec.podMetricsEndpoints[0].scrapeEvery"]
