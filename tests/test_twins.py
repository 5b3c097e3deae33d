"""Definitions kept in more than one place, each pinned to its one source.

collectors and embeddings never import each other, so a definition both need is kept in
each and pinned equal here. Provider names have one source, ``semhealth.collectors.PROVIDERS``;
the tables keyed by them follow it (the config schema's enum is pinned in
tests/agent/test_config.py). A change to one side without the other is a failing test, not
two stages that quietly disagree.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors import PROVIDERS, request
from semhealth.collectors.adapters import registry
from semhealth.embeddings import _text, estimate_tokens

CONCRETE_PROVIDERS = set(PROVIDERS) - {"auto"}


def test_the_cjk_character_set_is_the_same_in_collectors_and_embeddings() -> None:
    # Which characters count one token each (collectors' prompt class, the batcher's batch
    # cost) and which route a request to the multilingual encoder.
    assert request.CJK_CLASS == _text.CJK_CLASS


@given(st.text(min_size=1))
def test_both_token_estimates_agree_on_any_text(text: str) -> None:
    assert request.estimate_tokens([text]) == estimate_tokens(text)


def test_every_provider_has_a_request_reader_and_no_other_name_has() -> None:
    assert set(request._READERS) == CONCRETE_PROVIDERS


def test_every_provider_has_an_adapter_and_no_other_name_has() -> None:
    assert set(registry.ADAPTER_NAMES) - {registry.UNKNOWN} == CONCRETE_PROVIDERS


def test_request_paths_imply_only_known_providers() -> None:
    assert {provider for _, provider in registry._PATH_SUFFIXES} == CONCRETE_PROVIDERS
