"""Without cert-manager, an upgrade keeps the webhook's certificate: the chart `lookup`s the
Secret it made at install and reuses it, so the caBundle the API server trusts stays valid.

Helm's cluster-aware render (``helm_python.Config.render``) asks a loopback server shaped
like the API server for exactly what `lookup` needs: discovery of ``v1`` and one Secret.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from tests.helm import chart

SECRET_NAME = "obs-semhealth-injector-tls"
SECRET_PATH = f"/api/v1/namespaces/{chart.NAMESPACE}/secrets/{SECRET_NAME}"
V1_RESOURCES = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret",
         "verbs": ["get", "list"]}
    ],
}  # fmt: skip


class _Cluster(ThreadingHTTPServer):
    secret: dict[str, Any] | None = None
    paths: list[str]


class _Handler(BaseHTTPRequestHandler):
    server: _Cluster

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.server.paths.append(path)
        body: dict[str, Any] | None = {
            "/api/v1": V1_RESOURCES,
            SECRET_PATH: self.server.secret,
        }.get(path)
        code = 200 if body is not None else 404
        if body is None:
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "NotFound",
                "code": 404,
            }
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def cluster() -> Iterator[_Cluster]:
    server = _Cluster(("127.0.0.1", 0), _Handler)
    server.paths = []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _render_against(cluster: _Cluster, chart_dir: Path) -> list[dict[str, Any]]:
    port = cluster.server_address[1]
    kubeconfig = f"""apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: test, user: {{token: test}}}}]
contexts: [{{name: test, context: {{cluster: test, user: test, namespace: {chart.NAMESPACE}}}}}]
current-context: test
"""
    with helm.Config(kubeconfig_content=kubeconfig, namespace=chart.NAMESPACE) as config:
        rendered = config.render(
            chart.load(chart_dir),
            {},
            name=chart.RELEASE,
            namespace=chart.NAMESPACE,
            is_upgrade=True,
        )
    return chart.objects(rendered)


def _tls(items: list[dict[str, Any]]) -> tuple[dict[str, str], str]:
    secret = chart.one(items, "Secret", SECRET_NAME)
    webhook = chart.one(items, "MutatingWebhookConfiguration")["webhooks"][0]
    return secret["data"], webhook["clientConfig"]["caBundle"]


def test_upgrade_reuses_the_secret_made_at_install(
    cluster: _Cluster, chart_dir: Path, manifests: dict[str, list[dict[str, Any]]]
) -> None:
    installed = chart.one(manifests["defaults"], "Secret", SECRET_NAME)
    cluster.secret = installed
    data, ca_bundle = _tls(_render_against(cluster, chart_dir))
    assert data == installed["data"]
    assert ca_bundle == installed["data"]["ca.crt"]
    assert SECRET_PATH in cluster.paths


def test_a_secret_missing_a_key_is_made_again(
    cluster: _Cluster, chart_dir: Path, manifests: dict[str, list[dict[str, Any]]]
) -> None:
    installed = chart.one(manifests["defaults"], "Secret", SECRET_NAME)
    cluster.secret = {
        **installed,
        "data": {k: v for k, v in installed["data"].items() if k != "ca.crt"},
    }
    data, ca_bundle = _tls(_render_against(cluster, chart_dir))
    assert data["tls.crt"] != installed["data"]["tls.crt"]
    assert ca_bundle == data["ca.crt"]


def test_no_secret_yet_makes_a_new_pair(cluster: _Cluster, chart_dir: Path) -> None:
    data, ca_bundle = _tls(_render_against(cluster, chart_dir))
    assert ca_bundle == data["ca.crt"]
    assert SECRET_PATH in cluster.paths
