"""The client of a shared ``semhealth scorer`` service: a backend that embeds over gRPC.

A sidecar that scores remotely builds this instead of a ``LocalBackend``, so it never
imports torch. Each call carries a deadline (``timeout_s``). gRPC failures become
embeddings errors here, once:

- RESOURCE_EXHAUSTED from the scorer's full queue -> ``Overloaded``: the sidecar sheds
  the work and counts it, as it does for its own full queue.
- UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED -> retryable ``BackendError``.
- anything else, and an answer of the wrong shape -> permanent ``BackendError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc  # type: ignore[import-untyped]
import numpy as np

from semhealth.embeddings import _wire
from semhealth.embeddings.backend import Vectors, normalize_rows
from semhealth.embeddings.errors import BackendError, EmbeddingError, Overloaded

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


class RemoteScorerBackend:
    """Embeds through a ``semhealth scorer`` at ``target`` (``host:port``).

    ``encoder`` names the served encoder to use; ``name`` (default: ``encoder``) keys the
    cache. ``dim``, ``model`` and ``device`` come from ``connect()`` (call it at start-up
    to fail fast), or ``dim`` from the first answer. The channel is plaintext unless
    ``credentials`` (``grpc.ssl_channel_credentials(...)``) are given. Raises
    ``ValueError`` for settings that cannot work.
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
    ) -> None:
        _check_settings(target, encoder, timeout_s, dim, max_message_bytes)
        self.target = target
        self.encoder = encoder
        self.timeout_s = timeout_s
        self.name = name or encoder
        self.dim = dim or 0
        self.model = ""
        self.device = ""
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
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
            info: _wire.Info | _wire.Malformed = await info_call(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, self.name, "Info", 0) from exc
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
            answer: Vectors | _wire.Malformed = await embed_call(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, self.name, "Embed", len(texts)) from exc
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


def _translate(exc: Any, name: str, method: str, count: int) -> EmbeddingError:
    code = exc.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        overload = _overload(exc.trailing_metadata())
        if overload is not None:
            requested, free, queue_size = overload
            return Overloaded(requested=requested, free=free, queue_size=queue_size)
    details = (exc.details() or "")[:_MAX_DETAILS]
    return BackendError(
        f"{name}: the scorer answered {method} for {count} texts with {code.name}: {details}",
        retryable=code in _RETRYABLE_CODES,
    )


def _overload(metadata: Any) -> tuple[int, int, int] | None:
    """The scorer's queue figures when RESOURCE_EXHAUSTED meant a full queue, else None.

    gRPC itself answers RESOURCE_EXHAUSTED for a message over the size limit, which no
    retry or shedding fixes, so only the scorer's own mark counts as overload.
    """
    for key, value in metadata or ():
        if key == _wire.OVERLOADED_KEY and isinstance(value, str):
            return _wire.decode_overload(value)
    return None


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
