"""The scorer service's wire format: gRPC method names and their (de)serializers.

No protoc: the service is registered with a generic handler, and its messages are small
enough to write by hand.

- ``Embed`` request: orjson ``{"encoder": str, "texts": [str, ...]}``.
- ``Embed`` response: a 12-byte header (``b"SHv1"``, then dim and count as little-endian
  uint32) followed by the ``count x dim`` float32 matrix as raw little-endian bytes, so no
  float is ever printed as decimal text.
- ``Info`` request: orjson ``{"encoder": str}``; response: orjson
  ``{"encoder": str, "model": str, "dim": int, "device": str}``.

Decoders never raise on bad bytes: they return a ``Malformed`` value carrying sizes and a
reason (never text), which the server answers with INVALID_ARGUMENT and the client turns
into a permanent error.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from semhealth.common.text import utf8_safe
from semhealth.embeddings.backend import Vectors

SERVICE = "semhealth.scorer.v1.Scorer"
EMBED = "Embed"
INFO = "Info"
EMBED_METHOD = f"/{SERVICE}/{EMBED}"
INFO_METHOD = f"/{SERVICE}/{INFO}"

# Both ends set their limits to this unless told otherwise: 4096 rows of 1024 floats are 16 MiB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Overload is told apart from gRPC's own RESOURCE_EXHAUSTED (a message over the size limit)
# and from a caller's own limits by this trailing metadata key; its value is
# "requested/free/queue_size". The two keys beside it say why, and the wait the scorer
# expected (seconds) when that was the reason.
OVERLOADED_KEY = "semhealth-overloaded"
# On NOT_FOUND: the encoders this scorer serves, comma-separated (names are identifiers), so a
# sidecar can say which of its encoders are missing without parsing the details text.
SERVED_KEY = "semhealth-served-encoders"
OVERLOAD_REASON_KEY = "semhealth-overload-reason"
EXPECTED_WAIT_KEY = "semhealth-expected-wait-s"

_MAGIC = b"SHv1"
_HEADER = struct.Struct("<4sII")  # magic, dim, count
_FLOAT32_LE = np.dtype("<f4")


@dataclass(frozen=True, slots=True)
class Malformed:
    """Bytes that are not the message they should be: why, and how many bytes there were."""

    reason: str
    size: int


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    encoder: str
    texts: tuple[str, ...]
    size: int = field(default=0, compare=False)  # bytes on the wire, when decoded


@dataclass(frozen=True, slots=True)
class Overload:
    """Why the scorer shed a call, as its trailing metadata tell the client."""

    reason: str  # expected_wait, queue_full
    requested: int  # texts the call asked for
    free: int  # queue slots free then
    queue_size: int
    expected_wait_s: float | None = None  # when the reason is the expected wait


@dataclass(frozen=True, slots=True)
class InfoRequest:
    encoder: str


@dataclass(frozen=True, slots=True)
class Info:
    """What a served encoder is: clients learn ``dim`` from it before their first call."""

    encoder: str  # the name clients ask for
    model: str  # the backend's name (its model)
    dim: int
    device: str  # cpu, cuda, or what the backend says


# -- Embed -----------------------------------------------------------------------------------


def encode_embed_request(request: EmbedRequest) -> bytes:
    """Serialise a request; never raises (a lone surrogate becomes "?", as in the batcher)."""
    body = {"encoder": request.encoder, "texts": [utf8_safe(text) for text in request.texts]}
    return orjson.dumps(body)


def decode_embed_request(data: bytes) -> EmbedRequest | Malformed:
    body = _json_object(data)
    if isinstance(body, Malformed):
        return body
    encoder, texts = body.get("encoder"), body.get("texts")
    if not isinstance(encoder, str):
        return Malformed("'encoder' is not a string", len(data))
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        return Malformed("'texts' is not a list of strings", len(data))
    return EmbedRequest(encoder, tuple(texts), len(data))


def encode_vectors(vectors: Vectors) -> bytes:
    """Header and raw little-endian float32 rows of a ``(count, dim)`` matrix."""
    matrix = np.ascontiguousarray(vectors, dtype=_FLOAT32_LE)
    count, dim = matrix.shape
    return _HEADER.pack(_MAGIC, dim, count) + matrix.tobytes()


def decode_vectors(data: bytes) -> Vectors | Malformed:
    """The matrix of an Embed response, as a read-only float32 view of ``data``."""
    if len(data) < _HEADER.size:
        return Malformed(f"response has {len(data)} bytes, less than its header", len(data))
    magic, dim, count = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        return Malformed("response does not start with the scorer's magic bytes", len(data))
    expected = _HEADER.size + dim * count * _FLOAT32_LE.itemsize
    if len(data) != expected:
        return Malformed(
            f"response of {count} rows of width {dim} should have {expected} bytes", len(data)
        )
    flat = np.frombuffer(data, dtype=_FLOAT32_LE, offset=_HEADER.size)
    return flat.reshape(count, dim).astype(np.float32, copy=False)


# -- Info ------------------------------------------------------------------------------------


def encode_info_request(request: InfoRequest) -> bytes:
    return orjson.dumps({"encoder": utf8_safe(request.encoder)})


def decode_info_request(data: bytes) -> InfoRequest | Malformed:
    body = _json_object(data)
    if isinstance(body, Malformed):
        return body
    encoder = body.get("encoder")
    if not isinstance(encoder, str):
        return Malformed("'encoder' is not a string", len(data))
    return InfoRequest(encoder)


def encode_info(info: Info) -> bytes:
    return orjson.dumps(
        {"encoder": info.encoder, "model": info.model, "dim": info.dim, "device": info.device}
    )


def decode_info(data: bytes) -> Info | Malformed:
    body = _json_object(data)
    if isinstance(body, Malformed):
        return body
    dim = body.get("dim")
    names = [body.get(key) for key in ("encoder", "model", "device")]
    # bool is an int to Python; a width of True is still nonsense.
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        return Malformed("'dim' is not a positive integer", len(data))
    encoder, model, device = names
    if not (isinstance(encoder, str) and isinstance(model, str) and isinstance(device, str)):
        return Malformed("'encoder', 'model' or 'device' is not a string", len(data))
    return Info(encoder, model, dim, device)


# -- overload metadata -----------------------------------------------------------------------


def encode_overload(requested: int, free: int, queue_size: int) -> str:
    return f"{requested}/{free}/{queue_size}"


def decode_overload(value: str) -> tuple[int, int, int] | None:
    parts = value.split("/")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        return None
    requested, free, queue_size = (int(part) for part in parts)
    return requested, free, queue_size


def overload_metadata(overload: Overload) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that mark a RESOURCE_EXHAUSTED answer as the scorer shedding."""
    requested, free = max(0, overload.requested), max(0, overload.free)
    figures = encode_overload(requested, free, overload.queue_size)
    pairs = [(OVERLOADED_KEY, figures), (OVERLOAD_REASON_KEY, overload.reason)]
    if overload.expected_wait_s is not None:
        pairs.append((EXPECTED_WAIT_KEY, f"{overload.expected_wait_s:.3f}"))
    return tuple(pairs)


def read_overload(metadata: Iterable[tuple[str, Any]] | None) -> Overload | None:
    """The scorer's overload mark in trailing metadata, or None when there is none."""
    values = {key: value for key, value in metadata or () if isinstance(value, str)}
    figures = decode_overload(values.get(OVERLOADED_KEY, ""))
    if figures is None:
        return None
    try:
        wait: float | None = float(values[EXPECTED_WAIT_KEY])
    except (KeyError, ValueError):
        wait = None
    reason = values.get(OVERLOAD_REASON_KEY, "queue_full")
    return Overload(reason[:32], *figures, expected_wait_s=wait)


def served_metadata(names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    return ((SERVED_KEY, ",".join(sorted(names))),)


def read_served(metadata: Iterable[tuple[str, Any]] | None) -> tuple[str, ...] | None:
    """The encoders a NOT_FOUND answer says the scorer serves, or None when it did not say."""
    for key, value in metadata or ():
        if key == SERVED_KEY and isinstance(value, str):
            return tuple(name for name in value.split(",") if name.isidentifier())
    return None


def _json_object(data: bytes) -> dict[str, Any] | Malformed:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return Malformed(f"not JSON (at byte {exc.pos})", len(data))
    if not isinstance(body, dict):
        return Malformed("not a JSON object", len(data))
    return body
