"""Injected workloads validate strictly against the Kubernetes schemas (PyPI
``kubernetes-validate``) for the oldest version the chart claims and the newest known, so
the webhook can never turn a good Pod into one the API server refuses."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from semhealth.agent.kube import Settings, inject_text
from tests.agent.kube.samples import IMAGE, deployment, pod_template
from tests.servers import require_module

kubernetes_validate = require_module("kubernetes_validate", "kubernetes-validate")

OLDEST = "1.25.0"  # helm/semhealth/Chart.yaml: kubeVersion >=1.25
NATIVE_SIDECARS = "1.29.0"  # init containers with restartPolicy Always, on by default
NEWEST = kubernetes_validate.latest_version()
SETTINGS = Settings(image=IMAGE, scorer="semhealth-scorer.semhealth:50051")
INJECT = {
    "semhealth.io/inject": "true",
    "semhealth.io/takeover-port": "8000",
    "semhealth.io/upstream-port": "8001",
    "semhealth.io/cpu-limit": "500m",
}


def moved_template(extra: dict[str, str] | None = None) -> dict[str, Any]:
    """The sample Pod template with its model server moved to 8001 (takeover)."""
    template = pod_template({**INJECT, **(extra or {})})
    vllm = template["spec"]["containers"][1]
    vllm["args"], vllm["ports"] = ["--port", "8001"], [{"name": "openai", "containerPort": 8001}]
    return template


def workloads(native: bool) -> list[dict[str, Any]]:
    service = deployment(None)
    service["spec"]["template"] = moved_template()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat", "namespace": "shop"}}
    pod |= {"spec": moved_template()["spec"]}
    pod["metadata"]["annotations"] = INJECT
    objects = [service, pod]
    if native:
        job_template = moved_template()
        job_template["spec"]["restartPolicy"] = "OnFailure"
        objects.append(
            {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "metadata": {"name": "eval", "namespace": "shop"},
                "spec": {
                    "schedule": "0 * * * *",
                    "jobTemplate": {"spec": {"template": job_template}},
                },
            }
        )
    return objects


@pytest.mark.parametrize(
    ("version", "native"), [(OLDEST, False), (NATIVE_SIDECARS, True), (NEWEST, True)]
)
def test_injected_workloads_validate_strictly(version: str, native: bool) -> None:
    text = yaml.safe_dump_all(workloads(native), sort_keys=False)
    out, outcomes = inject_text(text, SETTINGS)
    assert all(outcome.changed for outcome in outcomes)
    for document in yaml.safe_load_all(out):
        kubernetes_validate.validate(document, version, strict=True)
