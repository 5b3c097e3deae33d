"""Sample manifests and a real AdmissionReview v1 request, as the API server sends it."""

from __future__ import annotations

import copy
import uuid
from typing import Any

IMAGE = "semhealth/semhealth:0.1.0"


def pod_template(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A vLLM-backed chat app's Pod template: the app calls the model server on localhost."""
    metadata: dict[str, Any] = {"labels": {"app": "chat"}}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {
        "metadata": metadata,
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "example/chat:1.2",
                    "env": [
                        {"name": "OPENAI_BASE_URL", "value": "http://127.0.0.1:8080/v1"},
                        {"name": "DB_PASSWORD", "value": "hunter2-do-not-log"},
                    ],
                    "ports": [{"name": "http", "containerPort": 3000}],
                },
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.6.0",
                    "args": ["--port", "8000"],
                    "ports": [{"name": "openai", "containerPort": 8000}],
                },
            ],
            "volumes": [{"name": "models", "emptyDir": {}}],
        },
    }


def deployment(annotations: dict[str, str] | None = None, name: str = "chat") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "chat"}},
            "template": pod_template(annotations),
        },
    }


def pod_from(template: dict[str, Any], generate_name: str = "chat-7d9f8-") -> dict[str, Any]:
    """The Pod a ReplicaSet makes from ``template``, as the API server hands it to admission
    (no name yet, only generateName)."""
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(template)}
    pod["metadata"]["generateName"] = generate_name
    return pod


def admission_review(pod: dict[str, Any], *, operation: str = "CREATE") -> dict[str, Any]:
    """An AdmissionReview v1 request for ``pod``, shaped as kube-apiserver sends one."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "5d5a0d2b-0c4e-4f0e-9a57-7d1c4e3b2a11",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
