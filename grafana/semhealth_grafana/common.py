"""What every semhealth dashboard shares: variables, selectors, thresholds and panel builders.

Thresholds and runbook links come from the alert rules the agent ships
(``semhealth.alerts.load_rules()``), so a changed default changes the dashboards on the next
``python3 grafana/generate.py`` and the regeneration test says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from semhealth.alerts import Rule, Thresholds, load_rules
from semhealth.collectors.config import Analysis

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "semhealth"
RATE = "$__rate_interval"

# Label matchers. The semantic-health metrics carry route, model and provider (the wire
# format, e.g. bedrock_converse); the GenAI conventions' metrics name the model
# gen_ai_request_model and carry the same provider label; the agent's own metrics carry none.
# The namespace (and pod) label is the one Prometheus adds from the ServiceMonitor/PodMonitor.
NAMESPACE = 'namespace=~"$namespace"'
ROUTE = f'{NAMESPACE}, route=~"$route"'
PROVIDER = 'provider=~"$provider"'
SEMANTIC = f'{ROUTE}, model=~"$model", {PROVIDER}'
GEN_AI = f'{ROUTE}, gen_ai_request_model=~"$model", {PROVIDER}'

GREEN = "green"
ORANGE = "orange"
RED = "red"

STALL_THRESHOLD_S = Analysis().stall_threshold_s  # analysis.stall_threshold_s, default


# --------------------------------------------------------------------------- alert rules


@dataclass(frozen=True)
class AlertRef:
    """What a panel takes from one default alert rule."""

    name: str
    threshold: float | dict[str, float]
    window: str  # the rule's window as a PromQL duration, e.g. "5m"
    runbook_url: str


def rate_query(metric: str, selector: str, by: str = "", window: str = RATE) -> str:
    """The per-second rate of a counter, summed (by ``by`` when given)."""
    group = f"sum by ({by}) " if by else "sum"
    return f"{group}(rate({metric}{{{selector}}}[{window}]))"


def quantile_query(q: float, metric: str, selector: str, by: str = "", window: str = RATE) -> str:
    """Quantile ``q`` of a histogram, over its buckets' rates summed by ``le`` (and ``by``)."""
    labels = f"le, {by}" if by else "le"
    return (
        f"histogram_quantile({q}, sum by ({labels}) "
        f"(rate({metric}_bucket{{{selector}}}[{window}])))"
    )


def _duration(seconds: float) -> str:
    if seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds)}s"


def _alert(rule: Rule) -> AlertRef:
    threshold: float | dict[str, float]
    if isinstance(rule.threshold, Thresholds):
        threshold = dict(rule.threshold.values)
    else:
        threshold = float(rule.threshold)
    return AlertRef(
        name=rule.name,
        threshold=threshold,
        window=_duration(rule.window_s),
        runbook_url=rule.annotations["runbook_url"],
    )


ALERTS: dict[str, AlertRef] = {rule.name: _alert(rule) for rule in load_rules()}


def alert(name: str) -> AlertRef:
    return ALERTS[name]


def scalar_threshold(name: str) -> float:
    threshold = ALERTS[name].threshold
    assert isinstance(threshold, float), f"{name} has a threshold per label"
    return threshold


# --------------------------------------------------------------------------- variables


def variables(*, route_and_model: bool) -> list[cogbuilder.Builder[model.VariableModel]]:
    """Datasource and namespace always; route, model and provider where the metrics carry
    them.

    Every query variable is multi-select with an "All" of ``.*``, so an unset label (no
    namespace outside Kubernetes) still matches.
    """
    out: list[cogbuilder.Builder[model.VariableModel]] = [
        dash.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        _query_variable(
            "namespace", "Namespace", "label_values(semhealth_records_total, namespace)"
        ),
    ]
    if route_and_model:
        out.append(
            _query_variable(
                "route",
                "Route",
                f"label_values(semantic_health_requests_total{{{NAMESPACE}}}, route)",
            )
        )
        out.append(
            _query_variable(
                "model",
                "Model",
                f"label_values(semantic_health_requests_total{{{ROUTE}}}, model)",
            )
        )
        out.append(
            _query_variable(
                "provider",
                "Provider",
                f"label_values(semantic_health_requests_total{{{ROUTE}}}, provider)",
            )
        )
    return out


def _query_variable(name: str, label: str, query: str) -> dash.QueryVariable:
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(selected=True, text="All", value="$__all"))
    )


def dashboard(uid: str, title: str, description: str) -> dash.Dashboard:
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .link(
            dash.DashboardLink("semhealth")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


# --------------------------------------------------------------------------- panels


def query(expr: str, legend: str, ref_id: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).range()


def steps(*pairs: tuple[float | None, str]) -> dash.ThresholdsConfig:
    """Absolute threshold steps; the first value is None (the base)."""
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in pairs])
    )


def below_is_bad(threshold: float) -> dash.ThresholdsConfig:
    return steps((None, RED), (threshold, GREEN))


def above_is_bad(threshold: float) -> dash.ThresholdsConfig:
    return steps((None, GREEN), (threshold, RED))


# A rate that should be zero: anything above this (one event in ~11 days) is coloured.
ANY = 1e-6


def any_is_bad(color: str = ORANGE) -> dash.ThresholdsConfig:
    """For counts that should stay at zero: green at 0, ``color`` above."""
    return steps((None, GREEN), (ANY, color))


def runbook(ref: AlertRef) -> dash.DashboardLink:
    return (
        dash.DashboardLink(f"Runbook: {ref.name}")
        .type(model.DashboardLinkType.LINK)
        .url(ref.runbook_url)
        .target_blank(True)
    )


Target = tuple[str, str]  # (PromQL, legend)


def _targets(targets: list[Target]) -> list[cogbuilder.Builder[variants.Dataquery]]:
    return [query(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)]


def series(
    title: str,
    description: str,
    targets: list[Target],
    *,
    unit: str,
    thresholds: dash.ThresholdsConfig,
    width: int = 12,
    height: int = 8,
    links: list[cogbuilder.Builder[model.DashboardLink]] | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
    stacked: bool = False,
    colors: dict[str, str] | None = None,
    red_series: str | None = None,
) -> timeseries.Panel:
    """A time series with the thresholds drawn as dashed lines; ``colors`` fixes the colour
    of the series with that exact name (legend); the series ``red_series`` (a regex) matches
    get thresholds of their own: green at zero, red above."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(targets))
        .unit(unit)
        .thresholds(thresholds)
        .thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
        )
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
        .fill_opacity(10)
        .span(width)
        .height(height)
    )
    if stacked:
        panel = panel.stacking(
            common_builders.StackingConfig().mode(common.StackingMode.NORMAL)
        ).fill_opacity(60)
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if links:
        panel = panel.links(links)
    if red_series is not None:
        panel = panel.override_by_regexp(
            red_series,
            [model.DynamicConfigValue(id_val="thresholds", value=any_is_bad(RED).build())],
        )
    for name, color in (colors or {}).items():
        panel = panel.override_by_name(
            name,
            [
                model.DynamicConfigValue(
                    id_val="color", value={"mode": "fixed", "fixedColor": color}
                )
            ],
        )
    return panel


def single(
    title: str,
    description: str,
    targets: list[Target],
    *,
    unit: str,
    thresholds: dash.ThresholdsConfig,
    width: int = 6,
    height: int = 5,
    links: list[cogbuilder.Builder[model.DashboardLink]] | None = None,
    decimals: float | None = None,
) -> stat.Panel:
    """One number per series, coloured by the thresholds, with its recent trend."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(targets))
        .unit(unit)
        .thresholds(thresholds)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .span(width)
        .height(height)
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    if links:
        panel = panel.links(links)
    return panel


def row(title: str) -> dash.Row:
    return dash.Row(title)
