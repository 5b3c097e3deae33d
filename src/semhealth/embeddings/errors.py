"""Errors the embeddings package raises: its branch of ``semhealth.common.errors``' tree.

    EmbeddingError            (a SemhealthError) root of every error this package raises on purpose
     ├── Overloaded           the queue has no room: the caller sheds the work (never retried)
     ├── Closed               the batcher is not running (not started, or shut down)
     └── BackendError         a backend failed a batch; ``retryable``: may a later try pass?
          ├── ModelLoadError  a local model could not be loaded (start-up only, permanent)
          └── EncoderNotServed  a shared scorer does not serve the encoder asked of it

Messages carry counts, sizes and reasons, never the texts being embedded. Third-party
errors (torch, sentence-transformers, HTTP clients) are translated once, where a backend
calls them, with ``raise ... from exc``.
"""

from __future__ import annotations

from semhealth.common.errors import Issue, SemhealthError


class EmbeddingError(SemhealthError):
    """Root of the errors this package raises on purpose; catch this to catch them all."""


class Overloaded(EmbeddingError):
    """The queue cannot take all of a call's texts; nothing of the call was queued."""

    def __init__(self, *, requested: int, free: int, queue_size: int) -> None:
        self.requested = requested
        self.free = free
        self.queue_size = queue_size
        super().__init__(
            f"embedding queue full: {requested} texts requested, "
            f"{free} of {queue_size} slots free; the work is shed"
        )


class Closed(EmbeddingError):
    """The batcher does not take or finish work: it was never started, or it shut down."""


class BackendError(EmbeddingError):
    """A backend could not embed a batch.

    ``retryable`` marks failures that may pass on a later try (a timeout, a busy remote
    scorer); permanent ones (a wrong shape, a closed backend, a model that cannot load)
    will fail the same way again.
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        self.retryable = retryable
        super().__init__(message)


class ModelLoadError(BackendError):
    """A local model could not be loaded; raised at start-up, never while scoring."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class EncoderNotServed(BackendError):
    """A ``semhealth scorer`` does not serve the encoder a sidecar asks it for (permanent
    until one of the two is configured again); ``served`` is what it does serve."""

    def __init__(self, message: str, *, target: str, encoder: str, served: tuple[str, ...]) -> None:
        self.target = target
        self.encoder = encoder
        self.served = served
        super().__init__(message, retryable=False)


# The issue type every check reports; its ``path`` is relative to the embeddings config that
# found it (``batching.max_batch``), and the agent re-roots it under ``embeddings.``.
ConfigIssue = Issue
