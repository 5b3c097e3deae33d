"""The soak's short profile, as CI runs it: ``bench/soak.py --quick`` must end with no
client-visible error, every ended stream analysed into a record, memory flat after the
warm-up, and its summary line; and the soak's exit status says when memory was not flat.

The quick profile measures growth over 20 s after a 10 s warm-up (about +1.4 % forwarding,
+0.2 % analysis on a 2-core machine): it holds the same 5 % limit as the long soak, so it
catches a gross leak, not a slow one; the 10-minute soak is for that."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def _soak_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SOAK.parent))  # its sibling proxy_overhead.py
    spec = importlib.util.spec_from_file_location("bench_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_quick_soak_has_no_client_visible_errors_and_a_record_per_stream() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    last = re.fullmatch(
        r"soak: (\d+) streams, (\d+) client-visible errors, RSS growth (-?[\d.]+)%", lines[-1]
    )
    assert last is not None, lines[-1]
    assert (int(last[1]), int(last[2])) == (40, 0)
    assert float(last[3]) < 5.0, "RSS grew past the soak's 5 % limit after the warm-up"
    assert "memory: flat" in lines
    records = re.search(r"records produced (\d+) for (\d+) streams ended", done.stdout)
    assert records is not None
    assert int(records[1]) == int(records[2]) > 0
    assert re.search(r"shed by stage: .*relevance=[1-9]", done.stdout), "scoring never shed"
    assert re.search(r"OTLP exports received [1-9]", done.stdout)


def test_the_soak_exits_1_on_a_client_visible_error_or_memory_that_is_not_flat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    soak = _soak_module(monkeypatch)
    assert soak.GROWTH_LIMIT_PCT == 5.0
    assert soak.exit_status(0, 4.9) == 0
    assert soak.exit_status(0, 5.0) == 1
    assert soak.exit_status(1, 0.0) == 1
