"""Every panel query is valid PromQL once Grafana has put the variables in, for "All" and for
a selection of values; it uses only variables its dashboard defines, and it filters by every
variable the metric's labels allow (the label table is the agent's own, ``metrics.SPECS``)."""

from __future__ import annotations

import promql_parser
import pytest

from semhealth.agent.telemetry import instruments as metrics
from tests.grafana.dashboards import (
    BUILTINS,
    Query,
    committed,
    multi,
    queries,
    substitute,
    used_variables,
    variable_names,
)

ALL = {
    "namespace": ".*",
    "route": ".*",
    "model": ".*",
    "provider": ".*",
    "datasource": "prometheus",
}
SELECTED = {
    "namespace": "team-a",
    "route": multi("chat_completions", "responses"),
    "model": multi("gpt-4.1-mini", "claude-3-5-haiku-latest"),
    "provider": multi("openai_chat", "bedrock_converse"),
    "datasource": "prometheus",
}
QUERIES = queries()
# Prometheus' own series of the alerts its rules evaluate: the exported rules aggregate by
# route and model, so the namespace a pod ran in is not on them.
PROMETHEUS_OWN = {"ALERTS"}


def selectors(promql: str) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(promql), visit)
    return found


def matchers(selector: promql_parser.VectorSelector) -> dict[str, str]:
    return {m.name: m.value for m in selector.matchers.matchers}


def labels_of(metric: str) -> tuple[str, ...] | None:
    """The Prometheus label names of one of the agent's table instruments, or None for the
    instruments outside the table (gauges and counters the telemetry observes)."""
    specs = [s for s in metrics.SPECS if metric.startswith(s.name.replace(".", "_"))]
    if not specs:
        return None
    spec = max(specs, key=lambda s: len(s.name))
    return tuple(key.replace(".", "_") for key in spec.attributes)


def test_there_are_queries_on_every_dashboard() -> None:
    assert {query.board for query in QUERIES} == {
        "semhealth-overview.json",
        "semhealth-streams.json",
        "semhealth-agent.json",
    }
    assert len(QUERIES) >= 40


@pytest.mark.parametrize("values", [ALL, SELECTED], ids=["all", "selected"])
@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.id)
def test_query_parses_with_the_variables_substituted(query: Query, values: dict[str, str]) -> None:
    promql = substitute(query.expr, values)
    assert "$" not in promql
    promql_parser.parse(promql)  # raises ValueError naming the position of a mistake


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.id)
def test_query_uses_only_variables_its_dashboard_defines(query: Query) -> None:
    defined = variable_names(committed(query.board)) | set(BUILTINS)
    assert used_variables(query.expr) <= defined


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.id)
def test_query_filters_by_every_variable_its_metric_carries(query: Query) -> None:
    defined = variable_names(committed(query.board))
    # Marker values, so each matcher shows which variable it holds.
    promql = substitute(query.expr, {name: f"<{name}>" for name in defined})
    found = selectors(promql)
    assert found
    for selector in found:
        assert selector.name is not None  # every selector names its metric
        if selector.name in PROMETHEUS_OWN:
            continue
        wanted = {"namespace": "<namespace>"}
        labels = labels_of(selector.name) or ()
        if "route" in defined and "route" in labels:
            wanted["route"] = "<route>"
        if "model" in defined and "model" in labels:
            wanted["model"] = "<model>"
        if "model" in defined and "gen_ai_request_model" in labels:
            wanted["gen_ai_request_model"] = "<model>"
        if "provider" in defined and "provider" in labels:
            wanted["provider"] = "<provider>"
        held = matchers(selector)
        assert {key: held.get(key) for key in wanted} == wanted, selector.name


def test_the_label_table_knows_the_metrics_with_route_and_model() -> None:
    assert labels_of("semantic_health_context_relevance_score_bucket") == (
        "route",
        "model",
        "provider",
        "prompt_class",
        "source",
        "variant",
    )
    assert labels_of("semantic_health_output_failure_reasons_total") == (
        "route",
        "model",
        "provider",
        "prompt_class",
        "source",
        "variant",
        "result",
        "reason",
    )
    assert "gen_ai_request_model" in (
        labels_of("gen_ai_server_time_to_first_token_seconds_bucket") or ()
    )
    assert labels_of("semhealth_tap_queue_depth") is None
