"""``semhealth injector``: the mutating admission webhook, over TLS.

``review`` is pure: AdmissionReview v1 JSON in, AdmissionReview v1 out, with the same
``plan_injection`` patch that ``semhealth inject`` applies. It always allows: a Pod that
cannot be injected, or a request that cannot be read, is answered ``allowed: true`` with a
warning, so the webhook can only ever add the sidecar, never stop a Pod (the chart also
sets ``failurePolicy: Ignore`` for when it is down). Logs carry the namespace, the name
and the decision, never the Pod spec, whose env values may be secrets.
"""

from __future__ import annotations

import base64
import json
import logging
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from semhealth.agent.kube.errors import InjectionError
from semhealth.agent.kube.patch import plan_injection
from semhealth.agent.kube.settings import Settings
from semhealth.agent.kube.tls import CertificateReloader

log = logging.getLogger("semhealth.injector")

API_VERSION = "admission.k8s.io/v1"
# An AdmissionReview holds the object (etcd's limit is 1.5 MiB) and, on UPDATE, the old one.
MAX_REVIEW_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Review:
    """The answer to one AdmissionReview, and the decision in words for the log."""

    response: dict[str, Any]
    where: str
    decision: str


def review(body: bytes, settings: Settings) -> Review:
    """Answer one AdmissionReview v1 request body; never raises, always allows."""
    try:
        request = _request(json.loads(body))
    except (ValueError, TypeError) as exc:
        message = f"semhealth injector: not an AdmissionReview v1 request: {exc}"
        return Review(_response("", warning=message), "?", "malformed, allowed unchanged")
    uid = request["uid"]
    try:
        return _review_request(request, uid, settings)
    except Exception as exc:  # a bug here must not block Pods: allow, and say so
        warning = f"semhealth injector: sidecar not injected: internal error {type(exc).__name__}"
        # The type and the line only: the message could quote the Pod, whose env may be secret.
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        log.error(
            "injector failed on a review (%s at %s:%s); the Pod is allowed unchanged",
            type(exc).__name__,
            frame.filename,
            frame.lineno,
        )
        return Review(_response(uid, warning=warning), "?", "internal error, allowed unchanged")


def _review_request(request: dict[str, Any], uid: str, settings: Settings) -> Review:
    pod = request.get("object")
    where = _where(request, pod)
    kind = request.get("kind")
    if request.get("operation") != "CREATE" or not isinstance(kind, Mapping):
        return Review(_response(uid), where, "not a Pod CREATE")
    if kind.get("kind") != "Pod":
        return Review(_response(uid), where, "not a Pod CREATE")
    if not isinstance(pod, dict):
        return Review(_response(uid, warning="semhealth injector: no Pod object"), where, "no Pod")
    try:
        plan = plan_injection(pod, settings)
    except InjectionError as exc:
        warning = f"semhealth injector: sidecar not injected: {exc}"
        return Review(_response(uid, warning=warning), where, f"not injected: {exc}")
    if not plan.inject:
        return Review(_response(uid), where, plan.reason)
    patch = [operation.to_json() for operation in plan.operations]
    return Review(_response(uid, patch=patch), where, "injected")


def _request(document: Any) -> dict[str, Any]:
    if not isinstance(document, Mapping):
        raise TypeError("the body is not a JSON object")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != "AdmissionReview":
        raise ValueError(f"apiVersion must be {API_VERSION} and kind AdmissionReview")
    request = document.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise ValueError("request.uid is missing")
    return request


def _response(
    uid: str, *, patch: list[dict[str, Any]] | None = None, warning: str | None = None
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warning is not None:
        response["warnings"] = [warning]
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _where(request: Mapping[str, Any], pod: Any) -> str:
    """namespace/name for the log; a Pod made by a controller has only its generateName."""
    metadata = pod.get("metadata") if isinstance(pod, Mapping) else None
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = request.get("name") or metadata.get("name") or f"{metadata.get('generateName', '')}*"
    return f"{request.get('namespace') or metadata.get('namespace') or '?'}/{name}"


def build_app(settings: Settings) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        answer = review(await request.read(), settings)
        log.info("%s: %s", answer.where, answer.decision)
        return web.json_response(answer.response)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app


class Injector:
    """The webhook server: ``start()`` listens with TLS, ``shutdown()`` stops (safe without
    ``start`` and twice)."""

    def __init__(
        self, settings: Settings, tls: CertificateReloader, *, host: str, port: int
    ) -> None:
        self._settings = settings
        self._tls = tls
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        addresses = self._runner.addresses if self._runner is not None else []
        return int(addresses[0][1]) if addresses else self._port

    async def start(self) -> None:
        runner = web.AppRunner(build_app(self._settings), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(
                runner, self._host, self._port, ssl_context=self._tls.server_context()
            )
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site

    async def shutdown(self) -> None:
        runner, self._runner, self._site = self._runner, None, None
        if runner is not None:
            await runner.cleanup()
