"""What the HTTP embedding backends share: one aiohttp session each, and one edge for errors.

``HttpBackend`` POSTs a batch as JSON and turns the answer into L2-normalised float32 rows; a
subclass says only where to POST, what to send and where the rows are in the answer
(``remote_openai``, ``remote_tei``). Every aiohttp failure and every bad answer becomes a
``BackendError`` here, once: timeouts, connection failures, 408, 429 and 5xx are
retryable; other 4xx answers and answers of the wrong shape are permanent. Messages carry
statuses, counts and sizes; never the texts, and never the body, which may echo them.

A server behind a bearer token gets the backend's ``api_key`` as ``Authorization: Bearer``
on every request; the key lives only in the session's default headers and is never in a
message, a log line or a ``repr()``. A 401 or 403 says whether a key was sent.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np
import orjson
from yarl import URL

from semhealth.common.text import utf8_safe
from semhealth.embeddings.backend import Vectors, normalize_rows
from semhealth.embeddings.errors import BackendError

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 8
MAX_RESPONSE_BYTES = 128 * 1024 * 1024  # 2048 rows of 1536 floats are about 60 MB of JSON
# What ``connect`` embeds to learn the width of the vectors: never a user's text.
PROBE_TEXT = "semhealth dimension probe"
_RETRYABLE_STATUSES = frozenset({408, 425, 429})
_AUTH_STATUSES = frozenset({401, 403})


class HttpBackend(abc.ABC):
    """A backend that embeds by POSTing JSON to an embedding server.

    One ``aiohttp.ClientSession`` per backend, opened on first use (in the running loop),
    with at most ``max_connections`` connections and ``timeout_s`` per request. A call of
    more than ``max_inputs`` texts is sent as several requests, in order; the batcher's
    workers give concurrency. ``dim`` is 0 until ``connect()`` or the first answer tells it,
    unless it is given; afterwards every answer must have that width. ``api_key``, when
    given, goes on every request as ``Authorization: Bearer``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str,
        dim: int | None,
        timeout_s: float,
        max_connections: int,
        max_inputs: int,
        api_key: str | None = None,
    ) -> None:
        _check_settings(base_url, dim, timeout_s, max_connections, max_inputs)
        if api_key is not None and not api_key.isprintable():
            # Said without the key: a header cannot hold it, and the message may be logged.
            raise ValueError("api_key holds a line break or another control character")
        self.name = name
        self.dim = dim or 0
        self.max_inputs = max_inputs
        self._base = URL(base_url.rstrip("/"))
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._headers = _headers(api_key)
        self._keyed = bool(api_key)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    # -- what a dialect says -----------------------------------------------------------------

    @property
    @abc.abstractmethod
    def path(self) -> str:
        """Where batches are POSTed, relative to the base URL."""

    @abc.abstractmethod
    def body(self, texts: list[str]) -> dict[str, Any]:
        """The JSON request for one batch."""

    @abc.abstractmethod
    def rows(self, answer: Any, count: int) -> list[Any] | str:
        """The answer's rows, in the order of the texts, or why the answer is not usable."""

    # -- the Backend seam --------------------------------------------------------------------

    async def connect(self) -> None:
        """Embed a fixed probe text: checks the server at start-up and learns ``dim``.

        Raises ``BackendError`` as ``embed`` does.
        """
        await self.embed([PROBE_TEXT])

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if self._closed:
            raise BackendError(f"{self.name}: the backend is closed", retryable=False)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        parts = [
            await self._embed_part(list(texts[start : start + self.max_inputs]))
            for start in range(0, len(texts), self.max_inputs)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    async def aclose(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- HTTP --------------------------------------------------------------------------------

    async def get_json(self, path: str) -> Any | None:
        """GET ``path``'s JSON; None when the server has no such path (404) or it is not JSON."""
        answer = await self._request("GET", path, None, 0)
        return None if answer is _MISSING else answer

    async def _embed_part(self, texts: list[str]) -> Vectors:
        body = self.body([utf8_safe(text) for text in texts])
        answer = await self._request("POST", self.path, body, len(texts))
        rows = self.rows(answer, len(texts))
        if isinstance(rows, str):
            raise self._shape_error(rows, len(texts))
        return self._matrix(rows, len(texts))

    async def _request(self, method: str, path: str, body: Any, count: int) -> Any:
        session = self._open()
        url = self._base / path.lstrip("/")
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with session.request(method, url, data=data, headers=headers) as response:
                if response.status == 404 and method == "GET":
                    return _MISSING
                if response.status >= 400:
                    raise _status_error(self.name, path, response.status, count, self._keyed)
                raw = await _read_capped(response, MAX_RESPONSE_BYTES)
        except BackendError:
            raise
        except Exception as exc:
            raise _translate(exc, self.name, path, count) from exc
        if raw is None:
            raise self._shape_error(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes", count)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if method == "GET":
                return _MISSING
            raise self._shape_error(f"the answer of {len(raw)} bytes is not JSON", count) from exc

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise BackendError(f"{self.name}: the backend is closed", retryable=False)
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                headers=self._headers,
                raise_for_status=False,
            )
        return self._session

    # -- validation --------------------------------------------------------------------------

    def _matrix(self, rows: list[Any], count: int) -> Vectors:
        if len(rows) != count:
            raise self._shape_error(f"the answer has {len(rows)} rows", count)
        try:
            # A value past float32's range becomes inf, refused below; no warning needed.
            with np.errstate(over="ignore"):
                matrix = np.array(rows, dtype=np.float32)
        except (ValueError, TypeError) as exc:
            reason = "the rows are not lists of numbers of one width"
            raise self._shape_error(reason, count) from exc
        if matrix.ndim != 2 or matrix.shape[1] == 0:
            raise self._shape_error(f"the rows have shape {matrix.shape[1:]}", count)
        width = matrix.shape[1]
        if self.dim and width != self.dim:
            raise self._shape_error(f"the rows have width {width}, not {self.dim}", count)
        if not np.isfinite(matrix).all():
            raise self._shape_error("the rows hold a value that is not finite", count)
        self.dim = width
        # Never trust the server to have normalised (or to have done it in float32).
        return normalize_rows(matrix)

    def _shape_error(self, reason: str, count: int) -> BackendError:
        return BackendError(
            f"{self.name}: unusable answer to {self.path} for {count} texts: {reason}",
            retryable=False,
        )


class _Missing:
    """A GET whose path the server does not have."""


_MISSING = _Missing()


def is_retryable_status(status: int) -> bool:
    """408, 425, 429 and 5xx may pass on a later try; every other 4xx will fail again."""
    return status >= 500 or status in _RETRYABLE_STATUSES


def _status_error(name: str, path: str, status: int, count: int, keyed: bool) -> BackendError:
    hint = ""
    if status in _AUTH_STATUSES:
        hint = (
            ": the server refused the API key sent; check the variable remote.api_key_env names"
            if keyed
            else ": no API key was sent; name the variable that holds it in remote.api_key_env"
        )
    return BackendError(
        f"{name}: {path} answered HTTP {status} for {count} texts{hint}",
        retryable=is_retryable_status(status),
    )


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": "semhealth"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _translate(exc: Exception, name: str, path: str, count: int) -> BackendError:
    if isinstance(exc, TimeoutError):
        return BackendError(f"{name}: {path} timed out on {count} texts", retryable=True)
    # A bad URL or certificate will not fix itself; a refused or dropped connection may.
    permanent = isinstance(exc, aiohttp.InvalidURL | aiohttp.ClientConnectorCertificateError)
    transient = isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError)
    return BackendError(
        f"{name}: {path} failed on {count} texts: {type(exc).__name__}",
        retryable=transient and not permanent,
    )


async def _read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body, or None once it passes ``limit`` bytes: a runaway server costs no memory."""
    if response.content_length is not None and response.content_length > limit:
        return None
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _check_settings(
    base_url: str, dim: int | None, timeout_s: float, max_connections: int, max_inputs: int
) -> None:
    problems = []
    try:
        url: URL | None = URL(base_url)
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        problems.append("base_url must be an http:// or https:// URL with a host")
    if dim is not None and dim < 1:
        problems.append(f"dim must be at least 1, not {dim}")
    if not timeout_s > 0:
        problems.append(f"timeout_s must be more than 0, not {timeout_s:g}")
    if max_connections < 1:
        problems.append(f"max_connections must be at least 1, not {max_connections}")
    if max_inputs < 1:
        problems.append(f"max_inputs must be at least 1, not {max_inputs}")
    if problems:
        raise ValueError("; ".join(problems))


def display_url(base_url: str) -> str:
    """``base_url`` without user name or password: fit to name a backend by."""
    return str(URL(base_url).with_user(None))
