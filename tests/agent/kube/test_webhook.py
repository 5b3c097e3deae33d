"""``semhealth injector``: AdmissionReview v1 answered over real TLS on loopback, by a client
that verifies the certificate; the patch gives the same Pod as ``semhealth inject``; the
certificate is picked up when the Secret rotates; nothing blocks a Pod."""

from __future__ import annotations

import base64
import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.agent.kube import CertificateReloader, Injector, Settings, inject_text, review
from tests.agent.kube import rfc6902
from tests.agent.kube.certs import Authority, make_ca, write_server_pair
from tests.agent.kube.samples import IMAGE, admission_review, deployment, pod_from, pod_template

SETTINGS = Settings(image=IMAGE, scorer="semhealth-scorer.semhealth:50051")
INJECT = {"semhealth.io/inject": "true", "semhealth.io/upstream-port": "8000"}


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]] | None:
    encoded = response["response"].get("patch")
    if encoded is None:
        return None
    assert response["response"]["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(encoded))
    return patch


# -- the review, without a server --------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{not json",
        b"[]",
        json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1beta1",
                "kind": "AdmissionReview",
                "request": {"uid": "u"},
            }
        ).encode(),
        json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}
        ).encode(),
    ],
)
def test_a_malformed_review_is_allowed_with_no_patch_and_a_warning(body: bytes) -> None:
    answer = review(body, SETTINGS)
    response = answer.response["response"]
    assert answer.response["apiVersion"] == "admission.k8s.io/v1"
    assert answer.response["kind"] == "AdmissionReview"
    assert response["allowed"] is True
    assert "patch" not in response
    assert response["warnings"][0].startswith(
        "semhealth injector: not an AdmissionReview v1 request"
    )


def test_only_pod_creates_are_patched() -> None:
    request = admission_review(pod_from(pod_template(INJECT)), operation="UPDATE")
    answer = review(json.dumps(request).encode(), SETTINGS)
    assert answer.response["response"] == {"uid": request["request"]["uid"], "allowed": True}


def test_an_unannotated_pod_is_allowed_unchanged() -> None:
    request = admission_review(pod_from(pod_template(None)))
    answer = review(json.dumps(request).encode(), SETTINGS)
    assert answer.response["response"] == {"uid": request["request"]["uid"], "allowed": True}
    assert answer.decision == "not asked for (semhealth.io/inject)"


def test_a_pod_that_cannot_be_injected_is_allowed_with_a_warning() -> None:
    request = admission_review(pod_from(pod_template({**INJECT, "semhealth.io/proxy-port": "x"})))
    response = review(json.dumps(request).encode(), SETTINGS).response["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert response["warnings"] == [
        "semhealth injector: sidecar not injected: semhealth.io/proxy-port: 'x' is not a port "
        "number from 1 to 65535"
    ]


def test_a_bug_is_answered_allowed_and_logged_without_the_pod(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(pod: dict[str, Any], _settings: Settings) -> None:
        raise RuntimeError(f"cannot handle {pod['spec']['containers'][0]['env']}")

    monkeypatch.setattr("semhealth.agent.kube.webhook.plan_injection", broken)
    request = admission_review(pod_from(pod_template(INJECT)))
    answer = review(json.dumps(request).encode(), SETTINGS)
    assert answer.response["response"] == {
        "uid": request["request"]["uid"],
        "allowed": True,
        "warnings": ["semhealth injector: sidecar not injected: internal error RuntimeError"],
    }
    assert "injector failed on a review (RuntimeError at" in caplog.text
    assert "hunter2" not in caplog.text


def test_the_patch_gives_the_pod_that_inject_gives_the_template() -> None:
    template = pod_template(INJECT)
    request = admission_review(pod_from(template))
    answer = review(json.dumps(request).encode(), SETTINGS)
    patched = rfc6902.apply(request["request"]["object"], patch_of(answer.response) or [])
    assert_same_pod(patched, template)
    assert answer.where == "shop/chat-7d9f8-*"


def assert_same_pod(patched_pod: dict[str, Any], template: dict[str, Any]) -> None:
    """``patched_pod`` has exactly the spec and annotations ``semhealth inject`` writes."""
    out, _ = inject_text(
        yaml.safe_dump(deployment(template["metadata"].get("annotations"))), SETTINGS
    )
    injected = yaml.safe_load(out)["spec"]["template"]
    assert patched_pod["spec"] == injected["spec"]
    assert patched_pod["metadata"]["annotations"] == injected["metadata"]["annotations"]
    assert patched_pod["spec"]["containers"][-1]["name"] == "semhealth"


# -- the server, over TLS ----------------------------------------------------------------------


@dataclass
class Served:
    injector: Injector
    reloader: CertificateReloader
    ca: Authority
    cert_file: Path
    key_file: Path

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.injector.port}{path}"


def client_context(ca: Authority) -> ssl.SSLContext:
    """Trusts ``ca`` only, and checks the host name: what the API server does with caBundle."""
    return ssl.create_default_context(cadata=ca.pem().decode())


async def post(
    served: Served, body: bytes, ca: Authority, host: str = "127.0.0.1"
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(ssl=client_context(ca))
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post(
            served.url("/mutate", host), data=body, headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == 200
            answer: dict[str, Any] = await response.json()
            return answer


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    ca = make_ca()
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_server_pair(ca, cert_file, key_file, "semhealth-injector.semhealth.svc")
    reloader = CertificateReloader(cert_file, key_file, check_interval_s=0)
    injector = Injector(SETTINGS, reloader, host="127.0.0.1", port=0)
    await injector.start()
    try:
        yield Served(injector, reloader, ca, cert_file, key_file)
    finally:
        await injector.shutdown()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])  # without and with SNI
async def test_a_pod_create_over_tls_gets_the_same_pod_as_inject(
    served: Served, host: str, caplog: pytest.LogCaptureFixture
) -> None:
    template = pod_template(INJECT)
    request = admission_review(pod_from(template))
    with caplog.at_level(logging.INFO, logger="semhealth.injector"):
        answer = await post(served, json.dumps(request).encode(), served.ca, host)
    assert answer["response"]["uid"] == request["request"]["uid"]
    assert answer["response"]["allowed"] is True
    patched = rfc6902.apply(request["request"]["object"], patch_of(answer) or [])
    assert_same_pod(patched, template)
    # The log says who and what, never the Pod spec: its env may hold secrets.
    assert "shop/chat-7d9f8-*: injected" in caplog.text
    assert "hunter2" not in caplog.text
    assert "OPENAI_BASE_URL" not in caplog.text


async def test_a_pod_that_already_has_the_sidecar_is_left_alone(served: Served) -> None:
    out, _ = inject_text(yaml.safe_dump(deployment(INJECT)), SETTINGS)
    template = yaml.safe_load(out)["spec"]["template"]
    request = admission_review(pod_from(template))
    answer = await post(served, json.dumps(request).encode(), served.ca)
    assert answer["response"] == {"uid": request["request"]["uid"], "allowed": True}


async def test_a_malformed_review_over_tls_is_allowed_with_no_patch(served: Served) -> None:
    answer = await post(served, b'{"kind": "AdmissionReview"}', served.ca)
    assert answer["response"]["allowed"] is True
    assert "patch" not in answer["response"]


async def test_healthz_and_a_client_that_does_not_trust_the_ca(served: Served) -> None:
    connector = aiohttp.TCPConnector(ssl=client_context(served.ca))
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(served.url("/healthz")) as response:
            assert (response.status, await response.text()) == (200, "ok\n")
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await post(served, b"{}", make_ca("someone else"))


async def test_a_rotated_certificate_is_served_on_the_next_handshake(served: Served) -> None:
    body = json.dumps(admission_review(pod_from(pod_template(INJECT)))).encode()
    rotated = make_ca("rotated CA")
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await post(served, body, rotated)
    # As the kubelet updates a Secret volume: new files, same paths, server still running.
    write_server_pair(rotated, served.cert_file, served.key_file, "semhealth-injector.rotated")
    answer = await post(served, body, rotated)
    assert patch_of(answer)
    assert served.reloader.reloads == 1
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await post(served, body, served.ca)  # the old pair is no longer served


async def test_shutdown_is_safe_without_start_and_twice(tmp_path: Path) -> None:
    ca = make_ca()
    write_server_pair(ca, tmp_path / "c", tmp_path / "k", "x")
    reloader = CertificateReloader(tmp_path / "c", tmp_path / "k")
    injector = Injector(SETTINGS, reloader, host="127.0.0.1", port=0)
    await injector.shutdown()
    await injector.start()
    await injector.shutdown()
    await injector.shutdown()
    again = Injector(SETTINGS, reloader, host="127.0.0.1", port=0)
    await again.start()
    await again.shutdown()


# -- whatever arrives, the answer allows ------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
ANNOTATIONS = st.dictionaries(
    st.sampled_from(
        [
            "semhealth.io/proxy-port",
            "semhealth.io/scorer",
            "semhealth.io/native-sidecar",
            "semhealth.io/memory-limit",
        ]
    ),
    st.sampled_from(["true", "false", "8081", "x", "", "1Gi"]) | JSON,
).map(lambda found: {"semhealth.io/inject": "true", **found})  # asked for: the checks must run
CONTAINERS = st.lists(
    JSON
    | st.fixed_dictionaries(
        {"name": st.sampled_from(["app", "semhealth"])}, optional={"ports": JSON}
    ),
    max_size=2,
)
PODS = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {}, optional={"annotations": ANNOTATIONS | JSON, "name": JSON}
        )
        | JSON,
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": CONTAINERS,
                "initContainers": JSON,
                "volumes": JSON,
                "restartPolicy": JSON,
            },
        )
        | JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(pod=PODS, kind=st.just({"kind": "Pod"}) | JSON, operation=st.just("CREATE") | JSON)
def test_any_review_is_answered_allowed_and_any_patch_applies(
    pod: dict[str, Any], kind: Any, operation: Any
) -> None:
    request = admission_review(pod)
    request["request"]["kind"] = kind
    request["request"]["operation"] = operation
    answer = review(json.dumps(request).encode(), SETTINGS).response
    assert answer["response"]["allowed"] is True
    assert answer["response"]["uid"] == request["request"]["uid"]
    # Junk is turned away by the checks, not by the last-resort catch.
    assert "internal error" not in " ".join(answer["response"].get("warnings", []))
    patch = patch_of(answer)
    if patch is not None:
        patched = rfc6902.apply(pod, patch)
        # Last of the app's containers, or (as a native sidecar) of its init containers;
        # either list may be empty in a generated pod.
        lasts = [
            containers[-1]["name"]
            for key in ("containers", "initContainers")
            if (containers := patched["spec"].get(key))
        ]
        assert "semhealth" in lasts
