"""PEM files for the scorer's TLS tests: a CA, the scorer's pair, and client pairs for mutual
TLS, made with ``cryptography`` (the CA and server pair come from the kube tests' helper)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.agent.kube.certs import Authority, make_ca, write_server_pair


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


@dataclass(frozen=True)
class Pki:
    ca: str  # the CA's certificate
    server: Pair  # for localhost and 127.0.0.1
    authority: Authority

    def client(self, folder: Path, name: str) -> Pair:
        return write_client_pair(self.authority, folder, name)


def make_pki(folder: Path, name: str = "scorer CA") -> Pki:
    authority = make_ca(name)
    ca = folder / f"{name.replace(' ', '-')}.pem"
    ca.write_bytes(authority.pem())
    server = Pair(str(folder / "server.pem"), str(folder / "server-key.pem"))
    write_server_pair(authority, Path(server.cert), Path(server.key), "semhealth-scorer")
    return Pki(str(ca), server, authority)


def write_client_pair(ca: Authority, folder: Path, name: str) -> Pair:
    """A client certificate for ``name`` (its subject's common name), signed by ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    pair = Pair(str(folder / f"{name}.pem"), str(folder / f"{name}-key.pem"))
    Path(pair.key).write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    Path(pair.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair
