"""Live shadowing: a sample of the sidecar's requests sent again to a candidate upstream,
and each candidate answer compared with the one the client got.

The shadow lives in the analysis plane, never in the forwarding relay. The tap tells it of
each exchange when the primary's stream opens (``on_open``: the primary request was sent
and its response head is back); a sampled exchange's request, copied by the relay when it
was small enough, is sent to the candidate from here, on this component's own connection
pool, timeouts and budget. The client never waits for, sees or pays for the shadow: in the
two-process layout this runs in the niced analysis process, in one process it is a task on
the loop beside the relay.

Which requests are shadowed:
- only ``methods`` (default ``POST``: an LLM API's POST reads a model and changes nothing,
  so sending it twice is safe; add others only for APIs where that holds);
- only requests on the configured ``routes`` (the collectors' route names, matched by the
  collectors' own ``match_route``), every route when none are named; a name that is no
  route is refused (``config check`` and here);
- a ``sample_rate`` share of those, within ``max_per_minute`` (a token bucket) and
  ``max_concurrent`` candidate requests in flight; over budget they are shed and counted;
- never one whose body the relay did not copy (``body_not_kept``) or larger than
  ``max_body_bytes``.

The shadow request carries the client's headers less credentials, cookies, hop-by-hop
fields and ``upstream.drop_headers`` (the relay leaves those out before copying, and
``candidate_headers`` checks again), then ``upstream.headers`` over them.

The candidate's answer becomes its own ``StreamRecord`` (the same collectors, through
``offline.send_request``), goes to the metrics with ``variant="shadow"`` and is joined with
the primary's record (same ``start_ns`` and route; either may finish first). Joined pairs are
compared (``pairs.compare``; ``pairs.agreement`` when a relevance scorer runs), counted,
observed and kept in a rolling window that ``render_json`` summarises for ``/shadow`` (ids and
numbers only, never text). A pair whose partner does not come within ``join_timeout_s`` is
dropped and counted. The optional diff log (``diff_log``, off by default) is the only place
text goes: the worst pairs, both answers, as JSONL, mode 0600, capped in size.

Nothing here raises into the tap: every failure is counted in ``ShadowStats``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from semhealth.agent.config import DiffLog, ShadowSettings, ShadowUpstream
from semhealth.agent.relevance import RecordScores, eligibility
from semhealth.agent.shadow.diff import Segmenter, default_segmenter, tokenizer_segmenter
from semhealth.agent.shadow.offline import rewrite_model, send_request
from semhealth.agent.shadow.pairs import PairResult, agreement, compare
from semhealth.agent.shadow.summary import as_json, summarise
from semhealth.agent.tasks import finish_within
from semhealth.collectors import Config as CollectorsConfig
from semhealth.collectors import Exchange, StreamRecord, match_route
from semhealth.common.tls import client_context
from semhealth.embeddings import EmbeddingError, Overloaded, Scorer

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- settings


# --------------------------------------------------------------------------- counters


@dataclass(slots=True)
class ShadowStats:
    """Plain counters, updated on the loop thread; the metrics read them."""

    # Shadowed exchanges by (route, result): exact, differs, candidate_error, shed.
    pairs: dict[tuple[str, str], int] = field(default_factory=dict)
    # Why an exchange that should have been shadowed was not, by (route, reason).
    shed: dict[tuple[str, str], int] = field(default_factory=dict)
    # Not meant to be shadowed (by design, not load), by reason: method, route, sampled_out.
    skipped: dict[str, int] = field(default_factory=dict)
    errors: int = 0  # failures inside the component (a bug: please report)
    scoring_skipped: int = 0  # the scorer was busy or failed: no agreement, or no shadow scores
    diff_log_lines: int = 0
    diff_log_dropped: int = 0  # worst pairs not written: the log is full or unwritable
    in_flight: int = 0  # candidate requests open now
    waiting: int = 0  # exchanges in the join table now

    def add_pair(self, route: str, result: str) -> None:
        key = (route, result)
        self.pairs[key] = self.pairs.get(key, 0) + 1

    def add_shed(self, route: str, reason: str) -> None:
        key = (route, reason)
        self.shed[key] = self.shed.get(key, 0) + 1
        self.add_pair(route, "shed")

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


# --------------------------------------------------------------------------- the budget


class TokenBucket:
    """``per_minute`` requests a minute, in bursts of up to ``per_minute``."""

    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self._rate = per_minute / 60.0
        self._capacity = float(per_minute)
        self._tokens = float(per_minute)
        self._clock = clock
        self._last = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


# --------------------------------------------------------------------------- the join table


@dataclass(slots=True)
class _Pending:
    exchange_id: str
    route: str
    deadline: float
    primary: StreamRecord | None = None
    shadow: StreamRecord | None = None
    task: asyncio.Task[None] | None = None


PairObserver = Callable[[PairResult], None]
RecordShadow = Callable[[StreamRecord], None]
ScorerSource = Callable[[], Scorer | None]


def _no_scorer() -> Scorer | None:
    return None


class Shadow:
    """The live shadowing component; the Agent calls ``on_open`` (the tap's hook),
    ``consume_record`` (after the recorder), ``start``, ``shutdown`` and ``render_json``."""

    def __init__(
        self,
        settings: ShadowSettings,
        collectors: CollectorsConfig,
        *,
        scorer: ScorerSource = _no_scorer,
        record_shadow: RecordShadow | None = None,
        record_shadow_scores: RecordScores | None = None,
        observe_pair: PairObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        known = [route.name for route in collectors.routes]
        problems = settings.validate() + settings.route_issues(known)
        if problems:
            raise ValueError("; ".join(f"shadow.{issue}" for issue in problems))
        self._settings = settings
        self._collectors = collectors
        self._routes = frozenset(settings.shadowed_routes(known))
        self._methods = frozenset(method.upper() for method in settings.methods)
        # A bad tokenizer file stops start-up here, its path in the message.
        self._segment: Segmenter = (
            tokenizer_segmenter(settings.tokenizer)
            if settings.tokenizer is not None
            else default_segmenter()
        )
        self._scorer = scorer
        self._record_shadow = record_shadow
        self._record_shadow_scores = record_shadow_scores
        self._observe_pair = observe_pair
        self._clock = clock
        self._rng = rng or random.Random()
        self._bucket = TokenBucket(settings.max_per_minute, clock)
        self._waiting: dict[tuple[int, str], _Pending] = {}
        self._recent: collections.deque[tuple[float, PairResult]] = collections.deque(
            maxlen=settings.window_pairs
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._accepting = False
        self._diff_log = _DiffLogWriter(settings.diff_log) if settings.diff_log else None
        self.stats = ShadowStats()

    # ----------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        upstream = self._settings.upstream
        timeouts = upstream.timeouts
        connector = aiohttp.TCPConnector(
            limit=self._settings.max_concurrent, ssl=_ssl_context(upstream)
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=timeouts.total_s, sock_connect=timeouts.connect_s, sock_read=timeouts.read_s
            ),
            auto_decompress=False,  # the collectors decode, as for the primary
        )
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="semhealth-shadow-sweep")
        self._accepting = True
        log.info(
            "shadowing %.4g of the requests on routes %s to the candidate",
            self._settings.sample_rate,
            ", ".join(sorted(self._routes)),
        )

    async def shutdown(self, timeout_s: float = 2.0) -> None:
        """Stop taking exchanges, let pairs in flight finish within the deadline, then close."""
        self._accepting = False
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        await finish_within(self._tasks, timeout_s)
        for item in list(self._waiting.values()):
            self.stats.add_shed(item.route, "closed")
        self._waiting.clear()
        self.stats.waiting = 0
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        if self._diff_log is not None:
            self._diff_log.close()

    # ----------------------------------------------------------------------- the tap's side

    def on_open(self, exchange: Exchange) -> None:
        """The primary's stream opened: shadow it if it qualifies. O(1); never raises."""
        try:
            self._open(exchange)
        except Exception:
            self.stats.errors += 1
            log.exception("shadowing an exchange failed before it was sent")

    def _open(self, exchange: Exchange) -> None:
        if not self._accepting or self._session is None:
            return
        if exchange.method.upper() not in self._methods:
            self.stats.skip("method")
            return
        route = match_route(self._collectors.routes, exchange.path.split("?", 1)[0])
        if route is None or route.name not in self._routes:
            self.stats.skip("route")
            return
        if self._rng.random() >= self._settings.sample_rate:
            self.stats.skip("sampled_out")
            return
        reason = self._shed_reason(exchange)
        if reason is not None:
            self.stats.add_shed(route.name, reason)
            return
        key = (exchange.start_ns, route.name)
        if key in self._waiting:  # two exchanges in the same nanosecond: leave the second
            self.stats.add_shed(route.name, "duplicate")
            return
        item = _Pending(
            exchange_id=uuid.uuid4().hex,
            route=route.name,
            deadline=self._clock() + self._settings.join_timeout_s,
        )
        self._waiting[key] = item
        self.stats.waiting = len(self._waiting)
        # Counted now, not when the task first runs: a burst of opens in one loop turn
        # must see each other against max_concurrent.
        self.stats.in_flight += 1
        item.task = self._spawn(self._ask(key, item, exchange))
        item.task.add_done_callback(self._asked)

    def _shed_reason(self, exchange: Exchange) -> str | None:
        """Why this sampled exchange cannot be shadowed now; the budget is taken last."""
        if exchange.request_body is None:
            return "body_not_kept"
        if len(exchange.request_body) > self._settings.max_body_bytes:
            return "body_too_large"
        if self.stats.in_flight >= self._settings.max_concurrent:
            return "max_concurrent"
        if len(self._waiting) >= self._settings.max_waiting:
            return "waiting_full"
        if not self._bucket.take():
            return "max_per_minute"
        return None

    def consume_record(self, record: StreamRecord) -> None:
        """A finished primary record: join it with its shadow, if it has one. Never raises."""
        if record.source != "proxy" or not self._waiting:
            return
        try:
            item = self._waiting.get((record.start_ns, record.route))
            if item is None or item.primary is not None:
                return
            item.primary = record
            if item.shadow is not None:
                self._joined((record.start_ns, record.route), item)
        except Exception:
            self.stats.errors += 1
            log.exception("joining a primary record failed")

    # ----------------------------------------------------------------------- the candidate

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name="semhealth-shadow")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _ask(self, key: tuple[int, str], item: _Pending, exchange: Exchange) -> None:
        session = self._session
        assert session is not None
        upstream = self._settings.upstream
        try:
            # Here, not in on_open: parsing a body may take a while, and in one process
            # on_open runs on the forwarding path.
            body = rewrite_model(exchange.request_body, self._settings.rewrite_model)
            record = await send_request(
                session,
                upstream.url,
                candidate_headers(exchange.request_headers, upstream),
                exchange.method,
                exchange.path,
                body,
                self._collectors,
            )
        except Exception:
            self.stats.errors += 1
            log.exception("the shadow request failed inside semhealth")
            self._drop(key, item, "error")
            return
        item.shadow = record
        if self._record_shadow is not None:
            try:
                self._record_shadow(record)
            except Exception:
                self.stats.errors += 1
                log.exception("recording a shadow record failed")
        scorer = self._scorer()
        wanted = self._record_shadow_scores is not None and eligibility(record) is None
        if scorer is not None and wanted:
            self._spawn(self._score_shadow(scorer, record))
        if item.primary is not None and self._waiting.get(key) is item:
            self._joined(key, item)

    def _asked(self, _task: asyncio.Task[None]) -> None:
        self.stats.in_flight -= 1

    def _drop(self, key: tuple[int, str], item: _Pending, reason: str) -> None:
        if self._waiting.get(key) is item:
            del self._waiting[key]
            self.stats.waiting = len(self._waiting)
            self.stats.add_shed(item.route, reason)

    # ----------------------------------------------------------------------- the pair

    def _joined(self, key: tuple[int, str], item: _Pending) -> None:
        del self._waiting[key]
        self.stats.waiting = len(self._waiting)
        primary, shadow = item.primary, item.shadow
        assert primary is not None and shadow is not None
        if primary.shed or primary.truncated or primary.client_aborted:
            # The primary's text is not its whole answer: nothing fair to compare.
            self.stats.add_shed(item.route, "primary_incomplete")
            return
        self._spawn(self._finish(item.exchange_id, primary, shadow))

    async def _finish(self, exchange_id: str, primary: StreamRecord, shadow: StreamRecord) -> None:
        try:
            pair = compare(exchange_id, primary, shadow, self._segment)
            pair = await self._with_agreement(pair, primary, shadow)
            self.stats.add_pair(pair.route, pair.result)
            self._recent.append((self._clock(), pair))
            if self._observe_pair is not None:
                self._observe_pair(pair)
            if self._diff_log is not None and self._is_bad(pair):
                await asyncio.to_thread(self._log_pair, pair, primary, shadow)
        except Exception:
            self.stats.errors += 1
            log.exception("comparing a shadow pair failed")

    async def _with_agreement(
        self, pair: PairResult, primary: StreamRecord, shadow: StreamRecord
    ) -> PairResult:
        scorer = self._scorer()
        if scorer is None:
            return pair
        try:
            return await agreement(pair, primary, shadow, scorer)
        except (Overloaded, EmbeddingError):
            self.stats.scoring_skipped += 1  # live: never wait on the scorer
            return pair

    async def _score_shadow(self, scorer: Scorer, record: StreamRecord) -> None:
        """The candidate's own context and answer relevance (variant="shadow")."""
        assert self._record_shadow_scores is not None
        query = record.request.query or ""
        try:
            scores = await scorer.score(query, record.request.context, record.output_text or None)
            self._record_shadow_scores(record, scores)
        except (Overloaded, EmbeddingError):
            self.stats.scoring_skipped += 1
        except Exception:
            self.stats.errors += 1
            log.exception("scoring a shadow record failed")

    def _is_bad(self, pair: PairResult) -> bool:
        """A pair past the tolerances: the ones a person should read."""
        tolerances = self._settings.tolerances
        if pair.result != "differs":
            return False
        if pair.agreement is not None and pair.agreement < tolerances.min_agreement:
            return True
        return pair.tokens is not None and pair.tokens.distance > tolerances.max_token_distance

    def _log_pair(self, pair: PairResult, primary: StreamRecord, shadow: StreamRecord) -> None:
        assert self._diff_log is not None
        if self._diff_log.write(_diff_line(pair, primary, shadow)):
            self.stats.diff_log_lines += 1
        else:
            self.stats.diff_log_dropped += 1

    # ----------------------------------------------------------------------- expiry

    async def _sweep_forever(self) -> None:
        period = min(5.0, self._settings.join_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            try:
                self.expire()
            except Exception:
                self.stats.errors += 1
                log.exception("expiring shadow pairs failed")

    def expire(self) -> int:
        """Drop the exchanges whose partner did not come in time; how many were dropped."""
        now = self._clock()
        late = [(key, item) for key, item in self._waiting.items() if item.deadline <= now]
        for key, item in late:
            self._drop(key, item, "expired")
            if item.task is not None and not item.task.done():
                item.task.cancel()
        return len(late)

    # ----------------------------------------------------------------------- /shadow

    def recent_pairs(self) -> list[PairResult]:
        """The pairs in the rolling window, oldest first."""
        horizon = self._clock() - self._settings.window_s
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()
        return [pair for _t, pair in self._recent]

    def render_json(self) -> bytes:
        """The ``/shadow`` document: per route, the measures with intervals, the verdict
        and the worst pairs' exchange ids; the counters beside them. Never text."""
        tolerances = self._settings.tolerances
        document = as_json(summarise(self.recent_pairs(), tolerances), tolerances)
        document["window"] = {
            "max_pairs": self._settings.window_pairs,
            "seconds": self._settings.window_s,
        }
        document["counts"] = {
            "pairs": _nested(self.stats.pairs.items()),
            "shed": _nested(self.stats.shed.items()),
            "skipped": dict(self.stats.skipped),
            "errors": self.stats.errors,
            "in_flight": self.stats.in_flight,
            "waiting": self.stats.waiting,
        }
        return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def candidate_headers(
    client: Iterable[tuple[str, str]] | None, upstream: ShadowUpstream
) -> list[tuple[str, str]]:
    """What a shadow request carries: the client's headers less the denylist (credentials,
    cookies, hop-by-hop, ``drop_headers``), then ``upstream.headers`` over them. The relay
    already left the denylisted ones out; checked again here, where they would be sent."""
    drop = upstream.dropped_headers() | {name.lower() for name in upstream.headers}
    kept = [(name, value) for name, value in client or () if name.lower() not in drop]
    return kept + list(upstream.headers.items())


def _nested(items: Iterable[tuple[tuple[str, str], int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (route, name), value in items:
        out.setdefault(route, {})[name] = value
    return out


def _ssl_context(upstream: ShadowUpstream) -> ssl.SSLContext | bool:
    if not upstream.url.lower().startswith("https://"):
        return False
    tls = upstream.tls
    return client_context(
        verify=tls.verify,
        ca_file=tls.ca_file,
        client_cert=tls.client_cert,
        client_key=tls.client_key,
    )


# --------------------------------------------------------------------------- the diff log


def _diff_line(pair: PairResult, primary: StreamRecord, shadow: StreamRecord) -> bytes:
    tokens = pair.tokens
    document = {
        "exchange_id": pair.exchange_id,
        "route": pair.route,
        "result": pair.result,
        "token_distance": tokens.distance if tokens is not None else None,
        "first_divergence": tokens.first_divergence if tokens is not None else None,
        "agreement": pair.agreement,
        "json_paths": list(pair.json.paths) if pair.json is not None else None,
        "primary_text": primary.output_text,
        "shadow_text": shadow.output_text,
    }
    return orjson.dumps(document) + b"\n"


class _DiffLogWriter:
    """Appends lines to the diff log, mode 0600, until ``max_bytes``; a line that does not
    fit is refused (the caller counts it), so the file never passes the cap."""

    def __init__(self, settings: DiffLog) -> None:
        self._settings = settings
        self._fd: int | None = None
        self._size = 0
        self._failed = False
        self._lock = threading.Lock()  # lines are written from worker threads

    def write(self, line: bytes) -> bool:
        with self._lock:
            return self._write(line)

    def _write(self, line: bytes) -> bool:
        if self._failed:
            return False
        try:
            if self._fd is None:
                self._open()
            assert self._fd is not None
            if self._size + len(line) > self._settings.max_bytes:
                return False
            os.write(self._fd, line)
        except OSError as exc:
            self._failed = True
            log.error(
                "shadow.diff_log: cannot write %s (%s); diff log off", self._settings.path, exc
            )
            return False
        self._size += len(line)
        return True

    def _open(self) -> None:
        fd = os.open(self._settings.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise: it holds text
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)
