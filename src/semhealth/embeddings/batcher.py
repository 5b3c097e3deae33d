"""The micro-batcher: texts from many concurrent callers, embedded in few backend calls.

Every caller's texts go into one bounded queue. A worker takes up to ``max_batch`` texts: at
once those that queued while it was busy, or, when it was idle, the first to arrive and any
that join it within ``flush_timeout_s``. It sorts them by estimated length (so short texts
are not padded to long ones) and splits them into backend calls of at most
``max_batch_tokens`` padded tokens. Each caller awaits its own futures, one per text.

- A call whose new texts do not all fit in the queue raises ``Overloaded`` at once and queues
  nothing: it never blocks, and the caller counts the work as shed.
- The cache answers texts seen before; a text already queued by another caller is shared,
  not queued twice, so a system prompt sent by fifty streams reaches the model once.
- A failed batch fails only its own texts' callers, with a ``BackendError``. A worker that
  dies fails every waiting caller and every later call, and is reported.
- A text every caller stopped waiting for (its deadline passed, or it cancelled) is dropped
  when it reaches the front, before the backend sees it, and counted as expired.
- Each successful batch updates a running estimate of what a batch costs (seconds for n
  texts, exponentially weighted over recent batches), so an owner can tell before queueing
  whether a call could finish within its deadline (``expected_wait_s``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from semhealth.common.text import estimate_tokens as _estimate
from semhealth.common.text import utf8_safe
from semhealth.embeddings.backend import Backend, Vectors
from semhealth.embeddings.cache import Cache, CacheStats, Vector
from semhealth.embeddings.config import DEFAULT_CACHE_ENTRIES, Batching
from semhealth.embeddings.errors import BackendError, Closed, EmbeddingError, Overloaded

# Weight of the newest batch in the batch-cost estimate: about the last five batches count,
# so the estimate follows a change of load (batch sizes) within a second or two.
THROUGHPUT_WEIGHT = 0.3


def estimate_tokens(text: str) -> int:
    """A text's cost in a batch: the shared estimate (``semhealth.common.text``), at least one
    token, since even an empty text takes a row."""
    return max(1, _estimate((text,)))


@dataclass(frozen=True, slots=True)
class BatcherStats:
    waiting: int  # texts in the queue now
    in_flight: int  # distinct texts queued or being embedded now
    batches: int  # backend calls that succeeded
    embedded: int  # texts those calls embedded
    failed_batches: int  # backend calls that failed
    shed_calls: int  # calls refused with Overloaded
    shed_texts: int  # texts those calls asked for
    expired_texts: int  # texts dropped before embedding: every caller had stopped waiting
    texts_per_s: float | None  # the throughput estimate; None before the first batch
    cache: CacheStats


@dataclass(slots=True)
class _Item:
    """One distinct text waiting for the backend, and every caller waiting for it."""

    key: bytes
    text: str
    tokens: int
    waiters: list[asyncio.Future[Vector]]

    def wanted(self) -> bool:
        return any(not waiter.done() for waiter in self.waiters)


@dataclass(slots=True)
class _Counters:
    batches: int = 0
    embedded: int = 0
    failed_batches: int = 0
    shed_calls: int = 0
    shed_texts: int = 0
    expired_texts: int = 0


@dataclass(slots=True)
class BatchCost:
    """What a batch of n texts costs the backend: a + b*n seconds, fitted to recent batches.

    An exponentially weighted least-squares line over (texts, seconds). A model on a
    busy CPU has a large fixed cost per call (a + b*n with a large a), so a rate of
    texts per second measured on small batches would call a full batch many times
    slower than it is, and admission would shrink batches further. When recent batches
    were all one size, the cost is taken as proportional to n.
    """

    weight: float = THROUGHPUT_WEIGHT
    batches: int = 0
    n: float = 0.0  # weighted means of texts, seconds, texts^2 and texts*seconds
    t: float = 0.0
    nn: float = 0.0
    nt: float = 0.0

    def observe(self, texts: int, seconds: float) -> None:
        w = 1.0 if self.batches == 0 else self.weight
        self.n += w * (texts - self.n)
        self.t += w * (seconds - self.t)
        self.nn += w * (texts * texts - self.nn)
        self.nt += w * (texts * seconds - self.nt)
        self.batches += 1

    def seconds_for(self, texts: int) -> float | None:
        """Seconds a batch of ``texts`` texts should take; None before the first batch."""
        if self.batches == 0 or self.n <= 0.0:
            return None
        variance = self.nn - self.n * self.n
        if variance <= 1e-6 * self.n * self.n:
            return self.t * texts / self.n
        slope = max(0.0, (self.nt - self.n * self.t) / variance)
        fixed = max(0.0, self.t - slope * self.n)
        return fixed + slope * texts


@dataclass(slots=True)
class _Shared:
    """What the batcher and its workers share; tasks hold this, never the batcher."""

    queue: asyncio.Queue[_Item]
    pending: dict[bytes, _Item] = field(default_factory=dict)  # queued or being embedded
    counters: _Counters = field(default_factory=_Counters)
    cost: BatchCost = field(default_factory=BatchCost)
    encoding: int = 0  # texts in the backend now
    failure: BaseException | None = None


class MicroBatcher:
    """Batches ``embed`` calls from many callers onto one backend.

    The owner builds the backend, hands it in, and closes it after ``shutdown``; the batcher
    never closes what it did not open. ``cache`` may be shared by several batchers (its keys
    carry the encoder's name); without one, the batcher keeps its own.
    ``on_task_failure`` hears of a worker that died (the agent logs, counts, marks health).
    """

    def __init__(
        self,
        backend: Backend,
        config: Batching | None = None,
        *,
        cache: Cache | None = None,
        on_task_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.config = config or Batching()
        issues = self.config.validate()
        if issues:
            raise ValueError("; ".join(str(issue) for issue in issues))
        self.backend = backend
        self.cache = cache if cache is not None else Cache(DEFAULT_CACHE_ENTRIES)
        self._on_task_failure = on_task_failure
        self._shared = _Shared(queue=asyncio.Queue(maxsize=self.config.queue_size))
        self._tasks: list[asyncio.Task[None]] = []
        self._state = "new"  # new -> running -> closed

    async def start(self) -> None:
        """Launch the workers; returns at once. Starting twice is a no-op."""
        if self._state == "running":
            return
        if self._state == "closed":
            raise Closed("this batcher was shut down; build a new one")
        loop = asyncio.get_running_loop()
        report = partial(_worker_done, self._shared, self._on_task_failure)
        for index in range(self.config.workers):
            task = loop.create_task(
                _work(self._shared, self.backend, self.config, self.cache),
                name=f"semhealth-embed-{self.backend.name}-{index}",
            )
            task.add_done_callback(report)
            self._tasks.append(task)
        self._state = "running"

    async def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop taking texts, let queued ones finish for up to ``timeout_s``, then stop.

        Callers still waiting after that get ``Closed``. Safe without ``start`` and twice.
        """
        if self._state == "closed":
            return
        was_running = self._state == "running"
        self._state = "closed"
        shared = self._shared
        waiting = [w for item in shared.pending.values() for w in item.waiters if not w.done()]
        if was_running and waiting and timeout_s > 0:
            await asyncio.wait(waiting, timeout=timeout_s)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        _fail_all(shared, Closed("the batcher shut down before these texts were embedded"))

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Vectors for ``texts``, in order: from the cache, or from the backend in a batch.

        Raises ``Overloaded`` when the queue cannot take the call's new texts (nothing is
        queued then), ``Closed`` when the batcher is not running, and ``BackendError`` when
        the batch holding one of the texts failed.
        """
        shared = self._shared
        if self._state != "running":
            raise Closed("the batcher is not running")
        if shared.failure is not None:
            raise BackendError("the batcher's worker failed", retryable=False) from shared.failure
        name = self.backend.name
        keys = [Cache.key(name, text) for text in texts]
        found, missing = self._look_up(keys, texts)
        waiting = self._enqueue(missing)
        rows: list[Vector] = []
        try:
            for key in keys:
                row = found.get(key)
                if row is None:
                    row = await waiting[key]
                    found[key] = row
                rows.append(row)
        except BaseException:
            # The caller gave up (its deadline, a cancel) or one text failed: none of its
            # texts is wanted by it any more. Its own futures are cancelled, not the texts
            # others wait for, so a text only this caller wanted is never embedded.
            for future in waiting.values():
                future.cancel()
            raise
        if not rows:
            return np.empty((0, self.backend.dim), dtype=np.float32)
        return np.stack(rows).astype(np.float32, copy=False)

    def stats(self) -> BatcherStats:
        shared = self._shared
        counters = shared.counters
        return BatcherStats(
            waiting=shared.queue.qsize(),
            in_flight=len(shared.pending),
            batches=counters.batches,
            embedded=counters.embedded,
            failed_batches=counters.failed_batches,
            shed_calls=counters.shed_calls,
            shed_texts=counters.shed_texts,
            expired_texts=counters.expired_texts,
            texts_per_s=self._texts_per_s(),
            cache=self.cache.stats(),
        )

    def expected_wait_s(self, texts: int) -> float | None:
        """Seconds until ``texts`` more texts queued now would be embedded, at the recent
        throughput; None before the first batch, and while nothing is queued or embedded.

        Every text queued or being embedded counts as ahead, cached or shared ones of the
        new call too, and the call waits for whole batches (its texts are answered when
        their batch ends): the estimate errs long, never short. An idle batcher gives none,
        so its owner admits the call: only batches that run update the estimate, and one
        that turned too slow (a cold first batch) must not refuse every call ever after.
        """
        shared, batch = self._shared, self.config.max_batch
        cost = shared.cost.seconds_for
        ahead = len(shared.pending)
        if shared.cost.batches == 0 or ahead == 0:
            return None
        # The batch in the model now (counted whole), then the queue and the call's own
        # texts in batches of max_batch, the last one partial.
        queued = ahead - shared.encoding + texts
        full, rest = divmod(queued, batch)
        seconds = (
            (cost(shared.encoding) or 0.0 if shared.encoding else 0.0)
            + full * (cost(batch) or 0.0)
            + (cost(rest) or 0.0 if rest else 0.0)
        )
        # Workers embed side by side, each a batch at a time.
        return seconds / self.config.workers

    def _texts_per_s(self) -> float | None:
        """Texts per second at full batches, all workers together."""
        batch = self.config.max_batch
        full = self._shared.cost.seconds_for(batch)
        if full is None or full <= 0.0:
            return None
        return batch * self.config.workers / full

    def _look_up(
        self, keys: list[bytes], texts: Sequence[str]
    ) -> tuple[dict[bytes, Vector], dict[bytes, str]]:
        """Split a call's distinct texts into cached rows and the texts still to embed."""
        found: dict[bytes, Vector] = {}
        missing: dict[bytes, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key in found or key in missing:
                continue
            row = self.cache.get(key)
            if row is None:
                missing[key] = text
            else:
                found[key] = row
        return found, missing

    def _enqueue(self, missing: dict[bytes, str]) -> dict[bytes, asyncio.Future[Vector]]:
        """A future per missing text: joined to a text already pending, or newly queued.

        All of the call's new texts are queued, or none of them (``Overloaded``).
        """
        shared = self._shared
        new = [key for key in missing if key not in shared.pending]
        free = shared.queue.maxsize - shared.queue.qsize()
        if len(new) > free:
            shared.counters.shed_calls += 1
            shared.counters.shed_texts += len(new)
            raise Overloaded(requested=len(new), free=free, queue_size=shared.queue.maxsize)
        loop = asyncio.get_running_loop()
        futures: dict[bytes, asyncio.Future[Vector]] = {}
        for key, text in missing.items():
            future: asyncio.Future[Vector] = loop.create_future()
            future.add_done_callback(_retrieve)
            futures[key] = future
            item = shared.pending.get(key)
            if item is None:
                item = _Item(key, utf8_safe(text), estimate_tokens(text), [])
                shared.pending[key] = item
                shared.queue.put_nowait(item)
            item.waiters.append(future)
        return futures


# -- the worker: module functions over _Shared, so tasks never hold the batcher ------------


async def _work(shared: _Shared, backend: Backend, config: Batching, cache: Cache) -> None:
    loop = asyncio.get_running_loop()
    while True:
        # A busy worker's cycle, collecting included, is what a queued text waits for; an
        # idle one's wait for the first text is not.
        busy = not shared.queue.empty()
        began = time.perf_counter()
        window = await _collect(shared.queue, config, loop)
        if not busy:
            began = time.perf_counter()
        for batch in _split(window, config.max_batch_tokens):
            began = await _run_batch(shared, backend, cache, batch, began)
        # Callers just answered run now and send their next texts before the next window.
        await asyncio.sleep(0)


async def _collect(
    queue: asyncio.Queue[_Item], config: Batching, loop: asyncio.AbstractEventLoop
) -> list[_Item]:
    """Up to ``max_batch`` items: those waiting, else the next one and its companions.

    Texts already waiting have waited out a backend call, and the batch they make is as
    large as waiting will make it, so they go at once. When the worker was idle, it waits
    at most ``flush_timeout_s`` after the first text for others to join it.
    """
    if not queue.empty():
        return _drain(queue, [], config.max_batch)
    window = _drain(queue, [await queue.get()], config.max_batch)
    deadline = loop.time() + config.flush_timeout_s
    while len(window) < config.max_batch:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            async with asyncio.timeout(remaining):
                window.append(await queue.get())
        except TimeoutError:
            break
        _drain(queue, window, config.max_batch)
    return window


def _drain(queue: asyncio.Queue[_Item], window: list[_Item], limit: int) -> list[_Item]:
    while len(window) < limit and not queue.empty():
        window.append(queue.get_nowait())
    return window


def _split(items: Iterable[_Item], max_tokens: int) -> list[list[_Item]]:
    """Sort by estimated length and cut where texts x longest would pass ``max_tokens``.

    A text longer than the budget alone still forms a batch of one.
    """
    batches: list[list[_Item]] = []
    current: list[_Item] = []
    for item in sorted(items, key=lambda entry: entry.tokens):
        # Sorted ascending, so the newcomer is the longest: it sets the padded length.
        if current and (len(current) + 1) * item.tokens > max_tokens:
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    return batches


async def _run_batch(
    shared: _Shared, backend: Backend, cache: Cache, batch: list[_Item], began: float
) -> float:
    """Embed ``batch``'s wanted texts and settle their callers; returns when it ended.

    ``began``: when the worker started on it (the end of its previous batch, if busy).
    """
    # Texts every caller gave up on are not embedded at all.
    live = [item for item in batch if item.wanted()]
    for item in batch:
        if not item.wanted() and shared.pending.get(item.key) is item:
            del shared.pending[item.key]
    shared.counters.expired_texts += len(batch) - len(live)
    if not live:
        return began
    shared.encoding += len(live)
    try:
        vectors = await backend.embed([item.text for item in live])
        _check_shape(vectors, len(live), backend.dim)
    except Exception as exc:
        shared.encoding -= len(live)
        shared.counters.failed_batches += 1
        _settle(shared, live, _as_embedding_error(exc, backend.name, len(live)))
        return time.perf_counter()
    shared.encoding -= len(live)
    ended = time.perf_counter()
    shared.cost.observe(len(live), ended - began)
    shared.counters.batches += 1
    shared.counters.embedded += len(live)
    for item, row in zip(live, vectors, strict=True):
        cache.put(item.key, row)
    _settle(shared, live, vectors)
    return ended


def _settle(shared: _Shared, items: list[_Item], outcome: Vectors | BaseException) -> None:
    for index, item in enumerate(items):
        if shared.pending.get(item.key) is item:
            del shared.pending[item.key]
        for waiter in item.waiters:
            if waiter.done():
                continue
            if isinstance(outcome, BaseException):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome[index])


def _check_shape(vectors: Vectors, count: int, dim: int) -> None:
    shape = getattr(vectors, "shape", None)
    if shape != (count, dim):
        raise BackendError(
            f"the backend returned shape {shape} for {count} texts of width {dim}",
            retryable=False,
        )


def _as_embedding_error(exc: Exception, backend: str, count: int) -> EmbeddingError:
    if isinstance(exc, EmbeddingError):
        return exc
    error = BackendError(
        f"backend '{backend}' failed a batch of {count} texts: {type(exc).__name__}",
        retryable=False,
    )
    error.__cause__ = exc
    return error


def _worker_done(
    shared: _Shared,
    on_failure: Callable[[BaseException], None] | None,
    task: asyncio.Task[None],
) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is None:
        return
    # Workers loop forever; one that ended with an error must not leave callers hanging.
    shared.failure = exc
    error = BackendError(f"the batcher's worker failed: {type(exc).__name__}", retryable=False)
    error.__cause__ = exc
    _fail_all(shared, error)
    if on_failure is not None:
        on_failure(exc)


def _fail_all(shared: _Shared, error: EmbeddingError) -> None:
    # Every queued or running item is in pending; the queue only orders them.
    for item in shared.pending.values():
        for waiter in item.waiters:
            if not waiter.done():
                waiter.set_exception(error)
    shared.pending.clear()
    while not shared.queue.empty():
        shared.queue.get_nowait()


def _retrieve(future: asyncio.Future[Vector]) -> None:
    # A caller that stopped waiting never reads its future's error; reading it here keeps
    # asyncio from logging "exception was never retrieved".
    if not future.cancelled():
        future.exception()
