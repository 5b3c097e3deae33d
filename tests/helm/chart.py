"""The chart under test, rendered by Helm's own Go library (helm-python-sdk), and the value
sets the tests render it with: the defaults, every component off, and every documented
option set (``OPTION_SETS``; a test checks each key of values.yaml is changed by one)."""

from __future__ import annotations

import copy
import functools
import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "semhealth"
RELEASE = "obs"
NAMESPACE = "semhealth-system"

# The Kubernetes versions the chart claims (Chart.yaml kubeVersion, helm/README.md): the
# oldest and the newest that kubernetes-validate knows.
KUBE_VERSIONS = ("1.25", "1.37")

# Kinds from CustomResourceDefinitions: Kubernetes' own schemas do not know them.
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
CERT_MANAGER_KINDS = {"Certificate", "Issuer"}
# Validated against the CRDs in ../shared/crds by test_canary_templates.py.
ROLLOUT_CONTROLLER_KINDS = {"AnalysisTemplate", "ClusterAnalysisTemplate", "MetricTemplate"}

DASHBOARD = {"title": "semhealth chart test", "uid": "semhealth-chart-test", "panels": []}

DISABLED: dict[str, Any] = {
    "sidecarConfig": {"enabled": False},
    "injector": {"enabled": False},
    "scorer": {"enabled": False},
    "serviceAccount": {"create": False},
    "dashboards": {"enabled": False},
}

# Every option of values.yaml set away from its default, over two sets (cert-manager with
# an Issuer the chart makes and with the user's own).
_COMMON: dict[str, Any] = {
    "nameOverride": "sh",
    "image": {"repository": "registry.example/semhealth", "tag": "0.1.1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "pull-secret"}],
    "commonLabels": {"team": "ml-platform"},
    "sidecarConfig": {"name": "semhealth-sidecar", "namespaces": ["apps", "staging"]},
    "config": {
        "listen": {"proxy": "0.0.0.0:8081", "admin": "0.0.0.0:9464"},
        "relevance": {
            "sample_rate": 0.25,
            "route_cjk_to": "default",
            "encoders": [
                {"name": "default", "backend": "scorer", "remote": {"url": "obs-sh-scorer:50051"}}
            ],
        },
        "alerts": {"enabled": True},
    },
    "injector": {
        "replicaCount": 3,
        "port": 9443,
        "failurePolicy": "Fail",
        "timeoutSeconds": 3,
        # A map in values merges with the default one: null removes the default's matchLabels.
        "namespaceSelector": {
            "matchLabels": None,
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": ["apps", "staging"],
                }
            ],
        },
        "objectSelector": {"matchLabels": {"semhealth.io/observe": "yes"}},
        "useScorer": False,
        "injectAll": True,
        "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "192Mi"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
        ],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/component": "injector"}
                            },
                        },
                    }
                ]
            }
        },
        "podAnnotations": {"example.com/owner": "platform"},
        "podLabels": {"tier": "control"},
        "priorityClassName": "system-cluster-critical",
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": "34%"},
        "service": {"type": "ClusterIP", "port": 8443},
        "metricsPort": 9090,
    },
    "selfSignedCertificate": {"validityDays": 365},
    "scorer": {
        "image": {
            "repository": "registry.example/semhealth-scorer",
            "tag": "0.1.1",
            "pullPolicy": "Always",
        },
        "replicaCount": 2,
        "port": 50052,
        "config": {
            "relevance": {
                "route_cjk_to": "default",
                "encoders": [
                    {
                        "name": "default",
                        "backend": "local",
                        "local": {"model": "all-MiniLM-L6-v2", "device": "cuda", "fp16": False},
                    }
                ],
            }
        },
        "resources": {
            "requests": {"cpu": "2", "memory": "3Gi", "nvidia.com/gpu": 1},
            "limits": {"memory": "6Gi", "nvidia.com/gpu": 1},
        },
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "nvidia.com/gpu.product",
                                    "operator": "In",
                                    "values": ["NVIDIA-L4"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
        "runtimeClassName": "nvidia",
        "podAnnotations": {"example.com/owner": "ml"},
        "podLabels": {"tier": "gpu"},
        "priorityClassName": "high",
        "service": {"type": "NodePort"},
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": "50%"},
        "autoscaling": {
            "enabled": True,
            "minReplicas": 2,
            "maxReplicas": 8,
            "externalMetricName": "semhealth_demand",
            "targetAverageValue": "150",
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
        "metricsPort": 9091,
        "networkPolicy": {
            "enabled": True,
            # Selectors merge with the defaults: null removes a default label.
            "clients": {
                "podSelector": {
                    "matchLabels": {
                        "semhealth.io/injected": None,
                        "app.kubernetes.io/part-of": "llm-apps",
                    }
                },
                "namespaceSelector": {"matchLabels": None},
            },
            "metrics": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": None, "app": "prom"}},
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": None, "team": "observability"}
                },
            },
        },
    },
    "adminWebConfig": {
        "enabled": True,
        "secretName": "sh-admin-web",
        "webConfig": {
            "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},
            "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
            # A bcrypt hash of "chart-test" (cost 4): only its shape is checked here.
            "basic_auth_users": {
                "prometheus": "$2b$04$FTLbEIa8Yc7ZvvRcNf5x6OmHj2g3aR9OJLGvBQs9DBgkoKUM.BUBO"
            },
        },
        "files": {"tls.crt": "PEM certificate", "tls.key": "PEM key"},
    },
    "podMonitor": {
        "enabled": True,
        "selector": {"matchLabels": {"semhealth.io/injected": "true", "env": "prod"}},
        "namespaces": ["apps", "staging"],
        "portName": "sh-admin",
        "interval": "15s",
        "scrapeTimeout": "5s",
        "labels": {"release": "kube-prometheus-stack"},
        "scheme": "https",
        "basicAuth": {
            "username": {"name": "semhealth-scrape", "key": "username"},
            "password": {"name": "semhealth-scrape", "key": "password"},
        },
        "tlsConfig": {
            "ca": {"secret": {"name": "semhealth-scrape", "key": "ca.crt"}},
            "serverName": "semhealth-admin",
        },
    },
    "serviceMonitor": {
        "enabled": True,
        "interval": "20s",
        "scrapeTimeout": "5s",
        "labels": {"release": "kube-prometheus-stack"},
    },
    "prometheusRule": {
        "enabled": True,
        "alerts": True,
        "recordingRules": True,
        "interval": "1m",
        "labels": {"release": "kube-prometheus-stack"},
    },
    "rulesConfigMap": {"enabled": True},
    "canary": {
        "prometheusAddress": "http://prometheus.monitoring:9090",
        "tolerance": 0.03,
        "minSamples": 50,
        "signals": {"contextRelevance": True, "answerRelevance": False, "validity": False},
        "argoRollouts": {
            "enabled": True,
            "name": "llm-gates",
            "clusterScoped": True,
            "window": "15m",
            "interval": "2m",
            "count": 5,
            "failureLimit": 1,
            "inconclusiveLimit": 3,
            "route": "chat|search",
        },
        "flagger": {"enabled": True, "name": "llm-gates"},
    },
    "dashboards": {
        "enabled": True,
        "namespace": "monitoring",
        "labels": {"grafana_dashboard": "1", "team": "ml-platform"},
        "annotations": {"grafana_folder": "semhealth"},
    },
    "podSecurityContext": {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "serviceAccount": {"create": True, "annotations": {"example.com/role": "semhealth"}},
}


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


OPTION_SETS: dict[str, dict[str, Any]] = {
    "cert-manager-own-issuer": _merged(
        _COMMON,
        {
            "fullnameOverride": "semhealth",
            "certManager": {"enabled": True, "duration": "2160h", "renewBefore": "360h"},
        },
    ),
    "cert-manager-cluster-issuer": _merged(
        _COMMON,
        {
            "certManager": {
                "enabled": True,
                "issuerRef": {
                    "name": "internal-ca",
                    "kind": "ClusterIssuer",
                    "group": "cert-manager.io",
                },
            },
            "prometheusRule": {"alerts": False},
            "adminWebConfig": {"existingSecret": "my-admin-web"},
            "scorer": {
                "autoscaling": {
                    "metrics": [
                        {
                            "type": "Resource",
                            "resource": {
                                "name": "cpu",
                                "target": {"type": "Utilization", "averageUtilization": 70},
                            },
                        }
                    ]
                }
            },
        },
    ),
    "alerts-only-self-signed": _merged(
        _COMMON,
        {
            "prometheusRule": {"recordingRules": False},
            "injector": {
                "podDisruptionBudget": {"enabled": False},
                "service": {"type": "NodePort"},
                "injectAll": False,
                "extraArgs": ["--all"],
            },
            "scorer": {"podDisruptionBudget": {"enabled": False}},
            "canary": {
                "signals": {"contextRelevance": False, "answerRelevance": True, "validity": True},
                "argoRollouts": {"clusterScoped": False},
            },
        },
    ),
}

VALUE_SETS: dict[str, dict[str, Any]] = {"defaults": {}, "disabled": DISABLED, **OPTION_SETS}


@functools.cache
def chart_copy(root: Path) -> Path:
    """The chart copied under ``root``, with a dashboard added when dashboards/ has none yet
    (the dashboards' own files come from grafana/; the template is tested either way)."""
    target = root / "semhealth"
    shutil.copytree(CHART_DIR, target)
    dashboards = target / "dashboards"
    dashboards.mkdir(exist_ok=True)
    if not any(dashboards.glob("*.json")):
        (dashboards / "semhealth-chart-test.json").write_text(json.dumps(DASHBOARD, indent=2))
    return target


@functools.cache
def load(path: Path) -> helm.Chart:
    return helm.Chart.load(path)


def render(path: Path, values: Mapping[str, Any]) -> dict[str, str]:
    """Template path -> rendered text, as `helm install` would render it (offline)."""
    return load(path).render(dict(values), name=RELEASE, namespace=NAMESPACE, is_install=True)


def objects(rendered: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in the rendered templates (NOTES.txt is not a manifest)."""
    out = []
    for name, text in sorted(rendered.items()):
        if name.endswith("NOTES.txt"):
            continue
        out += [doc for doc in yaml.safe_load_all(text) if doc]
    return out


def by_kind(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in items if item["kind"] == kind]


def one(items: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in by_kind(items, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} found"
    return found[0]


def leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Key paths of ``values``' leaves; a non-empty mapping is walked, anything else is a leaf."""
    if isinstance(values, Mapping) and values:
        for key, value in values.items():
            yield from leaf_paths(value, (*prefix, key))
    else:
        yield prefix


def get_path(values: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = values
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


_MISSING = object()
