"""One error root and one issue type for every package."""

from __future__ import annotations

from semhealth.agent.errors import ConfigError, ConfigIssue, RelevanceStartError
from semhealth.agent.kube.errors import InjectionError
from semhealth.alerts.errors import AlertsError, RuleError, RuleIssue
from semhealth.common.errors import Issue, IssuesError, SemhealthError
from semhealth.embeddings.errors import ConfigIssue as EmbeddingsIssue
from semhealth.embeddings.errors import EmbeddingError, ModelLoadError


def test_every_package_root_is_a_semhealth_error() -> None:
    for root in (ConfigError, RelevanceStartError, InjectionError, AlertsError, EmbeddingError):
        assert issubclass(root, SemhealthError)
    assert issubclass(ModelLoadError, EmbeddingError)


def test_every_check_reports_the_one_issue_type() -> None:
    assert ConfigIssue is Issue and RuleIssue is Issue and EmbeddingsIssue is Issue


def test_config_and_rule_errors_carry_their_issues_one_per_line() -> None:
    issues = [Issue("a.b", "is wrong", "fix it"), Issue("", "whole file", "rewrite")]
    for error in (ConfigError(issues), RuleError(issues)):
        assert isinstance(error, IssuesError)
        assert error.issues == tuple(issues)
        assert str(error) == "a.b: is wrong (fix: fix it)\nwhole file (fix: rewrite)"
    assert isinstance(RuleError(issues), AlertsError)


def test_an_issue_names_where_its_value_came_from() -> None:
    issue = Issue("upstream.url", "is not a URL", "write http://host:port", source="f.yaml", line=3)
    assert str(issue) == "f.yaml:3:1: upstream.url: is not a URL (fix: write http://host:port)"
    assert str(Issue("x", "m", "f", source="$SEMHEALTH_X")) == "$SEMHEALTH_X: x: m (fix: f)"
