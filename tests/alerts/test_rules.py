"""The rules loader: shipped defaults, overrides, rules files, and every issue in words."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from semhealth.alerts import templates
from semhealth.alerts.errors import RuleError
from semhealth.alerts.model import Baseline, Rule, Thresholds
from semhealth.alerts.rules import RULES_SCHEMA, default_rule_entries, load_rules, parse_rules
from semhealth.alerts.signals import SIGNALS, signal_named
from tests.docs.runbooks import runbook_source, runbook_url

DATA = Path(__file__).parent / "testdata" / "rules"
SIGNAL_LIST = (
    "context_relevance_score, answer_relevance_score, stream_continuity_index, stream_max_gap,"
    " model_output_validity_rate, request_success_rate, operation_duration, time_to_first_token,"
    " time_to_first_chunk, time_per_output_token"
)
LABELS = "route, model, provider, prompt_class, variant"
TEMPLATE_FIX = (
    "use {{ $value }}, {{ $value | humanize }} (or humanizePercentage, humanizeDuration),"
    ' {{ printf "%.2f" $value }} or {{ $labels.NAME }}'
)
DURATION_FIX = (
    "write a Prometheus duration such as 5m, 90s or 1h30m (whole numbers, largest unit first)"
)
MODEL_NOT_GROUPED = (
    "{{ $labels.model }} would always be empty: model is not a group label"
    " (fix: add model to group_by, or remove it from the annotation)"
)

# One YAML per bad case (its `rules:` laid over the defaults) and the exact issues it gives.
BAD_FILES: dict[str, list[str]] = {
    "aggregation_not_for_signal": [
        "rules[0].aggregation: aggregation 'p95' does not apply to ratio signal"
        " model_output_validity_rate (fix: use one of: ratio)"
    ],
    "alertname_label": [
        "rules[0].labels.alertname: alertname is the rule's name and cannot be set here"
        " (fix: rename the rule instead)"
    ],
    "annotation_label_not_grouped": [
        f"rules[0].annotations.summary: {MODEL_NOT_GROUPED}",
        f"rules[0].annotations.description: {MODEL_NOT_GROUPED}",
    ],
    "bad_rule_name": [
        "rules[0].name: '5xxRate' is not a valid rule name (fix: write it like ContextRelevanceLow)"
    ],
    "bad_threshold_duration": [
        "rules[0].threshold: '80 ms' is not a duration"
        " (fix: write it like 15ms, 2s or 1m30s (or a number of seconds))"
    ],
    "bad_window": [f"rules[0].window: '5 minutes' is not a duration (fix: {DURATION_FIX})"],
    "duplicate_name": [
        "rules[1].name: rule 'StreamChoppy' is already defined at rules[0]"
        " (fix: rename one of them, or merge the two entries into one)"
    ],
    "duration_threshold_on_score": [
        "rules[0].threshold: answer_relevance_score is a score between 0 and 1, so its threshold"
        " is a number, not '15ms' (fix: write a number between 0 and 1, e.g. 0.75)"
    ],
    "entry_not_mapping": [
        "rules[0]: expected a mapping, got the string 'ContextRelevanceLow'"
        " (fix: set it to a mapping, e.g. {name: ContextRelevanceLow, threshold: 0.7})"
    ],
    "group_by_unknown_label": [
        "rules[0].group_by[1]: time_to_first_token has no label 'modle'"
        f" (fix: did you mean 'model'? (one of: {LABELS}))",
        f"rules[0].annotations.summary: {MODEL_NOT_GROUPED}",
        f"rules[0].annotations.description: {MODEL_NOT_GROUPED}",
    ],
    "incomplete_new_rule": [
        "rules[0]: new rule 'AnswerRelevanceLow' is missing aggregation, window, op"
        " (fix: add aggregation, window, op; a new rule needs name, signal, aggregation, window,"
        " op, threshold)"
    ],
    "invalid_label_name": [
        "rules[0].labels.team-name: 'team-name' is not a valid label name"
        " (fix: use letters, digits and underscores, not starting with a digit or __)"
    ],
    "label_shadows_group_label": [
        "rules[0].labels.route: label 'route' would replace the group's own route label"
        " (fix: rename the label, or stop grouping by route)"
    ],
    "label_value_not_string": [
        'rules[0].labels.priority: expected a string, got the number 1 (fix: quote it: "1")'
    ],
    "match_unknown_label": [
        "rules[0].match.tenant: time_to_first_token has no label 'tenant'"
        f" (fix: use one of: {LABELS})"
    ],
    "min_samples_zero": ["rules[0].min_samples: must be at least 1, got 0 (fix: use 1 or more)"],
    "misspelt_default_name": [
        "rules[0]: new rule 'ContextRelevanceLo' is missing signal, aggregation, window, op,"
        " threshold (fix: did you mean 'ContextRelevanceLow'? an entry named like a rule changes"
        " only what it sets)"
    ],
    "percent_threshold_without_baseline": [
        "rules[0].threshold: a percentage threshold ('99%') needs a baseline to be relative to"
        " (fix: add baseline: {window: 1h} for a relative rule, or write a number between 0 and 1,"
        " e.g. 0.99)"
    ],
    "relative_threshold_is_duration": [
        "rules[0].threshold: a relative rule's threshold is a change against its baseline, not"
        " '20ms' (fix: write the relative change, e.g. -5% (5 % below the baseline) or -0.05)"
    ],
    "score_threshold_out_of_range": [
        "rules[0].threshold: context_relevance_score is a score between 0 and 1, so threshold 75"
        " can never be crossed (fix: write it as a fraction: 0.75 for 75 %)"
    ],
    "templated_label": [
        "rules[0].labels.value: label values are fixed text, not templates (fix: move the"
        " template to an annotation; labels identify the alert and must not change)"
    ],
    "threshold_by_unknown_label": [
        "rules[0].threshold.by: operation_duration has no label 'prompt_size'"
        f" (fix: did you mean 'prompt_class'? (one of: {LABELS}))",
        "rules[0].annotations.summary: {{ $labels.prompt_class }} would always be empty:"
        " prompt_class is not a group label (fix: add prompt_class to group_by, or remove it"
        " from the annotation)",
        "rules[0].annotations.description: {{ $labels.prompt_class }} would always be empty:"
        " prompt_class is not a group label (fix: add prompt_class to group_by, or remove it"
        " from the annotation)",
    ],
    "unknown_op": ["rules[0].op: unknown op '=<' (fix: did you mean '<'? (one of: <, <=, >, >=))"],
    "unknown_setting": [
        "rules[0].thresold: unknown setting 'thresold' (fix: did you mean 'threshold'?)"
    ],
    "unknown_signal": [
        "rules[0].signal: unknown signal 'answer_relevence_score'"
        f" (fix: did you mean 'answer_relevance_score'? (one of: {SIGNAL_LIST}))"
    ],
    "unknown_template_function": [
        "rules[0].annotations.summary: template error: unknown function 'humanizeBytes'"
        f" (known: humanize, humanizePercentage, humanizeDuration) (fix: {TEMPLATE_FIX})"
    ],
    "unquoted_greater_than": ['rules[0].op: op is empty (fix: quote the operator: op: ">")'],
    "unsorted_duration": [f"rules[0].for: '30s1m' is not a duration (fix: {DURATION_FIX})"],
    "wrong_type": [
        "rules[0].min_samples: expected a whole number, got the string 'twenty'"
        " (fix: set it to a whole number, e.g. 20)"
    ],
    "zero_baseline_window": [
        "rules[0].baseline.window: baseline.window must be longer than 0s"
        " (fix: use a window such as 5m)"
    ],
    "zero_window": [
        "rules[0].window: window must be longer than 0s (fix: use a window such as 5m)"
    ],
}


def rules_in(name: str) -> list[Any]:
    entries: list[Any] = yaml.safe_load((DATA / f"{name}.yaml").read_text())["rules"]
    return entries


def issues_of(entries: list[Any], base: list[Any] | None = None) -> list[str]:
    with pytest.raises(RuleError) as raised:
        parse_rules(entries, base=default_rule_entries() if base is None else base)
    return [str(issue) for issue in raised.value.issues]


def by_name(rules: tuple[Rule, ...]) -> dict[str, Rule]:
    return {rule.name: rule for rule in rules}


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- the shipped defaults -------------------------------------------------------------------


def test_shipped_defaults_load_with_the_issues_numbers() -> None:
    shape = {
        name: (r.signal, r.aggregation, r.window_s, r.op, r.threshold, r.min_samples, r.for_s,
               r.keep_firing_for_s, r.group_by, r.match, r.baseline, r.labels["severity"])
        for name, r in by_name(load_rules()).items()
    }  # fmt: skip
    route_model = ("route", "model")
    canary, stable = {"variant": "canary"}, Baseline(peer={"variant": "stable"})
    assert shape == {
        "ContextRelevanceLow": ("context_relevance_score", "p50", 300.0, "<", 0.75, 20, 120.0,
                                0.0, route_model, {}, None, "warning"),
        "OutputValidityLow": ("model_output_validity_rate", "ratio", 300.0, "<", 0.99, 20, 120.0,
                              0.0, route_model, {}, None, "critical"),
        "StreamChoppy": ("stream_continuity_index", "p95", 300.0, ">", 0.015, 20, 120.0, 0.0,
                         route_model, {}, None, "warning"),
        "LatencySLO": ("operation_duration", "p95", 300.0, ">",
                       Thresholds(label="prompt_class", values={"short": 0.05, "long_context": 0.18}),
                       20, 120.0, 0.0, route_model, {}, None, "warning"),
        "SlowFirstToken": ("time_to_first_token", "p95", 300.0, ">", 0.08, 20, 120.0, 0.0,
                           route_model, {}, None, "warning"),
        "RelevanceRegression": ("context_relevance_score", "p50", 300.0, "<", -0.05, 20, 300.0,
                                0.0, ("route",), {}, Baseline(window_s=3600.0), "warning"),
        "CanaryRelevanceDrop": ("context_relevance_score", "p50", 600.0, "<", -0.05, 20, 120.0,
                                0.0, ("route",), canary, stable, "critical"),
        "CanaryValidityDrop": ("model_output_validity_rate", "ratio", 600.0, "<", -0.05, 20,
                               120.0, 0.0, ("route",), canary, stable, "critical"),
        "CanaryAnswerRelevanceDrop": ("answer_relevance_score", "p50", 600.0, "<", -0.05, 20,
                                      120.0, 0.0, ("route",), canary, stable, "critical"),
    }  # fmt: skip


def test_shipped_defaults_come_in_the_documented_order() -> None:
    assert [rule.name for rule in load_rules()] == [
        "ContextRelevanceLow",
        "OutputValidityLow",
        "StreamChoppy",
        "LatencySLO",
        "SlowFirstToken",
        "RelevanceRegression",
        "CanaryRelevanceDrop",
        "CanaryValidityDrop",
        "CanaryAnswerRelevanceDrop",
    ]


def test_every_default_says_where_its_numbers_come_from() -> None:
    for rule in load_rules():
        assert re.search(r"[Ii]ssue \d+", rule.description), rule.name


def test_every_default_links_its_runbook_page() -> None:
    for rule in load_rules():
        url = rule.annotations["runbook_url"]
        assert url == runbook_url(rule.name)
        assert runbook_source(url).is_file(), f"{rule.name}: no page {runbook_source(url)}"


def test_every_default_has_a_summary_and_a_description() -> None:
    for rule in load_rules():
        assert set(rule.annotations) == {"summary", "description", "runbook_url"}, rule.name


def test_default_annotations_render_with_only_numbers_and_group_labels() -> None:
    group = {"route": "chat", "model": "gpt-x", "prompt_class": "short"}
    for rule in load_rules():
        labels = {name: group[name] for name in rule.group_labels}
        for text in rule.annotations.values():
            rendered = templates.render(text, value=0.5, labels=labels)
            assert "{{" not in rendered and "<no value>" not in rendered
        assert "chat" in templates.render(rule.annotations["summary"], value=0.5, labels=labels)


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("ContextRelevanceLow", 0.6234, "is 0.62:"),
        ("OutputValidityLow", 0.985, "Only 98.5% of"),
        ("StreamChoppy", 0.021, "is 21ms:"),
        ("LatencySLO", 0.075, "is 75ms,"),
        ("SlowFirstToken", 0.12, "is 120ms:"),
        ("RelevanceRegression", -0.08, "changed by -8% against"),
    ],
)
def test_default_descriptions_show_the_value_in_its_unit(
    name: str, value: float, shown: str
) -> None:
    rule = by_name(load_rules())[name]
    labels = dict.fromkeys(rule.group_labels, "x")
    assert shown in templates.render(rule.annotations["description"], value=value, labels=labels)


def test_default_rule_entries_are_fresh_copies() -> None:
    default_rule_entries()[0]["threshold"] = 0.1
    assert default_rule_entries()[0]["threshold"] == 0.75


def test_shipped_defaults_match_the_schema() -> None:
    validator = Draft202012Validator(RULES_SCHEMA)
    for entry in default_rule_entries():
        assert list(validator.iter_errors(entry)) == []


# -- the schema -----------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12() -> None:
    Draft202012Validator.check_schema(RULES_SCHEMA)


def schema_nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            yield from schema_nodes(child, f"{path}/{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from schema_nodes(child, f"{path}/{index}")


def test_schema_describes_every_property() -> None:
    for path, node in schema_nodes(RULES_SCHEMA):
        for name, child in node.get("properties", {}).items():
            assert "description" in child, f"{path}/properties/{name}"


def test_schema_closes_every_object_with_properties() -> None:
    for path, node in schema_nodes(RULES_SCHEMA):
        if "properties" in node:
            assert node["additionalProperties"] is False, path


def test_schema_requires_only_a_name_so_overrides_can_set_any_subset() -> None:
    assert RULES_SCHEMA["required"] == ["name"]


def test_schema_aggregations_are_those_the_signals_offer() -> None:
    offered = {aggregation for signal in SIGNALS for aggregation in signal.aggregations}
    assert set(RULES_SCHEMA["properties"]["aggregation"]["enum"]) == offered


def test_schema_names_every_signal_in_its_description() -> None:
    description = RULES_SCHEMA["properties"]["signal"]["description"]
    assert all(signal.name in description for signal in SIGNALS)


# -- overrides ------------------------------------------------------------------------------


def test_override_changes_only_what_it_sets() -> None:
    default = by_name(load_rules())["ContextRelevanceLow"]
    rules = by_name(parse_rules([{"name": "ContextRelevanceLow", "threshold": 0.7}],
                                base=default_rule_entries()))  # fmt: skip
    assert rules["ContextRelevanceLow"] == dataclasses.replace(default, threshold=0.7)


def test_override_leaves_the_other_defaults_alone() -> None:
    defaults = load_rules()
    rules = parse_rules([{"name": "StreamChoppy", "for": "5m"}], base=default_rule_entries())
    assert [r for r in rules if r.name != "StreamChoppy"] == [
        r for r in defaults if r.name != "StreamChoppy"
    ]


def test_override_merges_labels_key_by_key() -> None:
    rules = parse_rules(
        [{"name": "OutputValidityLow", "labels": {"team": "ml-platform"}}],
        base=default_rule_entries(),
    )
    assert by_name(rules)["OutputValidityLow"].labels == {
        "severity": "critical",
        "team": "ml-platform",
    }


def test_override_merges_annotations_key_by_key() -> None:
    default = by_name(load_rules())["StreamChoppy"]
    rules = parse_rules(
        [{"name": "StreamChoppy", "annotations": {"runbook_url": "https://wiki/choppy"}}],
        base=default_rule_entries(),
    )
    assert by_name(rules)["StreamChoppy"].annotations == {
        **default.annotations,
        "runbook_url": "https://wiki/choppy",
    }


def test_override_replaces_a_per_label_threshold_whole() -> None:
    override = {"name": "LatencySLO", "threshold": {"by": "prompt_class", "values": {"short": "120ms"}, "default": 0.3}}  # fmt: skip
    rules = parse_rules([override], base=default_rule_entries())
    assert by_name(rules)["LatencySLO"].threshold == Thresholds(
        label="prompt_class", values={"short": 0.12}, default=0.3
    )


def test_enabled_false_drops_a_default() -> None:
    rules = parse_rules([{"name": "StreamChoppy", "enabled": False}], base=default_rule_entries())
    assert "StreamChoppy" not in by_name(rules)
    assert len(rules) == len(load_rules()) - 1


def test_a_later_layer_can_enable_a_rule_an_earlier_one_disabled(tmp_path: Path) -> None:
    file = write(tmp_path, "on.yaml", "rules:\n  - name: StreamChoppy\n    enabled: true\n")
    rules = load_rules(entries=[{"name": "StreamChoppy", "enabled": False}], files=[file])
    assert by_name(rules)["StreamChoppy"] == by_name(load_rules())["StreamChoppy"]


def test_new_rule_is_added_after_the_defaults() -> None:
    new = {"name": "AnswerRelevanceLow", "signal": "answer_relevance_score",
           "aggregation": "mean", "window": "10m", "op": "<", "threshold": 0.6}  # fmt: skip
    rules = parse_rules([new], base=default_rule_entries())
    assert rules[-1] == Rule(
        name="AnswerRelevanceLow",
        signal="answer_relevance_score",
        aggregation="mean",
        window_s=600.0,
        op="<",
        threshold=0.6,
    )


def test_rules_load_without_defaults() -> None:
    new = {"name": "SuccessLow", "signal": "request_success_rate", "aggregation": "ratio",
           "window": "1m", "op": "<", "threshold": 0.95, "keep_firing_for": "10m"}  # fmt: skip
    assert load_rules(defaults=False, entries=[new]) == (
        Rule(name="SuccessLow", signal="request_success_rate", aggregation="ratio", window_s=60.0,
             op="<", threshold=0.95, keep_firing_for_s=600.0),
    )  # fmt: skip


def test_percentage_thresholds_of_relative_rules_become_fractions() -> None:
    rules = parse_rules(
        [{"name": "RelevanceRegression", "threshold": "+10%", "op": ">"}],
        base=default_rule_entries(),
    )
    assert by_name(rules)["RelevanceRegression"].threshold == pytest.approx(0.1)


def test_a_number_threshold_of_a_time_signal_is_seconds() -> None:
    rules = parse_rules(
        [{"name": "SlowFirstToken", "threshold": 0.25}], base=default_rule_entries()
    )
    assert by_name(rules)["SlowFirstToken"].threshold == 0.25


def test_match_limits_a_rule_to_some_samples() -> None:
    override = {"name": "SlowFirstToken", "match": {"prompt_class": "short"}}
    rules = parse_rules([override], base=default_rule_entries())
    assert by_name(rules)["SlowFirstToken"].match == {"prompt_class": "short"}


# -- issues ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_rules_give_their_exact_issues(name: str) -> None:
    assert issues_of(rules_in(name)) == BAD_FILES[name]


def test_every_bad_rules_file_has_its_expected_issues() -> None:
    assert {path.stem for path in DATA.glob("*.yaml")} == {*BAD_FILES, "several_issues"}


def test_every_issue_is_reported_at_once_in_document_order() -> None:
    assert issues_of(rules_in("several_issues")) == [
        f"rules[0].window: '5 min' is not a duration (fix: {DURATION_FIX})",
        "rules[0].threshold: context_relevance_score is a score between 0 and 1, so threshold 75"
        " can never be crossed (fix: write it as a fraction: 0.75 for 75 %)",
        f"rules[1].signal: unknown signal 'latency' (fix: use one of: {SIGNAL_LIST})",
        "rules[1].labels.alertname: alertname is the rule's name and cannot be set here"
        " (fix: rename the rule instead)",
        "rules[2].group_by[1]: stream_continuity_index has no label 'tenant'"
        f" (fix: use one of: {LABELS})",
        "rules[2].annotations.summary: template error: unknown function 'humanizeBytes'"
        f" (known: humanize, humanizePercentage, humanizeDuration) (fix: {TEMPLATE_FIX})",
        f"rules[2].annotations.description: {MODEL_NOT_GROUPED}",
    ]


def test_rule_error_lists_one_issue_per_line() -> None:
    with pytest.raises(RuleError) as raised:
        parse_rules(rules_in("several_issues"), base=default_rule_entries())
    assert str(raised.value).splitlines() == [str(i) for i in raised.value.issues]


def test_issues_in_the_base_are_under_defaults() -> None:
    base = [{"name": "Broken", "signal": "nope", "aggregation": "p50", "window": "5m",
             "op": "<", "threshold": 0.5}]  # fmt: skip
    assert issues_of([], base=base) == [
        f"defaults[0].signal: unknown signal 'nope' (fix: use one of: {SIGNAL_LIST})"
    ]


def test_a_field_written_by_an_earlier_layer_is_blamed_there(tmp_path: Path) -> None:
    file = write(tmp_path, "team.yaml", "rules:\n  - name: StreamChoppy\n    for: 5m\n")
    with pytest.raises(RuleError) as raised:
        load_rules(entries=[{"name": "StreamChoppy", "threshold": "15 ms"}], files=[file])
    assert [issue.path for issue in raised.value.issues] == ["rules[0].threshold"]


def test_config_entries_issue_path_can_be_rooted_elsewhere() -> None:
    with pytest.raises(RuleError) as raised:
        load_rules(entries=[{"name": "StreamChoppy", "window": "0s"}], path="alerts.rules")
    assert [issue.path for issue in raised.value.issues] == ["alerts.rules[0].window"]


def test_a_disabled_default_is_not_checked_against_a_broken_override() -> None:
    entries = [{"name": "ContextRelevanceLow", "group_by": ["route"], "enabled": False}]
    assert "ContextRelevanceLow" not in by_name(parse_rules(entries, base=default_rule_entries()))


# -- rules files ----------------------------------------------------------------------------


def test_rules_file_overrides_config_entries(tmp_path: Path) -> None:
    file = write(tmp_path, "rules.yaml", "rules:\n  - name: StreamChoppy\n    threshold: 30ms\n")
    rules = load_rules(entries=[{"name": "StreamChoppy", "threshold": "20ms"}], files=[file])
    assert by_name(rules)["StreamChoppy"].threshold == 0.03


def test_issues_in_a_rules_file_carry_its_name(tmp_path: Path) -> None:
    file = write(tmp_path, "rules.yaml", "rules:\n  - name: StreamChoppy\n    window: 0s\n")
    with pytest.raises(RuleError) as raised:
        load_rules(files=[file])
    assert [str(i) for i in raised.value.issues] == [
        f"{file}: rules[0].window: window must be longer than 0s (fix: use a window such as 5m)"
    ]


def test_missing_rules_file_is_an_issue(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.yaml")
    with pytest.raises(RuleError) as raised:
        load_rules(files=[missing])
    assert [str(i) for i in raised.value.issues] == [
        f"{missing}: rules file does not exist (fix: correct the path, or mount the file there)"
    ]


def test_unreadable_rules_file_is_an_issue(tmp_path: Path) -> None:
    with pytest.raises(RuleError) as raised:
        load_rules(files=[str(tmp_path)])  # a folder cannot be read as a file
    assert [i.message for i in raised.value.issues] == [
        "cannot read the rules file: Is a directory"
    ]


def test_rules_file_that_is_not_utf8_is_an_issue(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"rules: []\n# caf\xe9\n")
    with pytest.raises(RuleError) as raised:
        load_rules(files=[path])
    assert [i.message for i in raised.value.issues] == [
        "cannot read the rules file: UnicodeDecodeError"
    ]


def test_invalid_yaml_is_an_issue_at_its_line(tmp_path: Path) -> None:
    file = write(tmp_path, "bad.yaml", "rules:\n  - name: StreamChoppy\n   for: [5m\n")
    with pytest.raises(RuleError) as raised:
        load_rules(files=[file])
    [issue] = raised.value.issues
    assert issue.path.startswith(f"{file}:3:")
    assert issue.message.startswith("YAML syntax error: ")


def test_rules_file_must_hold_a_mapping(tmp_path: Path) -> None:
    file = write(tmp_path, "list.yaml", "- name: StreamChoppy\n")
    with pytest.raises(RuleError) as raised:
        load_rules(files=[file])
    assert [str(i) for i in raised.value.issues] == [
        f"{file}: expected a mapping with a rules list, got a list"
        " (fix: start the file with rules: and list the rules below it)"
    ]


def test_rules_key_must_hold_a_list(tmp_path: Path) -> None:
    file = write(tmp_path, "map.yaml", "rules:\n  StreamChoppy: {for: 5m}\n")
    with pytest.raises(RuleError) as raised:
        load_rules(files=[file])
    assert [str(i) for i in raised.value.issues] == [
        f"{file}: rules: expected a list of rules, got a mapping"
        " (fix: list the rules, one '- name: ...' each)"
    ]


def test_prometheus_groups_in_a_rules_file_get_a_hint(tmp_path: Path) -> None:
    file = write(tmp_path, "prom.yaml", "groups:\n  - name: semhealth\n    rules: []\n")
    with pytest.raises(RuleError) as raised:
        load_rules(files=[file])
    assert [str(i) for i in raised.value.issues] == [
        f"{file}: groups: unknown key 'groups' (fix: a rules file holds one key, rules: a list of"
        " rules (not Prometheus' groups: list the rules directly under rules:))"
    ]


def test_empty_rules_file_adds_nothing(tmp_path: Path) -> None:
    assert load_rules(files=[write(tmp_path, "empty.yaml", "")]) == load_rules()


def test_issues_from_files_and_entries_are_reported_together(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.yaml")
    with pytest.raises(RuleError) as raised:
        load_rules(entries=[{"name": "StreamChoppy", "op": "=="}], files=[missing])
    assert [i.path for i in raised.value.issues] == [missing, "rules[0].op"]


# -- properties -----------------------------------------------------------------------------

YAML_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
YAML_VALUES = st.recursive(
    YAML_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=10) | st.integers(), inner, max_size=3)
    ),
    max_leaves=8,
)
KEYS = st.sampled_from([*RULES_SCHEMA["properties"], "other"])
ENTRIES = st.dictionaries(KEYS, YAML_VALUES | st.sampled_from(["5m", "-5%", "15ms", "p50", "<"]))


DEFAULTS = default_rule_entries()  # parse_rules never changes its base; read it once


@settings(max_examples=150, deadline=None)
@given(st.lists(ENTRIES | YAML_VALUES, max_size=4))
def test_any_yaml_gives_rules_or_a_rule_error(entries: list[Any]) -> None:
    try:
        rules = parse_rules(entries, base=DEFAULTS)
    except RuleError as error:
        assert error.issues
    else:
        assert all(isinstance(rule, Rule) for rule in rules)


@st.composite
def valid_rules(draw: st.DrawFn) -> tuple[dict[str, Any], Rule]:
    signal = draw(st.sampled_from(SIGNALS))
    aggregation = draw(st.sampled_from(signal.aggregations))
    window_ms = draw(st.integers(1, 10**8))
    window = f"{window_ms}ms"
    if signal.unit == "s":
        millis = draw(st.integers(0, 10**6))
        threshold: Any = draw(st.sampled_from([f"{millis}ms", millis / 1000]))
    else:
        threshold = draw(st.floats(0, 1))
    group_by = draw(st.lists(st.sampled_from(signal.labels), unique=True))
    op = draw(st.sampled_from(["<", "<=", ">", ">="]))
    entry = {"name": "Generated", "signal": signal.name, "aggregation": aggregation,
             "window": window, "op": op, "threshold": threshold, "group_by": group_by}  # fmt: skip
    seconds = threshold if isinstance(threshold, float) else int(threshold[:-2]) / 1000
    rule = Rule(name="Generated", signal=signal.name, aggregation=aggregation,  # type: ignore[arg-type]
                window_s=window_ms / 1000, op=op, threshold=float(seconds),  # type: ignore[arg-type]
                group_by=tuple(group_by))  # fmt: skip
    return entry, rule


@settings(max_examples=100, deadline=None)
@given(valid_rules())
def test_any_well_formed_rule_loads_as_written(case: tuple[dict[str, Any], Rule]) -> None:
    entry, rule = case
    assert parse_rules([entry]) == (rule,)


def test_signal_table_knows_every_default_signal() -> None:
    assert all(signal_named(entry["signal"]) for entry in default_rule_entries())


# -- peer baselines (canary against stable) -------------------------------------------------

PEER_RULE = {
    "name": "CanaryTtft",
    "signal": "time_to_first_token",
    "aggregation": "p95",
    "window": "10m",
    "op": ">",
    "threshold": "+20%",
    "match": {"variant": "canary"},
    "baseline": {"peer": {"variant": "stable"}},
    "group_by": ["route"],
}


def test_a_peer_baseline_compares_the_match_with_its_peer() -> None:
    rules = by_name(parse_rules([PEER_RULE], base=[]))
    rule = rules["CanaryTtft"]
    assert rule.baseline == Baseline(peer={"variant": "stable"})
    assert rule.peer_match == {"variant": "stable"}
    assert rule.threshold == pytest.approx(0.2)


def test_the_default_canary_rules_roll_back_on_a_five_percent_drop() -> None:
    rules = by_name(load_rules(defaults=True))
    for name in ("CanaryRelevanceDrop", "CanaryValidityDrop", "CanaryAnswerRelevanceDrop"):
        rule = rules[name]
        assert (rule.threshold, rule.labels["action"], rule.min_samples) == (-0.05, "rollback", 20)
        assert (rule.match, rule.baseline) == (
            {"variant": "canary"},
            Baseline(peer={"variant": "stable"}),
        )


def test_a_peer_that_picks_the_rule_s_own_samples_is_an_issue() -> None:
    same = {**PEER_RULE, "baseline": {"peer": {"variant": "canary"}}}
    (issue,) = issues_of([same], base=[])
    assert issue.startswith("rules[0].baseline.peer: the peer picks the rule's own samples")


def test_a_peer_label_the_signal_lacks_is_an_issue() -> None:
    odd = {**PEER_RULE, "baseline": {"peer": {"colour": "blue"}}}
    (issue,) = issues_of([odd], base=[])
    assert issue.startswith("rules[0].baseline.peer.colour: time_to_first_token has no label")


def test_a_baseline_is_a_window_or_a_peer_not_both() -> None:
    both = {**PEER_RULE, "baseline": {"peer": {"variant": "stable"}, "window": "1h"}}
    issues = issues_of([both], base=[])
    assert issues == [
        "rules[0].baseline: a baseline is the time before (window) or another variant (peer),"
        " not both (fix: keep window: for a change over time, or peer: to compare with a variant)"
    ]
