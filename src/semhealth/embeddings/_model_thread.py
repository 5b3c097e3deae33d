"""A model that runs on one dedicated thread: one call at a time, never on the event loop.

The local sentence-transformers backend and the USE backend differ in how they load and
encode; the thread, the closed state and error translation around each call are this, and
giving back the heap the calls freed (``semhealth.common.heap``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Generic, TypeVar

import numpy as np

from semhealth.common.heap import HeapTrim, process_trim
from semhealth.common.threadcpu import name_os_thread
from semhealth.embeddings.backend import Vectors
from semhealth.embeddings.config import EMBEDDING_THREADS
from semhealth.embeddings.errors import BackendError

M = TypeVar("M")


def model_executor(thread_name: str) -> ThreadPoolExecutor:
    """One thread for one model, named ``thread_name`` in Python and ``EMBEDDING_THREADS`` in
    the kernel."""
    return ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix=thread_name,
        initializer=partial(name_os_thread, EMBEDDING_THREADS),
    )


class ModelThread(Generic[M]):
    def __init__(
        self,
        model: M,
        executor: ThreadPoolExecutor,
        *,
        encode: Callable[[M, list[str]], Vectors],
        translate: Callable[[Exception, int], BackendError],
        what: str,
        heap: HeapTrim | None = None,
    ) -> None:
        self._model: M | None = model
        self._executor = executor
        self._encode = encode
        self._translate = translate
        self._what = what  # "the local backend": for the closed error
        self._heap = heap if heap is not None else HeapTrim(process_trim())
        self._idle: asyncio.TimerHandle | None = None

    @classmethod
    def loading(
        cls,
        load: Callable[[], M],
        *,
        thread_name: str,
        encode: Callable[[M, list[str]], Vectors],
        translate: Callable[[Exception, int], BackendError],
        what: str,
    ) -> ModelThread[M]:
        """Load the model on its own new thread (engines that keep per-thread state want
        the thread that loaded them to run every call); the thread goes if loading fails."""
        executor = model_executor(thread_name)
        try:
            model = executor.submit(load).result()
        except BaseException:
            executor.shutdown(wait=False, cancel_futures=True)
            raise
        return cls(model, executor, encode=encode, translate=translate, what=what)

    async def embed(self, texts: Sequence[str], dim: int) -> Vectors:
        if not texts:
            return np.empty((0, dim), dtype=np.float32)
        model = self._model
        if model is None:
            raise BackendError(f"{self._what} is closed", retryable=False)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._encode, model, list(texts))
        except Exception as exc:
            raise self._translate(exc, len(texts)) from exc
        finally:
            self._called(loop)

    def _called(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._heap.after_call():
            self._trim()
        if self._idle is not None:
            self._idle.cancel()
        self._idle = loop.call_later(self._heap.idle_s, self._trim_when_idle)

    def _trim_when_idle(self) -> None:
        self._idle = None
        if self._heap.when_idle():
            self._trim()

    def _trim(self) -> None:
        """On the model thread, after the call that ended: the caller has its vectors."""
        if self._model is None:
            return
        with contextlib.suppress(RuntimeError):  # the executor shut down meanwhile
            self._executor.submit(self._heap.trim)

    async def close(self) -> None:
        if self._model is None:
            return
        self._model = None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        # Waits for a call already running on the model thread, off the event loop.
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
