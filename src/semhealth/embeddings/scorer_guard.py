"""Who may call the shared scorer, and how much: a bearer token, TLS, and per-caller limits.

``semhealth scorer`` receives prompt text over the network, so its gRPC port can be locked:

- **TLS** (``ScorerTls``): a certificate and key; with a client CA, mutual TLS, where the
  handshake itself refuses a client without a certificate that CA signed.
- **A bearer token** (``ScorerGuard.token``): every Embed and Info call must carry
  ``authorization: Bearer <token>``; one without it, or with another, is answered
  UNAUTHENTICATED. The health service stays open, for probes.
- **Limits per call** (texts, bytes) and **a rate per caller** (texts per second, a token
  bucket), answered RESOURCE_EXHAUSTED. A caller is its client certificate's subject under
  mutual TLS, else the SHA-256 of its token, else its address without the port.

Every refusal is counted by reason. Nothing here logs, labels or keeps a token, a
certificate or a text: callers are told apart by digests kept only as bucket keys.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Reasons a call is refused before it reaches an encoder (the refused counter's label).
UNAUTHENTICATED = "unauthenticated"
TOO_MANY_TEXTS = "too_many_texts"
TOO_MANY_BYTES = "too_many_bytes"
RATE_LIMITED = "rate_limited"
REASONS = (UNAUTHENTICATED, TOO_MANY_TEXTS, TOO_MANY_BYTES, RATE_LIMITED)

DEFAULT_MAX_TEXTS_PER_CALL = 1024  # a sidecar sends at most max_batch (64 by default) per call
DEFAULT_MAX_BYTES_PER_CALL = 8 * 1024 * 1024
# Callers remembered for their buckets: past this, the least recently seen is forgotten (and
# starts again with a full bucket), so a scan from many addresses cannot grow memory.
MAX_CALLERS = 10_000
_BEARER = "bearer "


@dataclass(frozen=True, slots=True, kw_only=True)
class ScorerLimits:
    """What one call and one caller may ask for. A rate of 0 sets no rate limit."""

    max_texts_per_call: int = DEFAULT_MAX_TEXTS_PER_CALL
    max_bytes_per_call: int = DEFAULT_MAX_BYTES_PER_CALL
    caller_texts_per_s: float = 0.0  # each caller's sustained rate; 0: unlimited
    caller_burst_texts: int = 0  # its bucket's size; 0: two seconds of its rate

    def validate(self) -> list[str]:
        problems = []
        if self.max_texts_per_call < 1:
            problems.append(f"max texts per call must be at least 1, not {self.max_texts_per_call}")
        if self.max_bytes_per_call < 1:
            problems.append(f"max bytes per call must be at least 1, not {self.max_bytes_per_call}")
        if self.caller_texts_per_s < 0:
            problems.append(f"the caller rate must be 0 or more, not {self.caller_texts_per_s:g}")
        if self.caller_burst_texts < 0:
            problems.append(f"the caller burst must be 0 or more, not {self.caller_burst_texts}")
        return problems

    @property
    def burst(self) -> float:
        if self.caller_burst_texts:
            return float(self.caller_burst_texts)
        return max(1.0, 2.0 * self.caller_texts_per_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScorerTls:
    """The scorer's certificate and key (PEM files); ``client_ca_file`` turns on mutual TLS."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def credentials(self) -> Any:
        """gRPC server credentials from the files; raises ``OSError`` naming an unreadable one."""
        import grpc  # type: ignore[import-untyped]

        key = read_pem(self.key_file, "--tls-key-file")
        cert = read_pem(self.cert_file, "--tls-cert-file")
        ca = read_pem(self.client_ca_file, "--client-ca-file") if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )


def read_pem(path: str, what: str) -> bytes:
    """A PEM file's bytes; ``OSError`` naming ``what`` and the path (never the content)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise OSError(f"{what} {path}: {exc.strerror or type(exc).__name__}") from exc
    if b"-----BEGIN" not in data:
        raise OSError(f"{what} {path}: not a PEM file")
    return data


def read_bearer_token(path: str) -> str:
    """The bearer token in ``path``, stripped (a Secret's file often ends in a newline)."""
    try:
        token = Path(path).read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OSError(f"--bearer-token-file {path}: cannot be read ({type(exc).__name__})") from exc
    if not token or not token.isprintable() or " " in token:
        # The token itself is never printed.
        raise OSError(f"--bearer-token-file {path}: holds no token, or more than one word")
    return token


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


@dataclass(slots=True)
class ScorerGuard:
    """Checks each call's credentials and size, and its caller's rate; counts refusals.

    ``token`` None: no token is asked for. ``clock`` is monotonic seconds.
    """

    token: str | None = field(default=None, repr=False)
    limits: ScorerLimits = field(default_factory=ScorerLimits)
    clock: Callable[[], float] = time.monotonic
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    _buckets: OrderedDict[str, _Bucket] = field(default_factory=OrderedDict)

    def authenticate(self, metadata: Sequence[tuple[str, Any]] | None) -> str | None:
        """The presented token's digest when it is right (or none is needed), else None."""
        presented = _bearer(metadata)
        if self.token is None:
            return _digest(presented) if presented else ""
        if presented is None or not hmac.compare_digest(
            presented.encode("utf-8", "surrogatepass"), self.token.encode("utf-8")
        ):
            self.refused[UNAUTHENTICATED] += 1
            return None
        return _digest(presented)

    def check_size(self, texts: int, size: int) -> str | None:
        """Why a call of ``texts`` texts in ``size`` bytes is too large, or None."""
        most_texts, most_bytes = self.limits.max_texts_per_call, self.limits.max_bytes_per_call
        if texts > most_texts:
            self.refused[TOO_MANY_TEXTS] += 1
            return f"{texts} texts in one call; this scorer takes at most {most_texts}"
        if size > most_bytes:
            self.refused[TOO_MANY_BYTES] += 1
            return f"{size} bytes in one call; this scorer takes at most {most_bytes}"
        return None

    def take(self, caller: str, texts: int) -> str | None:
        """Charge ``caller`` for ``texts``; why it is over its rate, or None."""
        rate = self.limits.caller_texts_per_s
        if rate <= 0:
            return None
        now, burst = self.clock(), self.limits.burst
        bucket = self._buckets.pop(caller, None) or _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        self._buckets[caller] = bucket  # most recently seen last
        while len(self._buckets) > MAX_CALLERS:
            self._buckets.popitem(last=False)
        if bucket.tokens < texts:
            self.refused[RATE_LIMITED] += 1
            return f"over this caller's rate of {rate:g} texts/s (burst {burst:g})"
        bucket.tokens -= texts
        return None

    @property
    def callers(self) -> int:
        """Callers whose buckets are kept now (at most ``MAX_CALLERS``)."""
        return len(self._buckets)


def caller_of(context: Any, token_digest: str) -> str:
    """Who is calling: the client certificate's subject, the token's digest, or the address.

    Only ever a dictionary key; the certificate subject and the address are hashed too, so
    no identity is kept in clear.
    """
    auth = context.auth_context() or {}
    for key in ("x509_subject", "x509_common_name", "x509_pem_cert"):
        values = auth.get(key)
        if values:
            return "cert:" + _digest(b"\n".join(values).decode("utf-8", "replace"))
    if token_digest:
        return "token:" + token_digest
    peer = str(context.peer() or "")
    # "ipv4:10.0.0.7:53412": the port changes with each connection, the caller does not.
    host = peer.rpartition(":")[0] if peer.count(":") >= 2 else peer
    return "peer:" + _digest(host)


def _bearer(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key.lower() == "authorization" and isinstance(value, str):
            if value[: len(_BEARER)].lower() == _BEARER:
                return value[len(_BEARER) :].strip()
            return None
    return None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
