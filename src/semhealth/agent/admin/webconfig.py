"""The admin listener's web configuration: Prometheus' exporter-toolkit ``web.yml``.

The same file an exporter takes as ``--web.config.file``, so Prometheus' ``scrape_config``
(``basic_auth``, ``tls_config``) speaks to the admin port as it speaks to any exporter::

    tls_server_config:            # present: the admin port serves HTTPS only
      cert_file: server.crt       # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:             # bcrypt hashes; empty: no authentication
      prometheus: $2y$10$...
    rate_limit: {interval: 100ms, burst: 10}

Reloading follows exporter-toolkit: the file (and the certificate files it names) is looked
at again on every request and every TLS handshake; a change takes effect at once. Unlike
exporter-toolkit, which answers 500 while the file is bad, a file that no longer parses keeps
the last good configuration in force and logs why (once per change). Whether TLS is on at
all is decided at start-up, as in exporter-toolkit.

Differences forced by Python's ``ssl`` (OpenSSL), each an error or documented here:

- ``client_auth_type``: ``NoClientCert``, ``VerifyClientCertIfGiven`` and
  ``RequireAndVerifyClientCert``. ``RequestClientCert`` and ``RequireAnyClientCert`` accept
  certificates without verifying them, which OpenSSL through Python cannot do: an error.
- ``cipher_suites``: Go's names, mapped to OpenSSL's, for TLS 1.2 and below; TLS 1.3 names
  are accepted and ignored (neither Go nor Python configures TLS 1.3 suites).
- ``curve_preferences``: checked, then ignored (OpenSSL's default groups apply).
- ``http_server_config.http2``: ignored; the admin port speaks HTTP/1.1.
- ``client_auth_type``, versions and cipher suites changed while running apply after a
  restart; certificates, keys and client CAs reload on the next handshake.

Passwords are checked with bcrypt off the event loop, one at a time (as exporter-toolkit's
mutex does), with results cached by a digest of (user, hash, password) so a scrape every
15 s costs one bcrypt per password, not one per scrape. The password itself is never stored,
logged or compared outside bcrypt.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import ssl
import tempfile
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import bcrypt
import yaml

from semhealth.agent.errors import SemhealthError

log = logging.getLogger(__name__)

# exporter-toolkit's own list: only these may be set, some only to these values.
_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# Go's crypto/tls CipherSuites() names -> OpenSSL's; None: a TLS 1.3 suite, not configurable.
_CIPHERS: dict[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
_CURVES = ("CurveP256", "CurveP384", "CurveP521", "X25519")
_BCRYPT = re.compile(rb"^\$2[abxy]\$\d\d\$[./A-Za-z0-9]{53}$")
# Checked when the user is unknown, so a wrong name costs what a wrong password costs
# (exporter-toolkit's fixed hash of "fakepassword").
_DUMMY_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
_AUTH_CACHE_SIZE = 100  # exporter-toolkit's
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class WebConfigError(SemhealthError):
    """The web configuration file is unreadable or invalid; the message names the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TLSServerConfig:
    cert_file: str | None = None
    key_file: str | None = None
    cert: str | None = None  # inline PEM, instead of cert_file
    key: str | None = None
    client_ca_file: str | None = None
    client_ca: str | None = None
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True
    curve_preferences: tuple[str, ...] = ()

    def files(self) -> tuple[str, ...]:
        """The files a handshake reads: a change to any makes a new context."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    interval_s: float  # one request per interval, on average
    burst: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WebConfig:
    tls: TLSServerConfig | None = None  # None: plain HTTP
    headers: Mapping[str, str] = field(default_factory=dict)
    users: Mapping[str, bytes] = field(default_factory=dict)  # name -> bcrypt hash
    rate_limit: RateLimit | None = None


# --------------------------------------------------------------------------- parsing


def load_web_config(path: str) -> WebConfig:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read the web configuration: {exc}") from exc
    return parse_web_config(text, base_dir=os.path.dirname(os.path.abspath(path)), source=path)


def parse_web_config(text: str, *, base_dir: str, source: str = "web config") -> WebConfig:
    """``text`` as a web.yml; relative file names are taken from ``base_dir``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{source}: not valid YAML: {exc}") from exc
    if data is None:
        return WebConfig()
    top = _mapping(source, "", data)
    _only(
        source,
        "",
        top,
        ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"),
    )
    tls_data = top.get("tls_server_config")
    tls = _tls(source, tls_data, base_dir) if tls_data else None
    return WebConfig(
        tls=tls,
        headers=_headers(source, top.get("http_server_config")),
        users=_users(source, top.get("basic_auth_users")),
        rate_limit=_rate_limit(source, top.get("rate_limit")),
    )


def _fail(source: str, key: str, message: str) -> WebConfigError:
    return WebConfigError(f"{source}: {key}: {message}" if key else f"{source}: {message}")


def _mapping(source: str, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(source, key, f"must be a mapping, not {type(value).__name__}")
    return value


def _only(source: str, key: str, data: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(str(name) for name in data if name not in known)
    if unknown:
        where = f"{key}." if key else ""
        raise _fail(source, f"{where}{unknown[0]}", f"unknown key (known: {', '.join(known)})")


def _string(source: str, key: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _fail(source, key, f"must be a string, not {type(value).__name__}")
    return value


def _strings(source: str, key: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _fail(source, key, "must be a list of strings")
    return tuple(value)


def _tls(source: str, value: Any, base_dir: str) -> TLSServerConfig:
    key = "tls_server_config"
    data = _mapping(source, key, value)
    fields = TLSServerConfig.__dataclass_fields__
    _only(source, key, data, tuple(fields))

    def text(name: str) -> str | None:
        return _string(source, f"{key}.{name}", data.get(name))

    def path(name: str) -> str | None:
        given = text(name)
        return None if given is None else os.path.join(base_dir, given)

    config = TLSServerConfig(
        cert_file=path("cert_file"),
        key_file=path("key_file"),
        cert=text("cert"),
        key=text("key"),
        client_ca_file=path("client_ca_file"),
        client_ca=text("client_ca"),
        client_auth_type=text("client_auth_type") or "NoClientCert",
        client_allowed_sans=_strings(
            source, f"{key}.client_allowed_sans", data.get("client_allowed_sans")
        ),
        min_version=text("min_version") or "TLS12",
        max_version=text("max_version") or "TLS13",
        cipher_suites=_strings(source, f"{key}.cipher_suites", data.get("cipher_suites")) or (),
        prefer_server_cipher_suites=data.get("prefer_server_cipher_suites", True) is not False,
        curve_preferences=_strings(
            source, f"{key}.curve_preferences", data.get("curve_preferences")
        )
        or (),
    )
    _check_tls(source, config)
    return config


def _check_tls(source: str, tls: TLSServerConfig) -> None:
    key = "tls_server_config"
    if (tls.cert_file is None) == (tls.cert is None):
        raise _fail(source, key, "give exactly one of cert_file and cert")
    if (tls.key_file is None) == (tls.key is None):
        raise _fail(source, key, "give exactly one of key_file and key")
    if tls.client_ca_file is not None and tls.client_ca is not None:
        raise _fail(source, key, "give at most one of client_ca_file and client_ca")
    auth = tls.client_auth_type
    if auth in _UNVERIFIED_CLIENT_AUTH:
        raise _fail(
            source,
            f"{key}.client_auth_type",
            f"{auth} accepts client certificates without verifying them, which semhealth "
            "(Python's ssl) cannot do; use RequireAndVerifyClientCert with client_ca_file",
        )
    if auth not in _CLIENT_AUTH:
        raise _fail(
            source,
            f"{key}.client_auth_type",
            f"unknown value {auth!r} (known: {', '.join(_CLIENT_AUTH)})",
        )
    has_ca = tls.client_ca_file is not None or tls.client_ca is not None
    if _CLIENT_AUTH[auth] != ssl.CERT_NONE and not has_ca:
        raise _fail(
            source, f"{key}.client_ca_file", f"{auth} needs the CA that signs client certificates"
        )
    if has_ca and auth == "NoClientCert":
        raise _fail(
            source,
            f"{key}.client_auth_type",
            "client CAs are configured without a client auth policy",
        )
    for name in ("min_version", "max_version"):
        if getattr(tls, name) not in _VERSIONS:
            raise _fail(
                source, f"{key}.{name}", f"unknown TLS version (known: {', '.join(_VERSIONS)})"
            )
    for suite in tls.cipher_suites:
        if suite not in _CIPHERS:
            raise _fail(source, f"{key}.cipher_suites", f"unknown cipher suite {suite!r}")
    for curve in tls.curve_preferences:
        if curve not in _CURVES:
            raise _fail(source, f"{key}.curve_preferences", f"unknown curve {curve!r}")


def _headers(source: str, value: Any) -> dict[str, str]:
    if not value:
        return {}
    key = "http_server_config"
    data = _mapping(source, key, value)
    _only(source, key, data, ("headers", "http2"))
    headers = data.get("headers") or {}
    _mapping(source, f"{key}.headers", headers)
    result: dict[str, str] = {}
    for name, given in headers.items():
        allowed = _HEADERS.get(name)
        where = f"{key}.headers.{name}"
        if allowed is None:
            raise _fail(source, where, f"cannot be configured (allowed: {', '.join(_HEADERS)})")
        text = _string(source, where, given)
        if text is None:
            continue
        if allowed and text not in allowed:
            raise _fail(source, where, f"must be one of {', '.join(allowed)}, not {text!r}")
        result[name] = text
    return result


def _users(source: str, value: Any) -> dict[str, bytes]:
    if not value:
        return {}
    data = _mapping(source, "basic_auth_users", value)
    users: dict[str, bytes] = {}
    for name, hashed in data.items():
        where = f"basic_auth_users.{name}"
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed.encode()):
            # The value may be a password written in clear by mistake: never echo it.
            raise _fail(source, where, "is not a bcrypt hash (make one with htpasswd -nBC 10 '')")
        users[str(name)] = hashed.encode()
    return users


def _rate_limit(source: str, value: Any) -> RateLimit | None:
    if not value:
        return None
    key = "rate_limit"
    data = _mapping(source, key, value)
    _only(source, key, data, ("interval", "burst"))
    interval = parse_duration(source, f"{key}.interval", data.get("interval", 0))
    burst = data.get("burst", 0)
    if not isinstance(burst, int) or burst < 0:
        raise _fail(source, f"{key}.burst", "must be a whole number, 0 or more")
    return RateLimit(interval_s=interval, burst=burst) if interval > 0 else None


def parse_duration(source: str, key: str, value: Any) -> float:
    """A Go duration (``1m30s``, ``100ms``) in seconds; a bare 0 is 0."""
    if value == 0:
        return 0.0
    text = str(value)
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise _fail(source, key, f"{text!r} is not a duration such as 100ms or 1m30s")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def validate_web_config(path: str) -> WebConfig:
    """The file, and its certificates loaded once: what ``semhealth run`` checks first."""
    config = load_web_config(path)
    if config.tls is not None:
        try:
            build_ssl_context(config.tls)
        except WebConfigError as exc:
            raise WebConfigError(f"{path}: {exc}") from exc
    return config


# --------------------------------------------------------------------------- TLS


def build_ssl_context(tls: TLSServerConfig) -> ssl.SSLContext:
    """A server context for ``tls``; raises ``WebConfigError`` naming what failed to load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[tls.min_version]
    context.maximum_version = _VERSIONS[tls.max_version]
    try:
        _load_chain(context, tls)
        if tls.client_ca_file is not None:
            context.load_verify_locations(cafile=tls.client_ca_file)
        elif tls.client_ca is not None:
            context.load_verify_locations(cadata=tls.client_ca)
        ciphers = [name for suite in tls.cipher_suites if (name := _CIPHERS[suite])]
        if ciphers:
            context.set_ciphers(":".join(dict.fromkeys(ciphers)))
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise WebConfigError(f"tls_server_config: cannot load the certificates: {exc}") from exc
    context.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def _load_chain(context: ssl.SSLContext, tls: TLSServerConfig) -> None:
    if tls.cert is None and tls.key is None:
        context.load_cert_chain(tls.cert_file or "", tls.key_file)
        return
    # OpenSSL loads a chain from files only: inline PEM goes through a private temporary
    # folder that is removed at once.
    with tempfile.TemporaryDirectory(prefix="semhealth-tls-") as folder:
        cert_path = tls.cert_file or _write_private(folder, "cert.pem", tls.cert or "")
        key_path = tls.key_file or _write_private(folder, "key.pem", tls.key or "")
        context.load_cert_chain(cert_path, key_path)


def _write_private(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    return path


def peer_sans(peercert: Mapping[str, Any] | None) -> set[str]:
    """The Subject Alternative Names of a verified peer certificate, as exporter-toolkit
    compares them (DNS, IP, e-mail, URI; IPs in their canonical form)."""
    names: set[str] = set()
    for kind, value in (peercert or {}).get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                value = str(ipaddress.ip_address(value.strip()))
            except ValueError:
                continue
        names.add(value)
    return names


def sans_allowed(allowed: tuple[str, ...], peercert: Mapping[str, Any] | None) -> bool:
    canonical = set()
    for name in allowed:
        try:
            canonical.add(str(ipaddress.ip_address(name)))
        except ValueError:
            canonical.add(name)
    return bool(canonical & peer_sans(peercert))


# --------------------------------------------------------------------------- the file, live


@dataclass(frozen=True, slots=True)
class _Stamp:
    """What tells a file changed: a Secret's update swaps a symlink, so stat follows it."""

    mtime_ns: int
    size: int
    inode: int


def _stamp(path: str) -> _Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _Stamp(st.st_mtime_ns, st.st_size, st.st_ino)


class WebConfigSource:
    """``path``, loaded at start (an invalid file stops start-up) and again whenever it or
    a certificate file it names changes; a bad version keeps the last good one in force."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.config = load_web_config(path)
        self._stamp = _stamp(path)
        self._bad_stamp: _Stamp | None = None
        self.reload_failures = 0
        self.tls_at_start = self.config.tls is not None
        self._context: ssl.SSLContext | None = None
        self._context_key: tuple[object, ...] | None = None
        if self.config.tls is not None:
            self._context = build_ssl_context(self.config.tls)  # fails start-up when broken
            self._context_key = self._tls_key(self.config.tls)

    def current(self) -> WebConfig:
        """The configuration in force; one ``stat`` when nothing changed."""
        stamp = _stamp(self.path)
        if stamp == self._stamp or stamp == self._bad_stamp:
            return self.config
        try:
            config = load_web_config(self.path)
        except WebConfigError as exc:
            self._bad_stamp = stamp
            self.reload_failures += 1
            log.error("web config %s not reloaded; the last good one stays: %s", self.path, exc)
            return self.config
        self._stamp, self._bad_stamp = stamp, None
        if self.tls_at_start != (config.tls is not None):
            log.warning("web config %s: turning TLS on or off takes a restart", self.path)
        self.config = config
        log.info("web config %s reloaded", self.path)
        return config

    def listening_context(self) -> ssl.SSLContext | None:
        """The context to listen with (None: plain HTTP). Each handshake switches to the
        context of the configuration in force, so rotated certificates are served at once."""
        listening = self._context
        if listening is not None:
            listening.sni_callback = self._on_hello
        return listening

    def context(self) -> ssl.SSLContext | None:
        """The context of the configuration in force, rebuilt when a file it reads changed;
        a certificate that no longer loads keeps the last good context."""
        tls = self.current().tls
        if tls is None or self._context is None:
            return self._context
        key = self._tls_key(tls)
        if key != self._context_key:
            try:
                self._context = build_ssl_context(tls)
            except WebConfigError as exc:
                log.error(
                    "web config %s: TLS not reloaded; the last good one stays: %s", self.path, exc
                )
            self._context_key = key  # the same broken files are not tried on every handshake
        return self._context

    def _tls_key(self, tls: TLSServerConfig) -> tuple[object, ...]:
        return (tls, *(_stamp(path) for path in tls.files()))

    def _on_hello(self, sslobj: Any, _server_name: str | None, _context: ssl.SSLContext) -> None:
        # Never raise here: OpenSSL would end the handshake with an internal error.
        try:
            context = self.context()
            if context is not None and context is not sslobj.context:
                sslobj.context = context
        except Exception:  # a bug must not cut the admin port off: the old context serves
            log.exception("web config: the TLS context could not be switched")


# --------------------------------------------------------------------------- basic auth


@dataclass(slots=True)
class AuthStats:
    failures: int = 0  # requests refused for missing or wrong credentials
    rate_limited: int = 0


class Authenticator:
    """Checks ``Authorization: Basic`` against the users in force."""

    def __init__(self) -> None:
        self.stats = AuthStats()
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        # One bcrypt at a time: a flood of wrong passwords costs one core, not all of them.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semhealth-bcrypt")

    async def check(self, users: Mapping[str, bytes], authorization: str | None) -> bool:
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        hashed = _find_user(users, user)
        known = hashed is not None
        hashed = hashed if hashed is not None else _DUMMY_HASH
        key = hashlib.sha256(b"\0".join((user, hashed, password))).digest()
        verdict = self._cache.get(key)
        if verdict is None:
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(self._pool, _bcrypt_ok, password, hashed)
            self._cache[key] = verdict
            while len(self._cache) > _AUTH_CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return known and verdict

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _basic_credentials(authorization: str | None) -> tuple[bytes, bytes] | None:
    if not authorization:
        return None
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    return (user, password) if sep else None


def _find_user(users: Mapping[str, bytes], user: bytes) -> bytes | None:
    """The user's hash; every name is compared in constant time, none skipped, so how long
    this takes says nothing about which names exist."""
    found = None
    for name, hashed in users.items():
        if hmac.compare_digest(name.encode(), user):
            found = hashed
    return found


def _bcrypt_ok(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a password over bcrypt's 72 bytes (bcrypt 5 refuses them)
        return False


class TokenBucket:
    """``rate_limit``: one token per interval, at most ``burst`` saved (Go's rate.Limiter)."""

    def __init__(self) -> None:
        self._tokens = 0.0
        self._at = time.monotonic()
        self._limit: RateLimit | None = None

    def allow(self, limit: RateLimit | None) -> bool:
        if limit is None:
            return True
        now = time.monotonic()
        if limit != self._limit:
            self._limit, self._tokens = limit, float(limit.burst)
        else:
            self._tokens = min(
                float(limit.burst), self._tokens + (now - self._at) / limit.interval_s
            )
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
