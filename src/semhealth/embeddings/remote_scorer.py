"""The client of a shared ``semhealth scorer`` service: a backend that embeds over gRPC.

A sidecar that scores remotely builds this instead of a ``LocalBackend``, so it never
imports torch. Each call carries a deadline (``timeout_s``). gRPC failures become
embeddings errors here, once:

- An Embed call the scorer shed (RESOURCE_EXHAUSTED with its overload mark: its queue
  was full, it could not answer before the deadline, or this caller is over its rate), or
  one it did not answer before the deadline (DEADLINE_EXCEEDED) -> ``ScorerOverloaded``,
  an ``Overloaded``: the sidecar sheds the work and counts it, as for its own full queue.
- UNAVAILABLE, ABORTED, CANCELLED (and DEADLINE_EXCEEDED of Info, at start-up) ->
  retryable ``BackendError``.
- anything else (UNAUTHENTICATED, a call over the scorer's size limits ...), and an answer
  of the wrong shape -> permanent ``BackendError``.

The channel is plain text, or TLS (``tls_credentials``: a CA, and a client certificate
for mutual TLS); a bearer ``token`` goes in each call's ``authorization`` metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import numpy as np

from semhealth.embeddings import _wire
from semhealth.embeddings.backend import Vectors, normalize_rows
from semhealth.embeddings.errors import BackendError, EmbeddingError, EncoderNotServed, Overloaded

DEFAULT_TIMEOUT_S = 5.0
_RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    }
)
_MAX_DETAILS = 200  # the server's details carry reasons and counts; cap them all the same
DEADLINE = "deadline"  # ScorerOverloaded.reason when the scorer did not answer in time


class ScorerOverloaded(Overloaded):
    """The scorer shed an Embed call, or did not answer it before its deadline.

    ``reason``: the scorer's (``expected_wait``, ``queue_full``, ``rate_limited``) or
    ``deadline``; ``expected_wait_s``: the wait the scorer foresaw, when it said.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        requested: int,
        free: int = 0,
        queue_size: int = 0,
        expected_wait_s: float | None = None,
    ) -> None:
        super().__init__(requested=requested, free=free, queue_size=queue_size)
        self.reason = reason
        self.expected_wait_s = expected_wait_s
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


def tls_credentials(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> Any:
    """gRPC channel credentials from PEM files: ``ca_file`` (None: the system's roots), and a
    client certificate and key for mutual TLS. Raises ``OSError`` naming an unreadable file
    (never its content) and ``ValueError`` for a certificate without its key."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("tls: cert_file and key_file go together, for mutual TLS")
    return grpc.ssl_channel_credentials(
        root_certificates=_pem(ca_file, "ca_file") if ca_file else None,
        private_key=_pem(key_file, "key_file") if key_file else None,
        certificate_chain=_pem(cert_file, "cert_file") if cert_file else None,
    )


def _pem(path: str, key: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise OSError(f"tls.{key} {path}: {exc.strerror or type(exc).__name__}") from exc
    if b"-----BEGIN" not in data:
        raise OSError(f"tls.{key} {path}: not a PEM file")
    return data


class RemoteScorerBackend:
    """Embeds through a ``semhealth scorer`` at ``target`` (``host:port``).

    ``encoder`` names the served encoder to use; ``name`` (default: ``encoder``) keys the
    cache. ``dim``, ``model`` and ``device`` come from ``connect()`` (call it at start-up
    to fail fast), or ``dim`` from the first answer. The channel is plaintext unless
    ``credentials`` (``tls_credentials(...)``) are given; ``server_name`` checks the
    scorer's certificate for that name instead of the target's host. ``token`` is sent as
    ``authorization: Bearer``. Raises ``ValueError`` for settings that cannot work.
    """

    def __init__(
        self,
        target: str,
        encoder: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        name: str | None = None,
        dim: int | None = None,
        max_message_bytes: int = _wire.MAX_MESSAGE_BYTES,
        credentials: Any = None,
        server_name: str | None = None,
        token: str | None = None,
    ) -> None:
        _check_settings(target, encoder, timeout_s, dim, max_message_bytes)
        if token is not None and (not token or not token.isprintable()):
            # The token itself is never in a message.
            raise ValueError("token is empty or holds a line break or control character")
        self.target = target
        self.encoder = encoder
        self.timeout_s = timeout_s
        self.name = name or encoder
        self.dim = dim or 0
        self.model = ""
        self.device = ""
        self._options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        if server_name:
            self._options.append(("grpc.ssl_target_name_override", server_name))
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._credentials = credentials
        self._channel: Any = None
        self._closed = False

    async def connect(self) -> _wire.Info:
        """Ask the scorer about the encoder: checks it is served and learns its width."""
        channel = self._open()
        info_call = channel.unary_unary(
            _wire.INFO_METHOD,
            request_serializer=_wire.encode_info_request,
            response_deserializer=_wire.decode_info,
        )
        try:
            request = _wire.InfoRequest(self.encoder)
            info: _wire.Info | _wire.Malformed = await info_call(
                request, timeout=self.timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise self._not_served(exc) or _translate(exc, self.name, "Info", 0) from exc
        if isinstance(info, _wire.Malformed):
            raise self._shape_error(f"its Info answer is malformed: {info.reason}", 0)
        if self.dim and info.dim != self.dim:
            raise self._shape_error(f"it serves width {info.dim}, not {self.dim}", 0)
        self.dim, self.model, self.device = info.dim, info.model, info.device
        return info

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            self._open()
            return np.empty((0, self.dim), dtype=np.float32)
        channel = self._open()
        embed_call = channel.unary_unary(
            _wire.EMBED_METHOD,
            request_serializer=_wire.encode_embed_request,
            response_deserializer=_wire.decode_vectors,
        )
        request = _wire.EmbedRequest(self.encoder, tuple(texts))
        try:
            answer: Vectors | _wire.Malformed = await embed_call(
                request, timeout=self.timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            shed = _shed(exc, self.name, len(texts), self.timeout_s)
            raise (shed or _translate(exc, self.name, "Embed", len(texts))) from exc
        return self._checked(answer, len(texts))

    async def aclose(self) -> None:
        self._closed = True
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    def _open(self) -> Any:
        if self._closed:
            raise BackendError(f"{self.name}: the backend is closed", retryable=False)
        if self._channel is None:
            # Built on first use, inside the running loop that will drive it.
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(
                    self.target, self._credentials, options=self._options
                )
        return self._channel

    def _not_served(self, exc: Any) -> EncoderNotServed | None:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            return None
        served = _wire.read_served(exc.trailing_metadata())
        if served is None:
            return None
        return EncoderNotServed(
            f"{self.name}: the scorer at {self.target} does not serve encoder "
            f"'{self.encoder}'; it serves: {', '.join(served) or 'nothing'}",
            target=self.target,
            encoder=self.encoder,
            served=served,
        )

    def _checked(self, answer: Vectors | _wire.Malformed, count: int) -> Vectors:
        if isinstance(answer, _wire.Malformed):
            raise self._shape_error(f"its answer is malformed: {answer.reason}", count)
        rows, width = answer.shape
        if rows != count:
            raise self._shape_error(f"it answered {rows} rows", count)
        if self.dim and width != self.dim:
            raise self._shape_error(f"it answered rows of width {width}, not {self.dim}", count)
        if width == 0 or not np.isfinite(answer).all():
            raise self._shape_error("its rows are empty or hold a value that is not finite", count)
        self.dim = width
        # Never trust the server to have normalised.
        return normalize_rows(answer)

    def _shape_error(self, reason: str, count: int) -> BackendError:
        return BackendError(
            f"{self.name}: unusable answer from the scorer at {self.target} for {count} texts: "
            f"{reason}",
            retryable=False,
        )


def _shed(exc: Any, name: str, count: int, timeout_s: float) -> ScorerOverloaded | None:
    """The Embed call's failure as shed work, when the scorer was too busy to answer it."""
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ScorerOverloaded(
            f"{name}: the scorer did not answer {count} texts within {timeout_s:g} s; "
            "the work is shed",
            reason=DEADLINE,
            requested=count,
        )
    if code != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    overload = _wire.read_overload(exc.trailing_metadata())
    if overload is None:
        return None
    wait = overload.expected_wait_s
    told = f", expecting a wait of {wait:.2f} s" if wait is not None else ""
    return ScorerOverloaded(
        f"{name}: the scorer shed {count} texts ({overload.reason}{told}); the work is shed",
        reason=overload.reason,
        requested=overload.requested,
        free=overload.free,
        queue_size=overload.queue_size,
        expected_wait_s=wait,
    )


def _translate(exc: Any, name: str, method: str, count: int) -> EmbeddingError:
    code = exc.code()
    details = (exc.details() or "")[:_MAX_DETAILS]
    return BackendError(
        f"{name}: the scorer answered {method} for {count} texts with {code.name}: {details}",
        retryable=code in _RETRYABLE_CODES,
    )


def _check_settings(
    target: str, encoder: str, timeout_s: float, dim: int | None, max_message_bytes: int
) -> None:
    problems = []
    if not target.strip():
        problems.append("target is empty: give the scorer's host:port")
    if not encoder.strip():
        problems.append("encoder is empty: name an encoder the scorer serves")
    if not timeout_s > 0:
        problems.append(f"timeout_s must be more than 0, not {timeout_s:g}")
    if dim is not None and dim < 1:
        problems.append(f"dim must be at least 1, not {dim}")
    if max_message_bytes < 1024:
        problems.append(f"max_message_bytes must be at least 1024, not {max_message_bytes}")
    if problems:
        raise ValueError("; ".join(problems))
