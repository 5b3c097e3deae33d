"""The container injection adds is the one the chart and README document, and the scorer
it is pointed at really loads through the agent's configuration."""

from __future__ import annotations

from semhealth.agent.config import load_config
from semhealth.agent.kube import Settings, read_options
from semhealth.agent.kube.sidecar import container, env, volumes
from semhealth.embeddings import resolve_profile

SETTINGS = Settings(image="semhealth/semhealth:0.1.0")


def test_container_is_the_documented_interface() -> None:
    made = container(read_options({}, SETTINGS))
    assert made["name"] == "semhealth"
    assert made["image"] == "semhealth/semhealth:0.1.0"
    assert made["command"] == [
        "semhealth", "run", "--config-if-present", "/etc/semhealth/semhealth.yaml",
        "--upstream", "http://127.0.0.1:8000", "--listen", "0.0.0.0:8080",
        "--admin-listen", "0.0.0.0:9464",
    ]  # fmt: skip
    assert made["ports"] == [
        {"name": "semhealth-proxy", "containerPort": 8080, "protocol": "TCP"},
        {"name": "semhealth-admin", "containerPort": 9464, "protocol": "TCP"},
    ]
    assert made["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "semhealth-admin"}
    assert made["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "semhealth-admin"}
    assert made["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert made["volumeMounts"] == [
        {"name": "semhealth-config", "mountPath": "/etc/semhealth", "readOnly": True},
        {"name": "semhealth-tmp", "mountPath": "/tmp"},
    ]
    assert made["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    # Kubernetes port names are at most 15 characters (IANA service name).
    assert all(len(port["name"]) <= 15 for port in made["ports"])


def test_volumes_mount_the_configmap_and_a_writable_tmp() -> None:
    options = read_options({"semhealth.io/config-map": "chat-semhealth"}, SETTINGS)
    assert volumes(options) == [
        # Optional: a namespace without the ConfigMap still runs the sidecar, on defaults.
        {"name": "semhealth-config", "configMap": {"name": "chat-semhealth", "optional": True}},
        {"name": "semhealth-tmp", "emptyDir": {}},
    ]


def test_downward_api_names_are_read_as_resource_attributes() -> None:
    variables = {item["name"]: item for item in env(read_options({}, SETTINGS))}
    assert variables["K8S_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert variables["K8S_NAMESPACE_NAME"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert "SEMHEALTH_RELEVANCE__SCORER" not in variables


def test_scorer_env_loads_as_remote_encoders_through_the_agents_config() -> None:
    """The env the container gets, with the downward API filled in as the kubelet would,
    and the command's flags, load into every encoder asking the shared scorer."""
    made = container(read_options({"semhealth.io/scorer": "semhealth-scorer.ops:50051"}, SETTINGS))
    filled = {"K8S_POD_NAME": "chat-7d9f8-abcde", "K8S_NAMESPACE_NAME": "shop"}
    environ = {item["name"]: item.get("value", filled.get(item["name"])) for item in made["env"]}
    flags = made["command"]
    config = load_config(
        None,
        environ,
        {
            "upstream.url": flags[flags.index("--upstream") + 1],
            "listen.proxy": flags[flags.index("--listen") + 1],
            "listen.admin": flags[flags.index("--admin-listen") + 1],
        },
    )
    embeddings = config.relevance.embeddings
    # The default profile's encoders, each asked of the scorer under its own name, routed
    # as the profile routes them.
    local = resolve_profile(None)
    assert {e.name: (e.backend, e.remote.url) for e in embeddings.encoders} == {
        e.name: ("scorer", "semhealth-scorer.ops:50051") for e in local.encoders
    }
    assert (embeddings.encoder, embeddings.route_cjk_to) == (local.encoder, local.route_cjk_to)
    assert dict(config.telemetry.resource_attributes) == {
        "k8s.pod.name": "chat-7d9f8-abcde",
        "k8s.namespace.name": "shop",
    }
    assert str(config.listen.proxy) == "0.0.0.0:8080"
