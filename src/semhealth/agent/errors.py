"""Errors the agent raises.

    SemhealthError            root of every error semhealth raises on purpose
     ├── ConfigError          the configuration is invalid; carries every ConfigIssue found
     └── RelevanceStartError  relevance scoring was required and its encoders could not start

Only start-up raises these; once traffic flows, problems are counted and answered,
never raised into the forwarding loop. Add new branches to the tree above as they appear.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass


class SemhealthError(Exception):
    """Root of the errors semhealth raises on purpose; catch this to catch them all."""


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One thing wrong with the configuration, and how to fix it.

    ``path`` names the setting as written in YAML (``upstream.timeouts.read_s``,
    ``routes[2].provider``; empty for the document as a whole). ``source`` is
    where the value came from: the file's name, ``$SEMHEALTH_...`` for an
    environment variable or ``command line``; ``line`` and ``column`` (1-based)
    are set when the value came from the file.
    """

    path: str
    message: str
    fix: str
    _: KW_ONLY
    source: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = ""
        if self.source is not None and self.line is not None:
            where = f"{self.source}:{self.line}:{self.column or 1}: "
        elif self.source is not None:
            where = f"{self.source}: "
        path = f"{self.path}: " if self.path else ""
        return f"{where}{path}{self.message} (fix: {self.fix})"


class ConfigError(SemhealthError):
    """The configuration has one or more issues; ``str()`` lists them, one per line."""

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        self.issues: tuple[ConfigIssue, ...] = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


class RelevanceStartError(SemhealthError):
    """Relevance scoring was asked for (``relevance.enabled: true``) and could not start."""
