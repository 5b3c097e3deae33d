"""The injector's TLS: a server context that picks up a rotated certificate by itself.

A Secret rotation (cert-manager, or the chart's hook Job run again) rewrites the mounted
files in place, and the API server keeps calling. So every TLS handshake, through the
standard library's ``sni_callback``, checks the files' content (at most once per
``check_interval_s``: two small reads from a tmpfs, cheap enough for the event loop) and,
when they changed, hands the handshake a freshly loaded context. A half-written pair
(certificate renewed, key not yet) fails to load: the last good context keeps serving and
the next handshake tries again.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("semhealth.injector")


class CertificateReloader:
    """Holds the current server context for ``cert_file``/``key_file``; loading at creation
    raises (``OSError``, ``ssl.SSLError``) so a bad pair stops start-up."""

    def __init__(
        self,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = (Path(cert_file), Path(key_file))
        self._interval = check_interval_s
        self._clock = clock
        self._signature = self._fingerprint()
        self._current = self._load()
        self._checked_at = clock()
        self.reloads = 0  # successful reloads since start, for tests and logs

    def server_context(self) -> ssl.SSLContext:
        """The context to listen with: it serves the current pair on every handshake."""
        context = self._load()
        context.sni_callback = self._on_client_hello
        return context

    def current(self) -> ssl.SSLContext:
        self.maybe_reload()
        return self._current

    def maybe_reload(self) -> None:
        now = self._clock()
        if now - self._checked_at < self._interval:
            return
        self._checked_at = now
        try:
            signature = self._fingerprint()
        except OSError as exc:  # mid-rotation, the files may be missing for a moment
            log.warning("TLS certificate files unreadable, serving the last good pair: %s", exc)
            return
        if signature == self._signature:
            return
        try:
            self._current = self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning("TLS certificate not reloaded, serving the last good pair: %s", exc)
            return
        self._signature = signature
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self._files[0])

    def _on_client_hello(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None, _: ssl.SSLContext
    ) -> None:
        connection.context = self.current()

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(*self._files)
        return context

    def _fingerprint(self) -> bytes:
        # The content, not mtime or inode: a rewrite within one clock tick, or by a tool
        # that keeps the inode, is still seen (a Secret volume swaps a ..data symlink).
        digest = hashlib.sha256()
        for path in self._files:
            digest.update(path.read_bytes())
        return digest.digest()
