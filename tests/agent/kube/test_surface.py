"""semhealth.agent.kube's public names are deliberate: adding or removing one is decided here."""

from __future__ import annotations

import semhealth.agent.kube as kube

SURFACE = {
    "POD_TEMPLATE_PATHS", "AnnotationError", "CertificateReloader", "InjectionError", "Injector",
    "ManifestError", "Operation", "Options", "Outcome", "Plan", "Review", "Settings",
    "apply_patch", "build_app", "inject_text", "plan_injection", "read_options", "review",
    "uninject_template", "uninject_text",
}  # fmt: skip


def test_public_surface_is_exactly_the_listed_names() -> None:
    assert set(kube.__all__) == SURFACE
    assert all(hasattr(kube, name) for name in SURFACE)
