"""The replay report's HTML: the page around the plots, its tables and its inline CSS.
Every value that came from the input (file names, routes, labels, errors) goes through
``html.escape``; the page loads nothing and runs no script.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from semhealth.agent.replay._report_stats import AlertSeries, RouteSummary
from semhealth.agent.replay.results import InputProblem, ReplayRun

MAX_PROBLEMS_SHOWN = 1000
NO_DATA = "no data"
MISSING = "\u2013"  # an en dash: no value to show

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;
 background:#fafafa;margin:0}
main{max-width:1100px;margin:0 auto;padding:16px 24px 48px;background:#fff}
h1{font-size:1.6em;margin:.4em 0 .1em}
h2{font-size:1.2em;margin:1.6em 0 .4em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.generated,.note{color:#666;font-size:.9em;margin:.2em 0 .6em}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:8px;
 margin:12px 0}
.fact{background:#f3f5f8;border-radius:6px;padding:8px 12px}
.fact b{display:block;font-size:1.3em}
.fact span{color:#555;font-size:.85em}
.warn b{color:#b42318}
ul.files{margin:.2em 0;padding-left:1.2em;font-family:ui-monospace,monospace;font-size:.85em}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:.88em;width:100%}
th,td{padding:4px 6px;text-align:right;border-bottom:1px solid #eee;white-space:nowrap}
th{white-space:normal;vertical-align:bottom}
th:first-child,td:first-child,th.text,td.text{text-align:left}
td.text{white-space:normal}
thead th{background:#f3f5f8}
tr.total td{font-weight:600;border-top:2px solid #ccc}
svg.plot{display:block;width:100%;height:auto}
.nodata{color:#777;font-style:italic;border:1px dashed #ccc;padding:16px;text-align:center}
ol.problems{font-family:ui-monospace,monospace;font-size:.85em}
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def millis(seconds: float | None) -> str:
    if seconds is None:
        return MISSING
    ms = seconds * 1000.0
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def score(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}"


def rate(row: RouteSummary) -> str:
    share = row.validity_rate
    if share is None:
        return MISSING
    return f"{share:.1%} ({row.valid_outputs}/{row.outputs})"


def plot_or_no_data(svg: str | None, why_empty: str) -> str:
    if svg is None:
        return f'<p class="nodata">{NO_DATA}: {esc(why_empty)}</p>'
    return f'<div class="figure">{svg}</div>'


def section(anchor: str, title: str, note: str, body: str) -> str:
    note_html = f'<p class="note">{esc(note)}</p>' if note else ""
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>{note_html}{body}</section>'


def _fact(value: object, label: str, *, warn: bool = False) -> str:
    cls = "fact warn" if warn else "fact"
    return f'<div class="{cls}"><b>{esc(value)}</b><span>{esc(label)}</span></div>'


def overview(run: ReplayRun, span: tuple[float, float] | None, fired: int) -> str:
    """The header: files, replayed span and the counts a reader checks first."""
    results = run.results
    sources = Counter(r.source for r in results)
    errors = sum(1 for r in results if r.error_type)
    scored = sum(1 for r in results if r.context_relevance is not None)
    skipped = Counter(r.relevance_skipped for r in results if r.relevance_skipped)
    span_text = f"{utc(span[0])} → {utc(span[1])}" if span else NO_DATA
    facts = [
        _fact(len(results), "records replayed"),
        _fact(", ".join(f"{n} {s}" for s, n in sources.most_common()) or "0", "by source"),
        _fact(errors, "records that ended in an error", warn=errors > 0),
        _fact(scored, "records with a context relevance score"),
        _fact(fired, "times an alert started firing", warn=fired > 0),
        _fact(len(run.problems), "input problems (lines not replayed)", warn=bool(run.problems)),
    ]
    skipped_text = ", ".join(f"{esc(k)}: {n}" for k, n in sorted(skipped.items()))
    files = "".join(f"<li>{esc(name)}</li>" for name in run.files)
    return (
        f'<section id="overview"><p><b>Replayed span:</b> {esc(span_text)}'
        + (f" ({esc(duration(span[1] - span[0]))})" if span else "")
        + f'</p><div class="facts">{"".join(facts)}</div>'
        + (f'<p class="note">Relevance not scored: {skipped_text}</p>' if skipped else "")
        + f'<p><b>Files ({len(run.files)}):</b></p><ul class="files">{files}</ul></section>'
    )


_SUMMARY_HEAD = (
    "route",
    "records",
    "errors",
    "validity rate",
    "context relevance p50",
    "p10",
    "answer relevance p50",
    "TTFT p50",
    "TTFT p95",
    "continuity p50",
    "stalls",
    "alerts fired",
)


def _summary_row(row: RouteSummary, *, total: bool) -> str:
    cells = (
        row.route,
        row.records,
        row.errors,
        rate(row),
        score(row.relevance_p50),
        score(row.relevance_p10),
        score(row.answer_relevance_p50),
        millis(row.ttft_p50_s),
        millis(row.ttft_p95_s),
        millis(row.continuity_p50_s),
        row.stalls,
        row.alerts_fired,
    )
    cls = ' class="total"' if total else ""
    return f"<tr{cls}>" + "".join(f"<td>{esc(cell)}</td>" for cell in cells) + "</tr>"


def _table(head: str, body: str) -> str:
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table}</div>'


def summary_table(rows: Sequence[RouteSummary]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in _SUMMARY_HEAD)
    body = "".join(_summary_row(row, total=i == len(rows) - 1) for i, row in enumerate(rows))
    return _table(head, body)


def _alert_row(one: AlertSeries) -> str:
    firing = [band for band in one.bands if band.state == "firing"]
    first = utc(firing[0].start)
    last = firing[-1]
    until = "still firing at the end" if last.open_end else utc(last.end)
    held = sum(band.end - band.start for band in firing)
    value = MISSING if one.fired_value is None else f"{one.fired_value:.4g}"
    labels = ", ".join(f"{k}={v}" for k, v in one.labels)
    cells = (one.rule, labels, first, until, len(firing), duration(held), value)
    return (
        "<tr>"
        + "".join(
            f'<td class="text">{esc(c)}</td>' if i < 2 else f"<td>{esc(c)}</td>"
            for i, c in enumerate(cells)
        )
        + "</tr>"
    )


def alerts_table(series: Iterable[AlertSeries]) -> str:
    fired = [one for one in series if one.fired]
    if not fired:
        return '<p class="note">No alert would have fired.</p>'
    head = '<th class="text">rule</th><th class="text">labels</th>' + "".join(
        f"<th>{h}</th>"
        for h in ("first fired", "last resolved", "times fired", "time firing", "value when fired")
    )
    body = "".join(_alert_row(one) for one in fired)
    return _table(head, body)


def problems_list(problems: Sequence[InputProblem]) -> str:
    if not problems:
        return '<p class="note">Every line of every file was replayed.</p>'
    shown = problems[:MAX_PROBLEMS_SHOWN]
    items = "".join(f"<li>{esc(p.source_file)}:{p.line}: {esc(p.error)}</li>" for p in shown)
    more = len(problems) - len(shown)
    tail = f'<p class="note">… and {more} more (see the replay\'s output).</p>' if more else ""
    return f'<ol class="problems">{items}</ol>{tail}'


def page(title: str, generated: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
        f"<body><main><h1>{esc(title)}</h1>\n"
        f'<p class="generated">{esc(generated)}</p>\n'
        f"{body}\n</main></body></html>\n"
    )
