"""Relevance over JSONL files: what ``semhealth score`` and ``semhealth calibrate`` run.

``score_jsonl`` reads records ``{"query": str, "context": [str, ...], "answer": str?}`` and
writes each one back with ``context_relevance_score`` and ``answer_relevance_score`` added
(null where there is nothing to compare), every other field kept in its place. It scores
with the sidecar's own scorer (encoders routed by script, micro-batchers, cache,
calibrations, built by ``factory.open_scorer``), so a user can check a threshold on their
own data before a rollout.

``calibrate_from_jsonl`` fits an encoder's calibration on a user's labelled records
``{"query": str, "context": str | [str, ...], "label": 0 | 1}``.

Many records are in flight at once, so the batcher fills its batches across records;
results are still written in input order. A line that is not a valid record is reported
by number and reason (never its text), left out of the output, and counted; the run goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import orjson
from tqdm import tqdm

from semhealth.embeddings.calibration import Calibration, fit_calibration, json_type
from semhealth.embeddings.errors import BackendError, Closed, EmbeddingError, Overloaded
from semhealth.embeddings.relevance import RelevanceScores, Scorer
from semhealth.embeddings.routing import RoutingScorer

__all__ = [
    "ANSWER_FIELD",
    "CONTEXT_FIELD",
    "LineError",
    "LineSink",
    "ScoreSummary",
    "calibrate_from_jsonl",
    "log_line_error",
    "score_jsonl",
]

CONTEXT_FIELD = "context_relevance_score"
ANSWER_FIELD = "answer_relevance_score"
DEFAULT_CONCURRENCY = (
    64  # records in flight: enough to fill batches, few enough to keep order cheap
)
KEPT_ERRORS = 100  # line errors a summary keeps; the count covers them all
RETRIES = 3  # tries of a record whose batch failed with a retryable error
_OVERLOAD_WAIT_S = (0.001, 0.1)  # first and longest wait before retrying a shed record

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
Line = str | bytes


class LineSink(Protocol):
    """Where scored records go: a text file, ``sys.stdout``, an ``io.StringIO``."""

    def write(self, text: str, /) -> object: ...


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that was not scored: its 1-based number and why (never its text)."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ScoreSummary:
    records: int  # non-blank lines read
    written: int  # records written with their scores
    errors: int  # lines left out, each reported
    first_errors: tuple[LineError, ...]  # the first KEPT_ERRORS of them


@dataclass(frozen=True, slots=True)
class _Record:
    line: int
    fields: dict[str, Any]  # the whole record, written back with the scores added
    query: str
    context: tuple[str, ...]
    answer: str | None
    label: int | None  # calibration records only


ErrorSink = Callable[[LineError], None]


def log_line_error(error: LineError) -> None:
    """The default ``on_error``: a warning with the line number and the reason."""
    logger.warning("skipped %s", error)


# -- score -------------------------------------------------------------------------------------


async def score_jsonl(
    lines_in: Iterable[Line],
    out: LineSink,
    scorer: Scorer,
    *,
    progress: bool,
    concurrency: int = DEFAULT_CONCURRENCY,
    total: int | None = None,
    on_error: ErrorSink = log_line_error,
) -> ScoreSummary:
    """Score every record of ``lines_in`` and write it, with its two scores, to ``out``.

    ``progress`` asks for a progress bar, drawn on stderr only when stderr is a terminal;
    ``total`` (records expected) gives it an end. Raises ``Closed`` if the scorer shuts
    down mid-run: then no later line could be scored either.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    tally = _Tally(on_error)
    with _progress_bar(progress, total) as bar:
        records = _parsed(_read(lines_in), tally, labelled=False)
        async for record, outcome in _in_order(records, _scoring(scorer), concurrency):
            if isinstance(outcome, LineError):
                tally.fail(outcome)
            else:
                out.write(_scored_line(record, outcome))
                tally.written += 1
            bar.update()
    return tally.summary()


def _scored_line(record: _Record, scores: RelevanceScores) -> str:
    fields = record.fields
    # A record that already had the fields keeps their place; others get them at the end.
    fields[CONTEXT_FIELD] = scores.context
    fields[ANSWER_FIELD] = scores.answer
    return orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE).decode()


# -- calibrate ---------------------------------------------------------------------------------


async def calibrate_from_jsonl(
    lines: Iterable[Line],
    scorer: Scorer,
    encoder: str,
    *,
    fitted_on: str = "user-labelled JSONL",
    concurrency: int = DEFAULT_CONCURRENCY,
    on_error: ErrorSink = log_line_error,
) -> Calibration:
    """Fit ``encoder``'s calibration on labelled records, scored as the sidecar scores them.

    The raw context score (mean top-k cosine, before any calibration the scorer applies)
    is fitted against each record's label. Bad lines are reported and skipped, and counted
    in the calibration's ``metrics["skipped_lines"]``. Raises ``CalibrationError`` when the
    records that remain cannot be fitted (one class only, for example).

    A calibration belongs to one encoder, so ``scorer`` must be one encoder's: a
    ``RoutingScorer`` (``ValueError``) would mix raw scores of two models by language;
    pass its ``scorers[name]`` instead.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    if isinstance(scorer, RoutingScorer):
        raise ValueError(
            "a calibration is fitted for one encoder; pass one of the routing scorer's "
            f"scorers ({', '.join(scorer.scorers)}), not the router"
        )
    tally = _Tally(on_error)
    digest = hashlib.sha256()
    raw: list[float] = []
    labels: list[int] = []
    records = _parsed(_read(lines, digest), tally, labelled=True)
    async for record, outcome in _in_order(records, _scoring(scorer), concurrency):
        if isinstance(outcome, LineError):
            tally.fail(outcome)
        elif outcome.context_raw is None or record.label is None:
            tally.fail(LineError(record.line, "no query or no non-blank context to score"))
        else:
            raw.append(outcome.context_raw)
            labels.append(record.label)
            tally.written += 1
    calibration = fit_calibration(
        np.array(raw, dtype=np.float64),
        np.array(labels, dtype=np.int64),
        encoder=encoder,
        fitted_on=fitted_on,
        data_sha256=digest.hexdigest(),
    )
    metrics = {**calibration.metrics, "skipped_lines": tally.errors}
    return dataclasses.replace(calibration, metrics=metrics)


# -- reading records ---------------------------------------------------------------------------


class _Tally:
    def __init__(self, on_error: ErrorSink) -> None:
        self.on_error = on_error
        self.records = 0
        self.written = 0
        self.errors = 0
        self.kept: list[LineError] = []

    def fail(self, error: LineError) -> None:
        self.errors += 1
        if len(self.kept) < KEPT_ERRORS:
            self.kept.append(error)
        self.on_error(error)

    def summary(self) -> ScoreSummary:
        return ScoreSummary(self.records, self.written, self.errors, tuple(self.kept))


async def _read(
    lines: Iterable[Line], digest: hashlib._Hash | None = None
) -> AsyncIterator[tuple[int, Line]]:
    """Non-blank lines with their 1-based numbers.

    Each line is read on a thread: stdin may be a pipe that blocks, and the batcher's
    worker must keep running meanwhile.
    """
    iterator = iter(lines)
    number = 0
    while True:
        line = await asyncio.to_thread(_next, iterator)
        if line is None:
            return
        number += 1
        if digest is not None:
            digest.update(line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line)
        if line.strip():
            yield number, line


def _next(iterator: Iterator[Line]) -> Line | None:
    return next(iterator, None)


async def _parsed(
    lines: AsyncIterator[tuple[int, Line]], tally: _Tally, *, labelled: bool
) -> AsyncIterator[_Record]:
    async for number, line in lines:
        tally.records += 1
        record = _parse(number, line, labelled=labelled)
        if isinstance(record, LineError):
            tally.fail(record)
        else:
            yield record


def _parse(number: int, line: Line, *, labelled: bool) -> _Record | LineError:
    try:
        fields = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        # The position only: orjson's message could quote the line.
        return LineError(number, f"not valid JSON (parser stopped at column {exc.colno})")
    if not isinstance(fields, dict):
        return LineError(number, f"a record must be a JSON object, not {json_type(fields)}")
    query = fields.get("query")
    if not isinstance(query, str):
        return LineError(number, _expected("query", "a string", query))
    context = _context(fields.get("context"))
    if isinstance(context, str):
        return LineError(number, context)
    answer = fields.get("answer")
    if answer is not None and not isinstance(answer, str):
        return LineError(number, _expected("answer", "a string or null", answer))
    label = _label(fields.get("label")) if labelled else None
    if labelled and label is None:
        return LineError(number, _expected("label", "0 or 1", fields.get("label")))
    return _Record(number, fields, query, context, None if labelled else answer, label)


def _context(value: object) -> tuple[str, ...] | str:
    """The record's chunks, or the reason they are not usable (a str)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list):
        return _expected("context", "an array of strings", value)
    for index, chunk in enumerate(value):
        if not isinstance(chunk, str):
            return _expected(f"context[{index}]", "a string", chunk)
    return tuple(value)


def _label(value: object) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value in (0, 1):
        return value
    return None


def _expected(key: str, wanted: str, value: object) -> str:
    found = "missing" if value is None else json_type(value)
    return f"'{key}' must be {wanted}, not {found}"


# -- scoring many records at once, in order ----------------------------------------------------


def _scoring(
    scorer: Scorer,
) -> Callable[[_Record], Awaitable[RelevanceScores | LineError]]:
    async def score(record: _Record) -> RelevanceScores | LineError:
        return await _score_one(scorer, record)

    return score


async def _score_one(scorer: Scorer, record: _Record) -> RelevanceScores | LineError:
    """The record's scores, or why it has none; shed and retryable failures are retried.

    Offline nothing needs shedding: a record the queue cannot take now waits for room.
    """
    wait_s, longest_s = _OVERLOAD_WAIT_S
    failures = 0
    while True:
        try:
            return await scorer.score(record.query, record.context, record.answer)
        except Overloaded as exc:
            if exc.requested > exc.queue_size:
                return LineError(
                    record.line,
                    f"the record has {exc.requested} texts to embed, more than the "
                    f"scorer's queue of {exc.queue_size}",
                )
            await asyncio.sleep(wait_s)
            wait_s = min(longest_s, wait_s * 2)
        except Closed:
            raise
        except BackendError as exc:
            failures += 1
            if not exc.retryable or failures >= RETRIES:
                return LineError(record.line, f"embedding failed: {exc}")
        except EmbeddingError as exc:
            return LineError(record.line, f"embedding failed: {exc}")


async def _in_order(
    items: AsyncIterator[T], work: Callable[[T], Awaitable[R]], concurrency: int
) -> AsyncIterator[tuple[T, R]]:
    """``(item, await work(item))`` in input order, with up to ``concurrency`` in flight."""
    window: deque[tuple[T, asyncio.Task[R]]] = deque()
    try:
        async for item in items:
            window.append((item, asyncio.ensure_future(work(item))))
            if len(window) >= concurrency:
                head, task = window.popleft()
                yield head, await task
        while window:
            head, task = window.popleft()
            yield head, await task
    finally:
        # An error or a cancelled run leaves no task behind.
        for _, task in window:
            task.cancel()
        await asyncio.gather(*(task for _, task in window), return_exceptions=True)


def _progress_bar(requested: bool, total: int | None) -> tqdm[Any]:
    stream = sys.stderr
    shown = requested and stream is not None and stream.isatty()
    return tqdm(total=total, unit="record", file=stream, disable=not shown, dynamic_ncols=True)
