"""The providers' one table follows the configuration's one list of names.

Each provider module declares its entries (adapter, request reader, paths, GenAI names) and the
registry gathers them; the configuration's ``PROVIDERS`` (and the config schema's enum, pinned
in tests/agent/test_config.py) must name exactly those. A provider added to one and not the
other is a failing test, not two stages that quietly disagree.
"""

from __future__ import annotations

from semhealth.collectors import PROVIDERS
from semhealth.collectors.adapters import registry

CONCRETE_PROVIDERS = set(PROVIDERS) - {"auto"}


def test_the_table_names_each_configurable_provider_once() -> None:
    names = [provider.name for provider in registry.PROVIDER_TABLE]
    assert sorted(names) == sorted(CONCRETE_PROVIDERS)


def test_every_provider_has_an_adapter_and_no_other_name_has() -> None:
    assert set(registry.ADAPTER_NAMES) - {registry.UNKNOWN} == CONCRETE_PROVIDERS


def test_every_provider_is_implied_by_some_request_path() -> None:
    assert all(provider.suffixes for provider in registry.PROVIDER_TABLE)


def test_no_two_providers_claim_the_same_path_on_the_same_platform() -> None:
    claims = [
        (suffix, provider.platform.pattern if provider.platform else None)
        for provider in registry.PROVIDER_TABLE
        for suffix in provider.suffixes
    ]
    assert len(claims) == len(set(claims))
