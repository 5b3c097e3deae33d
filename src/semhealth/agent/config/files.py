"""The files the configuration names, opened by the loaders the agent itself uses.

``semhealth config check`` accepts a file only if ``semhealth run`` will: each is read here
by the same code that reads it at start-up, and one that does not load is an issue naming its
key, the path and the reason. Two groups:

- read by every process that loads the configuration (the checks of ``Config.validate``):
  TLS files (``common.tls``, as the relay and live shadowing build their contexts) and the
  admin port's web configuration (``admin.webconfig``, with the certificates it names);
- read by the analysis process only (``analysis_file_issues``): the shadow tokenizer, the
  relevance calibration and a scorer encoder's TLS files. Their libraries (tokenizers, numpy,
  grpc) must never be mapped by a forwarding process, so those load the configuration
  without them and the analysis process, which opens these files anyway, checks them first.

Contracts and rule files are read by the route and alert checks themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from semhealth.agent.config.checks import file_issues, under
from semhealth.agent.errors import ConfigIssue
from semhealth.common.tls import TLSFileError, client_context

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from semhealth.embeddings import config as embeddings_config

_TLS_FIXES = {
    "ca_file": "give a PEM file of the CA certificates to trust",
    "client_cert": "give the PEM certificate and, in client_key, its PEM private key",
}


def tls_issues(
    *, verify: bool, ca_file: str | None, client_cert: str | None, client_key: str | None
) -> list[ConfigIssue]:
    """A TLS section's files loaded as the client context that uses them (paths relative to
    the section); run only once each file exists."""
    try:
        client_context(
            verify=verify, ca_file=ca_file, client_cert=client_cert, client_key=client_key
        )
    except TLSFileError as exc:
        return [ConfigIssue(exc.setting, str(exc), _TLS_FIXES[exc.setting])]
    return []


def web_config_issues(path: str | None) -> list[ConfigIssue]:
    """``listen.admin_web_config`` read and its certificates loaded, as the admin front does
    at start-up (path relative to ``listen``)."""
    missing = file_issues("admin_web_config", path)
    if missing or path is None:
        return missing
    # Imported here: the checks load it only when a file is named.
    from semhealth.agent.admin.webconfig import WebConfigError, validate_web_config

    try:
        validate_web_config(path)
    except WebConfigError as exc:
        return [
            ConfigIssue(
                "admin_web_config",
                str(exc),
                "correct the web configuration file (Prometheus exporter-toolkit's web.yml"
                " format) or the files it names",
            )
        ]
    return []


def read_tokenizer(path: str) -> Tokenizer:
    """A ``tokenizer.json`` (Hugging Face ``tokenizers`` format), as live shadowing and
    ``semhealth diff`` read it. Raises ``ValueError`` naming the file when it cannot be read."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the library raises a bare Exception for a bad file
        raise ValueError(f"{path}: not a readable tokenizer.json ({exc})") from None


def analysis_file_issues(
    *, tokenizer: str | None, calibration: str | None, embeddings: embeddings_config.Config
) -> list[ConfigIssue]:
    """The files only the analysis process reads, each read as it reads them (full paths):
    ``shadow.tokenizer``, ``relevance.calibration`` and the scorer encoders' TLS files.

    A file that does not exist is already an issue of ``Config.validate()``: not read again.
    """
    issues: list[ConfigIssue] = []
    if tokenizer is not None:
        issues += under("shadow", _tokenizer_issues(tokenizer))
    if calibration is not None:
        issues += under("relevance", _calibration_issues(calibration))
    for where, tls in _scorer_tls(embeddings):
        issues += under(f"relevance.{where}", _scorer_tls_issues(tls))
    return issues


def scorer_tls_file_issues(embeddings: embeddings_config.Config) -> list[ConfigIssue]:
    """The TLS files of the scorer encoders in use exist (paths relative to ``relevance``)."""
    return [
        issue
        for where, tls in _scorer_tls(embeddings)
        for name in _SCORER_TLS_FILES
        for issue in under(where, file_issues(name, getattr(tls, name) or None))
    ]


_SCORER_TLS_FILES = ("ca_file", "cert_file", "key_file")


def _scorer_tls(embeddings: embeddings_config.Config) -> list[tuple[str, embeddings_config.Tls]]:
    """(path under ``relevance``, TLS settings) of each scorer encoder in use with TLS on:
    the encoders ``open_scorer`` opens, and only a scorer's channel reads these files."""
    from semhealth.embeddings import used_encoders

    used = {encoder.name for encoder in used_encoders(embeddings)}
    return [
        (f"encoders[{index}].remote.tls", encoder.remote.tls)
        for index, encoder in enumerate(embeddings.encoders)
        if encoder.name in used and encoder.backend == "scorer" and encoder.remote.tls.enabled
    ]


def _tokenizer_issues(path: str) -> list[ConfigIssue]:
    if file_issues("tokenizer", path):
        return []
    try:
        read_tokenizer(path)
    except ValueError as exc:
        return [
            ConfigIssue(
                "tokenizer",
                str(exc),
                "give a tokenizer.json in Hugging Face tokenizers' format, such as the one"
                " beside the candidate model's weights",
            )
        ]
    return []


def _calibration_issues(path: str) -> list[ConfigIssue]:
    if file_issues("calibration", path):
        return []
    from semhealth.embeddings import CalibrationError, read_calibration

    try:
        read_calibration(path)
    except CalibrationError as exc:
        return [ConfigIssue("calibration", str(exc), "give a file written by semhealth calibrate")]
    return []


def _scorer_tls_issues(tls: embeddings_config.Tls) -> list[ConfigIssue]:
    if any(file_issues(name, getattr(tls, name) or None) for name in _SCORER_TLS_FILES):
        return []
    from semhealth.embeddings import tls_credentials

    try:
        tls_credentials(tls.ca_file or None, tls.cert_file or None, tls.key_file or None)
    except (OSError, ValueError) as exc:
        return [
            ConfigIssue(
                "",
                str(exc),
                "give PEM files: the CA that signed the scorer's certificate and, for mutual"
                " TLS, this sidecar's certificate and key",
            )
        ]
    return []
