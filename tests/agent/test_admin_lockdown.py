"""The admin port locked down by a web config: TLS, mutual TLS, bcrypt basic auth, headers,
``/alerts`` off, and reloads, on the in-process agent's admin app and on the front of a real
``semhealth run`` (which answers health itself and relays the rest from analysis).

``/healthz`` and ``/readyz`` stay open (kubelet probes carry no credentials) but are served
over TLS when TLS is on; everything else answers 401 with ``WWW-Authenticate: Basic`` without
the right credentials, and each refusal is counted in ``semhealth_admin_auth_failures_total``.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import signal
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from semhealth.agent.admin.gate import AdminAccess
from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.demo.simulator import Script, SimulatedUpstream
from tests.agent.conftest import agent_config
from tests.agent.kube.certs import Authority, make_ca, write_server_pair
from tests.agent.test_cli import _env
from tests.servers import free_port

USER, PASSWORD = "prometheus", "correct horse"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
FAILURES = "semhealth_admin_auth_failures_total"


@dataclass
class Pki:
    folder: Path
    ca: Authority

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.crt"

    def client_context(self, *, with_cert: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if with_cert:
            context.load_cert_chain(self.folder / "client.crt", self.folder / "client.key")
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = make_ca()
    write_server_pair(ca, tmp_path / "server.crt", tmp_path / "server.key", "semhealth-admin")
    write_client_pair(ca, tmp_path / "client.crt", tmp_path / "client.key")
    (tmp_path / "ca.crt").write_bytes(ca.pem())
    return Pki(tmp_path, ca)


def write_client_pair(ca: Authority, cert_file: Path, key_file: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prometheus")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("prometheus.monitoring")]), critical=False
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def web_yml(*, tls: str = "", users: bool = True, headers: bool = True) -> str:
    text = ""
    if tls:
        text += f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n{tls}"
    if headers:
        text += "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    if users:
        text += f"basic_auth_users:\n  {USER}: '{HASH}'\n"
    return text


def rewrite(path: Path, text: str) -> None:
    """Write ``text``, moving the mtime on so a reload sees it whatever the clock grain."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


def _auth(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def _get(
    url: str, *, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    connector = aiohttp.TCPConnector(ssl=context if context is not None else False)
    async with (
        aiohttp.ClientSession(connector=connector) as client,
        client.get(url, headers=headers) as response,
    ):
        return response.status, dict(response.headers), await response.text()


def _failures(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(FAILURES + " "):
            return float(line.split()[1])
    raise AssertionError(f"{FAILURES} is not in /metrics")


@asynccontextmanager
async def in_process(web_config: Path, *, alerts_endpoint: bool = True) -> AsyncIterator[Agent]:
    upstream = SimulatedUpstream(lambda r: Script(pieces=("hi",)))
    await upstream.start()
    access = AdminAccess(web_config_file=str(web_config), alerts_endpoint=alerts_endpoint)
    agent = Agent(agent_config(upstream.url), Settings(admin=access))
    try:
        await agent.start()
        yield agent
    finally:
        await agent.shutdown()
        await upstream.shutdown()


# --------------------------------------------------------------------------- in one process


async def test_tls_and_basic_auth_guard_metrics_and_leave_health_open(pki: Pki) -> None:
    path = pki.folder / "web.yml"
    path.write_text(web_yml(tls="  min_version: TLS12\n"))
    async with in_process(path) as agent:
        admin = agent.admin_url
        assert admin.startswith("https://")
        tls = pki.client_context()
        for probe in ("/healthz", "/readyz"):
            status, headers, _ = await _get(admin + probe, context=tls)
            assert status == 200
            assert headers["X-Content-Type-Options"] == "nosniff"
        status, headers, _ = await _get(admin + "/metrics", context=tls)
        assert status == 401
        assert headers["WWW-Authenticate"] == "Basic"
        assert headers["X-Content-Type-Options"] == "nosniff"
        status, _, _ = await _get(admin + "/metrics", context=tls, headers=_auth(password="no"))
        assert status == 401
        status, _, _ = await _get(admin + "/alerts", context=tls, headers=_auth(user="nobody"))
        assert status == 401
        status, _, _ = await _get(admin + "/shadow", context=tls)
        assert status == 401
        status, _, metrics = await _get(admin + "/metrics", context=tls, headers=_auth())
        assert status == 200
        assert _failures(metrics) == 4.0
        assert PASSWORD not in metrics
        # Plain HTTP on the TLS port gets nothing.
        with pytest.raises(aiohttp.ClientError):
            await _get(admin.replace("https://", "http://") + "/healthz")


async def test_alerts_can_be_turned_off(pki: Pki) -> None:
    path = pki.folder / "web.yml"
    path.write_text(web_yml())
    async with in_process(path, alerts_endpoint=False) as agent:
        status, _, body = await _get(agent.admin_url + "/alerts", headers=_auth())
        assert status == 404
        assert "turned off" in body
        status, _, _ = await _get(agent.admin_url + "/alerts")
        assert status == 401  # credentials first: an anonymous caller learns nothing
    async with in_process(path) as agent:
        status, _, _ = await _get(agent.admin_url + "/alerts", headers=_auth())
        assert status == 200


async def test_users_reload_from_disk_and_a_bad_file_keeps_the_last_good(pki: Pki) -> None:
    path = pki.folder / "web.yml"
    path.write_text(web_yml(users=False))
    async with in_process(path) as agent:
        metrics = agent.admin_url + "/metrics"
        assert (await _get(metrics))[0] == 200  # no users: open
        rewrite(path, web_yml())
        assert (await _get(metrics))[0] == 401
        assert (await _get(metrics, headers=_auth()))[0] == 200
        rewrite(path, "basic_auth_users: {prometheus: not-a-bcrypt-hash}\n")
        assert (await _get(metrics))[0] == 401  # still locked with the last good users
        assert (await _get(metrics, headers=_auth()))[0] == 200


async def test_the_rate_limit_answers_429_and_spares_the_probes(pki: Pki) -> None:
    path = pki.folder / "web.yml"
    path.write_text(web_yml(users=False) + "rate_limit: {interval: 1h, burst: 2}\n")
    async with in_process(path) as agent:
        statuses = [(await _get(agent.admin_url + "/metrics"))[0] for _ in range(3)]
        assert statuses == [200, 200, 429]
        assert (await _get(agent.admin_url + "/readyz"))[0] == 200


async def test_mutual_tls_needs_a_client_certificate_and_checks_its_sans(pki: Pki) -> None:
    path = pki.folder / "web.yml"
    mtls = "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
    path.write_text(web_yml(tls=mtls + "  client_allowed_sans: [prometheus.monitoring]\n"))
    async with in_process(path) as agent:
        admin = agent.admin_url
        with pytest.raises(aiohttp.ClientError):
            await _get(admin + "/healthz", context=pki.client_context())
        with_cert = pki.client_context(with_cert=True)
        assert (await _get(admin + "/healthz", context=with_cert))[0] == 200
        assert (await _get(admin + "/metrics", context=with_cert, headers=_auth()))[0] == 200
        rewrite(path, web_yml(tls=mtls + "  client_allowed_sans: [someone.else]\n"))
        status, _, _ = await _get(admin + "/healthz", context=with_cert)
        assert status == 403


async def test_a_rotated_certificate_is_served_on_the_next_connection(pki: Pki) -> None:
    path = pki.folder / "web.yml"
    path.write_text(web_yml(tls="  min_version: TLS12\n", users=False))
    async with in_process(path) as agent:
        assert agent.admin_address is not None
        host, port = agent.admin_address
        # In a thread: a blocking handshake here would stall the loop the agent serves on.
        assert await asyncio.to_thread(_served_common_name, host, port, pki) == "semhealth-admin"
        write_server_pair(pki.ca, pki.folder / "server.crt", pki.folder / "server.key", "rotated")
        rewrite(pki.folder / "server.crt", (pki.folder / "server.crt").read_text())
        assert await asyncio.to_thread(_served_common_name, host, port, pki) == "rotated"


def _served_common_name(host: str, port: int, pki: Pki) -> str:
    import socket

    context = pki.client_context()
    with (
        socket.create_connection((host, port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None
    subject = dict(pair[0] for pair in cert["subject"])  # type: ignore[misc]
    return str(subject["commonName"])


# --------------------------------------------------------------------------- semhealth run


@dataclass
class Running:
    admin: str
    proxy: str
    process: asyncio.subprocess.Process


@asynccontextmanager
async def semhealth_run(*extra: str) -> AsyncIterator[Running]:
    upstream = SimulatedUpstream(lambda r: Script(pieces=("hi",)))
    await upstream.start()
    proxy_port, admin_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run",
        "--upstream", upstream.url,
        "--listen", f"127.0.0.1:{proxy_port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        *extra,
        env=_env(),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    running = Running(f"https://localhost:{admin_port}", f"http://127.0.0.1:{proxy_port}", process)
    try:
        yield running
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.communicate(), 20)
        await upstream.shutdown()


async def _wait_ready(url: str, context: ssl.SSLContext, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        try:
            if (await _get(url + "/readyz", context=context))[0] == 200:
                return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("semhealth run did not become ready")


async def test_semhealth_run_locks_down_its_admin_front(pki: Pki) -> None:
    path = pki.folder / "web.yml"
    path.write_text(web_yml(tls="  min_version: TLS12\n"))
    tls = pki.client_context()
    async with semhealth_run("--web-config-file", str(path), "--no-alerts-endpoint") as run:
        await _wait_ready(run.admin, tls)
        status, headers, _ = await _get(run.admin + "/healthz", context=tls)
        assert status == 200 and headers["X-Content-Type-Options"] == "nosniff"
        status, headers, _ = await _get(run.admin + "/metrics", context=tls)
        assert status == 401 and headers["WWW-Authenticate"] == "Basic"
        status, _, _ = await _get(run.admin + "/metrics", context=tls, headers=_auth(password="x"))
        assert status == 401
        status, _, _ = await _get(run.admin + "/alerts", context=tls, headers=_auth())
        assert status == 404
        status, _, _ = await _get(run.admin + "/shadow", context=tls)
        assert status == 401
        # Relayed from the analysis process, which has no shadow: block here.
        status, _, body = await _get(run.admin + "/shadow", context=tls, headers=_auth())
        assert status == 404 and json.loads(body)["enabled"] is False
        status, headers, metrics = await _get(run.admin + "/metrics", context=tls, headers=_auth())
        assert status == 200
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "semhealth_records_total" in metrics  # from the analysis process
        assert _failures(metrics) == 3.0  # from the front
        assert metrics.count(f"# TYPE {FAILURES} counter") == 1
        # A rotated certificate (a renewed Secret) is served on the next connection.
        port = int(run.admin.rsplit(":", 1)[1])
        write_server_pair(pki.ca, pki.folder / "server.crt", pki.folder / "server.key", "renewed")
        rewrite(pki.folder / "server.crt", (pki.folder / "server.crt").read_text())
        assert await asyncio.to_thread(_served_common_name, "127.0.0.1", port, pki) == "renewed"
    assert run.process.returncode == 0


async def test_semhealth_run_refuses_a_bad_web_config_before_starting(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  alice: hunter2\n")
    async with semhealth_run("--web-config-file", str(path)) as run:
        _, err = await asyncio.wait_for(run.process.communicate(), 30)
    assert run.process.returncode == 2  # a configuration error, as config check reports it
    message = err.decode()
    assert "listen.admin_web_config" in message
    assert "basic_auth_users.alice" in message and "bcrypt" in message
    assert "hunter2" not in message
