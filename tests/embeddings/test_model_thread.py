"""The model thread gives the heap its calls freed back to the C library's kernel pages:
after a call at most once per interval, and once when the calls stop."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from semhealth.common.heap import HeapTrim, c_library_trim
from semhealth.embeddings._model_thread import ModelThread, model_executor
from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.errors import BackendError

DIM = 4


class _Trims:
    """A trim that notes the thread it ran on; ``wait`` resumes once ``n`` have run."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self._ran = threading.Event()

    def __call__(self) -> None:
        self.threads.append(threading.current_thread().name)
        self._ran.set()

    async def wait(self, n: int, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.threads) < n:
                self._ran.clear()
                await asyncio.to_thread(self._ran.wait, 0.05)


def _encode(_model: object, texts: list[str]) -> Vectors:
    return np.ones((len(texts), DIM), dtype=np.float32)


def _translate(exc: Exception, _count: int) -> BackendError:
    return BackendError(str(exc), retryable=False)


def _thread(heap: HeapTrim) -> ModelThread[object]:
    return ModelThread(
        object(),
        model_executor("test-model"),
        encode=_encode,
        translate=_translate,
        what="the test model",
        heap=heap,
    )


async def test_a_model_call_is_followed_by_a_trim_on_the_model_thread() -> None:
    trims = _Trims()
    thread = _thread(HeapTrim(trims, every_s=3600.0, idle_s=3600.0))
    try:
        await thread.embed(["one"], DIM)
        await trims.wait(1)
    finally:
        await thread.close()
    assert len(trims.threads) == 1
    assert trims.threads[0].startswith("test-model")


async def test_the_last_call_of_a_burst_is_trimmed_once_the_calls_stop() -> None:
    trims = _Trims()
    thread = _thread(HeapTrim(trims, every_s=3600.0, idle_s=0.05))
    try:
        await thread.embed(["first"], DIM)  # trimmed at once: none ran before
        await thread.embed(["second"], DIM)  # inside the interval: left for the idle trim
        await trims.wait(2)
    finally:
        await thread.close()
    assert len(trims.threads) == 2


def test_calls_in_quick_succession_trim_at_most_once_per_interval() -> None:
    now = [100.0]
    heap = HeapTrim(lambda: None, every_s=2.0, idle_s=1.0, clock=lambda: now[0])
    due = []
    for t in (100.0, 100.5, 101.9, 102.0, 102.1, 104.0):
        now[0] = t
        due.append(heap.after_call())
    assert due == [True, False, False, True, False, True]


def test_an_idle_trim_follows_only_calls_left_untrimmed() -> None:
    now = [0.0]
    heap = HeapTrim(lambda: None, every_s=2.0, idle_s=1.0, clock=lambda: now[0])
    assert heap.after_call()
    assert not heap.when_idle()  # that call was trimmed already
    now[0] = 0.5
    assert not heap.after_call()
    assert heap.when_idle()
    assert not heap.when_idle()


def test_a_c_library_without_malloc_trim_is_never_trimmed() -> None:
    class _Musl:  # musl and macOS's libc have no malloc_trim
        pass

    assert c_library_trim(_Musl()) is None
    heap = HeapTrim(None)
    assert not heap.after_call()
    assert not heap.when_idle()
