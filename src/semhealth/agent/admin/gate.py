"""Who may read the admin endpoints: the web configuration applied to one request.

Both admin servers ask it: the agent's own aiohttp app (``semhealth.agent.admin.app``, in one
process and in the analysis process) and the front of ``semhealth run``
(``semhealth.agent.admin.front``, in the forwarding process). It knows no HTTP framework, so
the forwarding process imports it without aiohttp.

The web configuration (``semhealth.agent.admin.webconfig``) gives TLS, response headers, a
rate limit and basic auth. ``/healthz`` and ``/readyz`` stay open for kubelet probes (over TLS
when TLS is on, and a client certificate outside ``client_allowed_sans`` is refused there
too); everything else needs credentials when users are configured.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from semhealth.agent.admin.answer import Answer
from semhealth.agent.admin.webconfig import (
    Authenticator,
    TokenBucket,
    WebConfigSource,
    sans_allowed,
)

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
AUTH_FAILURES = "semhealth_admin_auth_failures"  # exporters add _total
AUTH_FAILURES_HELP = (
    "Admin requests refused for missing or wrong credentials, or a client certificate "
    "outside client_allowed_sans."
)
ALERTS_OFF = b'{"enabled": false, "reason": "the /alerts endpoint is turned off"}\n'
_NO_HEADERS: Mapping[str, str] = {}
_CERT_REFUSED = Answer(403, b"client certificate not allowed\n")
_RATE_LIMITED = Answer(429, b"Too Many Requests\n")
_UNAUTHORIZED = Answer(401, b"Unauthorized\n", headers=(("WWW-Authenticate", "Basic"),))


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminAccess:
    """Who may read the admin endpoints, and which are served."""

    web_config_file: str | None = None  # exporter-toolkit web.yml; None: open, plain HTTP
    alerts_endpoint: bool = True  # False: /alerts answers 404


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the gate decided for one request: a refusal to send instead of the answer
    (None: serve it), and the configured headers every response carries, refusals too."""

    refusal: Answer | None
    headers: Mapping[str, str]


_OPEN = Verdict(None, _NO_HEADERS)


class AdminGate:
    """The web configuration, applied to every admin request."""

    def __init__(self, access: AdminAccess) -> None:
        self.access = access
        # Loaded now: a bad file stops start-up, before anything listens.
        self.source = WebConfigSource(access.web_config_file) if access.web_config_file else None
        self._auth = Authenticator()
        self._bucket = TokenBucket()

    @property
    def failures(self) -> int:
        return self._auth.stats.failures

    @property
    def scheme(self) -> str:
        return "https" if self.source is not None and self.source.tls_at_start else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        return self.source.listening_context() if self.source is not None else None

    async def admit(
        self, path: str, peercert: Mapping[str, Any] | None, authorization: str | None
    ) -> Verdict:
        """The verdict on a request for ``path`` from a client with ``peercert`` (TLS) and
        this ``Authorization`` header. Refusals are counted: a certificate outside the
        allowed SANs and missing or wrong credentials in ``failures``."""
        if self.source is None:
            return _OPEN
        config = self.source.current()
        tls = config.tls
        allowed = tls.client_allowed_sans if tls is not None else None
        if allowed is not None and not sans_allowed(allowed, peercert):
            self._auth.stats.failures += 1
            return Verdict(_CERT_REFUSED, config.headers)
        if path in OPEN_PATHS:
            return Verdict(None, config.headers)
        if not self._bucket.allow(config.rate_limit):
            self._auth.stats.rate_limited += 1
            return Verdict(_RATE_LIMITED, config.headers)
        if not config.users or await self._auth.check(config.users, authorization):
            return Verdict(None, config.headers)
        self._auth.stats.failures += 1
        return Verdict(_UNAUTHORIZED, config.headers)

    def close(self) -> None:
        self._auth.close()


def auth_failures_text(gate: AdminGate) -> bytes:
    """``semhealth_admin_auth_failures_total`` in Prometheus' text format, for the front to
    add to the metrics it relays from the analysis process."""
    name = AUTH_FAILURES + "_total"
    return (
        f"# HELP {name} {AUTH_FAILURES_HELP}\n# TYPE {name} counter\n{name} {gate.failures}.0\n"
    ).encode()
