"""Relevance scoring of live traffic, beside the forwarding path and never in its way.

``plan_relevance`` decides, before any model loads, what scoring starts with: the
configured encoders, USE for every request when ``auto`` finds sentence-transformers
missing (``semhealth.embeddings.choose_encoders``), or nothing, with the reason.

``RelevanceStage.consume_record`` decides in O(1) whether a record is scored
(has a query and something to compare it with, is sampled, and scoring is not
saturated) and, if so, starts a task that embeds its texts through the shared
micro-batcher and records the calibrated scores when they are ready. Records are
never held back waiting for a score; work that does not fit is shed and
counted. The task keeps the record's texts only until its embedding returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from typing import Any

from semhealth.agent.config import Relevance
from semhealth.agent.tasks import finish_within
from semhealth.agent.telemetry.observe import observe, observe_by, observe_counters
from semhealth.collectors import StreamRecord
from semhealth.embeddings import (
    Backend,
    CacheStats,
    Config,
    EmbeddingError,
    Encoder,
    Overloaded,
    RelevanceScores,
    Scorer,
    choose_encoders,
    open_scorer,
    used_encoders,
)

log = logging.getLogger(__name__)

RecordScores = Callable[[StreamRecord, RelevanceScores], None]


@dataclass(frozen=True, slots=True)
class RelevancePlan:
    """What relevance scoring starts with; ``open_scorer(embeddings, calibration_path=
    calibration)`` opens it. ``embeddings`` None: scoring stays off, and ``off`` says why.

    ``fallback`` is set when ``auto`` scores with other encoders than the configured ones:
    one line for the start-up log, saying what and how to get the configured ones.
    """

    embeddings: Config | None
    calibration: str | None = None  # the file for the default encoder; None: the shipped one
    off: str | None = None
    fallback: str | None = None

    @property
    def encoders(self) -> list[Encoder]:
        """The encoders that will score (none when scoring stays off)."""
        return [] if self.embeddings is None else used_encoders(self.embeddings)


@contextlib.asynccontextmanager
async def offline_scorer(
    relevance: Relevance, backend: Backend | None = None
) -> AsyncIterator[Scorer | str]:
    """The configured relevance scorer for an offline run (replay, ``semhealth diff``), or
    the reason there is none. ``backend`` replaces the configured encoder's (tests)."""
    plan = plan_relevance(relevance, backend_given=backend is not None)
    if plan.embeddings is None:
        yield plan.off or "relevance is off"
        return
    async with open_scorer(
        plan.embeddings, calibration_path=plan.calibration, backend=backend
    ) as scorer:
        yield scorer


def plan_relevance(
    relevance: Relevance,
    *,
    backend_given: bool = False,
    find_spec: Callable[[str], ModuleSpec | None] | None = None,
) -> RelevancePlan:
    """What relevance scoring starts with, decided without importing any model package.

    ``enabled: false``: nothing. ``true``, or a backend handed in by the caller: the
    configured encoders, whatever is installed (a missing package fails the start). ``auto``:
    the configured encoders when they can be built; USE for every request when only
    sentence-transformers is missing (the default install); else nothing, with the reason.
    ``find_spec`` looks packages up (None: ``importlib.util.find_spec``).
    """
    if relevance.enabled is False:
        return RelevancePlan(None, off="relevance.enabled is false")
    if relevance.enabled is True or backend_given:
        return RelevancePlan(relevance.embeddings, relevance.calibration)
    choice = choose_encoders(relevance.embeddings, find_spec)
    if choice.config is None:
        return RelevancePlan(None, off=choice.reason)
    calibration = relevance.calibration
    fallback = choice.fallback
    default = relevance.embeddings.encoder
    # The file was fitted for the configured default encoder: not for one chosen instead.
    if fallback is not None and calibration is not None and choice.config.encoder != default:
        fallback += (
            f"; relevance.calibration ({calibration}) is for encoder '{default}' and is not applied"
        )
        calibration = None
    return RelevancePlan(choice.config, calibration, fallback=fallback)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    sample_rate: float = 1.0  # share of eligible records scored
    max_in_flight: int = 256  # records being scored at once; past this, records are shed


@dataclass(slots=True)
class RelevanceStats:
    """Counters the telemetry layer reads: how much was scored, and why the rest was not."""

    scored: int = 0
    dropped: int = 0  # shed: scoring saturated (in-flight limit or the batcher's queue)
    errors: int = 0  # the encoder failed
    skipped: dict[str, int] = field(default_factory=dict)  # by reason: sampled_out, no_query, ...

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def eligibility(record: StreamRecord) -> str | None:
    """Why a record cannot be scored, or None when it can."""
    if record.shed or record.truncated or record.client_aborted or record.upstream_aborted:
        return "incomplete"
    if record.status >= 400:
        return "error_response"
    if not record.request.query:
        return "no_query"
    if not record.request.context and not record.output_text:
        return "nothing_to_compare"
    return None


# The skip reason while a shared scorer does not serve this sidecar's encoders (auto).
ENCODER_NOT_SERVED = "encoder_not_served"


class Unscored:
    """Relevance that could not start under ``enabled: auto`` for a reason the operator must
    fix (a shared scorer that does not serve this sidecar's encoders): every stream that
    would have been scored is counted as skipped for that reason, so the gap shows on a
    dashboard instead of as counters that stay at zero."""

    def __init__(self, reason: str) -> None:
        self._reason = reason
        self.stats = RelevanceStats()

    def consume_record(self, record: StreamRecord) -> None:
        self.stats.skip(eligibility(record) or self._reason)


class RelevanceStage:
    def __init__(
        self,
        scorer: Scorer,
        settings: Settings,
        record_scores: RecordScores,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self._scorer = scorer
        self._settings = settings
        self._record_scores: tuple[RecordScores, ...] = (record_scores,)
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = True
        self.stats = RelevanceStats()

    @property
    def scorer(self) -> Scorer:
        """The scorer this stage embeds with (live shadowing scores answer agreement too)."""
        return self._scorer

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def also_record(self, record_scores: RecordScores) -> None:
        """Hand each record's scores to ``record_scores`` too, after the sink given at build
        (``semhealth demo``'s table, in-process only). Scores already in flight are not."""
        self._record_scores = (*self._record_scores, record_scores)

    def consume_record(self, record: StreamRecord) -> None:
        reason = eligibility(record)
        if reason is not None:
            self.stats.skip(reason)
            return
        if self._rng.random() >= self._settings.sample_rate:
            self.stats.skip("sampled_out")
            return
        if not self._accepting or len(self._tasks) >= self._settings.max_in_flight:
            self.stats.dropped += 1
            return
        query = record.request.query or ""
        task = asyncio.create_task(
            _score(
                self._scorer,
                self.stats,
                self._record_scores,
                record,
                query,
                record.request.context,
                record.output_text or None,
            ),
            name="semhealth-relevance",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def shutdown(self, timeout_s: float = 2.0) -> None:
        """Stop taking records, let scores in flight finish within the deadline, cancel the rest."""
        self._accepting = False
        await finish_within(self._tasks, timeout_s)


async def _score(
    scorer: Scorer,
    stats: RelevanceStats,
    record_scores: tuple[RecordScores, ...],
    record: StreamRecord,
    query: str,
    context: Sequence[str],
    answer: str | None,
) -> None:
    # A module function, not a method: the task holds what it needs and nothing of the stage.
    try:
        scores = await scorer.score(query, context, answer)
    except Overloaded:
        stats.dropped += 1
        return
    except EmbeddingError as exc:
        stats.errors += 1
        log.warning("relevance scoring failed: %s", type(exc).__name__)
        return
    except Exception:
        stats.errors += 1
        log.exception("relevance scoring failed inside semhealth (a bug: please report)")
        return
    stats.scored += 1
    for sink in record_scores:
        sink(record, scores)


def observe_relevance(
    meter: Any,
    relevance: Callable[[], RelevanceStats | None],
    cache: Callable[[], CacheStats | None],
) -> None:
    """Relevance and embedding counters; zero while scoring is off, so series never vanish."""

    def field_of(stats: RelevanceStats | CacheStats | None, name: str) -> int:
        return int(getattr(stats, name)) if stats is not None else 0

    def skipped() -> dict[str, int]:
        stats = relevance()
        # A copy: the OTLP reader's thread iterates while the loop may add a reason.
        return dict(stats.skipped) if stats is not None else {}

    observe_counters(
        meter,
        {
            "semhealth_relevance_scored": (
                lambda: field_of(relevance(), "scored"),
                "Streams whose relevance was scored and recorded.",
            ),
            "semhealth_relevance_errors": (
                lambda: field_of(relevance(), "errors"),
                "Streams whose scoring failed in the encoder (counted, never retried).",
            ),
            "semhealth_embedding_cache_hits": (
                lambda: field_of(cache(), "hits"),
                "Texts whose embedding came from the cache.",
            ),
            "semhealth_embedding_cache_misses": (
                lambda: field_of(cache(), "misses"),
                "Texts the cache did not hold, so the model embedded them.",
            ),
        },
    )
    # A gauge: the cache's memory grows with it up to relevance.cache_entries, then stays.
    meter.create_observable_up_down_counter(
        "semhealth_embedding_cache_entries",
        [observe(lambda: field_of(cache(), "entries"))],
        description="Vectors the embedding cache holds (at most relevance.cache_entries; "
        "each takes the encoder's dimensions x 4 bytes).",
    )
    meter.create_observable_counter(
        "semhealth_relevance_skipped",
        [observe_by("reason", skipped)],
        description="Streams not scored, by reason: sampled_out, no_query, "
        "nothing_to_compare, incomplete, error_response, encoder_not_served.",
    )
