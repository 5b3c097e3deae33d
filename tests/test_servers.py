"""The helpers every real-part test leans on: a missing binary or test-extra package skips
on a developer's machine and fails where ``REQUIRE_REAL_SERVERS=1`` (CI) forbids skipping."""

from __future__ import annotations

import json

import pytest

from tests.servers import REQUIRE_ENV, require_module

ABSENT = "semhealth_no_such_module"


def test_a_present_package_is_imported() -> None:
    assert require_module("json", "json") is json


def test_a_missing_package_skips_where_skipping_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{ABSENT} cannot be imported"):
        require_module(ABSENT, "no-such-package")


def test_a_missing_package_fails_under_require_real_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV}=1 forbids skipping"):
        require_module(ABSENT, "no-such-package")
