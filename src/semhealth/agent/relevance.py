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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias

from semhealth.agent.config import Relevance
from semhealth.agent.tasks import finish_within
from semhealth.agent.telemetry.observe import observe, observe_by, observe_counters
from semhealth.collectors import StreamRecord
from semhealth.common.threadcpu import cpu_seconds
from semhealth.embeddings import (
    EMBEDDING_THREADS,
    Config,
    EmbeddingError,
    Encoder,
    Overloaded,
    choose_encoders,
    used_encoders,
)

if TYPE_CHECKING:  # each loads numpy: an agent that scores nothing never imports them
    from semhealth.embeddings import Backend, CacheStats, RelevanceScores, Scorer

log = logging.getLogger(__name__)

RecordScores: TypeAlias = "Callable[[StreamRecord, RelevanceScores], None]"


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


# Encoders already loaded, by the configured encoder's name: each is used instead of loading
# that encoder again (the caller keeps it open). Nothing else changes: whether scoring runs,
# which encoders, the routing and the calibrations all come from the configuration. Tests
# share one loaded model between the agents they start this way.
LoadedEncoders: TypeAlias = "Mapping[str, Backend]"
EMPTY: LoadedEncoders = MappingProxyType({})


def used(plan: RelevancePlan, loaded: LoadedEncoders) -> dict[str, Backend]:
    """The loaded encoders the plan scores with (a plan without one loads none)."""
    return {e.name: loaded[e.name] for e in plan.encoders if e.name in loaded}


@contextlib.asynccontextmanager
async def offline_scorer(
    relevance: Relevance, loaded: LoadedEncoders = EMPTY
) -> AsyncIterator[Scorer | str]:
    """The configured relevance scorer for an offline run (replay, ``semhealth diff``), or
    the reason there is none. ``loaded``: see ``LoadedEncoders``."""
    plan = plan_relevance(relevance)
    if plan.embeddings is None:
        yield plan.off or "relevance is off"
        return
    from semhealth.embeddings import open_scorer  # loads numpy: only where something scores

    async with open_scorer(
        plan.embeddings, calibration_path=plan.calibration, backends=used(plan, loaded)
    ) as scorer:
        yield scorer


def plan_relevance(
    relevance: Relevance,
    *,
    find_spec: Callable[[str], ModuleSpec | None] | None = None,
) -> RelevancePlan:
    """What relevance scoring starts with, decided without importing any model package.

    ``enabled: false``: nothing. ``true``: the configured encoders, whatever is installed
    (a missing package fails the start). ``auto``:
    the configured encoders when they can be built; USE for every request when only
    sentence-transformers is missing (the default install); else nothing, with the reason.
    ``find_spec`` looks packages up (None: ``importlib.util.find_spec``).
    """
    if relevance.enabled is False:
        return RelevancePlan(None, off="relevance.enabled is false")
    if relevance.enabled is True:
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
    sample_rate: float = 1.0  # share of eligible records scored, at most
    max_in_flight: int = 256  # records being scored at once; past this, records are shed
    cpu_budget: float | None = None  # cores the encoders' threads may use; None: no budget


class Budget:
    """Keeps the encoders' CPU within ``cores`` by scoring a share of eligible streams.

    Every ``WINDOW_S`` it reads the CPU the encoder threads used (``read_cpu``: cumulative
    seconds, None where it cannot be read), the streams whose scoring ended and the eligible
    streams that arrived. From them: the CPU a scored stream costs (a running mean) and the
    demand (eligible streams a second), so the share that spends the budget is
    ``cores / (cost * demand)``, never above ``ceiling`` (``relevance.sample_rate``). Under
    light traffic that is the ceiling: everything is scored. Until a stream's cost is known
    the share halves while use is over the budget and doubles while it is under. Each
    stream is kept or not by one random draw against the share, so what is scored is an
    unbiased sample of routes and models.

    The share acts on streams chosen from now on; work already taken would still run past
    the budget. So the streams being scored at once are also bounded to what the budget
    spends in ``HORIZON_S`` at the measured cost (``in_flight_limit``): a burst before the
    next reading costs at most that much more.
    """

    WINDOW_S = 2.0
    HORIZON_S = 2.0
    MIN_RATE = 0.001  # never fully off: a trickle keeps the cost per stream measured

    def __init__(self, cores: float, ceiling: float, read_cpu: Callable[[], float | None]) -> None:
        self.cores = cores
        self.ceiling = ceiling
        self.rate = ceiling
        self.cpu_seconds = 0.0  # CPU the encoder threads used while measured
        self.cost_s: float | None = None  # CPU per scored stream, once measured
        self._read_cpu = read_cpu
        self._last: tuple[float, float, int, int] | None = None  # time, cpu, finished, eligible

    def in_flight_limit(self) -> int | None:
        """Streams that may be scored at once, or None until a stream's cost is known."""
        if self.cost_s is None:
            return None
        return max(1, int(self.cores * self.HORIZON_S / self.cost_s))

    def update(self, now: float, finished: int, eligible: int) -> None:
        """A window's reading: ``finished`` counts every stream whose scoring ended,
        ``eligible`` every stream that could have been scored (both cumulative)."""
        cpu = self._read_cpu()
        if cpu is None:
            return  # nothing to measure: the share stays where it is
        last, self._last = self._last, (now, cpu, finished, eligible)
        if last is None or now <= last[0]:
            return
        seconds = now - last[0]
        used_s = max(0.0, cpu - last[1])  # a thread that ended takes its seconds with it
        self.cpu_seconds += used_s
        if finished > last[2] and used_s > 0:
            cost = used_s / (finished - last[2])
            self.cost_s = cost if self.cost_s is None else (self.cost_s + cost) / 2
        demand = (eligible - last[3]) / seconds
        if self.cost_s is not None and demand > 0:
            rate = self.cores / (self.cost_s * demand)
        elif used_s / seconds > self.cores:
            rate = self.rate / 2
        else:
            rate = self.rate * 2
        self.rate = min(self.ceiling, max(self.MIN_RATE, rate))


@dataclass(slots=True)
class RelevanceStats:
    """Counters the telemetry layer reads: how much was scored, and why the rest was not."""

    scored: int = 0
    dropped: int = 0  # shed: scoring saturated (in-flight limit or the batcher's queue)
    sample_rate: float = 0.0  # the share of eligible streams scored now (0 while off)
    cpu_seconds: float = 0.0  # CPU the encoder threads used, as the budget measured it
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
        read_cpu: Callable[[], float | None] | None = None,
    ) -> None:
        self._scorer = scorer
        self._settings = settings
        self._record_scores: tuple[RecordScores, ...] = (record_scores,)
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = True
        self.stats = RelevanceStats(sample_rate=settings.sample_rate)
        self.budget = (
            Budget(settings.cpu_budget, settings.sample_rate, read_cpu or _encoder_cpu)
            if settings.cpu_budget is not None
            else None
        )
        self._budgeting: asyncio.Task[None] | None = None
        self._finished = 0  # streams whose scoring ended, however it ended
        self._eligible = 0  # streams that could have been scored (the budget's demand)

    def start(self) -> None:
        """Start keeping the budget (a no-op without one)."""
        if self.budget is not None and self._budgeting is None:
            self._budgeting = asyncio.create_task(
                self._keep_budget(self.budget), name="semhealth-relevance-budget"
            )

    async def _keep_budget(self, budget: Budget) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # /proc reads are a few system calls for the handful of threads there are.
            budget.update(loop.time(), self._finished, self._eligible)
            self.stats.sample_rate = budget.rate
            self.stats.cpu_seconds = budget.cpu_seconds
            await asyncio.sleep(Budget.WINDOW_S)

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
        self._eligible += 1
        draw = self._rng.random()
        if draw >= self._settings.sample_rate:
            self.stats.skip("sampled_out")
            return
        if self.budget is not None and (
            draw >= self.budget.rate
            or len(self._tasks) >= (self.budget.in_flight_limit() or 1 << 62)
        ):
            self.stats.skip("budgeted_out")
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
        task.add_done_callback(self._done)

    def _over_budget(self, draw: float) -> bool:
        assert self.budget is not None
        limit = self.budget.in_flight_limit()
        return draw >= self.budget.rate or (limit is not None and len(self._tasks) >= limit)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._finished += 1

    async def shutdown(self, timeout_s: float = 2.0) -> None:
        """Stop taking records, let scores in flight finish within the deadline, cancel the rest."""
        self._accepting = False
        budgeting, self._budgeting = self._budgeting, None
        if budgeting is not None:
            budgeting.cancel()
            await asyncio.gather(budgeting, return_exceptions=True)
        await finish_within(self._tasks, timeout_s)


def _encoder_cpu() -> float | None:
    return cpu_seconds(EMBEDDING_THREADS)


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
    meter.create_observable_gauge(
        "semhealth_relevance_sample_rate",
        [observe(lambda: _rate(relevance()))],
        description="Share of eligible streams scored now: relevance.sample_rate, lowered "
        "to keep relevance.cpu_budget (0 while scoring is off).",
    )
    meter.create_observable_counter(
        "semhealth_relevance_cpu",
        [observe(lambda: _cpu(relevance()))],
        unit="s",
        description="CPU the encoders' threads used in this process, as relevance.cpu_budget "
        "measures it (0 without a budget or with remote encoders only).",
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
        description="Streams not scored, by reason: sampled_out, budgeted_out, no_query, "
        "nothing_to_compare, incomplete, error_response, encoder_not_served.",
    )


def _rate(stats: RelevanceStats | None) -> float:
    return stats.sample_rate if stats is not None else 0.0


def _cpu(stats: RelevanceStats | None) -> float:
    return stats.cpu_seconds if stats is not None else 0.0
