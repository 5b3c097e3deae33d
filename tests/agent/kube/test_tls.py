"""The reloading server context: a new pair is picked up, a half-written one is not, and
the files are looked at no more often than asked."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from semhealth.agent.kube import CertificateReloader
from tests.agent.kube.certs import make_ca, write_server_pair


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_server_pair(make_ca(), cert_file, key_file, "first")
    return cert_file, key_file


def test_a_bad_pair_at_start_up_raises(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(ssl.SSLError):
        CertificateReloader(tmp_path / "tls.crt", tmp_path / "tls.key")
    with pytest.raises(FileNotFoundError):
        CertificateReloader(tmp_path / "missing.crt", tmp_path / "missing.key")


def test_changes_are_looked_for_once_per_interval(pair: tuple[Path, Path]) -> None:
    clock = Clock()
    reloader = CertificateReloader(*pair, check_interval_s=1.0, clock=clock)
    first = reloader.current()
    write_server_pair(make_ca(), *pair, "second")
    clock.now = 0.5
    assert reloader.current() is first  # not looked at yet
    clock.now = 1.5
    assert reloader.current() is not first
    assert reloader.reloads == 1


def test_a_half_written_rotation_keeps_the_last_good_pair(
    pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    cert_file, key_file = pair
    reloader = CertificateReloader(cert_file, key_file, check_interval_s=0)
    first = reloader.current()
    good_key = key_file.read_bytes()
    write_server_pair(make_ca(), cert_file, key_file, "second")
    key_file.write_bytes(good_key)  # new certificate, old key: they do not match yet
    assert reloader.current() is first
    assert "TLS certificate not reloaded, serving the last good pair" in caplog.text
    key_file.unlink()
    assert reloader.current() is first  # files missing for a moment
    write_server_pair(make_ca(), cert_file, key_file, "third")
    assert reloader.current() is not first
    assert reloader.reloads == 1
