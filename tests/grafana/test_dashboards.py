"""What a user of the dashboards relies on: variables, units, thresholds at the alert
thresholds, runbook links, unique panel ids, and the chart's copies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

from semhealth.alerts import Thresholds, load_rules
from tests.docs.runbooks import runbook_source, runbook_url
from tests.grafana.dashboards import COMMITTED, NAMES, boards, committed, panels

RULES = {rule.name: rule for rule in load_rules()}
BOARDS = dict(boards())
DATA_PANELS = [
    (name, panel) for name, board in BOARDS.items() for panel in panels(board) if "targets" in panel
]


def panel_titled(title: str) -> dict[str, Any]:
    return next(panel for _, panel in DATA_PANELS if panel["title"] == title)


def steps(panel: dict[str, Any]) -> list[tuple[float | None, str]]:
    thresholds = panel["fieldConfig"]["defaults"]["thresholds"]
    assert thresholds["mode"] == "absolute"
    return [(step["value"], step["color"]) for step in thresholds["steps"]]


def runbooks(panel: dict[str, Any]) -> set[str]:
    return {link["url"] for link in panel.get("links", [])}


def test_dashboards_have_stable_distinct_uids_and_the_shared_tag() -> None:
    uids = [board["uid"] for board in BOARDS.values()]
    assert uids == ["semhealth-overview", "semhealth-streams", "semhealth-agent"]
    assert all("semhealth" in board["tags"] for board in BOARDS.values())


@pytest.mark.parametrize("name", NAMES)
def test_variables(name: str) -> None:
    variables = {v["name"]: v for v in BOARDS[name]["templating"]["list"]}
    expected = ["datasource", "namespace"]
    if name != "semhealth-agent.json":  # the agent's own metrics carry no route or model
        expected += ["route", "model", "provider"]
    assert list(variables) == expected
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for key in expected[1:]:
        variable = variables[key]
        assert variable["type"] == "query"
        assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert (variable["multi"], variable["includeAll"], variable["allValue"]) == (
            True,
            True,
            ".*",
        )
        assert f", {key})" in variable["query"]


@pytest.mark.parametrize("name", NAMES)
def test_panel_ids_are_unique_and_every_panel_uses_the_datasource_variable(name: str) -> None:
    board = BOARDS[name]
    ids = [panel["id"] for panel in board["panels"]]
    assert ids == list(range(1, len(ids) + 1))
    for panel in panels(board):
        if "targets" in panel:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


@pytest.mark.parametrize(
    ("name", "panel"),
    DATA_PANELS,
    ids=[f"{name.removesuffix('.json')}:{panel['title']}" for name, panel in DATA_PANELS],
)
def test_every_panel_has_a_unit_thresholds_and_a_description(
    name: str, panel: dict[str, Any]
) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["unit"]
    found = steps(panel)
    assert found[0][0] is None  # the base step
    values = [value for value, _ in found[1:]]
    assert None not in values
    assert values == sorted(v for v in values if v is not None)
    assert panel["description"]


def test_relevance_panels_draw_the_alert_threshold_0_75() -> None:
    assert RULES["ContextRelevanceLow"].threshold == 0.75
    for title in (
        "Context relevance P50",
        "Context relevance P50 / P95 by route and model",
        "Answer relevance P50 by route and model",
    ):
        assert steps(panel_titled(title)) == [(None, "red"), (0.75, "green")], title


@pytest.mark.parametrize(
    ("title", "rule", "colors"),
    [
        ("Structured-output validity", "OutputValidityLow", ("red", "green")),
        ("Structured-output validity by route and model", "OutputValidityLow", ("red", "green")),
        ("Stream continuity index P95", "StreamChoppy", ("green", "red")),
        ("Stream continuity index P95 by route and model", "StreamChoppy", ("green", "red")),
        ("Stream continuity index P50 / P95 by prompt class", "StreamChoppy", ("green", "red")),
        ("Time to first token P50 / P95 by prompt class", "SlowFirstToken", ("green", "red")),
    ],
)
def test_signal_panels_draw_their_default_alert_threshold(
    title: str, rule: str, colors: tuple[str, str]
) -> None:
    threshold = RULES[rule].threshold
    assert isinstance(threshold, float)
    assert steps(panel_titled(title)) == [(None, colors[0]), (threshold, colors[1])]


def test_latency_panel_turns_each_prompt_class_red_past_its_own_budget() -> None:
    budgets = RULES["LatencySLO"].threshold
    assert isinstance(budgets, Thresholds)
    panel = panel_titled("Operation duration P95 by prompt class")
    assert steps(panel) == [(None, "green"), (min(budgets.values.values()), "red")]
    overrides = {
        override["matcher"]["options"]: override["properties"]
        for override in panel["fieldConfig"]["overrides"]
    }
    assert overrides == {
        f".* {name}$": [
            {
                "id": "thresholds",
                "value": {
                    "mode": "absolute",
                    "steps": [{"color": "green", "value": None}, {"color": "red", "value": v}],
                },
            }
        ]
        for name, v in budgets.values.items()
    }
    # The regex matches the legend the query gives the series.
    assert all(t["legendFormat"].endswith("{{prompt_class}}") for t in panel["targets"])


@pytest.mark.parametrize(
    ("title", "rule"),
    [
        ("Structured-output validity", "OutputValidityLow"),
        ("Context relevance P50 / P95 by route and model", "ContextRelevanceLow"),
        ("Context relevance P50 / P95 by route and model", "RelevanceRegression"),
        ("Stream continuity index P95 by route and model", "StreamChoppy"),
        ("Time to first token P50 / P95 by prompt class", "SlowFirstToken"),
        ("Operation duration P95 by prompt class", "LatencySLO"),
    ],
)
def test_signal_panels_link_the_runbook_of_their_alert(title: str, rule: str) -> None:
    url = RULES[rule].annotations["runbook_url"]
    assert url == runbook_url(rule)
    assert url in runbooks(panel_titled(title))


def test_every_default_alert_has_a_panel_linking_its_runbook() -> None:
    linked = set().union(*(runbooks(panel) for _, panel in DATA_PANELS))
    assert {rule.annotations["runbook_url"] for rule in RULES.values()} <= linked


def test_the_runbook_pages_exist_in_the_manual() -> None:
    for rule in RULES.values():
        assert runbook_source(rule.annotations["runbook_url"]).is_file(), rule.name


def test_the_helm_copies_are_valid_dashboards_too() -> None:
    for name in NAMES:
        assert committed(name, COMMITTED[1]) == BOARDS[name]


@pytest.mark.parametrize("name", NAMES)
def test_json_reads_back_through_the_sdk_dashboard_model_unchanged(name: str) -> None:
    """Every key is one the pinned Grafana schema knows: decoding into the SDK's model and
    encoding again loses or adds nothing."""
    text = (COMMITTED[0] / name).read_text()
    board = model.Dashboard.from_json(json.loads(text))
    assert json.dumps(board, cls=JSONEncoder, indent=2, sort_keys=True) + "\n" == text
    assert board.schema_version is not None and board.schema_version >= 36


# The panel each runbook page names (/d/<uid>?viewPanel=<id>): a layout change that moves
# one fails here, so the pages under docs/operations/runbooks/ are changed with it.
RUNBOOK_PANELS = {
    "ContextRelevanceLow": ("semhealth-overview", 8),
    "RelevanceRegression": ("semhealth-overview", 8),
    "OutputValidityLow": ("semhealth-overview", 7),
    "StreamChoppy": ("semhealth-streams", 8),
    "LatencySLO": ("semhealth-streams", 3),
    "SlowFirstToken": ("semhealth-streams", 2),
    "CanaryRelevanceDrop": ("semhealth-overview", 18),
    "CanaryValidityDrop": ("semhealth-overview", 19),
    "CanaryAnswerRelevanceDrop": ("semhealth-overview", 20),
}


@pytest.mark.parametrize(("rule", "place"), RUNBOOK_PANELS.items())
def test_the_panel_a_runbook_links_to_shows_that_alert(rule: str, place: tuple[str, int]) -> None:
    uid, panel_id = place
    board = BOARDS[f"{uid}.json"]
    assert board["uid"] == uid
    panel = next(panel for panel in board["panels"] if panel["id"] == panel_id)
    assert RULES[rule].annotations["runbook_url"] in runbooks(panel)


def test_every_default_alert_has_a_runbook_panel() -> None:
    assert set(RUNBOOK_PANELS) == set(RULES)
