"""The chart renders with Helm's Go library for every value set, lints clean, rejects bad
values through its schema, and renders what the shared interface promises (the injector's
flags, the webhook, the certificates, the sidecar and scorer configurations)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from semhealth.agent.cli import build_parser
from semhealth.agent.config import load_config, load_relevance
from semhealth.agent.kube.sidecar import ADMIN_PORT_NAME
from semhealth.embeddings import resolve_profile
from tests.helm import chart

ALL_SETS = list(chart.VALUE_SETS)


# --------------------------------------------------------------------------- lint and schema


@pytest.mark.parametrize("kube_version", chart.KUBE_VERSIONS)
@pytest.mark.parametrize("value_set", ALL_SETS)
def test_helm_lint_reports_nothing(chart_dir: Path, value_set: str, kube_version: str) -> None:
    report = helm.lint(
        chart_dir,
        chart.VALUE_SETS[value_set],
        strict=True,
        namespace=chart.NAMESPACE,
        kube_version=f"v{kube_version}.0",
    )
    assert report["messages"] == [] and report["errors"] == []


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_every_value_set_passes_the_values_schema(value_set: str) -> None:
    chart.load(chart.CHART_DIR).validate_schema(chart.VALUE_SETS[value_set])


def test_every_option_in_values_yaml_is_changed_by_some_value_set() -> None:
    """Each key of values.yaml, or a mapping above it, is set to something else by a value
    set, so every documented option is rendered and validated at least once."""
    defaults = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())
    # The agent's configurations are checked against the agent's own schema and loader.
    leaves = [
        p for p in chart.leaf_paths(defaults) if p[0] != "config" and p[:2] != ("scorer", "config")
    ]

    def changed(path: tuple[str, ...]) -> bool:
        return any(
            chart.get_path(values, path[:n])
            not in (chart._MISSING, chart.get_path(defaults, path[:n]))
            for values in chart.VALUE_SETS.values()
            for n in range(1, len(path) + 1)
        )

    assert [".".join(path) for path in leaves if not changed(path)] == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"injector": {"failurePolicy": "Maybe"}}, "/injector/failurePolicy"),
        ({"injector": {"replicas": 2}}, "'replicas' not allowed"),
        ({"config": {"listen": {"admin": "localhost"}}}, "/config/listen/admin"),
        ({"config": {"upstream": {"ulr": "http://x"}}}, "'ulr' not allowed"),
        (
            {"scorer": {"config": {"relevance": {"sample_rate": 2}}}},
            "/scorer/config/relevance/sample_rate",
        ),
        ({"podMonitor": {"interval": "30 seconds"}}, "/podMonitor/interval"),
        ({"sidecarConfig": {"namespaces": ["Apps"]}}, "/sidecarConfig/namespaces/0"),
    ],
)
def test_the_schema_names_the_bad_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        chart.load(chart.CHART_DIR).validate_schema(values)


def test_lint_reports_a_value_the_schema_rejects(chart_dir: Path) -> None:
    report = helm.lint(chart_dir, {"injector": {"failurePolicy": "Maybe"}}, strict=True)
    assert any("failurePolicy" in m["error"] for m in report["messages"])


# --------------------------------------------------------------------------- what renders


def test_defaults_render_the_injector_the_scorer_the_sidecar_config_and_dashboards(
    manifests: dict[str, list[dict[str, Any]]], chart_dir: Path
) -> None:
    dashboards = [o for o in manifests["defaults"] if _component(o) == "dashboards"]
    assert len(dashboards) == len(list((chart_dir / "dashboards").glob("*.json"))) > 0
    kinds = sorted(
        (o["kind"], o["metadata"]["name"]) for o in manifests["defaults"] if o not in dashboards
    )
    assert kinds == [
        ("ConfigMap", "obs-semhealth-scorer"),
        ("ConfigMap", "semhealth-config"),
        ("Deployment", "obs-semhealth-injector"),
        ("Deployment", "obs-semhealth-scorer"),
        ("MutatingWebhookConfiguration", "obs-semhealth-injector"),
        ("PodDisruptionBudget", "obs-semhealth-injector"),
        ("PodDisruptionBudget", "obs-semhealth-scorer"),
        ("Secret", "obs-semhealth-injector-tls"),
        ("Service", "obs-semhealth-injector"),
        ("Service", "obs-semhealth-scorer"),
        ("ServiceAccount", "obs-semhealth"),
    ]


def _component(item: dict[str, Any]) -> str | None:
    component: str | None = item["metadata"]["labels"].get("app.kubernetes.io/component")
    return component


def test_every_part_switches_off(manifests: dict[str, list[dict[str, Any]]]) -> None:
    assert manifests["disabled"] == []


def test_injector_runs_the_shared_interface_command(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    deployment = chart.one(manifests["defaults"], "Deployment", "obs-semhealth-injector")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "semhealth/semhealth:0.1.0"
    assert container["args"] == [
        "injector",
        "--listen",
        "0.0.0.0:8443",
        "--tls-cert",
        "/tls/tls.crt",
        "--tls-key",
        "/tls/tls.key",
        "--image",
        "semhealth/semhealth:0.1.0",
        "--config-map",
        "semhealth-config",
        "--scorer",
        f"obs-semhealth-scorer.{chart.NAMESPACE}.svc:50051",
    ]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {
            "path": "/healthz",
            "port": "https",
            "scheme": "HTTPS",
        }


def test_injector_options_reach_its_flags(manifests: dict[str, list[dict[str, Any]]]) -> None:
    deployment = chart.one(manifests["cert-manager-own-issuer"], "Deployment", "semhealth-injector")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "injector",
        "--listen",
        "0.0.0.0:9443",
        "--tls-cert",
        "/tls/tls.crt",
        "--tls-key",
        "/tls/tls.key",
        "--image",
        "registry.example/semhealth:0.1.1",
        "--all",
        "--config-map",
        "semhealth-sidecar",
    ]


@pytest.mark.parametrize("value_set", ["defaults", *chart.OPTION_SETS])
def test_injector_args_parse_with_the_semhealth_cli(
    manifests: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    """The chart and `semhealth injector` agree on every flag (argparse exits on one it
    does not know)."""
    (deployment,) = [
        d
        for d in chart.by_kind(manifests[value_set], "Deployment")
        if d["metadata"]["name"].endswith("-injector")
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["semhealth"]
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.tls_cert, args.tls_key) == (
        "injector",
        "/tls/tls.crt",
        "/tls/tls.key",
    )
    assert args.image == container["image"]


def test_webhook_follows_the_shared_interface(manifests: dict[str, list[dict[str, Any]]]) -> None:
    config = chart.one(manifests["defaults"], "MutatingWebhookConfiguration")
    (webhook,) = config["webhooks"]
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "None"
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["timeoutSeconds"] <= 10
    assert webhook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["namespaceSelector"] == {"matchLabels": {"semhealth.io/injection": "enabled"}}
    assert webhook["clientConfig"]["service"] == {
        "name": "obs-semhealth-injector",
        "namespace": chart.NAMESPACE,
        "path": "/mutate",
        "port": 443,
    }


def test_webhook_options_replace_the_defaults(manifests: dict[str, list[dict[str, Any]]]) -> None:
    (webhook,) = chart.one(manifests["cert-manager-own-issuer"], "MutatingWebhookConfiguration")[
        "webhooks"
    ]
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["timeoutSeconds"] == 3
    # The default's matchLabels is gone (set to null), so only the user's selector applies.
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["apps", "staging"]}
        ]
    }
    assert webhook["objectSelector"] == {"matchLabels": {"semhealth.io/observe": "yes"}}
    assert webhook["clientConfig"]["service"]["port"] == 8443


def _pem(b64: str) -> bytes:
    return base64.b64decode(b64)


def test_self_signed_certificate_serves_the_service_and_chains_to_the_webhook_ca(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    """Secret and caBundle come from different templates, yet from one generated pair."""
    secret = chart.one(manifests["defaults"], "Secret", "obs-semhealth-injector-tls")
    webhook = chart.one(manifests["defaults"], "MutatingWebhookConfiguration")["webhooks"][0]
    ca_bundle = webhook["clientConfig"]["caBundle"]
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["data"]["ca.crt"] == ca_bundle
    ca = x509.load_pem_x509_certificate(_pem(ca_bundle))
    cert = x509.load_pem_x509_certificate(_pem(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"obs-semhealth-injector.{chart.NAMESPACE}.svc" in names.get_values_for_type(
        x509.DNSName
    )
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    assert b"PRIVATE KEY" in _pem(secret["data"]["tls.key"])


def test_cert_manager_issues_the_certificate_and_injects_the_ca(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    items = manifests["cert-manager-own-issuer"]
    # cert-manager writes the webhook's Secret; the chart's only are the sidecars' web configs.
    secrets = chart.by_kind(items, "Secret")
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in secrets} == {"sidecar"}
    issuer = chart.one(items, "Issuer", "semhealth-injector")
    assert issuer["spec"] == {"selfSigned": {}}
    certificate = chart.one(items, "Certificate", "semhealth-injector")
    assert certificate["spec"]["secretName"] == "semhealth-injector-tls"
    assert certificate["spec"]["issuerRef"] == {
        "name": "semhealth-injector",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert f"semhealth-injector.{chart.NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    config = chart.one(items, "MutatingWebhookConfiguration")
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{chart.NAMESPACE}/semhealth-injector"
    }
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    # With the user's own issuer, the chart makes none.
    items = manifests["cert-manager-cluster-issuer"]
    assert chart.by_kind(items, "Issuer") == []
    certificate = chart.one(items, "Certificate")
    assert certificate["spec"]["issuerRef"] == {
        "name": "internal-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def _containers(items: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (deployment["spec"]["template"]["spec"], container)
        for deployment in chart.by_kind(items, "Deployment")
        for container in deployment["spec"]["template"]["spec"]["containers"]
    ]


@pytest.mark.parametrize("value_set", ["defaults", *chart.OPTION_SETS])
def test_every_container_is_locked_down(
    manifests: dict[str, list[dict[str, Any]]], value_set: str
) -> None:
    pairs = _containers(manifests[value_set])
    assert len(pairs) == 2
    for pod, container in pairs:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "memory" in container["resources"]["limits"]
        assert {"readinessProbe", "livenessProbe"} <= set(container)


def test_scorer_takes_a_gpu_and_is_health_checked_over_grpc(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    deployment = chart.one(manifests["defaults"], "Deployment", "obs-semhealth-scorer")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "semhealth/semhealth-scorer:0.1.0"
    assert container["command"] == ["semhealth"]
    assert container["args"] == [
        "scorer",
        "--listen",
        "0.0.0.0:50051",
        "--config",
        "/etc/semhealth/semhealth.yaml",
        "--metrics-listen",
        "0.0.0.0:9465",
    ]
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.listen, args.metrics_listen) == (
        "scorer",
        "0.0.0.0:50051",
        "0.0.0.0:9465",
    )
    assert {"name": "metrics", "containerPort": 9465, "protocol": "TCP"} in container["ports"]
    mount = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}["/etc/semhealth"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount]
    assert volume["configMap"]["name"] == "obs-semhealth-scorer"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 50051}


def test_scorer_autoscales_on_the_fleets_demand(manifests: dict[str, list[dict[str, Any]]]) -> None:
    items = manifests["cert-manager-own-issuer"]
    hpa = chart.one(items, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "semhealth-scorer",
    }
    assert hpa["spec"]["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {"name": "semhealth_demand"},
                "target": {"type": "AverageValue", "averageValue": "150"},
            },
        }
    ]
    # An autoscaled Deployment leaves replicas to the HPA.
    assert "replicas" not in chart.one(items, "Deployment", "semhealth-scorer")["spec"]
    own = chart.one(manifests["cert-manager-cluster-issuer"], "HorizontalPodAutoscaler")
    assert own["spec"]["metrics"][0]["type"] == "Resource"


def test_sidecar_config_is_in_every_listed_namespace_and_loads_in_the_agent(
    manifests: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    for value_set, namespaces, name in [
        ("defaults", [chart.NAMESPACE], "semhealth-config"),
        ("cert-manager-own-issuer", ["apps", "staging"], "semhealth-sidecar"),
    ]:
        maps = [
            o
            for o in chart.by_kind(manifests[value_set], "ConfigMap")
            if o["metadata"]["name"] == name
        ]
        assert sorted(m["metadata"]["namespace"] for m in maps) == namespaces
        for config_map in maps:
            path = tmp_path / "semhealth.yaml"
            path.write_text(config_map["data"]["semhealth.yaml"])
            # The injector passes each Pod's upstream; everything else comes from the file.
            config = load_config(str(path), {}, {"upstream.url": "http://127.0.0.1:8000"})
            assert config.listen.admin.port == 9464
            assert config.listen.admin.host == "0.0.0.0"


@pytest.mark.parametrize("value_set", ["defaults", "cert-manager-own-issuer"])
def test_scorer_config_loads_as_the_scorer_reads_it(
    manifests: dict[str, list[dict[str, Any]]], value_set: str, tmp_path: Path
) -> None:
    (config_map,) = [
        o
        for o in chart.by_kind(manifests[value_set], "ConfigMap")
        if o["metadata"]["name"].endswith("-scorer")
    ]
    path = tmp_path / "semhealth.yaml"
    path.write_text(config_map["data"]["semhealth.yaml"])
    relevance = load_relevance(str(path), {})
    if value_set == "defaults":
        assert relevance.embeddings == resolve_profile(None)
    else:  # the value set lists its own encoder
        (encoder,) = relevance.embeddings.encoders
        assert (encoder.name, encoder.backend, encoder.local.device) == ("default", "local", "cuda")


def test_default_scorer_serves_every_encoder_injected_sidecars_ask_for(
    manifests: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    # An injected sidecar on the default profile asks for that profile's encoders by name.
    config_map = chart.one(manifests["defaults"], "ConfigMap", "obs-semhealth-scorer")
    path = tmp_path / "semhealth.yaml"
    path.write_text(config_map["data"]["semhealth.yaml"])
    served = {encoder.name for encoder in load_relevance(str(path), {}).embeddings.encoders}
    assert served == {encoder.name for encoder in resolve_profile(None).encoders}


def test_dashboards_become_configmaps_for_grafanas_sidecar(
    manifests: dict[str, list[dict[str, Any]]], chart_dir: Path
) -> None:
    files = sorted(p.name for p in (chart_dir / "dashboards").glob("*.json"))
    maps = [o for o in manifests["cert-manager-own-issuer"] if _component(o) == "dashboards"]
    assert {m["kind"] for m in maps} == {"ConfigMap"}
    assert sorted(name for m in maps for name in m["data"]) == files
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "monitoring"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "semhealth"}
        ((name, text),) = config_map["data"].items()
        # The JSON exactly as committed, byte for byte (Grafana reads it as it is).
        assert text == (chart_dir / "dashboards" / name).read_text().rstrip("\n")


def test_notes_name_what_to_do_next(rendered: dict[str, dict[str, str]]) -> None:
    notes = rendered["cert-manager-own-issuer"]["semhealth/templates/NOTES.txt"]
    assert 'semhealth.io/inject: "true"' in notes
    assert "1. The namespaces matching injector.namespaceSelector are watched." in notes
    assert "semhealth:relevance_demand:rate2m" in notes
    defaults = rendered["defaults"]["semhealth/templates/NOTES.txt"]
    assert "kubectl label namespace <ns> semhealth.io/injection=enabled\n" in defaults
    assert f"obs-semhealth-scorer.{chart.NAMESPACE}.svc:50051" in defaults


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("PrometheusRule", "prometheusRule"),
        ("PodMonitor", "podMonitor"),
        ("ServiceMonitor", "serviceMonitor"),
    ],
)
def test_operator_objects_carry_the_labels_their_prometheus_selects_them_by(
    manifests: dict[str, list[dict[str, Any]]], kind: str, key: str
) -> None:
    # kube-prometheus-stack's Prometheus picks up only rules and monitors labelled
    # release=<its release>: without the configured labels it ignores them, silently.
    wanted = chart.OPTION_SETS["cert-manager-own-issuer"][key]["labels"]
    assert wanted == {"release": "kube-prometheus-stack"}
    labels = chart.one(manifests["cert-manager-own-issuer"], kind)["metadata"]["labels"]
    assert labels.items() >= wanted.items()
    assert labels["app.kubernetes.io/managed-by"] == "Helm"  # the chart's own labels stay


def test_pod_monitor_scrapes_the_admin_port_the_injector_adds(chart_dir: Path) -> None:
    items = chart.objects(chart.render(chart_dir, {"podMonitor": {"enabled": True}}))
    monitor = chart.one(items, "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (ADMIN_PORT_NAME, "/metrics")
    # Every Pod: the port name alone picks out the sidecars, whatever labels they carry.
    assert monitor["spec"]["selector"] == {}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    items = chart.objects(chart.render(chart_dir, chart.OPTION_SETS["cert-manager-own-issuer"]))
    monitor = chart.one(items, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["apps", "staging"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "sh-admin"


def test_service_monitor_scrapes_the_scorers_metrics_port_by_default(chart_dir: Path) -> None:
    items = chart.objects(chart.render(chart_dir, {"serviceMonitor": {"enabled": True}}))
    monitor = chart.one(items, "ServiceMonitor")
    (components,) = monitor["spec"]["selector"]["matchExpressions"]
    assert components["values"] == ["scorer"]  # the injector serves no /metrics by default
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    service = chart.one(items, "Service", "obs-semhealth-scorer")
    assert {"name": "metrics", "port": 9465, "targetPort": "metrics", "protocol": "TCP"} in (
        service["spec"]["ports"]
    )


def test_scorer_metrics_port_null_turns_its_metrics_off(chart_dir: Path) -> None:
    values = {"serviceMonitor": {"enabled": True}, "scorer": {"metricsPort": None}}
    items = chart.objects(chart.render(chart_dir, values))
    deployment = chart.one(items, "Deployment", "obs-semhealth-scorer")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][-2:] == ["--metrics-listen", "off"]
    assert build_parser().parse_args(container["args"]).metrics_listen == "off"
    assert [port["name"] for port in container["ports"]] == ["grpc"]
    assert chart.by_kind(items, "ServiceMonitor") == []
