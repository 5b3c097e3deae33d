"""Relevance scoring of live traffic, beside the forwarding path and never in its way.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from semhealth.collectors.record import StreamRecord
from semhealth.embeddings.errors import EmbeddingError, Overloaded
from semhealth.embeddings.relevance import RelevanceScores

log = logging.getLogger(__name__)


class Scorer(Protocol):
    async def score(
        self, query: str, context_chunks: Sequence[str] = (), answer: str | None = None
    ) -> RelevanceScores: ...


RecordScores = Callable[[StreamRecord, RelevanceScores], None]


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
        self._record_scores = record_scores
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = True
        self.stats = RelevanceStats()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

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
        tasks = set(self._tasks)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _score(
    scorer: Scorer,
    stats: RelevanceStats,
    record_scores: RecordScores,
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
    record_scores(record, scores)
