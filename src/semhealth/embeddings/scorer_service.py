"""The shared scorer: one process embeds for a fleet of sidecars over gRPC.

``semhealth scorer`` serves ``semhealth.scorer.v1.Scorer`` (``Embed``, ``Info``; the wire
format is ``_wire``'s, no protoc) and the standard ``grpc.health.v1.Health`` service.

- Every RPC for an encoder goes through that encoder's one ``MicroBatcher``, so texts from
  concurrent sidecars share backend calls (and the cache).
- Health is NOT_SERVING until every encoder's model is loaded, then SERVING, and
  NOT_SERVING again from the start of shutdown.
- The client's deadline bounds the batcher call: when it passes, or the client cancels,
  the call is cancelled (texts other callers wait for are kept, the batcher shields them).
- Admission by expected wait: a call that could not be answered within its deadline, at
  the encoder's recent throughput with every queued text ahead of it, is answered
  RESOURCE_EXHAUSTED at once (reason ``expected_wait``), as is one whose texts do not fit in
  the queue (``queue_full``); trailing metadata carry the reason, the queue's figures and
  the expected wait, so clients shed instead of retrying. Texts whose callers' deadlines
  passed while queued are dropped before the model sees them. Shedding is logged at most
  once per ``overload_log_interval_s``, with counts only.
- A retryable backend failure answers UNAVAILABLE, a permanent one INTERNAL. Details carry
  counts and reasons, never texts.
- The port can be locked (``scorer_guard``): TLS or mutual TLS, a bearer token
  (UNAUTHENTICATED without it), and limits per call and per caller (RESOURCE_EXHAUSTED).
- Each encoder keeps its own counters; ``self.metrics`` exports them, its queue and the
  batch and latency histograms (``scorer_metrics``) for ``semhealth scorer --metrics-listen``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn

import grpc  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from semhealth.embeddings import _wire
from semhealth.embeddings.backend import Backend, Vectors
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.cache import Cache
from semhealth.embeddings.config import DEFAULT_CACHE_ENTRIES, Batching
from semhealth.embeddings.errors import (
    BackendError,
    Closed,
    EmbeddingError,
    ModelLoadError,
    Overloaded,
)
from semhealth.embeddings.scorer_guard import RATE_LIMITED, ScorerGuard, caller_of
from semhealth.embeddings.scorer_metrics import (
    NO_ENCODER,
    OK,
    EncoderStats,
    MeteredBackend,
    Queue,
    ScorerMetrics,
)

DEFAULT_SHUTDOWN_S = 5.0
DEFAULT_OVERLOAD_LOG_INTERVAL_S = 10.0
# Why a call was shed as overload (the rejected counter's label and the metadata's reason).
EXPECTED_WAIT = "expected_wait"  # it could not be answered before its deadline
QUEUE_FULL = "queue_full"  # its texts did not fit in the queue
EXPIRED = "expired"  # its deadline passed, or its client cancelled, while it waited
# A call is admitted when its expected wait fits in this share of the time its deadline
# leaves: the estimate trails a model whose speed moves (a shared machine, a GPU that
# throttles), and a call admitted to miss its deadline wastes the model's time twice.
ADMIT_SHARE = 0.75
log = logging.getLogger("semhealth.scorer")
_HEALTH_NAMES = ("", _wire.SERVICE)  # the whole server, and the scorer service by name


@dataclass(frozen=True, slots=True)
class ServedEncoder:
    """An encoder the scorer loads and owns.

    ``load`` builds the backend (a ``LocalBackend`` loads its model: seconds, blocking), so
    it runs in a thread after the server is up; the scorer closes the backend at shutdown.
    """

    load: Callable[[], Backend]
    batching: Batching = field(default_factory=Batching)


# A running batcher its owner started and will close, or an encoder for the scorer to load.
Source = MicroBatcher | ServedEncoder


@dataclass(frozen=True, slots=True)
class ScorerStats:
    rpcs: int  # Embed calls received
    texts: int  # texts those calls had embedded
    overloaded: int  # calls shed as overload (RESOURCE_EXHAUSTED), for every reason
    expired: int  # calls whose deadline passed or whose client cancelled
    failed: int  # calls a backend failure answered
    rejected: Mapping[str, int] = field(default_factory=dict)  # overloaded, by reason
    refused: Mapping[str, int] = field(default_factory=dict)  # by the guard, by reason
    expired_texts: int = 0  # texts dropped before encoding: every caller had gone


@dataclass(slots=True)
class _Counters:
    rpcs: int = 0
    texts: int = 0
    overloaded: int = 0
    overloaded_texts: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # overloaded calls, by reason
    expired: int = 0
    failed: int = 0
    # Every Embed call that ended with a non-OK status, by the status's name: the
    # fields above say why in the scorer's terms, this says what the client heard.
    codes: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Served:
    source: Source
    batcher: MicroBatcher | None = None  # set once loaded and started: then RPCs may use it
    info: _wire.Info | None = None
    built: MicroBatcher | None = None  # built here from a ServedEncoder, so shut down here
    counters: _Counters = field(default_factory=_Counters)
    worker_failed: bool = False  # its batcher's worker died: it no longer serves


@dataclass(slots=True)
class _ShedLog:
    """Shed calls since the last line: one log line per interval at most, counts only."""

    interval_s: float
    last: float = field(default_factory=time.monotonic)
    calls: dict[str, int] = field(default_factory=dict)
    texts: int = 0

    def note(self, reason: str, texts: int) -> None:
        self.calls[reason] = self.calls.get(reason, 0) + 1
        self.texts += texts
        now = time.monotonic()
        if now - self.last < self.interval_s:
            return
        reasons = ", ".join(f"{count} {name}" for name, count in sorted(self.calls.items()))
        log.warning(
            "overloaded: shed %d calls (%d texts) in the last %.0f s (%s)",
            sum(self.calls.values()),
            self.texts,
            now - self.last,
            reasons,
        )
        self.last, self.calls, self.texts = now, {}, 0


@dataclass(slots=True)
class _State:
    """What the handlers and the loading task share; they hold this, never the server."""

    encoders: dict[str, _Served]
    guard: ScorerGuard
    shed_log: _ShedLog
    cache: Cache
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # health updates in flight
    load_error: EmbeddingError | None = None
    metrics: ScorerMetrics = field(default_factory=ScorerMetrics)
    # Embed calls that named no encoder served here, or could not be read.
    unmatched: _Counters = field(default_factory=_Counters)


class ScorerServer:
    """A ``grpc.aio`` server for the scorer and health services, on ``host:port``.

    ``encoders`` maps the name clients ask for to its source. ``port`` 0 picks a free port;
    ``self.port`` is the bound one after ``start``. ``on_task_failure`` hears of a model
    that failed to load or a batcher worker that died (the agent logs, counts, marks health).
    ``credentials`` (``ScorerTls(...).credentials()``) serve TLS instead of plain text;
    ``guard`` checks tokens and limits (default: no token, the default size limits).
    ``cache_entries`` bounds the vectors kept for the encoders built here, all together.
    """

    def __init__(
        self,
        encoders: Mapping[str, Source],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_message_bytes: int = _wire.MAX_MESSAGE_BYTES,
        on_task_failure: Callable[[BaseException], None] | None = None,
        credentials: Any = None,
        guard: ScorerGuard | None = None,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        overload_log_interval_s: float = DEFAULT_OVERLOAD_LOG_INTERVAL_S,
    ) -> None:
        if not encoders:
            raise ValueError("the scorer needs at least one encoder to serve")
        self.host = host
        self.port = port
        self._max_message_bytes = max_message_bytes
        self._on_task_failure = on_task_failure
        self._credentials = credentials
        self._state = _State(
            {name: _Served(source) for name, source in encoders.items()},
            guard=guard or ScorerGuard(),
            shed_log=_ShedLog(overload_log_interval_s),
            cache=Cache(cache_entries),
        )
        self.metrics = self._state.metrics
        self.metrics.read_stats(self.encoder_stats, self.refused)
        self._server: Any = None
        self._health: Any = None
        self._load_task: asyncio.Task[None] | None = None
        self._lifecycle = "new"  # new -> running -> closed

    async def start(self) -> None:
        """Bind and serve at once (NOT_SERVING), then load the models in the background.

        Raises ``OSError`` when the address cannot be bound, having stopped what it started.
        """
        if self._lifecycle == "running":
            return
        if self._lifecycle == "closed":
            raise Closed("this scorer was shut down; build a new one")
        servicer = health.aio.HealthServicer()
        await _set_health(servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", self._max_message_bytes),
                ("grpc.max_receive_message_length", self._max_message_bytes),
                # Two scorers must never share a port silently.
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers((_scorer_handler(self._state),))
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        self.port = await _bind_and_start(server, self.host, self.port, self._credentials)
        self._server, self._health = server, servicer
        self._load_task = asyncio.get_running_loop().create_task(
            _load_all(self._state, servicer, self._on_task_failure), name="semhealth-scorer-load"
        )
        self._lifecycle = "running"

    async def wait_ready(self) -> None:
        """Return once every encoder is loaded and serving; raise ``ModelLoadError`` if one
        failed to load (at start-up, so the process can stop with the reason)."""
        if self._lifecycle != "running":
            raise Closed("the scorer is not running")
        await self._state.loaded.wait()
        if self._state.load_error is not None:
            raise self._state.load_error

    async def shutdown(self, timeout_s: float = DEFAULT_SHUTDOWN_S) -> None:
        """Report NOT_SERVING, stop taking RPCs, let running ones finish within ``timeout_s``,
        then shut down the batchers and backends the scorer built. Safe without ``start``
        and twice; failures of the parts are raised together at the end."""
        if self._lifecycle == "closed":
            return
        self._lifecycle = "closed"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        tasks = [*self._state.tasks, *([self._load_task] if self._load_task else [])]
        for task in tasks:
            # A model still loading in its thread finishes there and is dropped unused.
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(max(0.0, deadline - loop.time()))
        errors = await _close_owned(self._state, lambda: max(0.0, deadline - loop.time()))
        self._server = self._health = self._load_task = None
        if errors:
            raise ExceptionGroup("the scorer did not shut down cleanly", errors)

    def stats(self) -> ScorerStats:
        """The whole scorer's counts: every encoder's, and calls that named none."""
        state = self._state
        every = [*(served.counters for served in state.encoders.values()), state.unmatched]
        rejected: dict[str, int] = {}
        for counters in every:
            for reason, count in counters.rejected.items():
                rejected[reason] = rejected.get(reason, 0) + count
        batchers = [s.batcher for s in state.encoders.values() if s.batcher is not None]
        return ScorerStats(
            rpcs=sum(counters.rpcs for counters in every),
            texts=sum(counters.texts for counters in every),
            overloaded=sum(counters.overloaded for counters in every),
            expired=sum(counters.expired for counters in every),
            failed=sum(counters.failed for counters in every),
            rejected=rejected,
            refused=dict(state.guard.refused),
            expired_texts=sum(batcher.stats().expired_texts for batcher in batchers),
        )

    def encoder_stats(self) -> list[EncoderStats]:
        """Each served encoder's counts and queue now; calls that named none come last,
        as ``NO_ENCODER``. What ``self.metrics`` exports at every scrape."""
        state = self._state
        rows = [_encoder_stats(name, served, state) for name, served in state.encoders.items()]
        unmatched = state.unmatched
        rows.append(EncoderStats(NO_ENCODER, unmatched.rpcs, 0, 0, dict(unmatched.codes), None))
        return rows

    def refused(self) -> dict[str, int]:
        """Calls the guard refused before they reached an encoder, by reason."""
        return dict(self._state.guard.refused)


def _encoder_stats(name: str, served: _Served, state: _State) -> EncoderStats:
    counters, batcher = served.counters, served.batcher
    stats = batcher.stats() if batcher is not None else None
    up = batcher is not None and state.load_error is None and not served.worker_failed
    return EncoderStats(
        encoder=name,
        requests=counters.rpcs,
        texts=counters.texts,
        overloaded_texts=counters.overloaded_texts,
        failed=dict(counters.codes),
        queue=Queue(
            up=up,
            queued=stats.waiting if stats else 0,
            queue_size=batcher.config.queue_size if batcher is not None else 0,
            expired_texts=stats.expired_texts if stats else 0,
            texts_per_s=stats.texts_per_s if stats else None,
        ),
        rejected=dict(counters.rejected),
    )


async def serve_scorer(
    encoders: Mapping[str, Source],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_message_bytes: int = _wire.MAX_MESSAGE_BYTES,
    on_task_failure: Callable[[BaseException], None] | None = None,
    credentials: Any = None,
    guard: ScorerGuard | None = None,
    cache_entries: int = DEFAULT_CACHE_ENTRIES,
    overload_log_interval_s: float = DEFAULT_OVERLOAD_LOG_INTERVAL_S,
) -> ScorerServer:
    """Build and start a scorer; ``await server.wait_ready()`` to wait for the models."""
    server = ScorerServer(
        encoders,
        host=host,
        port=port,
        max_message_bytes=max_message_bytes,
        on_task_failure=on_task_failure,
        credentials=credentials,
        guard=guard,
        cache_entries=cache_entries,
        overload_log_interval_s=overload_log_interval_s,
    )
    await server.start()
    return server


# -- start and stop --------------------------------------------------------------------------


async def _bind_and_start(server: Any, host: str, port: int, credentials: Any) -> int:
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
        if not bound:
            raise OSError(f"could not bind the scorer to {address}")
        await server.start()
    except Exception as exc:
        await server.stop(None)
        if isinstance(exc, OSError):
            raise
        raise OSError(f"could not bind the scorer to {address}: {exc}") from exc
    return int(bound)


async def _load_all(
    state: _State, servicer: Any, on_failure: Callable[[BaseException], None] | None
) -> None:
    try:
        for name, served in state.encoders.items():
            report = _worker_failure_reporter(state, servicer, on_failure, served)
            await _load_one(name, served, report, state.metrics, state.cache)
    except Exception as exc:
        state.load_error = _as_load_error(exc)
        if on_failure is not None:
            on_failure(exc)
    else:
        await _set_health(servicer, health_pb2.HealthCheckResponse.SERVING)
    finally:
        state.loaded.set()


def _worker_failure_reporter(
    state: _State,
    servicer: Any,
    on_failure: Callable[[BaseException], None] | None,
    served: _Served,
) -> Callable[[BaseException], None]:
    """Hears of a dead worker in a batcher built here: the scorer no longer serves."""

    def report(exc: BaseException) -> None:
        served.worker_failed = True
        if on_failure is not None:
            on_failure(exc)
        # Called from a task's done-callback, on the loop; the health update is async, and
        # the state keeps its task so it is not collected half-way.
        task = asyncio.get_running_loop().create_task(
            _set_health(servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        state.tasks.add(task)
        task.add_done_callback(state.tasks.discard)

    return report


async def _set_health(servicer: Any, status: Any) -> None:
    for name in _HEALTH_NAMES:
        await servicer.set(name, status)


async def _load_one(
    name: str,
    served: _Served,
    on_failure: Callable[[BaseException], None] | None,
    metrics: ScorerMetrics,
    cache: Cache,
) -> None:
    source = served.source
    if isinstance(source, MicroBatcher):
        # A running batcher its owner built: its model calls are the owner's to measure.
        batcher = source
    else:
        loaded = await asyncio.to_thread(source.load)
        metered = MeteredBackend(loaded, partial(metrics.observe_batch, name))
        try:
            batcher = MicroBatcher(
                metered, source.batching, cache=cache, on_task_failure=on_failure
            )
        except ValueError:
            await metered.aclose()
            raise
        served.built = batcher
        await batcher.start()
    backend = batcher.backend
    device = getattr(backend, "device", None)
    served.info = _wire.Info(
        name, backend.name, backend.dim, device if isinstance(device, str) else "unknown"
    )
    served.batcher = batcher


def _as_load_error(exc: Exception) -> EmbeddingError:
    if isinstance(exc, EmbeddingError):
        return exc
    error = ModelLoadError(f"an encoder failed to load: {type(exc).__name__}")
    error.__cause__ = exc
    return error


async def _close_owned(state: _State, remaining: Callable[[], float]) -> list[Exception]:
    errors: list[Exception] = []
    for served in state.encoders.values():
        batcher = served.built
        if batcher is None:
            continue
        try:
            await batcher.shutdown(remaining())
            await batcher.backend.aclose()
        except Exception as exc:
            errors.append(exc)
    return errors


# -- the RPCs --------------------------------------------------------------------------------


def _scorer_handler(state: _State) -> Any:
    async def embed(request: _wire.EmbedRequest | _wire.Malformed, context: Any) -> Vectors:
        return await _embed(state, request, context)

    async def info(request: _wire.InfoRequest | _wire.Malformed, context: Any) -> _wire.Info:
        return await _info(state, request, context)

    return grpc.method_handlers_generic_handler(
        _wire.SERVICE,
        {
            _wire.EMBED: grpc.unary_unary_rpc_method_handler(
                embed,
                request_deserializer=_wire.decode_embed_request,
                response_serializer=_wire.encode_vectors,
            ),
            _wire.INFO: grpc.unary_unary_rpc_method_handler(
                info,
                request_deserializer=_wire.decode_info_request,
                response_serializer=_wire.encode_info,
            ),
        },
    )


@dataclass(slots=True)
class _Call:
    """One Embed call's outcome, for its latency histogram and its encoder's counters."""

    counters: _Counters
    encoder: str = NO_ENCODER
    code: str = OK


async def _embed(
    state: _State, request: _wire.EmbedRequest | _wire.Malformed, context: Any
) -> Vectors:
    call = _Call(state.unmatched)
    started = time.perf_counter()
    try:
        return await _embed_counted(state, request, context, call)
    except asyncio.CancelledError:
        # The client cancelled (or the server stopped): it hears no status from us.
        call.counters.expired += 1
        _count_failure(call, "CANCELLED")
        raise
    finally:
        state.metrics.observe_embed(call.encoder, call.code, time.perf_counter() - started)


async def _embed_counted(
    state: _State, request: _wire.EmbedRequest | _wire.Malformed, context: Any, call: _Call
) -> Vectors:
    caller = await _authenticated(state, context, call)
    if isinstance(request, _wire.Malformed):
        call.counters.rpcs += 1
        await _refuse(context, call, *_malformed(request, "Embed"))
    found = _served(state, request.encoder)
    if isinstance(found, _Served):
        call.counters, call.encoder = found.counters, request.encoder
    call.counters.rpcs += 1
    if not isinstance(found, _Served):
        await _refuse(context, call, *found)
    batcher = found.batcher
    assert batcher is not None  # _served refuses unless loaded
    counters, count = call.counters, len(request.texts)
    await _within_limits(state, context, call, caller, request)
    # None when the client set no deadline: then only its cancelling ends the wait.
    remaining = context.time_remaining()
    await _admit_by_wait(state, context, call, batcher, count, remaining)
    try:
        async with asyncio.timeout(remaining):
            vectors = await batcher.embed(request.texts)
    except TimeoutError:
        counters.expired += 1
        state.shed_log.note(EXPIRED, count)
        await _refuse(
            context,
            call,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the deadline passed before {count} texts",
        )
    except Overloaded as exc:
        figures = _wire.Overload(QUEUE_FULL, exc.requested, exc.free, exc.queue_size)
        await _shed(state, context, call, figures, str(exc))
    except Closed:
        await _refuse(context, call, grpc.StatusCode.UNAVAILABLE, "the scorer is shutting down")
    except BackendError as exc:
        counters.failed += 1
        code = grpc.StatusCode.UNAVAILABLE if exc.retryable else grpc.StatusCode.INTERNAL
        await _refuse(context, call, code, str(exc))
    except EmbeddingError as exc:
        counters.failed += 1
        await _refuse(context, call, grpc.StatusCode.INTERNAL, str(exc))
    counters.texts += count
    return vectors


async def _authenticated(state: _State, context: Any, call: _Call) -> str:
    """The caller's identity (a digest), or the call ends UNAUTHENTICATED, counted."""
    token = state.guard.authenticate(context.invocation_metadata())
    if token is None:
        call.counters.rpcs += 1
        # Never says what was presented, nor what was expected.
        await _refuse(
            context,
            call,
            grpc.StatusCode.UNAUTHENTICATED,
            "this scorer needs authorization: Bearer <token> metadata",
        )
    return caller_of(context, token)


async def _within_limits(
    state: _State, context: Any, call: _Call, caller: str, request: _wire.EmbedRequest
) -> None:
    """A call over the size limits, or from a caller over its rate, ends RESOURCE_EXHAUSTED.

    Too large a call has no overload mark: no shedding or retry fixes it, so the client
    takes it as a permanent error. A caller over its rate sheds, as for a busy scorer.
    """
    guard, count = state.guard, len(request.texts)
    too_large = guard.check_size(count, request.size)
    if too_large is not None:
        await _refuse(context, call, grpc.StatusCode.RESOURCE_EXHAUSTED, too_large)
    over_rate = guard.take(caller, count)
    if over_rate is not None:
        mark = _wire.overload_metadata(_wire.Overload(RATE_LIMITED, count, 0, 0))
        await _refuse(context, call, grpc.StatusCode.RESOURCE_EXHAUSTED, over_rate, mark)


async def _admit_by_wait(
    state: _State,
    context: Any,
    call: _Call,
    batcher: MicroBatcher,
    count: int,
    remaining: float | None,
) -> None:
    """Refuse at once a call that would still be queued when its deadline passes."""
    if remaining is None:
        return
    wait = batcher.expected_wait_s(count)
    if wait is None or wait <= ADMIT_SHARE * remaining:
        return
    queue_size = batcher.config.queue_size
    free = queue_size - batcher.stats().waiting
    figures = _wire.Overload(EXPECTED_WAIT, count, free, queue_size, wait)
    await _shed(
        state,
        context,
        call,
        figures,
        f"{count} texts would be answered in about {wait:.2f} s, too close to the "
        f"{remaining:.2f} s left to the deadline; the work is shed",
    )


async def _shed(
    state: _State, context: Any, call: _Call, figures: _wire.Overload, details: str
) -> NoReturn:
    """End a call as overload: RESOURCE_EXHAUSTED with the scorer's mark, counted by reason."""
    counters = call.counters
    counters.overloaded += 1
    counters.overloaded_texts += figures.requested
    counters.rejected[figures.reason] = counters.rejected.get(figures.reason, 0) + 1
    state.shed_log.note(figures.reason, figures.requested)
    await _refuse(
        context,
        call,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        details,
        _wire.overload_metadata(figures),
    )


async def _info(
    state: _State, request: _wire.InfoRequest | _wire.Malformed, context: Any
) -> _wire.Info:
    if state.guard.authenticate(context.invocation_metadata()) is None:
        await _abort(
            context,
            grpc.StatusCode.UNAUTHENTICATED,
            "this scorer needs authorization: Bearer <token> metadata",
        )
    if isinstance(request, _wire.Malformed):
        await _abort(context, *_malformed(request, "Info"))
    found = _served(state, request.encoder)
    if not isinstance(found, _Served):
        await _abort(context, *found)
    info = found.info
    assert info is not None  # _served refuses unless loaded
    return info


# A gRPC status code, its details and trailing metadata.
_Refusal = tuple[Any, str, tuple[tuple[str, str], ...]]


def _served(state: _State, encoder: str) -> _Served | _Refusal:
    """The loaded encoder a request names, or why there is none to use."""
    served = state.encoders.get(encoder)
    if served is None:
        names = ", ".join(sorted(state.encoders))
        # The requested name is not echoed: it came from a client.
        return (
            grpc.StatusCode.NOT_FOUND,
            f"no such encoder here; this scorer serves: {names}",
            _wire.served_metadata(state.encoders),
        )
    if state.load_error is not None:
        return grpc.StatusCode.FAILED_PRECONDITION, str(state.load_error), ()
    if served.batcher is None:
        return grpc.StatusCode.UNAVAILABLE, "the encoder's model is still loading", ()
    return served


def _malformed(malformed: _wire.Malformed, method: str) -> _Refusal:
    return (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"malformed {method} request of {malformed.size} bytes: {malformed.reason}",
        (),
    )


def _count_failure(call: _Call, code: str) -> None:
    call.code = code
    call.counters.codes[code] = call.counters.codes.get(code, 0) + 1


async def _refuse(
    context: Any,
    call: _Call,
    code: Any,
    details: str,
    metadata: tuple[tuple[str, str], ...] = (),
) -> NoReturn:
    """End an Embed call with ``code``, counted under the encoder it named."""
    _count_failure(call, code.name)
    await _abort(context, code, details, metadata)


async def _abort(
    context: Any, code: Any, details: str, metadata: tuple[tuple[str, str], ...] = ()
) -> NoReturn:
    """End the RPC with ``code``; grpc's ``abort`` raises, which the type checker cannot see."""
    await context.abort(code, details, metadata)
    raise AssertionError("grpc's abort returned")  # pragma: no cover
