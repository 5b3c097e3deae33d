"""Kubernetes: sidecar injection into Pod templates, by command (``semhealth inject``) and by
mutating admission webhook (``semhealth injector``), through one code path.

``plan_injection`` turns a Pod template and its ``semhealth.io/`` annotations into the JSON
Patch that adds the sidecar; the command applies it to manifests (``inject_text``), the
webhook sends it to the API server (``review``), so both give the same Pod.
"""

from semhealth.agent.kube.errors import AnnotationError, InjectionError, ManifestError
from semhealth.agent.kube.manifests import POD_TEMPLATE_PATHS, Outcome, inject_text, uninject_text
from semhealth.agent.kube.patch import (
    Operation,
    Plan,
    apply_patch,
    plan_injection,
    uninject_template,
)
from semhealth.agent.kube.settings import Options, Settings, read_options
from semhealth.agent.kube.tls import CertificateReloader
from semhealth.agent.kube.webhook import Injector, Review, build_app, review

__all__ = [
    "POD_TEMPLATE_PATHS",
    "AnnotationError",
    "CertificateReloader",
    "InjectionError",
    "Injector",
    "ManifestError",
    "Operation",
    "Options",
    "Outcome",
    "Plan",
    "Review",
    "Settings",
    "apply_patch",
    "build_app",
    "inject_text",
    "plan_injection",
    "read_options",
    "review",
    "uninject_template",
    "uninject_text",
]
