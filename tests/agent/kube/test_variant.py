"""The canary variant reaches the sidecar as ``SEMHEALTH_TELEMETRY__VARIANT``: literally from
``semhealth.io/variant``, from a Pod label named by ``semhealth.io/variant-label`` (Flagger's
``app``), or from Argo Rollouts' ``rollouts-pod-template-hash`` when the Pod carries it; a
bad annotation is named with its fix; the injected Pod still validates strictly."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from semhealth.agent.config import load_config
from semhealth.agent.kube import AnnotationError, Settings, apply_patch, plan_injection, review
from semhealth.agent.kube.settings import Variant, read_variant
from semhealth.agent.kube.sidecar import VARIANT_ENV
from tests.agent.kube.samples import IMAGE, admission_review, pod_from, pod_template
from tests.servers import require_module

kubernetes_validate = require_module("kubernetes_validate", "kubernetes-validate")

SETTINGS = Settings(image=IMAGE)
INJECT = {"semhealth.io/inject": "true"}
HASH = "6d4f9c7b8"


def _injected(template: dict[str, Any]) -> dict[str, Any]:
    plan = plan_injection(template, SETTINGS)
    assert plan.inject, plan.reason
    result: dict[str, Any] = apply_patch(template, plan.operations)
    return result


def _sidecar_env(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (sidecar,) = [c for c in template["spec"]["containers"] if c["name"] == "semhealth"]
    return {item["name"]: item for item in sidecar["env"]}


def _argo_pod_template(annotations: dict[str, str]) -> dict[str, Any]:
    """A Pod template as Argo Rollouts' ReplicaSet stamps it: the hash label added."""
    template = pod_template(annotations)
    template["metadata"]["labels"]["rollouts-pod-template-hash"] = HASH
    return template


def test_argo_rollouts_pods_get_the_pod_template_hash_from_the_downward_api() -> None:
    env = _sidecar_env(_injected(_argo_pod_template(INJECT)))
    assert env[VARIANT_ENV] == {
        "name": "SEMHEALTH_TELEMETRY__VARIANT",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['rollouts-pod-template-hash']"}},
    }


def test_a_pod_without_a_variant_source_gets_no_variant_env() -> None:
    """An env var from an absent label would be empty and override telemetry.variant."""
    env = _sidecar_env(_injected(pod_template(INJECT)))
    assert VARIANT_ENV not in env


def test_the_variant_annotation_is_set_literally_and_wins_over_the_hash() -> None:
    env = _sidecar_env(_injected(_argo_pod_template({**INJECT, "semhealth.io/variant": "canary"})))
    assert env[VARIANT_ENV] == {"name": VARIANT_ENV, "value": "canary"}


def test_flagger_maps_the_workload_label_through_variant_label() -> None:
    """Flagger's primary Pods carry app: <name>-primary, the canary's app: <name>; the
    annotation (copied to the primary with the template) picks that label."""
    env = _sidecar_env(_injected(pod_template({**INJECT, "semhealth.io/variant-label": "app"})))
    assert env[VARIANT_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.labels['app']"}}


def test_the_webhook_patch_carries_the_variant_env() -> None:
    pod = pod_from(_argo_pod_template(INJECT), generate_name=f"chat-{HASH}-")
    answer = review(json.dumps(admission_review(pod)).encode(), SETTINGS)
    response = answer.response["response"]
    assert response["allowed"] is True
    operations = json.loads(base64.b64decode(response["patch"]))
    (sidecar,) = [op["value"] for op in operations if op["path"] == "/spec/containers/-"]
    fields = {
        item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"]
        for item in sidecar["env"]
        if "valueFrom" in item
    }
    assert fields[VARIANT_ENV] == "metadata.labels['rollouts-pod-template-hash']"


@pytest.mark.parametrize(
    ("annotations", "labels", "expected"),
    [
        ({"semhealth.io/variant": " stable "}, {}, Variant(value="stable")),
        ({"semhealth.io/variant-label": "app.kubernetes.io/name"}, {}, Variant(label="app.kubernetes.io/name")),
        ({}, {"rollouts-pod-template-hash": HASH}, Variant(label="rollouts-pod-template-hash")),
        ({}, {"app": "chat"}, None),
    ],
)  # fmt: skip
def test_variant_sources_in_order(
    annotations: dict[str, str], labels: dict[str, str], expected: Variant | None
) -> None:
    assert read_variant(annotations, labels) == expected


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"semhealth.io/variant": ""}, "semhealth.io/variant: '' is not a label value"),
        ({"semhealth.io/variant": "new model"}, "semhealth.io/variant: 'new model' is not a label value"),
        ({"semhealth.io/variant": "x" * 64}, "semhealth.io/variant: 'xxxx"),
        ({"semhealth.io/variant-label": "app']"}, "semhealth.io/variant-label: \"app']\" is not a label key"),
        ({"semhealth.io/variant-label": "Bad_Prefix/app"}, "semhealth.io/variant-label: 'Bad_Prefix/app' is not a label key"),
        (
            {"semhealth.io/variant": "canary", "semhealth.io/variant-label": "app"},
            "semhealth.io/variant and semhealth.io/variant-label are both set",
        ),
    ],
)  # fmt: skip
def test_a_bad_variant_annotation_is_named_with_its_fix(
    annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(AnnotationError) as raised:
        plan_injection(pod_template({**INJECT, **annotations}), SETTINGS)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("extra", [{}, {"semhealth.io/variant": "canary"}])
def test_the_injected_pod_validates_strictly(extra: dict[str, str]) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", **_injected(_argo_pod_template({**INJECT, **extra}))}
    pod["metadata"]["name"] = "chat"
    for version in ("1.25.0", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(pod, version, strict=True)


def test_the_env_the_kubelet_fills_in_loads_as_telemetry_variant() -> None:
    env = _sidecar_env(_injected(_argo_pod_template(INJECT)))
    # The kubelet resolves the fieldRef against the Pod's labels at container start.
    environ = {VARIANT_ENV: HASH}
    assert env[VARIANT_ENV]["valueFrom"]["fieldRef"]["fieldPath"].endswith(
        "['rollouts-pod-template-hash']"
    )
    config = load_config(None, environ, {"upstream.url": "http://127.0.0.1:8000"})
    assert config.telemetry.variant == HASH
