"""The CPU time of a named group of threads, for a stage that keeps itself within a budget.

A thread named with ``name_os_thread`` passes its name to the threads it starts (Linux copies
a thread's name to the threads it creates), so the pools an engine starts from its model
thread (OpenMP, torch's intra-op threads) are counted with it. Linux only: elsewhere names
are not set and ``cpu_seconds`` answers None. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

_PR_SET_NAME = 15
_NAME_BYTES = 15  # the kernel keeps 15 bytes of a thread's name
_TASKS = Path("/proc/self/task")
try:
    _TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):  # not on Linux
    _TICK_S = 0.01


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (at most 15 bytes) as the kernel knows it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:_NAME_BYTES], 0, 0, 0)
    except (OSError, AttributeError):
        return  # a libc without prctl: the thread keeps its name and is not counted


def cpu_seconds(prefix: str, tasks: Path = _TASKS) -> float | None:
    """User and system CPU seconds of this process's live threads whose name starts with
    ``prefix``, or None where threads cannot be read. A thread that has ended is no longer
    counted, so callers compare readings of threads that live as long as they measure."""
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return None
    wanted = prefix.encode()[:_NAME_BYTES]
    ticks = 0
    for entry in entries:
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue  # the thread ended while we read
        # pid (comm) state ... : the name may hold spaces and parentheses; it ends at the last ')'.
        name_start, name_end = stat.find(b"("), stat.rfind(b")")
        if not stat[name_start + 1 : name_end].startswith(wanted):
            continue
        fields = stat[name_end + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return ticks * _TICK_S
