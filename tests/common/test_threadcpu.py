"""The CPU time of a named group of threads, read from /proc (Linux)."""

from __future__ import annotations

import threading
import time

from semhealth.common.threadcpu import cpu_seconds, name_os_thread

SPIN_S = 0.3


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_named_thread_and_the_threads_it_starts_are_counted_others_not() -> None:
    seen: list[float | None] = []
    spun, release = threading.Event(), threading.Event()

    def child() -> None:  # started by the named thread: it inherits the kernel's name
        spin(SPIN_S)
        spun.set()
        release.wait()

    def named() -> None:
        name_os_thread("sh-test-group")
        started = threading.Thread(target=child)
        started.start()
        spin(SPIN_S)
        spun.wait()
        seen.append(cpu_seconds("sh-test-group"))  # both alive, both done spinning
        release.set()
        started.join()

    before = cpu_seconds("sh-test-group")
    stranger = threading.Thread(target=spin, args=(SPIN_S,))
    stranger.start()
    thread = threading.Thread(target=named)
    thread.start()
    thread.join()
    stranger.join()
    assert before == 0.0
    (both,) = seen
    assert both is not None
    # The two spins, at the clock tick's resolution; the stranger's spin is not in it.
    assert 2 * SPIN_S - 0.05 <= both < 3 * SPIN_S - 0.05


def test_threads_that_cannot_be_read_give_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert cpu_seconds("sh-embed", tasks=tmp_path / "missing") is None
