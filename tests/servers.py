"""What every test that runs a real server needs: a free loopback port, and the binary of a
Debian package, or a clear skip without it; likewise a Python package of the test extra.

A missing binary or package skips the test with the reason, unless ``REQUIRE_REAL_SERVERS=1``
(CI sets it), where it fails: CI must never pass by skipping what it was meant to run.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
from types import ModuleType

import pytest

REQUIRE_ENV = "REQUIRE_REAL_SERVERS"


def free_port() -> int:
    """A loopback port free a moment ago (bound, then released for a server to take)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/bin")


def required() -> bool:
    """Whether a missing real server must fail the run instead of skipping it."""
    return os.environ.get(REQUIRE_ENV) == "1"


def require_binary(name: str, package: str) -> str:
    """The path of ``name`` from Debian's ``package``; skip without it, or fail where it is
    required."""
    found = find_binary(name)
    if found is not None:
        return found
    reason = f"{name} not found on PATH or in /usr/bin (Debian package: {package})"
    if required():
        pytest.fail(f"{reason}, and {REQUIRE_ENV}=1 forbids skipping", pytrace=False)
    pytest.skip(reason)


def require_module(name: str, package: str) -> ModuleType:
    """The module ``name`` from the test extra's ``package``; skip without it (at module
    level too), or fail where it is required."""
    try:
        return importlib.import_module(name)
    except ImportError:
        reason = f"{name} cannot be imported (PyPI package {package}, in the test extra)"
    if required():
        pytest.fail(f"{reason}, and {REQUIRE_ENV}=1 forbids skipping", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
