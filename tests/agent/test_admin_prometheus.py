"""A real Prometheus (Debian's ``prometheus``) scrapes the locked-down admin port of a real
``semhealth run``: with ``basic_auth`` and ``tls_config`` (its CA file) in the scrape config
the target is up; the same target without credentials is down with a 401, counted by the
sidecar in ``semhealth_admin_auth_failures_total``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.agent.prometheus_server import PrometheusServer, has_value
from tests.agent.test_admin_lockdown import PASSWORD, USER, Pki, pki, web_yml
from tests.agent.test_cli import _env
from tests.servers import free_port

__all__ = ["pki"]  # the fixture, shared with the lock-down tests


class LockedDownScrape(PrometheusServer):
    """Two jobs on the same target: one with credentials and the CA, one with the CA only."""

    def __init__(self, target: str, workdir: Path, ca_file: Path) -> None:
        super().__init__(target, workdir)
        self._ca_file = ca_file

    def start(self) -> None:
        password_file = self._workdir / "password"
        password_file.write_text(PASSWORD)
        tls = f"    tls_config: {{ca_file: '{self._ca_file}'}}\n"
        target = f"    static_configs: [{{targets: ['{self._target}']}}]\n"
        config = self._workdir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1m}\n"
            "scrape_configs:\n"
            "  - job_name: semhealth\n"
            "    scheme: https\n"
            f"    basic_auth: {{username: {USER}, password_file: '{password_file}'}}\n"
            f"{tls}{target}"
            "  - job_name: anonymous\n"
            "    scheme: https\n"
            f"{tls}{target}"
        )
        port = free_port()
        self._spawn(config, port)
        self.url = f"http://127.0.0.1:{port}"
        if not self._wait_ready():
            raise AssertionError(f"prometheus did not become ready:\n{self.log_tail()}")

    def last_error(self, job: str) -> str:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as response:
            targets = orjson.loads(response.read())["data"]["activeTargets"]
        (found,) = [t for t in targets if t["labels"]["job"] == job]
        return str(found["lastError"])


@pytest.fixture
def sidecar(pki: Pki) -> Iterator[int]:
    """``semhealth run`` with TLS and basic auth on its admin port; yields that port."""
    from semhealth.agent.demo.simulator import Script, SimulatedUpstream

    web = pki.folder / "web.yml"
    web.write_text(web_yml(tls="  min_version: TLS12\n"))
    admin_port = free_port()
    loop = asyncio.new_event_loop()
    upstream = SimulatedUpstream(lambda r: Script(pieces=("hi",)))
    loop.run_until_complete(upstream.start())
    process = subprocess.Popen(
        [
            sys.executable, "-m", "semhealth.agent.cli", "run",
            "--upstream", upstream.url,
            "--listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{admin_port}",
            "--web-config-file", str(web),
        ],
        env=_env(),
    )  # fmt: skip
    try:
        yield admin_port
    finally:
        process.terminate()
        assert process.wait(20) == 0
        loop.run_until_complete(upstream.shutdown())
        loop.close()


def test_prometheus_scrapes_with_basic_auth_and_tls_and_is_refused_without(
    sidecar: int, pki: Pki, tmp_path: Path
) -> None:
    prometheus = LockedDownScrape(f"127.0.0.1:{sidecar}", tmp_path, pki.ca_file)
    with prometheus:
        prometheus.wait_for('up{job="semhealth"}', has_value(lambda v: v == 1.0), 60)
        prometheus.wait_for('up{job="anonymous"}', has_value(lambda v: v == 0.0), 30)
        assert "401" in prometheus.last_error("anonymous")
        assert prometheus.last_error("semhealth") == ""
        # What the authorised job scraped includes the count of the anonymous job's refusals.
        prometheus.wait_for(
            'semhealth_admin_auth_failures_total{job="semhealth"}',
            has_value(lambda v: v >= 1.0),
            30,
        )
