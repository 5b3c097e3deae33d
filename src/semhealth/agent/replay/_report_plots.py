"""The replay report's plots, drawn with matplotlib (the ``report`` extra) straight to SVG
text: no pyplot, so no global figure state and no GUI or raster backend. Each function returns
the SVG to inline, or ``None`` when there is nothing to draw, so the page can say "no data"
instead of showing an empty axis.

The SVG is made deterministic (fixed hash salt, no date in its metadata) and every id in it
is prefixed with the plot's name, so several plots can share one HTML page.
"""

from __future__ import annotations

import io
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from semhealth.agent.replay._report_stats import AlertSeries, route_order
from semhealth.agent.replay.results import RecordResult

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

# At most this many routes get their own colour and row; the rest are drawn as "other".
MAX_PLOTTED_ROUTES = 8
OTHER = "other"
# Scatter points drawn per time plot; past it every k-th point of a route is drawn (the
# median line still uses all of them), which keeps the page light at 10,000 records.
MAX_SCATTER_POINTS = 3000
TIME_BINS = 48

_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
)  # tab10 without red and grey, which mean "below threshold" and "other"
_OTHER_COLOUR = "#7f7f7f"
_BELOW = "#d62728"
_ABOVE = "#1f77b4"
_STATE_COLOURS = {"pending": "#f2b134", "firing": "#d62728"}
_RESOLVED = "#2ca02c"

_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",  # text stays text: small, selectable, escaped by matplotlib
    "font.size": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "timezone": "UTC",
}


@dataclass(frozen=True, slots=True)
class RouteGroups:
    """The routes drawn, in order, and which drawn name each record's route maps to."""

    names: tuple[str, ...]
    folded: int  # routes folded into "other"

    def of(self, route: str) -> str:
        return route if route in self.names else OTHER

    def colour(self, name: str) -> str:
        if name == OTHER:
            return _OTHER_COLOUR
        return _PALETTE[self.names.index(name) % len(_PALETTE)]


def route_groups(results: Sequence[RecordResult]) -> RouteGroups:
    routes = route_order(results)
    if len(routes) <= MAX_PLOTTED_ROUTES:
        return RouteGroups(tuple(routes), 0)
    kept = routes[: MAX_PLOTTED_ROUTES - 1]
    return RouteGroups((*kept, OTHER), len(routes) - len(kept))


MAX_LABEL = 48


def plain(text: str) -> str:
    """A label matplotlib shows as written (``$`` would start mathtext), cut to
    ``MAX_LABEL`` characters so one long route cannot squeeze the plot; tables keep it whole."""
    if len(text) > MAX_LABEL:
        text = text[: MAX_LABEL - 1] + "\u2026"
    return text.replace("$", r"\$")


_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'(xlink:href="#|href="#|url\(#)([^")]+)')
_SIZE = re.compile(r'^<svg([^>]*?) width="[^"]*" height="[^"]*"')


def to_svg(figure: Figure, name: str, label: str) -> str:
    """The figure as an inline ``<svg>`` element that scales to the page's width."""
    buffer = io.StringIO()
    with mpl.rc_context({"svg.hashsalt": f"semhealth-report-{name}"}):
        figure.savefig(
            buffer,
            format="svg",
            metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
        )
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = _ID.sub(lambda m: f'id="{name}-{m.group(1)}"', svg)
    svg = _REF.sub(lambda m: f"{m.group(1)}{name}-{m.group(2)}", svg)
    label_attr = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return _SIZE.sub(rf'<svg\1 class="plot" role="img" aria-label="{label_attr}"', svg, 1)


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _drawn(name: str, label: str, draw: Callable[[], Figure | None]) -> str | None:
    with mpl.rc_context():
        mpl.rcParams.update(_RC)
        figure = draw()
        return None if figure is None else to_svg(figure, name, label)


# --- relevance distributions ---------------------------------------------------------------

_RELEVANCE_BINS = tuple(i / 40 for i in range(41))


def _histogram(ax: Axes, values: np.ndarray, threshold: float) -> None:
    clipped = np.clip(values, 0.0, 1.0)
    below = clipped[clipped < threshold]
    above = clipped[clipped >= threshold]
    ax.hist([below, above], bins=_RELEVANCE_BINS, stacked=True, color=[_BELOW, _ABOVE])
    ax.axvline(threshold, color="#333333", linestyle="--", linewidth=1.0)
    share = len(below) / len(values)
    ax.text(
        0.01,
        0.95,
        f"n={len(values)}  below {threshold:g}: {share:.0%}",
        transform=ax.transAxes,
        va="top",
        fontsize=8,
    )
    ax.set_xlim(0.0, 1.0)


def _no_values(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#777777")
    ax.set_xlim(0.0, 1.0)
    ax.set_yticks([])


def _relevance_values(
    results: Sequence[RecordResult], groups: RouteGroups
) -> dict[tuple[str, str], np.ndarray]:
    values: dict[tuple[str, str], list[float]] = {}
    for result in results:
        name = groups.of(result.route)
        for signal, value in (
            ("context", result.context_relevance),
            ("answer", result.answer_relevance),
        ):
            if value is not None:
                values.setdefault((name, signal), []).append(value)
    return {key: np.asarray(vals, dtype=np.float64) for key, vals in values.items()}


def relevance_plot(results: Sequence[RecordResult], threshold: float) -> str | None:
    """Context and answer relevance histograms per route, bars under the threshold in red."""

    def draw() -> Figure | None:
        groups = route_groups(results)
        values = _relevance_values(results, groups)
        rows = [
            name
            for name in groups.names
            if (name, "context") in values or (name, "answer") in values
        ]
        if not rows:
            return None
        figure = _figure(9.0, 0.4 + 1.5 * len(rows))
        axes = figure.subplots(len(rows), 2, sharex=True, squeeze=False)
        for row, name in enumerate(rows):
            for col, signal in enumerate(("context", "answer")):
                ax = axes[row][col]
                data = values.get((name, signal))
                if data is None:
                    _no_values(ax)
                else:
                    _histogram(ax, data, threshold)
                if row == 0:
                    ax.set_title(f"{signal} relevance")
            axes[row][0].set_ylabel(plain(name), color=groups.colour(name))
        for ax in axes[-1]:
            ax.set_xlabel(f"calibrated score (dashed: threshold {threshold:g})")
        return figure

    return _drawn("relevance", "relevance score distributions by route", draw)


# --- signals over time ---------------------------------------------------------------------


def _stride(count: int, routes: int) -> int:
    per_route = max(200, MAX_SCATTER_POINTS // max(routes, 1))
    return max(1, -(-count // per_route))


def _binned_median(
    times: np.ndarray, values: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    index = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(edges) - 2)
    centres, medians = [], []
    for b in np.unique(index):
        centres.append((edges[b] + edges[b + 1]) / 2)
        medians.append(float(np.median(values[index == b])))
    return np.asarray(centres), np.asarray(medians)


def _as_dates(seconds: np.ndarray) -> np.ndarray:
    return (seconds * 1000.0).astype("datetime64[ms]")


def _date_number(seconds: float) -> float:
    return float(date2num(_as_dates(np.asarray([seconds]))[0]))  # type: ignore[no-untyped-call]


def _date_axis(ax: Axes) -> None:
    locator = AutoDateLocator()  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]


def _clip_outliers(ax: Axes, all_values: np.ndarray) -> None:
    """One far outlier would flatten every other point: past 4x the p99 the axis stops at
    1.2x the p99 and says how many points it leaves out."""
    p99 = float(np.quantile(all_values, 0.99))
    if p99 > 0 and float(all_values.max()) > 4 * p99:
        ax.set_ylim(0, 1.2 * p99)
        hidden = int(np.count_nonzero(all_values > 1.2 * p99))
        ax.text(
            0.99,
            0.98,
            f"{hidden} points above the axis",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            color="#555555",
        )


Points = dict[str, tuple[np.ndarray, np.ndarray]]


def _points(
    results: Sequence[RecordResult],
    pick: Callable[[RecordResult], float | None],
    scale: float,
    groups: RouteGroups,
) -> Points:
    """(times, values) per drawn route, for the records that have the value."""
    collected: dict[str, tuple[list[float], list[float]]] = {}
    for result in results:
        value = pick(result)
        if value is not None and math.isfinite(value):
            times, values = collected.setdefault(groups.of(result.route), ([], []))
            times.append(result.time)
            values.append(value * scale)
    return {
        route: (np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.float64))
        for route, (times, values) in collected.items()
    }


def _draw_route(
    ax: Axes,
    times: np.ndarray,
    values: np.ndarray,
    step: int,
    colour: str,
    label: str,
    edges: np.ndarray,
) -> None:
    ax.scatter(
        _as_dates(times[::step]), values[::step], s=6, alpha=0.35, color=colour, linewidths=0
    )
    centres, medians = _binned_median(times, values, edges)
    ax.plot(_as_dates(centres), medians, color=colour, linewidth=1.5, label=plain(label))


def time_plot(
    results: Sequence[RecordResult],
    pick: Callable[[RecordResult], float | None],
    *,
    name: str,
    ylabel: str,
    scale: float,
    threshold: float | None = None,
) -> str | None:
    """One signal over the replayed span: a point per record (thinned past
    ``MAX_SCATTER_POINTS``) and a line through each route's median per time bin."""

    def draw() -> Figure | None:
        groups = route_groups(results)
        points = _points(results, pick, scale, groups)
        if not points:
            return None
        figure = _figure(9.0, 3.2)
        ax = figure.subplots()
        every = np.concatenate([times for times, _ in points.values()])
        edges = np.linspace(every.min(), every.max() + 1e-9, TIME_BINS + 1)
        steps = {route: _stride(len(times), len(points)) for route, (times, _) in points.items()}
        for route in (r for r in groups.names if r in points):
            times, values = points[route]
            _draw_route(
                ax,
                times,
                values,
                steps[route],
                groups.colour(route),
                f"{route} (n={len(times)})",
                edges,
            )
        _clip_outliers(ax, np.concatenate([values for _, values in points.values()]))
        if threshold is not None:
            ax.axhline(
                threshold,
                color="#333333",
                linestyle="--",
                linewidth=1.0,
                label=f"threshold {threshold:g}",
            )
        _date_axis(ax)
        ax.set_ylabel(ylabel)
        thinned = any(step > 1 for step in steps.values())
        ax.set_xlabel(
            "time (UTC); lines: median per time bin"
            + ("; points thinned to every k-th record" if thinned else "")
        )
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        return figure

    return _drawn(name, f"{ylabel} by route over time", draw)


# --- validity failures ---------------------------------------------------------------------

MAX_REASONS = 15


def validity_plot(failures: dict[str, Counter[str]], results: Sequence[RecordResult]) -> str | None:
    """Failed structured outputs by ``result: reason``, bars stacked by route."""

    def draw() -> Figure | None:
        if not failures:
            return None
        groups = route_groups(results)
        reasons = sorted(failures, key=lambda key: (-sum(failures[key].values()), key))
        shown = reasons[:MAX_REASONS]
        more = (
            f" (the {len(shown)} most frequent of {len(reasons)})"
            if len(reasons) > len(shown)
            else ""
        )
        reasons = shown
        figure = _figure(9.0, 0.9 + 0.32 * len(reasons))
        ax = figure.subplots()
        y = np.arange(len(reasons))
        left = np.zeros(len(reasons))
        for route in groups.names:
            counts = np.asarray(
                [
                    sum(n for r, n in failures[key].items() if groups.of(r) == route)
                    for key in reasons
                ],
                dtype=float,
            )
            if counts.any():
                ax.barh(y, counts, left=left, color=groups.colour(route), label=plain(route))
                left += counts
        for i, total in enumerate(left):
            ax.text(total, i, f" {int(total)}", va="center", fontsize=8)
        ax.set_yticks(y, [plain(key) for key in reasons])
        ax.invert_yaxis()
        ax.set_xlabel("failed structured outputs" + more)
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower right", fontsize=8, frameon=False)
        return figure

    return _drawn("validity", "validity failures by reason", draw)


# --- alert timeline ------------------------------------------------------------------------

MAX_ALERT_ROWS = 40


def alerts_plot(series: Sequence[AlertSeries], span: tuple[float, float] | None) -> str | None:
    """One row per alert series: amber while pending, red while firing, a tick where it
    resolved."""

    def draw() -> Figure | None:
        if not series or span is None:
            return None
        # Past the limit, the alerts that fired come first: they are what the page is for.
        rows = sorted(series, key=lambda one: not one.fired)[:MAX_ALERT_ROWS]
        figure = _figure(9.0, 0.8 + 0.3 * len(rows))
        ax = figure.subplots()
        for i, one in enumerate(rows):
            for band in one.bands:
                width = max(band.end - band.start, 1.0) / 86400.0  # date units are days
                ax.broken_barh(
                    [(_date_number(band.start), width)],
                    (i - 0.35, 0.7),
                    color=_STATE_COLOURS.get(band.state, _OTHER_COLOUR),
                )
            if one.resolved_at:
                ax.plot(
                    [_date_number(t) for t in one.resolved_at],
                    [i] * len(one.resolved_at),
                    marker="|",
                    color=_RESOLVED,
                    markersize=12,
                    linestyle="none",
                )
        ax.set_yticks(np.arange(len(rows)), [plain(one.name) for one in rows])
        ax.invert_yaxis()
        pad = max((span[1] - span[0]) * 0.01, 1.0)
        ax.set_xlim(_date_number(span[0] - pad), _date_number(span[1] + pad))
        _date_axis(ax)
        shown = f"; {len(rows)} of {len(series)} alerts shown" if len(rows) < len(series) else ""
        ax.set_xlabel("time (UTC)" + shown)
        ax.legend(
            handles=[
                Patch(color=_STATE_COLOURS["pending"], label="pending"),
                Patch(color=_STATE_COLOURS["firing"], label="firing"),
                Line2D(
                    [],
                    [],
                    marker="|",
                    color=_RESOLVED,
                    linestyle="none",
                    markersize=10,
                    label="resolved",
                ),
            ],
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            ncols=3,
            fontsize=8,
            frameon=False,
        )
        ax.grid(axis="y", visible=False)
        return figure

    return _drawn("alerts", "alert timeline", draw)
