"""Delivery of alerts to one or more Alertmanagers over API v2 (``POST /api/v2/alerts``).

The shape is Prometheus' notifier: ``send`` converts alerts to the wire form once and puts
them on each Alertmanager's own bounded queue, dropping the oldest when it is full; one
sender task per Alertmanager POSTs them in batches of at most ``max_batch``, with a timeout
per POST. ``send`` never blocks and never raises, so evaluation and the proxy never wait on
an Alertmanager.

Resending does the job of retrying. The evaluator sends firing alerts again every resend
delay with ``ends_at`` a few periods ahead, so a batch that cannot be delivered is dropped
and counted: the next resend carries the same alerts. Before giving up, a batch gets a few
quick retries (full-jitter exponential backoff) for a retryable failure (a timeout, a
refused connection, 5xx, 408, 425, 429), all started within ``retry_window_s``, which is
kept shorter than the resend delay so a retried batch never overtakes the next resend. A
permanent failure (any other non-2xx answer) is not retried: the same body would be
refused again.

Logs and errors carry URLs without credentials, statuses, counts and alert names; never
label values or annotations, which a user may have templated.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from random import Random
from typing import Any

import aiohttp
import orjson
from yarl import URL

from semhealth.alerts.model import Alert

_API_PATH = "/api/v2/alerts"
_RETRYABLE_STATUSES = frozenset({408, 425, 429})
_SNIPPET_BYTES = 200  # of an error answer's body, for the log line
_NAMES_IN_LOG = 5  # alert names listed in a log line; more are counted
_MAX_UNIX_S = 253_402_300_800.0  # 10000-01-01: the first instant RFC 3339 cannot write
_DELIVERED_STATES = frozenset({"firing", "resolved"})  # Alertmanager has no pending alerts

Wire = dict[str, Any]  # one alert in API v2's JSON form


def _module_logger() -> logging.Logger:
    return logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What the agent hands the notifier.

    A batch is POSTed at most ``max_attempts`` times, each with ``timeout_s``; the wait
    before try ``n + 1`` is uniform in ``[0, min(backoff_cap_s, backoff_base_s * 2**(n-1))]``
    (full jitter) and no try starts later than ``retry_window_s`` after the first, so a
    batch is settled within ``retry_window_s + timeout_s``. Keep that under the evaluator's
    resend delay (Prometheus: 1 min).

    ``external_labels`` (the pod and namespace from the downward API) are added to every
    alert that lacks them; empty values are left out, as Alertmanager drops them anyway.
    ``generator_url`` is the agent's ``/alerts`` URL. ``clock`` gives Unix time for
    ``last_success``; ``random`` draws the jitter.
    """

    timeout_s: float = 10.0
    queue_size: int = 10_000
    max_batch: int = 256
    max_attempts: int = 3
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 5.0
    retry_window_s: float = 30.0
    external_labels: Mapping[str, str] = field(default_factory=dict)
    generator_url: str = ""
    random: Random = field(default_factory=Random)
    clock: Callable[[], float] = time.time
    logger: logging.Logger = field(default_factory=_module_logger)

    def validate(self) -> list[str]:
        """Every problem with these settings, each naming the field and the fix."""
        problems = [
            f"{name} must be more than 0, not {value:g}"
            for name, value in (
                ("timeout_s", self.timeout_s),
                ("backoff_base_s", self.backoff_base_s),
                ("backoff_cap_s", self.backoff_cap_s),
            )
            if not (math.isfinite(value) and value > 0)
        ]
        if not (math.isfinite(self.retry_window_s) and self.retry_window_s >= 0):
            problems.append(f"retry_window_s must be 0 or more, not {self.retry_window_s:g}")
        problems.extend(
            f"{name} must be at least 1, not {value}"
            for name, value in (
                ("queue_size", self.queue_size),
                ("max_batch", self.max_batch),
                ("max_attempts", self.max_attempts),
            )
            if value < 1
        )
        if self.generator_url and not _is_http_url(self.generator_url):
            problems.append("generator_url must be an http:// or https:// URL, or empty")
        return problems


@dataclass(frozen=True, slots=True)
class DeliveryStats:
    """What happened to the alerts meant for one Alertmanager, counted in alerts.

    ``sent``: accepted (2xx). ``errors``: in batches given up after failed POSTs (also
    counted in ``dropped``). ``dropped``: never delivered (given up, pushed out of a full
    queue, left over at shutdown, unwritable times). ``retries``: POSTs repeated after a
    retryable failure (counted in POSTs). ``last_error`` says why the latest POST failed
    ("" before any failure); ``last_success`` is the Unix time of the latest 2xx.
    """

    url: str
    sent: int
    errors: int
    dropped: int
    retries: int
    queue_length: int
    last_error: str
    last_success: float | None


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str  # status or exception type: never a body, never credentials
    retryable: bool
    snippet: str = ""  # the start of an error answer, for the log line only


class _Target:
    """One Alertmanager: where to POST, its queue and its counters."""

    def __init__(self, url: str, queue_size: int) -> None:
        parsed = URL(url)
        self.name = str(parsed.with_user(None))
        self.post_url = parsed.with_user(None).with_path(parsed.path.rstrip("/") + _API_PATH)
        self.headers: dict[str, str] = {}
        if parsed.user is not None:
            self.headers["Authorization"] = _basic_auth(parsed.user, parsed.password or "")
        self.queue: deque[Wire] = deque()
        self.queue_size = queue_size
        self.wake = asyncio.Event()
        self.sent = self.errors = self.dropped = self.retries = 0
        self.last_error = ""
        self.last_success: float | None = None

    def add(self, alerts: Sequence[Wire]) -> int:
        """Queue ``alerts``, dropping the oldest past the queue's size; returns how many
        were dropped."""
        overflow = max(0, len(self.queue) + len(alerts) - self.queue_size)
        # Newest win: drop from the queue's head, then from the front of the new alerts.
        from_queue = min(overflow, len(self.queue))
        for _ in range(from_queue):
            self.queue.popleft()
        self.queue.extend(alerts[overflow - from_queue :])
        self.dropped += overflow
        self.wake.set()
        return overflow

    def take(self, limit: int) -> list[Wire]:
        return [self.queue.popleft() for _ in range(min(limit, len(self.queue)))]

    def stats(self) -> DeliveryStats:
        return DeliveryStats(
            url=self.name,
            sent=self.sent,
            errors=self.errors,
            dropped=self.dropped,
            retries=self.retries,
            queue_length=len(self.queue),
            last_error=self.last_error,
            last_success=self.last_success,
        )


class Notifier:
    """Sends alerts to every Alertmanager in ``urls``; each gets every alert.

    ``urls`` are base URLs (``http://host:9093``, ``http://host/alertmanager``); alerts go
    to ``<base>/api/v2/alerts``. ``http://user:pass@host`` sends basic auth; the user and
    password never appear in stats or logs. Raises ``ValueError`` for a bad URL or bad
    settings, at construction only.

    Call ``send`` from the event loop's thread. Alerts sent before ``start`` wait in the
    queues; alerts sent after ``shutdown`` began are dropped and counted.
    """

    def __init__(self, urls: Sequence[str], *, settings: Settings | None = None) -> None:
        self._settings = settings or Settings()
        problems = self._settings.validate()
        problems.extend(
            f"alertmanager URL #{i + 1} must be an http:// or https:// URL with a host"
            for i, url in enumerate(urls)
            if not _is_http_url(url)
        )
        if problems:
            raise ValueError("; ".join(problems))
        self._targets = [_Target(url, self._settings.queue_size) for url in urls]
        self._external = {k: v for k, v in self._settings.external_labels.items() if v}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closing = False

    # -- intake ------------------------------------------------------------------------------

    def send(self, alerts: Sequence[Alert]) -> None:
        """Queue ``alerts`` (firing and resolved; others are skipped) for every Alertmanager."""
        wire: list[Wire] = []
        unwritable: list[str] = []
        for alert in alerts:
            if alert.state not in _DELIVERED_STATES:
                continue
            converted = self._to_wire(alert)
            if converted is None:
                unwritable.append(alert.rule)
            else:
                wire.append(converted)
        if unwritable:
            self._settings.logger.warning(
                "dropped %d alerts whose times cannot be written in RFC 3339: %s",
                len(unwritable),
                _names(unwritable),
            )
        for target in self._targets:
            target.dropped += len(unwritable)
            if self._closing:
                target.dropped += len(wire)
            elif wire and (overflow := target.add(wire)):
                self._settings.logger.warning(
                    "alertmanager %s: queue full, dropped the %d oldest alerts",
                    target.name,
                    overflow,
                )

    def _to_wire(self, alert: Alert) -> Wire | None:
        """The API v2 form of ``alert``, or None if one of its times is not writable."""
        # Prometheus starts an alert where it fired: Alertmanager never sees it pending.
        starts_at = alert.fired_at if alert.fired_at is not None else alert.active_at
        if not _writable(starts_at) or (alert.ends_at is not None and not _writable(alert.ends_at)):
            return None
        labels = {**self._external, **alert.labels}
        labels.setdefault("alertname", alert.rule)
        wire: Wire = {
            "labels": labels,
            "annotations": dict(alert.annotations),
            "startsAt": format_time(starts_at),
        }
        if alert.ends_at is not None:
            wire["endsAt"] = format_time(alert.ends_at)
        if self._settings.generator_url:
            wire["generatorURL"] = self._settings.generator_url
        return wire

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the HTTP session and start one sender task per Alertmanager."""
        if self._closing:
            raise RuntimeError("a Notifier cannot start again after shutdown; build a new one")
        if self._started:
            return
        self._started = True
        self._session = aiohttp.ClientSession(
            headers={"User-Agent": "semhealth", "Content-Type": "application/json"},
            raise_for_status=False,
        )
        self._tasks = [
            asyncio.create_task(self._run(target), name=f"semhealth-alertmanager-{i}")
            for i, target in enumerate(self._targets)
        ]
        for task in self._tasks:
            task.add_done_callback(self._sender_ended)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop intake, deliver what is queued within ``timeout_s``, then cancel; what is
        left is counted as dropped. Safe without ``start`` and safe twice."""
        if self._closing:
            return
        self._closing = True
        for target in self._targets:
            target.wake.set()  # a sender with an empty queue wakes up to end
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=max(timeout_s, 0.0))
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for target in self._targets:
            target.dropped += len(target.queue)
            target.queue.clear()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def stats(self) -> tuple[DeliveryStats, ...]:
        """One entry per Alertmanager, in the order of ``urls``."""
        return tuple(target.stats() for target in self._targets)

    def _sender_ended(self, task: asyncio.Task[None]) -> None:
        # A sender ends only at shutdown; one that died of a bug must not do so silently.
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._settings.logger.error(
                "%s stopped delivering alerts: %s", task.get_name(), type(exc).__name__
            )

    # -- delivery ----------------------------------------------------------------------------

    async def _run(self, target: _Target) -> None:
        while True:
            if not target.queue:
                if self._closing:
                    return
                target.wake.clear()
                await target.wake.wait()
                continue
            batch = target.take(self._settings.max_batch)
            try:
                await self._deliver(target, batch)
            except Exception as exc:
                # A bug here must not end delivery for good: count the batch, keep going.
                self._settings.logger.exception(
                    "alertmanager %s: delivering %d alerts failed", target.name, len(batch)
                )
                target.errors += len(batch)
                target.dropped += len(batch)
                target.last_error = f"internal error: {type(exc).__name__}"

    async def _deliver(self, target: _Target, batch: list[Wire]) -> None:
        settings = self._settings
        loop = asyncio.get_running_loop()
        first_try = loop.time()
        body = orjson.dumps(batch)
        attempt = 1
        try:
            while True:
                failure = await self._post(target, body)
                if failure is None:
                    target.sent += len(batch)
                    target.last_success = settings.clock()
                    return
                target.last_error = failure.reason
                delay = self._backoff(attempt)
                if (
                    not failure.retryable
                    or attempt >= settings.max_attempts
                    or loop.time() + delay - first_try > settings.retry_window_s
                ):
                    break
                await asyncio.sleep(delay)
                attempt += 1
                target.retries += 1
        except asyncio.CancelledError:
            target.dropped += len(batch)  # the shutdown deadline passed mid-delivery
            raise
        target.errors += len(batch)
        target.dropped += len(batch)
        self._log_given_up(target, batch, failure, attempt)

    def _backoff(self, attempt: int) -> float:
        """Full jitter: uniform up to the capped exponential step (AWS' recommendation)."""
        settings = self._settings
        step = min(settings.backoff_cap_s, settings.backoff_base_s * 2.0 ** (attempt - 1))
        return settings.random.uniform(0.0, step)

    async def _post(self, target: _Target, body: bytes) -> _Failure | None:
        """POST one batch; None on 2xx, else why it failed. Translates aiohttp's errors."""
        assert self._session is not None  # senders run only between start and shutdown
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout_s)
        try:
            async with self._session.post(
                target.post_url, data=body, headers=target.headers, timeout=timeout
            ) as response:
                if 200 <= response.status < 300:
                    return None
                raw = await response.content.read(_SNIPPET_BYTES)
                return _Failure(
                    f"HTTP {response.status}",
                    retryable=response.status >= 500 or response.status in _RETRYABLE_STATUSES,
                    snippet=raw.decode("utf-8", "replace").strip(),
                )
        except TimeoutError:
            return _Failure(f"timed out after {self._settings.timeout_s:g} s", retryable=True)
        except aiohttp.InvalidURL:
            return _Failure("invalid URL", retryable=False)
        except (aiohttp.ClientError, OSError) as exc:
            return _Failure(f"connection failed: {type(exc).__name__}", retryable=True)

    def _log_given_up(
        self, target: _Target, batch: list[Wire], failure: _Failure, attempts: int
    ) -> None:
        names = _names([str(wire["labels"].get("alertname", "")) for wire in batch])
        if failure.retryable:
            self._settings.logger.warning(
                "alertmanager %s: dropped %d alerts after %d attempts (%s): %s; "
                "the next resend carries them",
                target.name,
                len(batch),
                attempts,
                failure.reason,
                names,
            )
        else:
            self._settings.logger.warning(
                "alertmanager %s refused %d alerts with %s, not retried: %r; alerts: %s",
                target.name,
                len(batch),
                failure.reason,
                failure.snippet,
                names,
            )


def format_time(t: float) -> str:
    """Unix seconds as RFC 3339 in UTC with milliseconds: ``2024-05-01T12:00:00.250Z``."""
    moment = datetime.fromtimestamp(t, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _writable(t: float) -> bool:
    return math.isfinite(t) and 0.0 <= t < _MAX_UNIX_S


def _is_http_url(url: str) -> bool:
    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host)


def _basic_auth(user: str, password: str) -> str:
    # Built by hand: aiohttp deprecates BasicAuth, and its replacement is newer than 3.10.
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def _names(names: Sequence[str]) -> str:
    """Distinct alert names for a log line, a few at most."""
    distinct = sorted(set(names))
    shown = ", ".join(distinct[:_NAMES_IN_LOG])
    more = len(distinct) - _NAMES_IN_LOG
    return f"{shown} and {more} more" if more > 0 else shown
