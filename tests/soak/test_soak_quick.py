"""The soak's short profile, as CI runs it: ``bench/soak.py --quick`` must end with no
client-visible error, every ended stream analysed into a record, and its summary line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


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
    records = re.search(r"records produced (\d+) for (\d+) streams ended", done.stdout)
    assert records is not None
    assert int(records[1]) == int(records[2]) > 0
    assert re.search(r"shed by stage: .*relevance=[1-9]", done.stdout), "scoring never shed"
    assert re.search(r"OTLP exports received [1-9]", done.stdout)
