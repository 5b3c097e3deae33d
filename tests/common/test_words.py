"""How configuration messages name values: the same words for the agent's checks and the
alert rules' checks."""

from __future__ import annotations

import pytest

from semhealth.common.words import kind_of, show


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "null"), (True, "true"), (False, "false"), (3, "3"), (0.5, "0.5"), ("x", "'x'")],
)
def test_show_writes_values_as_yaml_users_read_them(value: object, shown: str) -> None:
    assert show(value) == shown


def test_show_cuts_a_long_value_and_keeps_it_on_one_line() -> None:
    shown = show("a\n" * 100)
    # 60 characters of the value, each newline escaped as two, and the quotes and the ellipsis.
    assert "\n" not in shown and shown == repr("a\n" * 30 + "…")


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("x", "the string 'x'"),
        (2, "the number 2"),
        ([1], "a list"),
        ({"a": 1}, "a mapping"),
        (None, "null"),
        (True, "true"),
        ({1}, "a set"),
    ],
)
def test_kind_of_names_a_value_for_expected_got_messages(value: object, kind: str) -> None:
    assert kind_of(value) == kind


def test_the_agent_and_the_rules_use_the_same_words() -> None:
    from semhealth.agent.config import checks
    from semhealth.alerts import rules

    assert rules.kind_of is kind_of
    assert checks.show is show
