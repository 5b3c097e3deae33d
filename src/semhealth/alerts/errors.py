"""Errors the alerts package raises.

    AlertsError           (a SemhealthError) root of every error this package raises on purpose
     └── RuleError        (also an IssuesError) rules are invalid; carries every RuleIssue found

Evaluation and delivery never raise: a failed POST to Alertmanager is counted and the
alert goes out again on the next resend.
"""

from __future__ import annotations

from semhealth.common.errors import Issue, IssuesError, SemhealthError


class AlertsError(SemhealthError):
    """Root of the errors this package raises on purpose; catch this to catch them all."""


# The issue type every check reports; ``path`` is a path into the rules document in the form
# the agent's configuration errors use (``rules[2].threshold``), so the agent can point at the
# YAML line.
RuleIssue = Issue


class RuleError(IssuesError, AlertsError):
    """The rules have one or more issues (start-up, reload); ``str()`` lists them, one per
    line."""
