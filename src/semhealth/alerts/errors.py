"""Errors the alerts package raises.

    AlertsError           root of every error this package raises on purpose
     └── RuleError        rules are invalid; carries every RuleIssue found (start-up, reload)

Evaluation and delivery never raise: a failed POST to Alertmanager is counted and the
alert goes out again on the next resend.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class AlertsError(Exception):
    """Root of the errors this package raises on purpose; catch this to catch them all."""


@dataclass(frozen=True, slots=True)
class RuleIssue:
    """One thing wrong with a rule, and how to fix it.

    ``path`` is a path into the rules document in the form the agent's configuration
    errors use (``rules[2].threshold``), so the agent can point at the YAML line.
    """

    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        path = f"{self.path}: " if self.path else ""
        return f"{path}{self.message} (fix: {self.fix})"


class RuleError(AlertsError):
    """The rules have one or more issues; ``str()`` lists them, one per line."""

    def __init__(self, issues: Iterable[RuleIssue]) -> None:
        self.issues: tuple[RuleIssue, ...] = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))
