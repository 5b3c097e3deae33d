"""Any OpenAI-compatible ``POST /v1/embeddings`` endpoint: vLLM, TEI's OpenAI route, OpenAI.

The base URL is the one the OpenAI SDK takes, ending in ``/v1`` (``http://vllm:8000/v1``);
batches go to ``{base_url}/embeddings`` as
``{"model": ..., "input": [...], "encoding_format": "float"}`` and the answer's ``data`` rows
are put back in order by their ``index``. Rows are normalised here whatever the server did.
"""

from __future__ import annotations

from typing import Any

from semhealth.embeddings._http import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TIMEOUT_S,
    HttpBackend,
)

# OpenAI's own limit on inputs per request; vLLM and TEI accept at least as many.
DEFAULT_MAX_INPUTS = 2048


class OpenAICompatibleBackend(HttpBackend):
    """Embeds through an OpenAI-compatible embeddings endpoint.

    ``model`` is what the server is asked for; ``name`` (default: ``model``) keys the cache.
    ``api_key``, when given, goes in an ``Authorization: Bearer`` header and nowhere else.
    ``connect()`` checks the endpoint and learns ``dim`` at start-up; raises ``ValueError``
    for settings that cannot work.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        name: str | None = None,
        dim: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_inputs: int = DEFAULT_MAX_INPUTS,
    ) -> None:
        if not model.strip():
            raise ValueError("model is empty: name the model the server serves")
        super().__init__(
            base_url,
            name=name or model,
            dim=dim,
            timeout_s=timeout_s,
            max_connections=max_connections,
            max_inputs=max_inputs,
            api_key=api_key,
        )
        self.model = model

    @property
    def path(self) -> str:
        return "embeddings"

    def body(self, texts: list[str]) -> dict[str, Any]:
        # The OpenAI API refuses an empty string, which would fail every other caller's
        # texts in the batch; a BERT-style tokenizer reads " " exactly as "" anyway.
        inputs = [text if text else " " for text in texts]
        return {"model": self.model, "input": inputs, "encoding_format": "float"}

    def rows(self, answer: Any, count: int) -> list[Any] | str:
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            return "the answer has no 'data' list"
        if len(data) != count:
            return f"the answer has {len(data)} rows"
        ordered: list[Any] = [None] * count
        for position, item in enumerate(data):
            if not isinstance(item, dict) or "embedding" not in item:
                return f"row {position} has no 'embedding'"
            index = item.get("index", position)
            if not _valid_index(index, count) or ordered[index] is not None:
                return f"the rows' indices are not 0 to {count - 1}, each once"
            ordered[index] = item["embedding"]
        return ordered


def _valid_index(index: Any, count: int) -> bool:
    # bool is an int to Python; an index of True is still a bad answer.
    return isinstance(index, int) and not isinstance(index, bool) and 0 <= index < count
