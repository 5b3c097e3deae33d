"""Texts to vectors to relevance: the encoder seam, the local model, the micro-batcher, the cache.

Importing this package never imports torch; only building a ``LocalBackend`` does.
"""

from semhealth.embeddings.backend import Backend, Embedder, Vectors, normalize_rows
from semhealth.embeddings.batcher import BatcherStats, MicroBatcher, estimate_tokens
from semhealth.embeddings.cache import Cache, CacheStats
from semhealth.embeddings.calibration import Calibration, fit_calibration, load_calibration
from semhealth.embeddings.config import Batching, Config, Encoder, Local, default_config
from semhealth.embeddings.errors import (
    BackendError,
    Closed,
    ConfigIssue,
    EmbeddingError,
    ModelLoadError,
    Overloaded,
)
from semhealth.embeddings.local import LocalBackend, resolve_model
from semhealth.embeddings.relevance import (
    RelevanceScorer,
    RelevanceScores,
    answer_relevance,
    context_relevance,
)
from semhealth.embeddings.remote_openai import OpenAICompatibleBackend
from semhealth.embeddings.remote_scorer import RemoteScorerBackend
from semhealth.embeddings.remote_tei import TEIBackend
from semhealth.embeddings.routing import RoutingScorer, has_cjk
from semhealth.embeddings.use import UseBackend

__all__ = [
    "Backend",
    "BackendError",
    "BatcherStats",
    "Batching",
    "Cache",
    "CacheStats",
    "Calibration",
    "Closed",
    "Config",
    "ConfigIssue",
    "Embedder",
    "EmbeddingError",
    "Encoder",
    "Local",
    "LocalBackend",
    "MicroBatcher",
    "ModelLoadError",
    "OpenAICompatibleBackend",
    "Overloaded",
    "RelevanceScorer",
    "RelevanceScores",
    "RemoteScorerBackend",
    "RoutingScorer",
    "TEIBackend",
    "UseBackend",
    "Vectors",
    "answer_relevance",
    "context_relevance",
    "default_config",
    "estimate_tokens",
    "fit_calibration",
    "has_cjk",
    "load_calibration",
    "normalize_rows",
    "resolve_model",
]
