"""The client side of TLS to an upstream: the one place its files are loaded.

The relay (to ``upstream``), live shadowing (to ``shadow.upstream``) and ``semhealth config
check`` all build their context here, so a file the check accepts is a file the agent loads.
"""

from __future__ import annotations

import ssl

from semhealth.common.errors import SemhealthError


class TLSFileError(SemhealthError):
    """A TLS file that does not load; ``setting`` names the key, the message never holds the
    file's content."""

    def __init__(self, setting: str, path: str, reason: str) -> None:
        self.setting = setting
        self.path = path
        self.reason = reason
        super().__init__(f"{setting} {path!r} cannot be loaded: {reason}")


def client_context(
    *,
    verify: bool = True,
    ca_file: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
) -> ssl.SSLContext:
    """A client context trusting ``ca_file`` (None: the system's store) and presenting
    ``client_cert``/``client_key`` when given; raises ``TLSFileError`` naming the setting
    whose file did not load."""
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except OSError as exc:  # ssl.SSLError is one
        raise TLSFileError("ca_file", ca_file or "", _reason(exc)) from exc
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert:
        try:
            context.load_cert_chain(client_cert, client_key)
        except OSError as exc:
            raise TLSFileError("client_cert", client_cert, _reason(exc)) from exc
    return context


def _reason(exc: OSError) -> str:
    """OpenSSL's library and reason (``X509: NO_CERTIFICATE_OR_CRL_FOUND``), or the system's
    (``No such file or directory``), without the C source line ``str()`` adds."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"{exc.library}: {exc.reason}" if exc.library else exc.reason
    return exc.strerror or str(exc)
