"""How many CPUs this process may really use, for thread and process counts.

Standard library only: the forwarding process reads it for ``dataplane.workers: auto``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs a cgroup quota allows (``1.5`` for 150 ms per 100 ms), or None when unlimited.

    Reads cgroup v2's ``cpu.max``, else v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``.
    """
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return _ratio(quota, period or "100000")
    for folder in ("cpu", "cpu,cpuacct"):
        quota_text = _read(root / folder / "cpu.cfs_quota_us")
        period_text = _read(root / folder / "cpu.cfs_period_us")
        if quota_text is not None and period_text is not None:
            return _ratio(quota_text, period_text)
    return None


def available_cpus(root: Path = CGROUP_ROOT) -> int:
    """CPUs this process may really use: its affinity mask, capped by the cgroup quota.

    ``os.cpu_count()`` reports the host's cores; in a container limited to 2 CPUs on a
    64-core host, 64 torch threads would thrash, so the quota wins (rounded down, at least 1).
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit(root)
    if limit is not None:
        cpus = min(cpus, max(1, math.floor(limit)))
    return max(1, cpus)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # "max": no quota
        return None
    if quota_us <= 0 or period_us <= 0:  # v1 writes -1 for no quota
        return None
    return quota_us / period_us
