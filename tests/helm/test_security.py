"""The chart's lock-down: a NetworkPolicy that admits only the sidecars to the scorer's gRPC
port and only Prometheus to its metrics port, the sidecars' admin web config as a Secret
that semhealth itself loads, and the PodMonitor's TLS and basic auth to scrape them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import bcrypt
import helm_python as helm
import pytest

from semhealth.agent.admin.webconfig import parse_web_config, validate_web_config
from tests.agent.kube.certs import make_ca, write_server_pair
from tests.helm import chart

OPTIONS = "cert-manager-own-issuer"  # _COMMON: the policy and the web config on
EXISTING = "cert-manager-cluster-issuer"  # the same, with an existing Secret


def _scorer(items: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [
        o
        for o in chart.by_kind(items, "Deployment")
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "scorer"
    ]
    return found


def test_the_network_policy_admits_only_sidecars_and_prometheus(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    items = manifests[OPTIONS]
    policy = chart.one(items, "NetworkPolicy")
    scorer = _scorer(items)
    values = chart.VALUE_SETS[OPTIONS]["scorer"]
    assert policy["metadata"]["namespace"] == chart.NAMESPACE
    assert policy["spec"]["podSelector"] == scorer["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # all other ingress is denied
    grpc, metrics = policy["spec"]["ingress"]
    assert grpc["ports"] == [{"port": values["port"], "protocol": "TCP"}]
    # One peer each, so both selectors must match (two peers would admit either).
    assert grpc["from"] == [
        {
            "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "llm-apps"}},
            "namespaceSelector": {},  # any namespace
        }
    ]
    assert metrics["ports"] == [{"port": values["metricsPort"], "protocol": "TCP"}]
    assert metrics["from"] == [
        {
            "podSelector": {"matchLabels": {"app": "prom"}},
            "namespaceSelector": {"matchLabels": {"team": "observability"}},
        }
    ]
    ports = {
        p["containerPort"] for p in scorer["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert ports == {values["port"], values["metricsPort"]}  # every port it opens is covered


def test_the_network_policy_is_off_by_default_and_follows_the_metrics_port(
    manifests: dict[str, list[dict[str, Any]]], chart_dir: Path
) -> None:
    assert chart.by_kind(manifests["defaults"], "NetworkPolicy") == []
    values = {"scorer": {"networkPolicy": {"enabled": True}, "metricsPort": None}}
    policy = chart.one(chart.objects(chart.render(chart_dir, values)), "NetworkPolicy")
    (grpc,) = policy["spec"]["ingress"]
    assert grpc["ports"] == [{"port": 50051, "protocol": "TCP"}]
    assert grpc["from"] == [
        {
            "podSelector": {"matchLabels": {"semhealth.io/injected": "true"}},
            "namespaceSelector": {"matchLabels": {"semhealth.io/injection": "enabled"}},
        }
    ]


def test_the_admin_web_config_is_a_secret_in_every_sidecar_namespace_that_semhealth_loads(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    values = chart.VALUE_SETS[OPTIONS]["adminWebConfig"]
    secrets = [
        s
        for s in chart.by_kind(manifests[OPTIONS], "Secret")
        if s["metadata"]["name"] == values["secretName"]
    ]
    assert sorted(s["metadata"]["namespace"] for s in secrets) == ["apps", "staging"]
    for secret in secrets:
        data = secret["stringData"]
        assert set(data) == {"web.yml", *values["files"]}
        config = parse_web_config(data["web.yml"], base_dir="/etc/semhealth/web")
        assert config.tls is not None
        assert config.tls.cert_file == "/etc/semhealth/web/tls.crt"
        assert config.headers == {"X-Content-Type-Options": "nosniff"}
        assert bcrypt.checkpw(b"chart-test", config.users["prometheus"])
    # An existing Secret: the chart renders none of its own.
    assert not [
        s
        for s in chart.by_kind(manifests[EXISTING], "Secret")
        if s["metadata"]["name"] == values["secretName"]
    ]
    assert not [s for s in chart.by_kind(manifests["defaults"], "Secret") if "admin-web" in str(s)]


def test_a_rendered_secret_with_real_certificates_validates_as_the_sidecar_would_load_it(
    chart_dir: Path, tmp_path: Path
) -> None:
    write_server_pair(make_ca(), tmp_path / "c.pem", tmp_path / "k.pem", "semhealth-admin")
    values = {
        "adminWebConfig": {
            "enabled": True,
            "webConfig": {
                "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},
                "basic_auth_users": {
                    "prometheus": bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
                },
            },
            "files": {
                "tls.crt": (tmp_path / "c.pem").read_text(),
                "tls.key": (tmp_path / "k.pem").read_text(),
            },
        }
    }
    secret = chart.one(
        chart.objects(chart.render(chart_dir, values)), "Secret", "semhealth-admin-web"
    )
    mount = tmp_path / "mount"  # as the Secret volume lays the keys out
    mount.mkdir()
    for name, text in secret["stringData"].items():
        (mount / name).write_text(text)
    config = validate_web_config(str(mount / "web.yml"))  # loads the certificate and key
    assert config.tls is not None and set(config.users) == {"prometheus"}


def test_the_pod_monitor_scrapes_with_tls_and_basic_auth_when_set(
    manifests: dict[str, list[dict[str, Any]]],
) -> None:
    (endpoint,) = chart.one(manifests[OPTIONS], "PodMonitor")["spec"]["podMetricsEndpoints"]
    values = chart.VALUE_SETS[OPTIONS]["podMonitor"]
    assert endpoint["scheme"] == "https"
    assert endpoint["basicAuth"] == values["basicAuth"]
    assert endpoint["tlsConfig"] == values["tlsConfig"]


def test_the_pod_monitor_scrapes_plain_http_by_default(chart_dir: Path) -> None:
    items = chart.objects(chart.render(chart_dir, {"podMonitor": {"enabled": True}}))
    (endpoint,) = chart.one(items, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "http"
    assert "basicAuth" not in endpoint and "tlsConfig" not in endpoint


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"adminWebConfig": {"webConfig": {"basic_auth_users": {"u": "hunter2"}}}},
            "/adminWebConfig/webConfig/basic_auth_users/u",
        ),
        ({"adminWebConfig": {"webConfig": {"tls_config": {}}}}, "'tls_config' not allowed"),
        ({"podMonitor": {"scheme": "ftp"}}, "/podMonitor/scheme"),
        ({"scorer": {"networkPolicy": {"clients": {"pods": {}}}}}, "'pods' not allowed"),
    ],
)
def test_the_schema_names_the_bad_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        chart.load(chart.CHART_DIR).validate_schema(values)
