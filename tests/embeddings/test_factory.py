"""``open_scorer``: the live scorer built from the config, and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.config import Config, default_config
from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.local import LocalBackend
from semhealth.embeddings.relevance import RelevanceScorer
from semhealth.embeddings.routing import RoutingScorer


async def test_the_scorer_built_for_the_sidecar_uses_the_configured_top_k(
    minilm: LocalBackend,
) -> None:
    async with open_scorer(Config(top_k=1), backend=minilm) as scorer:
        assert isinstance(scorer, RelevanceScorer)
        assert scorer.top_k == 1


async def test_an_unrouted_scorer_names_its_one_batcher(minilm: LocalBackend) -> None:
    async with open_scorer(default_config(), backend=minilm) as scorer:
        (batcher,) = scorer.batchers()
        assert isinstance(batcher, MicroBatcher)
        assert batcher.backend is minilm


async def test_a_routing_scorer_names_one_batcher_per_encoder_over_one_cache(
    minilm: LocalBackend,
) -> None:
    backends = {"default": minilm, "multilingual": minilm}
    async with open_scorer(default_config(), backends=backends) as scorer:
        assert isinstance(scorer, RoutingScorer)
        batchers = scorer.batchers()
        assert len(batchers) == 2
        assert batchers[0] is not batchers[1]
        assert batchers[0].cache is batchers[1].cache  # the cache counters count it once


def test_a_scorer_over_a_bare_backend_has_no_batcher(minilm: LocalBackend) -> None:
    assert RelevanceScorer(minilm).batchers() == ()


@pytest.mark.parametrize(
    "module", ["semhealth.embeddings.factory", "semhealth.embeddings", "semhealth.embeddings.use"]
)
def test_importing_the_factory_loads_no_heavy_dependency(module: str) -> None:
    # A fresh interpreter: this one has them all loaded. grpc is the scorer client's and
    # aiohttp the HTTP backends'; tqdm is the JSONL commands' progress bar.
    heavy = ("grpc", "aiohttp", "tqdm", "torch", "sentence_transformers")
    probe = (
        f"import sys, {module}; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_a_lazy_name_is_imported_on_first_use() -> None:
    probe = (
        "import sys, semhealth.embeddings as e; "
        "before = 'grpc' in sys.modules; "
        "e.RemoteScorerBackend; "
        "print(before, 'grpc' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["False", "True"]
