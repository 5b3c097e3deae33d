"""The admin web config (exporter-toolkit's web.yml): parsing with errors that name the key,
reloading from disk (a bad file keeps the last good one), bcrypt basic auth and TLS contexts.

Test files follow exporter-toolkit's own testdata (web/testdata/*.yml) where they overlap.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import ssl
from pathlib import Path

import bcrypt
import pytest

from semhealth.agent.admin.webconfig import (
    Authenticator,
    RateLimit,
    TokenBucket,
    WebConfigError,
    WebConfigSource,
    build_ssl_context,
    load_web_config,
    parse_web_config,
    sans_allowed,
    validate_web_config,
)
from tests.agent.kube.certs import make_ca, write_server_pair

# Cost 4, the least bcrypt allows: the tests check behaviour, not the cost.
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def pair(tmp_path: Path) -> Path:
    ca = make_ca()
    write_server_pair(ca, tmp_path / "server.crt", tmp_path / "server.key", "semhealth")
    (tmp_path / "ca.crt").write_bytes(ca.pem())
    return tmp_path


# --------------------------------------------------------------------------- parsing


def test_an_empty_file_means_plain_http_and_no_auth() -> None:
    config = parse_web_config("", base_dir="/")
    assert config.tls is None and not config.users and not config.headers


def test_a_full_file_parses_with_paths_relative_to_the_file(pair: Path) -> None:
    (pair / "web.yml").write_text(
        "tls_server_config:\n"
        "  cert_file: server.crt\n"
        "  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_ca_file: ca.crt\n"
        "  min_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n"
        "  curve_preferences: [X25519]\n"
        "http_server_config:\n"
        "  http2: false\n"
        "  headers:\n"
        "    X-Frame-Options: deny\n"
        "    Content-Security-Policy: default-src 'none'\n"
        f"basic_auth_users:\n  prometheus: '{HASH}'\n"
        "rate_limit: {interval: 1m30s, burst: 3}\n"
    )
    config = validate_web_config(str(pair / "web.yml"))
    assert config.tls is not None
    assert config.tls.cert_file == str(pair / "server.crt")
    assert config.tls.client_ca_file == str(pair / "ca.crt")
    assert config.headers == {
        "X-Frame-Options": "deny",
        "Content-Security-Policy": "default-src 'none'",
    }
    assert config.users == {"prometheus": HASH.encode()}
    assert config.rate_limit == RateLimit(interval_s=90.0, burst=3)
    context = build_ssl_context(config.tls)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  bogus: 1\n", "bogus"),
        ("basic_auth_users:\n  alice: plain-password-by-mistake\n", "basic_auth_users.alice"),
        ("http_server_config:\n  headers:\n    Server: semhealth\n", "headers.Server"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "X-Frame-Options"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Sometimes\n",
            "client_auth_type",
        ),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: SSL3\n", "min_version"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_BOGUS]\n",
            "cipher_suites",
        ),
        ("tls_server_config:\n  key_file: b\n", "cert_file"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n",
            "client_auth_type",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            "client_ca_file",
        ),
        ("rate_limit: {interval: soon, burst: 1}\n", "rate_limit.interval"),
        ("junk_key: 1\n", "junk_key"),
        ("[not, a, mapping]\n", "mapping"),
    ],
)
def test_a_bad_file_is_an_error_naming_the_key(text: str, names: str) -> None:
    with pytest.raises(WebConfigError) as raised:
        parse_web_config(text, base_dir="/", source="web.yml")
    message = str(raised.value)
    assert message.startswith("web.yml: ")
    assert names in message
    assert "plain-password-by-mistake" not in message  # a secret is never echoed


def test_client_auth_without_verification_is_refused_with_the_alternative() -> None:
    text = (
        "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n"
        "  client_auth_type: RequireAnyClientCert\n"
    )
    with pytest.raises(WebConfigError, match="RequireAndVerifyClientCert"):
        parse_web_config(text, base_dir="/")


def test_missing_certificate_files_fail_validation(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text("tls_server_config: {cert_file: no.crt, key_file: no.key}\n")
    with pytest.raises(WebConfigError, match="cannot load the certificates"):
        validate_web_config(str(tmp_path / "web.yml"))
    with pytest.raises(WebConfigError, match="cannot read"):
        load_web_config(str(tmp_path / "absent.yml"))


def test_inline_certificates_load(pair: Path) -> None:
    cert = (pair / "server.crt").read_text()
    key = (pair / "server.key").read_text()
    cert_block = "\n".join("    " + line for line in cert.splitlines())
    key_block = "\n".join("    " + line for line in key.splitlines())
    text = f"tls_server_config:\n  cert: |\n{cert_block}\n  key: |\n{key_block}\n"
    config = parse_web_config(text, base_dir=str(pair))
    assert config.tls is not None
    build_ssl_context(config.tls)  # loads from a private temporary file, then removes it


# --------------------------------------------------------------------------- reloading


def _touch_later(path: Path, text: str) -> None:
    stat = path.stat()
    path.write_text(text)
    # A filesystem with coarse timestamps could keep the same mtime: move it on.
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_changes_are_picked_up_and_a_bad_file_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: '{HASH}'\n")
    source = WebConfigSource(str(path))
    assert set(source.current().users) == {"alice"}
    _touch_later(path, f"basic_auth_users:\n  bob: '{HASH}'\n")
    assert set(source.current().users) == {"bob"}
    with caplog.at_level(logging.ERROR):
        _touch_later(path, "basic_auth_users:\n  carol: not-a-hash\n")
        assert set(source.current().users) == {"bob"}
        assert set(source.current().users) == {"bob"}  # the same bad file: logged once
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "basic_auth_users.carol" in errors[0].getMessage()
    assert "not-a-hash" not in errors[0].getMessage()
    assert source.reload_failures == 1
    _touch_later(path, f"basic_auth_users:\n  dave: '{HASH}'\n")
    assert set(source.current().users) == {"dave"}


def test_a_rotated_certificate_makes_a_new_context(pair: Path) -> None:
    (pair / "web.yml").write_text(
        "tls_server_config: {cert_file: server.crt, key_file: server.key}\n"
    )
    source = WebConfigSource(str(pair / "web.yml"))
    first = source.context()
    assert first is not None and source.context() is first  # nothing changed: the same
    ca = make_ca("another CA")
    write_server_pair(ca, pair / "server.crt", pair / "server.key", "rotated")
    stat = (pair / "server.crt").stat()
    os.utime(pair / "server.crt", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = source.context()
    assert second is not None and second is not first


# --------------------------------------------------------------------------- basic auth


async def test_basic_auth_accepts_the_right_password_only() -> None:
    auth = Authenticator()
    users = {"prometheus": HASH.encode()}
    try:
        assert await auth.check(users, _basic("prometheus", "s3cret"))
        assert await auth.check(users, _basic("prometheus", "s3cret"))  # cached
        assert not await auth.check(users, _basic("prometheus", "wrong"))
        assert not await auth.check(users, _basic("nobody", "s3cret"))
        assert not await auth.check(users, None)
        assert not await auth.check(users, "Bearer abc")
        assert not await auth.check(users, "Basic !!!not-base64")
        assert not await auth.check(users, "Basic " + base64.b64encode(b"no-colon").decode())
        # A $2y$ hash, as htpasswd writes them, works too.
        assert await auth.check({"p": b"$2y$" + HASH.encode()[4:]}, _basic("p", "s3cret"))
    finally:
        auth.close()


async def test_bcrypt_runs_off_the_event_loop() -> None:
    auth = Authenticator()
    slow = bcrypt.hashpw(b"pw", bcrypt.gensalt(12)).decode().encode()  # hundreds of ms
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        assert await auth.check({"u": slow}, _basic("u", "pw"))
    finally:
        ticker.cancel()
        auth.close()
    assert ticks >= 3  # the loop kept running while bcrypt worked


def test_the_token_bucket_allows_a_burst_then_one_per_interval() -> None:
    bucket = TokenBucket()
    limit = RateLimit(interval_s=3600.0, burst=2)
    assert [bucket.allow(limit) for _ in range(3)] == [True, True, False]
    assert bucket.allow(None)


def test_client_sans_compare_like_exporter_toolkit() -> None:
    cert = {"subjectAltName": (("DNS", "prometheus.monitoring"), ("IP Address", "0:0:0:0:0:0:0:1"))}
    assert sans_allowed(("::1",), cert)
    assert sans_allowed(("prometheus.monitoring",), cert)
    assert not sans_allowed(("other",), cert)
    assert not sans_allowed(("::1",), None)
