"""``semhealth run --record FILE``: every exchange the tap analyses, written in the replay
format (``semhealth.agent.replay.format``) by a thread of its own.

Opt-in: the file holds prompt and response text, so it is created mode 0600 and only when
the flag asks for it. The tap hands each closed exchange over in O(1) (``capture``); a
bounded queue sits between it and the writer thread, and when the queue is full the
exchange is shed and counted, never waited for. The file is capped at ``max_bytes``: past
it, ``FILE`` becomes ``FILE.1`` (``FILE.1`` becomes ``FILE.2``, ...) and the oldest past
``keep`` is deleted. A write that fails (disk full, the file gone) loses that batch, is
counted and logged once, and the next batch tries again: recording never stops the agent.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from semhealth.agent.replay.format import encode_exchange
from semhealth.agent.replay.settings import RecordSettings
from semhealth.agent.telemetry.observe import Labelled
from semhealth.agent.wire import Outcome
from semhealth.collectors import Exchange

log = logging.getLogger(__name__)

_BATCH_LINES = 256  # lines per write(2); a batch is what one failure loses
_STOP = object()


@dataclass(slots=True)
class RecordingStats:
    """What recording did; plain ints, read by the agent's metrics."""

    written: int = 0  # exchanges written
    shed: int = 0  # exchanges dropped because the writer's queue was full
    failed: int = 0  # exchanges lost to a failed write (disk full, ...)
    rotations: int = 0


@dataclass(slots=True)
class _Captured:
    wall_start: float
    exchange: Exchange
    chunks: list[tuple[int, bytes]]
    elided_bytes: int
    outcome: Outcome
    shed: bool


class Recording:
    """The tap's tee: ``capture`` on the loop, a writer thread behind a bounded queue."""

    def __init__(
        self,
        settings: RecordSettings,
        *,
        max_exchange_bytes: int,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if settings.max_bytes < 1 or settings.keep < 0:
            raise ValueError("--record-max-bytes must be at least 1 and --record-keep at least 0")
        self.settings = settings
        # Body bytes stored per exchange: past this the collectors stopped analysing anyway.
        self.max_exchange_bytes = max_exchange_bytes
        self._wall_clock = wall_clock
        self._queue: queue.Queue[_Captured | object] = queue.Queue(settings.queue_size)
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._size = 0
        self._failing = False
        self.stats = RecordingStats()

    def start(self) -> None:
        """Open the file (a failure here is a start-up error) and start the writer."""
        self._open()
        self._thread = threading.Thread(target=self._run, name="semhealth-record", daemon=True)
        self._thread.start()
        log.info("recording exchanges to %s (holds prompt and response text)", self.settings.path)

    def capture(
        self,
        exchange: Exchange,
        chunks: list[tuple[int, bytes]],
        elided_bytes: int,
        outcome: Outcome,
        shed: bool,
    ) -> None:
        """One closed exchange, as the collectors received it. O(1); never blocks."""
        # The tap's clock is monotonic (shared by every process on the host): the wall-clock
        # start is now minus the time since the request head arrived.
        age_s = (time.monotonic_ns() - exchange.start_ns) / 1e9
        item = _Captured(self._wall_clock() - age_s, exchange, chunks, elided_bytes, outcome, shed)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.stats.shed += 1

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (within the deadline), then close the file. Safe twice."""
        thread, self._thread = self._thread, None
        if thread is not None:
            # Blocking put: the writer is draining, so room comes; the deadline bounds it.
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=timeout_s)
            thread.join(timeout_s)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    # -- the writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            while len(batch) < _BATCH_LINES:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    self._write_batch(batch)
                    return
                batch.append(item)
            self._write_batch(batch)

    def _write_batch(self, batch: Iterable[object]) -> None:
        pending: list[bytes] = []
        pending_bytes = 0
        for item in batch:
            assert isinstance(item, _Captured)
            line = encode_exchange(
                exchange_id=uuid.uuid4().hex,
                wall_start=item.wall_start,
                exchange=item.exchange,
                chunks=item.chunks,
                elided_bytes=item.elided_bytes,
                outcome=item.outcome,
                shed=item.shed,
            )
            if self._size + pending_bytes + len(line) > self.settings.max_bytes:
                self._flush(pending)
                pending, pending_bytes = [], 0
                if self._size > 0:
                    self._rotate()
            # A line longer than the cap alone still goes in: a file of its own.
            pending.append(line)
            pending_bytes += len(line)
        self._flush(pending)

    def _flush(self, lines: list[bytes]) -> None:
        if not lines:
            return
        try:
            if self._fd is None:
                self._open()
            assert self._fd is not None
            data = memoryview(b"".join(lines))
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
                self._size += written
        except OSError as exc:
            self.stats.failed += len(lines)
            self._failed(exc)
            return
        self.stats.written += len(lines)
        if self._failing:
            log.info("recording to %s works again", self.settings.path)
            self._failing = False

    def _failed(self, exc: OSError) -> None:
        # Once per streak, and never the lines: they hold text.
        if not self._failing:
            reason = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            log.error(
                "recording to %s failed (%s): exchanges are dropped and counted until "
                "writes succeed again; the agent keeps serving",
                self.settings.path,
                reason,
            )
            self._failing = True

    def _open(self) -> None:
        path = self.settings.path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # an existing file is appended to; its mode is tightened
        self._fd = fd
        self._size = info.st_size if stat.S_ISREG(info.st_mode) else 0

    def _rotate(self) -> None:
        """FILE -> FILE.1 -> ... -> FILE.keep; the oldest is deleted."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        path, keep = self.settings.path, self.settings.keep
        try:
            if keep == 0:
                os.unlink(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{path}.{keep}")
                for index in range(keep - 1, 0, -1):
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(f"{path}.{index}", f"{path}.{index + 1}")
                os.rename(path, f"{path}.1")
        except OSError as exc:
            self._failed(exc)
        self.stats.rotations += 1
        self._size = 0  # the next flush opens a new FILE


def observe_recording(meter: Meter, stats: RecordingStats) -> None:
    """``semhealth_recorded_exchanges_total{result=written|shed|failed}``."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(stats.written, {"result": "written"}),
            Observation(stats.shed, {"result": "shed"}),
            Observation(stats.failed, {"result": "failed"}),
        ]

    meter.create_observable_counter(
        "semhealth_recorded_exchanges",
        [Labelled(callback, "result")],
        description="Exchanges --record handled: written to the file, shed (the writer's "
        "queue was full) or failed (a write error such as a full disk).",
    )
