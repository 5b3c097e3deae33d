"""Test support: a real Prometheus (Debian's ``prometheus`` package) scraping one target on loopback.

``PrometheusServer`` writes a one-job config (1 s scrapes), starts ``prometheus`` on a free
loopback port with its TSDB in a temporary folder, waits for ``/-/ready`` and answers PromQL
through ``/api/v1/query``. It stops the process on exit: terminate, then kill.

The helpers are synchronous: the agent under test must run on another thread's event loop
(``tests.agent.conftest.ThreadedStack``), or a blocking query would stall the scrapes it waits
for.

A missing binary skips the test with the reason, unless ``REQUIRE_REAL_SERVERS=1`` (CI sets
it), where it fails: CI must never pass by skipping what it was meant to run.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from tests.servers import free_port
from tests.servers import require_binary as _require

JOB = "semhealth"
SCRAPE_INTERVAL_S = 1.0

_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 5.0
_POLL_S = 0.2
_HTTP_TIMEOUT_S = 5.0
_START_ATTEMPTS = 3  # a free port can be taken between our probe and Prometheus' bind

Result = list[dict[str, Any]]


def require_binary(name: str) -> str:
    """The path of a Prometheus tool (``prometheus``, ``promtool``); see ``tests.servers``."""
    return _require(name, "prometheus")


def _config(target: str) -> str:
    # scrape_timeout must not exceed the interval; a loopback scrape takes milliseconds.
    return (
        "global:\n"
        f"  scrape_interval: {SCRAPE_INTERVAL_S:g}s\n"
        "  scrape_timeout: 900ms\n"
        "  evaluation_interval: 1m\n"
        "scrape_configs:\n"
        f"  - job_name: {JOB}\n"
        "    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )


class PrometheusError(AssertionError):
    """Prometheus did not start, or answered a query with an error."""


class PrometheusServer:
    """One ``prometheus`` process scraping ``target`` (``host:port``) every second."""

    def __init__(self, target: str, workdir: Path) -> None:
        self._binary = require_binary("prometheus")
        self._target = target
        self._workdir = workdir
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = workdir / "prometheus.log"
        self.url = ""

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        config = self._workdir / "prometheus.yml"
        config.write_text(_config(self._target))
        for attempt in range(1, _START_ATTEMPTS + 1):
            port = free_port()
            self._spawn(config, port)
            self.url = f"http://127.0.0.1:{port}"
            if self._wait_ready():
                return
            self.stop()
            if attempt == _START_ATTEMPTS:
                break
        raise PrometheusError(f"prometheus did not become ready:\n{self.log_tail()}")

    def _spawn(self, config: Path, port: int) -> None:
        args = [
            self._binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self._workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        with self._log_path.open("ab") as log:
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def _wait_ready(self) -> bool:
        """True once ``/-/ready`` answers 200; False if the process exits or time runs out."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            time.sleep(_POLL_S)
        return False

    def stop(self) -> None:
        """Terminate, then kill after a grace period. Safe to call twice."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(_STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 30) -> str:
        if not self._log_path.exists():
            return "(no log)"
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def query(self, promql: str) -> Result:
        """The instant vector ``promql`` evaluates to now: ``[{"metric": {...}, "value":
        [t, "v"]}, ...]``. Scalars come back as one element with an empty ``metric``."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as response:
                body = orjson.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            body = orjson.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"query {promql!r} failed: {body.get('error', body)}")
        data = body["data"]
        if data["resultType"] == "vector":
            return list(data["result"])
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PrometheusError(f"query {promql!r} returned a {data['resultType']}, not a vector")

    def wait_for(
        self, promql: str, predicate: Callable[[Result], bool], timeout_s: float = 15.0
    ) -> Result:
        """Poll ``promql`` until ``predicate`` holds for its result; fail with the last one."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"after {timeout_s:g} s, {promql!r} still returns {result!r}\n"
                    f"prometheus log:\n{self.log_tail()}"
                )
            time.sleep(_POLL_S)

    def wait_for_scrape(self, after: float, timeout_s: float = 15.0) -> None:
        """Wait for a successful scrape that started after ``after`` (Unix time, seconds), so
        everything the target held at that time is in the TSDB."""
        up = f'up{{job="{JOB}"}}'
        # timestamp() of a bare selector is the scrape's start; `and` keeps only a good scrape.
        promql = f"timestamp({up}) and on(job, instance) {up} == 1"
        self.wait_for(promql, has_value(lambda t: t > after), timeout_s)


def scalar(result: Result) -> float:
    """The one value of a single-element result (``float('nan')`` stays NaN)."""
    if len(result) != 1:
        raise PrometheusError(f"expected one sample, got {len(result)}: {result!r}")
    return float(result[0]["value"][1])


def has_value(check: Callable[[float], bool]) -> Callable[[Result], bool]:
    """A ``wait_for`` predicate: exactly one sample whose value passes ``check``."""

    def predicate(result: Result) -> bool:
        return len(result) == 1 and check(float(result[0]["value"][1]))

    return predicate
