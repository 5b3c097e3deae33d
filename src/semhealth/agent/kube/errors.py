"""Errors of sidecar injection.

    SemhealthError                 (semhealth.agent.errors)
     └── InjectionError            a Pod template cannot be injected as asked
          ├── AnnotationError      a semhealth.io/ annotation has a value that cannot be used
          └── ManifestError        an input document is not YAML, or not a Kubernetes object

``semhealth inject`` reports them and stops with status 1; the webhook answers the same
error as a warning on an allowed request, so a mistake never blocks a Pod from starting.
Messages name the object and the annotation, never a value from the Pod's env.
"""

from __future__ import annotations

from semhealth.agent.errors import SemhealthError


class InjectionError(SemhealthError):
    """A Pod template cannot be injected as asked; the message says why and how to fix it."""


class AnnotationError(InjectionError):
    """A ``semhealth.io/`` annotation's value cannot be used."""


class ManifestError(InjectionError):
    """An input document is not YAML, or not the Kubernetes object it claims to be."""
