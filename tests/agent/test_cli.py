"""The command line as a user runs it: real subprocesses, real ports on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from semhealth.agent.cli import main
from semhealth.agent.demo.simulator import Script, SimulatedUpstream
from tests.servers import free_port

TESTDATA = Path(__file__).parent / "testdata" / "config"
EXAMPLE = Path(__file__).parents[2] / "examples" / "semhealth.yaml"


def _env() -> dict[str, str]:
    # A clean environment: a stray SEMHEALTH_* variable must not change what is tested.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SEMHEALTH_", "OTEL_", "K8S_"))}
    # Relevance scoring has tests of its own; loading models here would only cost seconds.
    env["SEMHEALTH_RELEVANCE__ENABLED"] = "false"
    return env


def test_config_schema_prints_a_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].endswith("2020-12/schema")
    assert {"upstream", "listen", "routes", "limits", "analysis"} <= set(schema["properties"])


def test_config_check_accepts_the_shipped_example_without_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "check", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert out.strip().endswith(": ok")
    assert err == ""


TOP_K_WARNING = (
    "warning: relevance.top_k: top_k is set to 5, but pooling max scores a context by its best"
    " window alone and never reads it (fix: remove top_k, or set relevance.pooling: mean to"
    " average the top_k best windows)"
)


def test_config_check_warns_of_top_k_under_a_pooling_that_ignores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text("upstream: {url: 'http://127.0.0.1:8000'}\nrelevance:\n  top_k: 5\n")
    assert main(["config", "check", str(path)]) == 0  # a warning, not an error
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"{path}:3:3: {TOP_K_WARNING}"]
    assert out.strip() == f"{path}: ok, with 1 warning"


def test_top_k_under_mean_pooling_is_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:8000'}\nrelevance: {pooling: mean, top_k: 5}\n"
    )
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr() == (f"{path}: ok\n", "")


def test_config_check_names_the_bad_key_and_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(TESTDATA / "unknown_key.yaml")]) == 1
    err = capsys.readouterr().err
    assert "unknown_key.yaml:" in err
    assert "fix:" in err


async def _wait_ready(admin: str, deadline_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    async with aiohttp.ClientSession() as client:
        while loop.time() < end:
            try:
                async with client.get(admin + "/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("semhealth did not become ready")


async def test_run_with_only_upstream_serves_traffic_and_stops_on_sigterm() -> None:
    upstream = SimulatedUpstream(lambda r: Script(pieces=("hello", " world")))
    await upstream.start()
    proxy_port, admin_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run",
        "--upstream", upstream.url,
        "--listen", f"127.0.0.1:{proxy_port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        env=_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_ready(f"http://127.0.0.1:{admin_port}")
        async with aiohttp.ClientSession() as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
            async with client.post(url, json=body) as r:
                text = await r.text()
            assert r.status == 200
            assert '"hello"' in text
            # Analysis is asynchronous: the record follows within the wire's hold of an end.
            metrics = ""
            for _ in range(100):
                async with client.get(f"http://127.0.0.1:{admin_port}/metrics") as r:
                    metrics = await r.text()
                if "semhealth_records_total 1.0" in metrics:
                    break
                await asyncio.sleep(0.1)
        assert "semhealth_records_total 1.0" in metrics
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await upstream.shutdown()


async def test_run_with_config_if_present_starts_on_defaults_when_the_file_is_absent(
    tmp_path: Path,
) -> None:
    # An injected sidecar whose ConfigMap is not in its namespace: the volume is optional,
    # so the file is simply not there; both planes start and say why.
    upstream = SimulatedUpstream(lambda r: Script(pieces=("hello",)))
    await upstream.start()
    proxy_port, admin_port = free_port(), free_port()
    missing = tmp_path / "configmap" / "semhealth.yaml"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run",
        "--config-if-present", str(missing),
        "--upstream", upstream.url,
        "--listen", f"127.0.0.1:{proxy_port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        env=_env(), stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_ready(f"http://127.0.0.1:{admin_port}")
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
            async with client.post(url, json={"stream": True, "messages": []}) as r:
                assert r.status == 200
                assert '"hello"' in await r.text()
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0
        assert f"no configuration file at {missing}".encode() in err
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await upstream.shutdown()


async def test_run_logs_a_configuration_warning_once_at_start(tmp_path: Path) -> None:
    upstream = SimulatedUpstream(lambda r: Script(pieces=("hello",)))
    await upstream.start()
    admin = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "semhealth.yaml"
    config.write_text(
        f"upstream: {{url: '{upstream.url}'}}\n"
        f"listen: {{proxy: '127.0.0.1:{free_port()}', admin: '{admin.removeprefix('http://')}'}}\n"
        "relevance:\n  top_k: 5\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run", "--config", str(config),
        env=_env(), stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_ready(admin)  # both processes have loaded the configuration
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await upstream.shutdown()
    assert process.returncode == 0
    lines = [line for line in err.decode().splitlines() if "relevance.top_k" in line]
    assert len(lines) == 1, lines
    assert lines[0].endswith(f"WARNING semhealth.agent.cli.run: {config}:4:3: {TOP_K_WARNING}")


async def test_run_with_a_bad_config_exits_2_and_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstream:\n  url: ftp://example.invalid\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run", "--config", str(bad),
        env=_env(), stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert b"upstream.url" in err
    assert b"ftp" in err


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "does not exist"), ("{not json", "not a readable tokenizer.json")],
    ids=["missing", "unparsable"],
)
async def test_run_with_a_bad_shadow_tokenizer_stops_at_start_up_and_says_why(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    # It used to start, then restart the analysis process forever, each time on a traceback,
    # while the proxy port never listened.
    tokenizer = tmp_path / "tokenizer.json"
    if content is not None:
        tokenizer.write_text(content)
    config = tmp_path / "semhealth.yaml"
    config.write_text(
        f"upstream: {{url: 'http://127.0.0.1:{free_port()}'}}\n"
        f"listen: {{proxy: '127.0.0.1:{free_port()}', admin: '127.0.0.1:{free_port()}'}}\n"
        f"shadow:\n  upstream: {{url: 'http://127.0.0.1:{free_port()}'}}\n"
        f"  routes: [chat_completions]\n  tokenizer: {tokenizer}\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run", "--config", str(config),
        env=_env(), stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        # A bound against restarting forever, far above what stopping takes.
        _, err = await asyncio.wait_for(process.communicate(), 90)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = err.decode()
    assert process.returncode == 2, text
    assert f"{config}:6:3: shadow.tokenizer: " in text
    assert reason in text
    assert "Traceback" not in text
    assert "restarting in" not in text


async def test_demo_runs_live_traffic_and_prints_a_summary() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "demo",
        "--duration", "4", "--rate", "10", "--seed", "7",
        "--listen", f"127.0.0.1:{free_port()}",
        "--admin-listen", f"127.0.0.1:{free_port()}",
        env=_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    summary = out.decode()
    assert "streams analysed:" in summary
    total = int(summary.rsplit("streams analysed: ", 1)[1].split(" ", 1)[0])
    assert total > 5
    for route in ("chat_completions", "messages"):
        assert route in summary


async def _rule_names(admin: str) -> list[str]:
    async with aiohttp.ClientSession() as client, client.get(admin + "/alerts") as r:
        document = await r.json()
    return [rule["name"] for rule in document["rules"]]


async def _wait_rules(admin: str, predicate: Callable[[list[str]], bool]) -> list[str]:
    loop = asyncio.get_running_loop()
    end = loop.time() + 15
    while True:
        names = await _rule_names(admin)
        if predicate(names) or loop.time() > end:
            return names
        await asyncio.sleep(0.1)


async def test_sighup_reloads_the_alert_rules_and_a_bad_file_keeps_the_running_ones(
    tmp_path: Path,
) -> None:
    upstream = SimulatedUpstream(lambda r: Script(pieces=("hello",)))
    await upstream.start()
    admin_port = free_port()
    admin = f"http://127.0.0.1:{admin_port}"
    config = tmp_path / "semhealth.yaml"
    head = (
        f"upstream: {{url: '{upstream.url}'}}\n"
        f"listen: {{proxy: '127.0.0.1:{free_port()}', admin: '127.0.0.1:{admin_port}'}}\n"
    )
    config.write_text(head + "alerts:\n  rules:\n    - {name: StreamChoppy, enabled: false}\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run", "--config", str(config),
        env=_env(), stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_ready(admin)
        assert "StreamChoppy" not in await _rule_names(admin)
        config.write_text(head + "alerts: {default_rules: true}\n")
        process.send_signal(signal.SIGHUP)
        assert "StreamChoppy" in await _wait_rules(admin, lambda n: "StreamChoppy" in n)
        config.write_text(head + "alerts:\n  rules:\n    - {name: StreamChoppy, threshold: x}\n")
        process.send_signal(signal.SIGHUP)
        await asyncio.sleep(1.0)  # a bad reload changes nothing, so there is nothing to wait on
        assert len(await _rule_names(admin)) == 9
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0
        assert b"alert rules reloaded from" in err
        assert b"alert rules not reloaded; the running rules stay" in err
        assert b"alerts.rules[0].threshold" in err
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await upstream.shutdown()
