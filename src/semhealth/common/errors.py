"""The root of semhealth's errors and the one type every configuration check reports.

    SemhealthError             root of every error semhealth raises on purpose
     ├── IssuesError           one or more Issues; str() lists them, one per line
     │    ├── agent.errors.ConfigError      the configuration is invalid
     │    └── alerts.errors.RuleError       alert rules are invalid (start-up, reload)
     ├── agent.errors.RelevanceStartError   relevance was required and could not start
     ├── agent.errors.ConfigRefused         a process `semhealth run` started refused its config
     ├── common.tls.TLSFileError            a TLS file that does not load
     ├── agent.kube.errors.InjectionError   a manifest cannot take the sidecar
     ├── alerts.errors.AlertsError          root of the alerts package's errors
     └── embeddings.errors.EmbeddingError   root of the embeddings package's errors
          ├── Overloaded, Closed
          └── BackendError
               └── ModelLoadError

Each package's ``errors.py`` draws its own branch in full.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass


class SemhealthError(Exception):
    """Root of the errors semhealth raises on purpose; catch this to catch them all."""


@dataclass(frozen=True, slots=True)
class Issue:
    """One thing wrong with a setting, and how to fix it.

    ``path`` names the setting as written in YAML (``upstream.timeouts.read_s``,
    ``routes[2].provider``, ``rules[0].threshold``; empty for the document as a whole), relative
    to whatever checked it: a package's own checks leave the prefix to the agent, which
    re-roots them. ``source`` is where the value came from: the file's name, ``$SEMHEALTH_...``
    for an environment variable or ``command line``; ``line`` and ``column`` (1-based) are set
    when the value came from the file. ``warning``: the setting works against itself (it is
    read by nothing, say) but nothing stops; said, never refused.
    """

    path: str
    message: str
    fix: str
    _: KW_ONLY
    source: str | None = None
    line: int | None = None
    column: int | None = None
    warning: bool = False

    def __str__(self) -> str:
        where = ""
        if self.source is not None and self.line is not None:
            where = f"{self.source}:{self.line}:{self.column or 1}: "
        elif self.source is not None:
            where = f"{self.source}: "
        kind = "warning: " if self.warning else ""
        path = f"{self.path}: " if self.path else ""
        return f"{where}{kind}{path}{self.message} (fix: {self.fix})"


class IssuesError(SemhealthError):
    """One or more issues, all found at once; ``str()`` lists them, one per line."""

    def __init__(self, issues: Iterable[Issue]) -> None:
        self.issues: tuple[Issue, ...] = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))
