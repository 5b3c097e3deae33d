"""The replay report in a real browser: Debian's headless Chromium opens it from disk, logs no
console message, makes no network request, builds a DOM holding every plot's SVG, and paints
a screenshot that shows them (the plots' red and blue bars are on it).

Each check is first shown to catch what it looks for, on a page made to fail it: a script
error and a fetched image. Skipped without Chromium, failed instead under
``REQUIRE_REAL_SERVERS=1``.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from semhealth.agent.replay.report import write_report
from tests.agent.replay.report_runs import realistic_run
from tests.agent.replay.test_report import PLOTS, Page
from tests.servers import require_binary

WIDTH, HEIGHT = 1280, 2400
# Quiet the browser's own traffic (updates, sync, spell-check), so every request left in
# its NetLog is one the page made; the resolver rule fails any that still try.
_QUIET = (
    "--headless",
    "--disable-gpu",
    "--no-sandbox",  # CI runs as root
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND",
)


@dataclass(frozen=True)
class Visit:
    console: list[str]  # the page's console messages (script errors land here too)
    requests: list[str]  # URLs the page itself asked the network for
    screenshot: Path


@pytest.fixture
def chromium() -> str:
    return require_binary("chromium", "chromium")


def _page_requests(netlog: Path) -> list[str]:
    """URLs requested on behalf of a page loaded from file://: the browser's own requests
    have no file:// network isolation key."""
    log = json.loads(netlog.read_text(encoding="utf-8"))
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        event["params"]["url"]
        for event in log["events"]
        if event["type"] == start_job
        and "file://" in event.get("params", {}).get("network_isolation_key", "")
    ]


def visit(chromium: str, page: Path, work: Path) -> Visit:
    """Open ``page`` in headless Chromium; screenshot it, keep its console and NetLog."""
    shot, netlog = work / "shot.png", work / "netlog.json"
    result = subprocess.run(
        [
            chromium,
            *_QUIET,
            f"--user-data-dir={work / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            f"--log-net-log={netlog}",
            f"--screenshot={shot}",
            f"--window-size={WIDTH},{HEIGHT}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return Visit(console, _page_requests(netlog), shot)


def dump_dom(chromium: str, page: Path, work: Path) -> str:
    result = subprocess.run(
        [chromium, *_QUIET, f"--user-data-dir={work / 'profile-dom'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def _pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16).reshape(-1, 3)


def _share_near(pixels: np.ndarray, colour: tuple[int, int, int]) -> float:
    """Share of pixels within a few levels of ``colour`` (bar interiors are flat colour)."""
    return float(np.all(np.abs(pixels - np.asarray(colour)) <= 6, axis=1).mean())


def test_the_checks_catch_a_script_error_and_a_fetch(chromium: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><img src="https://example.com/x.png">'
        "<script>notDefined()</script></body></html>",
        encoding="utf-8",
    )
    seen = visit(chromium, bad, tmp_path)
    assert any("notDefined" in line for line in seen.console)
    assert seen.requests == ["https://example.com/x.png"]


def test_the_report_opens_cleanly_and_shows_its_plots(chromium: str, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    write_report(realistic_run(), str(report), generated_at=datetime(2026, 1, 1, tzinfo=UTC))

    seen = visit(chromium, report, tmp_path)
    assert seen.console == []
    assert seen.requests == []

    dom = Page(dump_dom(chromium, report, tmp_path))
    assert sorted(dom.svgs()) == sorted(PLOTS)  # the parsed DOM holds every plot
    assert "semhealth replay report" in dom.all_text()

    image = Image.open(seen.screenshot)
    assert image.size == (WIDTH, HEIGHT)
    pixels = _pixels(image)
    assert len(np.unique(pixels, axis=0)) > 200  # text, tables and plots, not a blank page
    assert _share_near(pixels, (255, 255, 255)) < 0.9
    # The relevance histograms sit in the first screen: red under the threshold, blue over.
    assert _share_near(pixels, (0xD6, 0x27, 0x28)) > 0.002
    assert _share_near(pixels, (0x1F, 0x77, 0xB4)) > 0.002
