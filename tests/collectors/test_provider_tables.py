"""The collectors' tables keyed by provider follow its one list of names.

Provider names have one source, ``semhealth.collectors.PROVIDERS``; the request readers, the
adapters and the path suffixes are keyed by them (the config schema's enum is pinned in
tests/agent/test_config.py). A provider added to one table and not the others is a failing
test, not two stages that quietly disagree.
"""

from __future__ import annotations

from semhealth.collectors import PROVIDERS, request
from semhealth.collectors.adapters import registry

CONCRETE_PROVIDERS = set(PROVIDERS) - {"auto"}


def test_every_provider_has_a_request_reader_and_no_other_name_has() -> None:
    assert set(request._READERS) == CONCRETE_PROVIDERS


def test_every_provider_has_an_adapter_and_no_other_name_has() -> None:
    assert set(registry.ADAPTER_NAMES) - {registry.UNKNOWN} == CONCRETE_PROVIDERS


def test_request_paths_imply_only_known_providers() -> None:
    # vertex_ai is Gemini's suffix on a Vertex AI path (see test_adapter_registry).
    implied = {provider for _, provider in registry._PATH_SUFFIXES} | {"vertex_ai"}
    assert implied == CONCRETE_PROVIDERS
