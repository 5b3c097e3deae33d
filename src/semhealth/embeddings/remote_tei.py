"""Hugging Face text-embeddings-inference (TEI), through its native ``POST /embed`` route.

Batches go as ``{"inputs": [...], "normalize": true, "truncate": true}`` and come back as a
list of rows. TEI refuses (413) a request of more inputs than its ``max_client_batch_size``
(32 by default), so a larger call is sent in slices of that size; ``connect()`` reads the
server's own limit from ``GET /info``. Rows are normalised here whatever the server did.
"""

from __future__ import annotations

from typing import Any

from semhealth.embeddings._http import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TIMEOUT_S,
    HttpBackend,
    display_url,
)

DEFAULT_MAX_INPUTS = 32  # TEI's default --max-client-batch-size


class TEIBackend(HttpBackend):
    """Embeds through a text-embeddings-inference server.

    ``name`` (default: the URL, without credentials) keys the cache. ``truncate`` lets the
    server cut a text longer than the model's input instead of refusing the batch (422).
    ``api_key``, when the server was started with ``--api-key``, goes in an
    ``Authorization: Bearer`` header. Raises ``ValueError`` for settings that cannot work.
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str | None = None,
        dim: int | None = None,
        truncate: bool = True,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_inputs: int = DEFAULT_MAX_INPUTS,
    ) -> None:
        super().__init__(
            base_url,
            name=name or display_url(base_url),
            dim=dim,
            timeout_s=timeout_s,
            max_connections=max_connections,
            max_inputs=max_inputs,
            api_key=api_key,
        )
        self.truncate = truncate

    @property
    def path(self) -> str:
        return "embed"

    async def connect(self) -> None:
        """Read the server's batch limit from ``/info``, then embed a probe to learn ``dim``."""
        info = await self.get_json("info")
        limit = info.get("max_client_batch_size") if isinstance(info, dict) else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
            self.max_inputs = min(self.max_inputs, limit)
        await super().connect()

    def body(self, texts: list[str]) -> dict[str, Any]:
        # An empty input can be refused by the server's validation and fail the whole batch;
        # a BERT-style tokenizer reads " " exactly as "".
        inputs = [text if text else " " for text in texts]
        return {"inputs": inputs, "normalize": True, "truncate": self.truncate}

    def rows(self, answer: Any, count: int) -> list[Any] | str:
        if not isinstance(answer, list):
            return "the answer is not a list of rows"
        return answer
