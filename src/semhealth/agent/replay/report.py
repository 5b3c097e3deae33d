"""The HTML report of ``semhealth replay --report FILE``: one self-contained page (inline CSS,
plots as inline SVG, no script, nothing fetched) that shows what a replay found: relevance
against the threshold, continuity and TTFT over time by route, validity failures by reason,
the alerts that would have fired, a table per route and the input lines that could not be
replayed. It holds numbers and bounded labels only, as ``ReplayRun`` does.

The plots need matplotlib, the ``report`` extra; without it ``write_report`` raises
``ReportUnavailableError`` saying how to install it. The same run gives the same bytes,
except the one line that says when the page was generated.
"""

from __future__ import annotations

import importlib
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from semhealth.agent.errors import SemhealthError
from semhealth.agent.replay import _report_html as page
from semhealth.agent.replay import _report_stats as stats
from semhealth.agent.replay.results import ReplayRun

INSTALL_HINT = "pip install 'semhealth[report]'"
TITLE = "semhealth replay report"


class ReportUnavailableError(SemhealthError):
    """The report cannot be drawn here: its optional dependencies are not installed."""


def require_report_extra() -> None:
    """Raise ``ReportUnavailableError`` now if the report could not be drawn: the replay
    calls this before it starts, so a long replay does not end in this error."""
    _plots()


def _plots() -> ModuleType:
    try:
        return importlib.import_module("semhealth.agent.replay._report_plots")
    except ImportError as exc:
        raise ReportUnavailableError(
            f"the HTML report draws its plots with matplotlib, which is not installed "
            f"({exc.name or exc}); install the report extra: {INSTALL_HINT}"
        ) from exc


def _figures(run: ReplayRun, plots: ModuleType, span: tuple[float, float] | None) -> str:
    threshold = run.threshold
    results = run.results
    series = stats.alert_series(run)
    continuity = plots.time_plot(
        results,
        lambda r: r.continuity_index_s,
        name="continuity",
        ylabel="continuity index (ms)",
        scale=1000.0,
    )
    relevance = plots.time_plot(
        results,
        lambda r: r.context_relevance,
        name="relevance-time",
        ylabel="context relevance",
        scale=1.0,
        threshold=threshold,
    )
    ttft = plots.time_plot(
        results, lambda r: r.ttft_s, name="ttft", ylabel="time to first token (ms)", scale=1000.0
    )
    parts = (
        page.section(
            "relevance",
            "Relevance against the threshold",
            f"Calibrated scores per route; bars under {threshold:g} (the context-relevance "
            "alert's threshold) are red. Answer relevance is shown against the same line.",
            page.plot_or_no_data(
                plots.relevance_plot(results, threshold), "no record had a relevance score"
            ),
        ),
        page.section(
            "relevance-time",
            "Context relevance over time",
            "A dip that lasts is what the context-relevance alert pages on.",
            page.plot_or_no_data(relevance, "no record had a context relevance score"),
        ),
        page.section(
            "continuity",
            "Stream continuity over time",
            "Standard deviation of the gaps between content deltas, per stream.",
            page.plot_or_no_data(continuity, "no streamed record with timed chunks"),
        ),
        page.section(
            "ttft",
            "Time to first token over time",
            "",
            page.plot_or_no_data(ttft, "no record with a time to first token"),
        ),
        page.section(
            "validity",
            "Validity failures by reason",
            "Structured outputs that failed, by result and reason, stacked by route.",
            page.plot_or_no_data(
                plots.validity_plot(stats.validity_failures(results), results),
                "no structured output failed",
            ),
        ),
        page.section(
            "alerts",
            "Alerts over the replayed span",
            "What the alert rules would have done: pending, firing and resolved, per rule "
            "and labels.",
            page.plot_or_no_data(plots.alerts_plot(series, span), "no alert changed state")
            + page.alerts_table(series),
        ),
    )
    return "\n".join(parts)


def render_report(run: ReplayRun, *, generated_at: datetime | None = None) -> str:
    """The report as an HTML document."""
    plots = _plots()
    span = stats.span_of(run)
    rows = stats.route_summaries(run)
    generated = (generated_at or datetime.now(UTC)).astimezone(UTC)
    body = "\n".join(
        (
            page.overview(run, span, rows[-1].alerts_fired),
            page.section(
                "routes",
                "Routes",
                "Percentiles over the records that gave the value; a dash where none did.",
                page.summary_table(rows),
            ),
            _figures(run, plots, span),
            page.section(
                "problems",
                f"Input problems ({len(run.problems)})",
                "file:line: why it was not replayed",
                page.problems_list(run.problems),
            ),
        )
    )
    stamp = f"Generated {generated.strftime('%Y-%m-%d %H:%M:%S UTC')} by semhealth replay"
    return page.page(TITLE, stamp, body)


def write_report(run: ReplayRun, path: str, *, generated_at: datetime | None = None) -> None:
    """Write the report to ``path`` (UTF-8). The page is rendered before the file is opened,
    so a missing extra (``ReportUnavailableError``) leaves ``path`` untouched."""
    document = render_report(run, generated_at=generated_at)
    Path(path).write_text(document, encoding="utf-8")
