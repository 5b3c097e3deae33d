"""The objects injection adds to a Pod: the ``semhealth`` container and its two volumes.

Plain dicts in the Kubernetes API's own shape, so they go into a manifest or a JSON Patch
as they are. The container runs ``semhealth run`` with the flags the chart documents; it
reads its config from the ConfigMap and, when a shared scorer is named, scores through it
(set by environment, so the ConfigMap stays the same for local and remote scoring).
"""

from __future__ import annotations

from typing import Any

from semhealth.agent.kube.settings import ADMIN_PORT, Options, Variant

CONTAINER = "semhealth"
CONFIG_VOLUME = "semhealth-config"
TMP_VOLUME = "semhealth-tmp"
VOLUMES = (CONFIG_VOLUME, TMP_VOLUME)
PROXY_PORT_NAME = "semhealth-proxy"
ADMIN_PORT_NAME = "semhealth-admin"
CONFIG_DIR = "/etc/semhealth"
CONFIG_KEY = "semhealth.yaml"
RUN_AS_USER = 65532
# relevance.scorer: the sidecar asks the shared scorer for its profile's encoders, by the
# names the profiles give them, which is what a scorer on the same profile serves.
SCORER_ENV = "SEMHEALTH_RELEVANCE__SCORER"
# telemetry.variant: the `variant` label on the semantic series the canary gates compare.
VARIANT_ENV = "SEMHEALTH_TELEMETRY__VARIANT"


def container(options: Options) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": options.image,
        "command": [
            "semhealth",
            "run",
            "--config-if-present",
            f"{CONFIG_DIR}/{CONFIG_KEY}",
            "--upstream",
            f"http://127.0.0.1:{options.upstream_port}",
            "--listen",
            f"0.0.0.0:{options.proxy_port}",
            "--admin-listen",
            f"0.0.0.0:{ADMIN_PORT}",
        ],
        "ports": [
            {"name": PROXY_PORT_NAME, "containerPort": options.proxy_port, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        "env": env(options),
        "resources": resources(options),
        "readinessProbe": _probe("/readyz", period_s=5, failures=3),
        "livenessProbe": _probe("/healthz", period_s=10, failures=3),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
            # The root filesystem is read-only; the sidecar makes its Unix sockets here.
            {"name": TMP_VOLUME, "mountPath": "/tmp"},
        ],
    }


def volumes(options: Options) -> list[dict[str, Any]]:
    return [
        # Optional: a Pod in a namespace without the ConfigMap still starts (on the defaults,
        # with a warning) instead of waiting in ContainerCreating for it.
        {"name": CONFIG_VOLUME, "configMap": {"name": options.config_map, "optional": True}},
        {"name": TMP_VOLUME, "emptyDir": {}},
    ]


def env(options: Options) -> list[dict[str, Any]]:
    """Downward-API names the agent reads as resource attributes and alert labels, the
    canary variant, and the remote encoders when a shared scorer is named."""
    variables: list[dict[str, Any]] = [
        {"name": "K8S_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "K8S_NAMESPACE_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
    ]
    if options.variant is not None:
        variables.append(variant_env(options.variant))
    if options.scorer is not None:
        variables.append({"name": SCORER_ENV, "value": options.scorer})
    return variables


def variant_env(variant: Variant) -> dict[str, Any]:
    """``SEMHEALTH_TELEMETRY__VARIANT``, literal or from a Pod label. The downward API fills
    an env var once, when the container starts: a label changed later (Flagger or Argo
    relabelling a running Pod) does not reach the sidecar until the Pod is recreated."""
    if variant.value is not None:
        return {"name": VARIANT_ENV, "value": variant.value}
    field = f"metadata.labels['{variant.label}']"
    return {"name": VARIANT_ENV, "valueFrom": {"fieldRef": {"fieldPath": field}}}


def resources(options: Options) -> dict[str, Any]:
    sizes = options.resources
    limits = {"memory": sizes.memory_limit}
    if sizes.cpu_limit is not None:
        limits["cpu"] = sizes.cpu_limit
    return {
        "requests": {"cpu": sizes.cpu_request, "memory": sizes.memory_request},
        "limits": limits,
    }


def _probe(path: str, *, period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": ADMIN_PORT_NAME},
        "periodSeconds": period_s,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }
