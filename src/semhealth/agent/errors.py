"""Errors the agent raises: its branch of ``semhealth.common.errors``' tree.

    SemhealthError              root of every error semhealth raises on purpose (common)
     ├── IssuesError            one or more Issues (common)
     │    └── ConfigError       the configuration is invalid; carries every ConfigIssue found
     ├── ConfigRefused          a process `semhealth run` started refused the configuration
     ├── RelevanceStartError    relevance scoring was required and its encoders could not start
     └── kube.errors.InjectionError    a manifest or annotation the injector cannot use
          ├── AnnotationError
          └── ManifestError

Only start-up raises these; once traffic flows, problems are counted and answered,
never raised into the forwarding loop. Add new branches to the tree above as they appear.
"""

from __future__ import annotations

from semhealth.common.errors import Issue, IssuesError, SemhealthError

__all__ = [
    "CONFIG_EXIT",
    "ConfigError",
    "ConfigIssue",
    "ConfigRefused",
    "RelevanceStartError",
    "SemhealthError",
]

# One issue type for every check: the configuration's, the embeddings' and the rules'.
ConfigIssue = Issue


# How a semhealth process exits when it refuses its configuration: a supervisor does not
# restart a child that exits so at its first start, since it would only refuse it again.
CONFIG_EXIT = 2


class ConfigError(IssuesError):
    """The configuration has one or more issues; ``str()`` lists them, one per line."""


class ConfigRefused(SemhealthError):
    """A process ``semhealth run`` started exited with ``CONFIG_EXIT`` at its first start; it
    wrote the issues to stderr itself."""


class RelevanceStartError(SemhealthError):
    """Relevance scoring was asked for (``relevance.enabled: true``) and could not start."""
