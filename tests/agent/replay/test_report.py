"""The replay report as a document: it renders a realistic run with one SVG per plot, loads
nothing from anywhere, escapes every label, says "no data" where a plot has none, gives the
same bytes for the same run, and names the extra to install when matplotlib is missing."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from semhealth.agent.replay import _report_plots as plots
from semhealth.agent.replay import _report_stats as stats
from semhealth.agent.replay.report import render_report, write_report
from semhealth.agent.replay.results import AlertTransition, InputProblem, ReplayRun
from tests.agent.replay.report_runs import EVIL, START, empty_run, realistic_run

WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
PLOTS = ("relevance", "relevance-time", "continuity", "ttft", "validity", "alerts")


class Page(HTMLParser):
    """What a browser would see of the page: its elements, their attributes and the text
    inside each section (by section id)."""

    def __init__(self, document: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.section: str | None = None
        self.text: dict[str | None, list[str]] = {}
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.feed(document)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "section":
            self.section = dict(attrs).get("id")
        elif tag == "tr" and self.section == "routes":
            self.rows.append([])
        elif tag == "td" and self.section == "routes":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.setdefault(self.section, []).append(data)
        if self._cell is not None:
            self._cell.append(data)

    def count(self, tag: str) -> int:
        return sum(1 for name, _ in self.tags if name == tag)

    def all_text(self) -> str:
        return "".join(part for parts in self.text.values() for part in parts)

    def section_text(self, section: str) -> str:
        return "".join(self.text.get(section, []))

    def svgs(self) -> dict[str, str | None]:
        """Each plot's <svg>, by the section it sits in."""
        found: dict[str, str | None] = {}
        section = None
        for tag, attrs in self.tags:
            if tag == "section":
                section = attrs.get("id")
            elif tag == "svg" and section is not None:
                found[section] = attrs.get("aria-label")
        return found


def test_a_realistic_run_renders_every_plot_and_the_route_table(tmp_path: Path) -> None:
    run = realistic_run()
    path = tmp_path / "report.html"
    write_report(run, str(path), generated_at=WHEN)
    page = Page(path.read_text(encoding="utf-8"))

    assert page.count("svg") == len(PLOTS)
    assert sorted(page.svgs()) == sorted(PLOTS)
    assert "no data" not in page.all_text()
    # The table: one row per route, busiest first, then all routes; counts from the run.
    routes = Counter(r.route for r in run.results)
    names = [row[0] for row in page.rows if row]
    assert names == [*sorted(routes, key=lambda r: (-routes[r], r)), "all routes"]
    for row in page.rows[1:]:
        if row[0] != "all routes":
            assert int(row[1]) == routes[row[0]]
            errors = sum(1 for r in run.results if r.route == row[0] and r.error_type)
            assert int(row[2]) == errors
    # The validity rate of /extract, computed here from the records.
    outcomes = [k for r in run.results if r.route == "/extract" for k, _ in r.validity]
    extract = next(row for row in page.rows if row and row[0] == "/extract")
    assert (
        extract[3]
        == f"{outcomes.count('valid') / len(outcomes):.1%} ({outcomes.count('valid')}/{len(outcomes)})"
    )
    # Relevance p50 of /rag/search and alerts fired per route.
    rag = next(row for row in page.rows if row and row[0] == "/rag/search")
    values = [
        r.context_relevance
        for r in run.results
        if r.route == "/rag/search" and r.context_relevance is not None
    ]
    assert rag[4] == f"{np.quantile(values, 0.5):.2f}"
    assert rag[-1] == "1"
    # Header, alerts and problems say what happened.
    overview = page.section_text("overview")
    assert f"{len(run.results)}records replayed" in overview
    assert "2025-12-01 00:00:00 UTC → 2025-12-01 01:00:00 UTC" in overview
    assert "traffic.jsonl" in overview and "spans.otlp.json" in overview
    alerts = page.section_text("alerts")
    assert "ContextRelevanceLow" in alerts and "2025-12-01 00:24:00 UTC" in alerts
    assert "still firing at the end" in alerts  # OutputValidityLow never resolved
    assert "StreamChoppy" not in alerts.split("first fired")[1]  # pending only: not in the table
    problems = page.section_text("problems")
    for problem in run.problems:
        assert f"{problem.source_file}:{problem.line}: {problem.error}" in problems


def test_the_page_fetches_nothing_and_runs_nothing() -> None:
    document = render_report(realistic_run(), generated_at=WHEN)
    page = Page(document)
    assert page.count("script") == page.count("link") == page.count("img") == 0
    assert page.count("iframe") == page.count("object") == page.count("embed") == 0
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "srcset", "action", "poster"):
            value = attrs.get(name)
            assert value is None or value.startswith("#"), (tag, name, value)
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
    assert "@import" not in document and "url(http" not in document
    # Every in-page reference points at an id that exists, once.
    ids = Counter(attrs["id"] for _, attrs in page.tags if attrs.get("id"))
    refs = {v[1:] for _, a in page.tags for k, v in a.items() if k.endswith("href") and v}
    assert refs and all(ids[ref] == 1 for ref in refs)


def test_labels_from_the_input_are_escaped() -> None:
    hostile = '"><img src=x onerror=alert(1)>'
    run = realistic_run(300, extra_routes={EVIL: 2, "/price/$id/$total": 1})
    run = dataclasses.replace(
        run,
        files=(*run.files, "<b>bold</b>.jsonl"),
        alerts=(
            *run.alerts,
            AlertTransition(
                rule="OutputValidityLow",
                state="firing",
                time=START + 50 * 60,
                labels={"route": hostile},
            ),
        ),
        problems=(*run.problems, InputProblem(source_file="x.har", line=9, error=hostile)),
    )
    document = render_report(run, generated_at=WHEN)
    page = Page(document)
    assert page.count("script") == 0 and page.count("img") == 0
    all_text = page.all_text()
    # The hostile strings arrive as text, in the table, the plots' labels and the lists.
    assert EVIL in [row[0] for row in page.rows if row]
    assert "/price/$id/$total" in all_text  # "$" did not turn into mathtext
    assert all_text.count(EVIL) >= 3  # table, histogram row label, time plot legends
    assert hostile in page.section_text("alerts") and hostile in page.section_text("problems")
    assert "<b>bold</b>.jsonl" in page.section_text("overview")


def test_an_empty_run_says_no_data_for_every_plot() -> None:
    page = Page(render_report(empty_run(), generated_at=WHEN))
    assert page.count("svg") == 0
    for section in PLOTS:
        assert "no data" in page.section_text(section), section
    assert [row[:3] for row in page.rows if row] == [["all routes", "0", "0"]]
    assert "Replayed span: no data" in page.section_text("overview")
    assert "No alert would have fired." in page.section_text("alerts")


def test_a_plot_without_data_says_so_while_the_others_draw() -> None:
    # Only unstructured, unscored, unstreamed records: TTFT is the one signal present.
    run = realistic_run(200)
    bare = tuple(
        dataclasses.replace(
            r, validity=(), context_relevance=None, answer_relevance=None, continuity_index_s=None
        )
        for r in run.results
    )
    page = Page(render_report(dataclasses.replace(run, results=bare, alerts=()), generated_at=WHEN))
    assert sorted(page.svgs()) == ["ttft"]
    for section in ("relevance", "relevance-time", "continuity", "validity", "alerts"):
        assert "no data" in page.section_text(section)


def test_the_same_run_gives_the_same_page_but_for_one_line() -> None:
    first = render_report(realistic_run(400), generated_at=WHEN)
    assert render_report(realistic_run(400), generated_at=WHEN) == first
    later = render_report(realistic_run(400), generated_at=datetime(2027, 1, 1, tzinfo=UTC))
    changed = [
        (a, b) for a, b in zip(first.splitlines(), later.splitlines(), strict=True) if a != b
    ]
    assert len(changed) == 1 and "Generated 2027-01-01 00:00:00 UTC" in changed[0][1]


def test_many_routes_fold_into_other_in_plots_but_not_in_the_table() -> None:
    extra = {f"/tenant/{i}": 1 for i in range(12)}
    run = realistic_run(900, extra_routes=extra)
    page = Page(render_report(run, generated_at=WHEN))
    routes = {r.route for r in run.results}
    assert len([row for row in page.rows if row]) == len(routes) + 1
    groups = plots.route_groups(run.results)
    assert len(groups.names) == plots.MAX_PLOTTED_ROUTES and groups.names[-1] == plots.OTHER
    assert groups.folded == len(routes) - (plots.MAX_PLOTTED_ROUTES - 1)
    assert "other (n=" in page.section_text("ttft")


def test_alert_transitions_become_bands() -> None:
    run = realistic_run(50)
    series = {one.rule: one for one in stats.alert_series(run)}
    relevance = series["ContextRelevanceLow"]
    assert [(b.state, b.start - START, b.end - START, b.open_end) for b in relevance.bands] == [
        ("pending", 22 * 60, 24 * 60, False),
        ("firing", 24 * 60, 38 * 60, False),
    ]
    assert relevance.resolved_at == (START + 38 * 60,) and relevance.fired_value == 0.59
    validity = series["OutputValidityLow"]
    assert validity.bands[-1].state == "firing" and validity.bands[-1].open_end
    assert validity.bands[-1].end == run.end
    assert not series["StreamChoppy"].fired
    assert relevance.name == "ContextRelevanceLow{model=gpt-4o-mini, route=/rag/search}"


def test_validity_failures_count_each_reason() -> None:
    run = realistic_run()
    failures = stats.validity_failures(run.results)
    both = sum(1 for r in run.results for k, why in r.validity if why == ("required", "type"))
    only = sum(1 for r in run.results for k, why in r.validity if why == ("required",))
    assert sum(failures["schema: required"].values()) == both + only
    assert sum(failures["schema: type"].values()) == both
    assert "valid" not in " ".join(failures)


def test_ten_thousand_records_render_with_thinned_points(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = realistic_run(10_000)
    began = time.perf_counter()
    document = render_report(run, generated_at=WHEN)
    took = time.perf_counter() - began
    with capsys.disabled():
        print(f"\nreport of {len(run.results)} records: {took:.2f} s, {len(document) / 1e6:.2f} MB")
    page = Page(document)
    assert page.count("svg") == len(PLOTS)
    # Each time plot draws at most MAX_SCATTER_POINTS points (plus one per legend entry),
    # while its legend still counts every record.
    for section in ("continuity", "ttft", "relevance-time"):
        body = document.split(f'<section id="{section}">')[1].split("</section>")[0]
        assert body.count("<use ") <= plots.MAX_SCATTER_POINTS + 200
    chat = sum(1 for r in run.results if r.route == "/v1/chat" and r.ttft_s is not None)
    assert f"/v1/chat (n={chat})" in page.section_text("ttft")


_WITHOUT_MATPLOTLIB = """
import sys

class _HideMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _HideMatplotlib())

from semhealth.agent.replay.report import (
    ReportUnavailableError, require_report_extra, write_report)
from semhealth.agent.replay.results import ReplayRun

try:
    require_report_extra()
except ReportUnavailableError as exc:
    print("early:", exc)
try:
    write_report(ReplayRun(files=(), results=(), alerts=(), problems=()), sys.argv[1])
except ReportUnavailableError as exc:
    print(exc)
    sys.exit(3)
"""


def test_without_matplotlib_the_error_names_the_extra(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    # A fresh interpreter: this one has matplotlib loaded already.
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_MATPLOTLIB, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    assert "pip install 'semhealth[report]'" in result.stdout
    assert result.stdout.startswith("early: ")  # the replay can check before it starts
    assert "matplotlib" in result.stdout
    assert not target.exists()


def test_percentiles_skip_missing_values() -> None:
    # Eleven /extract records with a TTFT of 0.1, 0.2, ... 1.1 s, the rest without one: with
    # linear interpolation the p50 is the sixth (0.6 s) and the p95 lies halfway between the
    # tenth and the eleventh (1.05 s); a missing value counted as anything would move both.
    base = realistic_run(300)
    extract = [i for i, r in enumerate(base.results) if r.route == "/extract"]
    ttft = {index: 0.1 * (n + 1) if n < 11 else None for n, index in enumerate(extract)}
    results = tuple(
        dataclasses.replace(r, ttft_s=ttft[i]) if i in ttft else r
        for i, r in enumerate(base.results)
    )
    assert len(extract) > 11
    run = dataclasses.replace(base, results=results)
    rows = {row.route: row for row in stats.route_summaries(run)}
    assert rows["/extract"].relevance_p50 is None and rows["/extract"].relevance_p10 is None
    assert rows["/extract"].ttft_p50_s == pytest.approx(0.6)
    assert rows["/extract"].ttft_p95_s == pytest.approx(1.05)
    assert rows[stats.ALL_ROUTES].records == len(run.results)
    assert rows[stats.ALL_ROUTES].alerts_fired == 2
    assert ReplayRun(files=(), results=(), alerts=(), problems=()).threshold == 0.75


def test_non_finite_values_and_long_labels_do_not_spoil_the_page() -> None:
    long_route = "/v1/" + "very-long-route-segment/" * 8
    run = realistic_run(300, extra_routes={long_route: 1})
    spoiled = tuple(
        dataclasses.replace(r, ttft_s=float("nan"), continuity_index_s=float("inf"))
        if i % 7 == 0
        else r
        for i, r in enumerate(run.results)
    )
    run = dataclasses.replace(run, results=spoiled)
    page = Page(render_report(run, generated_at=WHEN))
    table = page.section_text("routes")
    assert "nan" not in table and "inf" not in table
    assert long_route in [row[0] for row in page.rows if row]  # the table keeps it whole
    ttft = page.section_text("ttft")
    assert long_route not in ttft and long_route[: plots.MAX_LABEL - 1] + "\u2026" in ttft
    finite = [
        r.ttft_s
        for r in spoiled
        if r.route == "/v1/chat" and r.ttft_s == r.ttft_s and r.ttft_s is not None
    ]
    assert f"/v1/chat (n={len(finite)})" in ttft


def test_past_the_limits_the_plots_say_how_much_they_show() -> None:
    run = realistic_run(200)
    reasons = tuple(("schema", (f"keyword{i}",)) for i in range(plots.MAX_REASONS + 5))
    failing = dataclasses.replace(run.results[0], validity=reasons)
    many_alerts = tuple(
        AlertTransition(
            rule="StreamChoppy", state="pending", time=START + i, labels={"route": f"/r{i}"}
        )
        for i in range(plots.MAX_ALERT_ROWS + 10)
    )
    run = dataclasses.replace(
        run, results=(failing, *run.results[1:]), alerts=run.alerts + many_alerts
    )
    page = Page(render_report(run, generated_at=WHEN))
    validity = page.section_text("validity")
    kinds = len(stats.validity_failures(run.results))
    assert kinds >= plots.MAX_REASONS + 5
    assert f"the {plots.MAX_REASONS} most frequent of {kinds}" in validity
    alerts = page.section_text("alerts")
    total = len(stats.alert_series(run))
    assert f"{plots.MAX_ALERT_ROWS} of {total} alerts shown" in alerts
    assert "ContextRelevanceLow{" in alerts  # the ones that fired are kept
