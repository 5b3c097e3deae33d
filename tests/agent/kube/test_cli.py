"""``semhealth inject`` and ``semhealth injector`` as a user runs them."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import socket
import ssl
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from semhealth.agent.cli import main
from tests.agent.kube.certs import make_ca, write_server_pair
from tests.agent.kube.samples import IMAGE, admission_review, deployment, pod_from, pod_template

INJECT = {"semhealth.io/inject": "true"}


def write(path: Path, *documents: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def test_inject_files_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = write(tmp_path / "a.yaml", deployment(INJECT, "a"))
    second = write(tmp_path / "b.yaml", deployment(None, "b"))
    assert main(["inject", str(first), str(second), "--image", IMAGE]) == 0
    out, err = capsys.readouterr()
    a, b = yaml.safe_load_all(out)
    assert [c["name"] for c in a["spec"]["template"]["spec"]["containers"]][-1] == "semhealth"
    assert b == deployment(None, "b")
    assert err == f"semhealth inject: {first}#1 Deployment/a: injected\n"


def test_inject_stdin_twice_then_uninject(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = yaml.safe_dump(deployment(INJECT))
    outputs = []
    for argv in (
        ["inject", "--image", IMAGE],
        ["inject", "-", "--image", IMAGE],
        ["inject", "--uninject"],
    ):
        monkeypatch.setattr(sys, "stdin", io.StringIO(outputs[-1] if outputs else text))
        assert main(argv) == 0
        outputs.append(capsys.readouterr().out)
    once, twice, back = outputs
    assert twice == once
    assert yaml.safe_load(back) == yaml.safe_load(text)


def test_inject_scorer_and_configmap_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(deployment(None))))
    argv = [
        "inject",
        "--all",
        "--image",
        IMAGE,
        "--config-map",
        "fleet",
        "--scorer",
        "scorer.ops:50051",
    ]
    assert main(argv) == 0
    spec = yaml.safe_load(capsys.readouterr().out)["spec"]["template"]["spec"]
    assert spec["volumes"][-2]["configMap"] == {"name": "fleet", "optional": True}
    env = {item["name"]: item.get("value") for item in spec["containers"][-1]["env"]}
    assert env["SEMHEALTH_RELEVANCE__SCORER"] == "scorer.ops:50051"


def test_inject_without_image_or_with_a_bad_annotation_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["inject"]) == 2
    assert "--image is required to inject" in capsys.readouterr().err
    bad = deployment({**INJECT, "semhealth.io/memory-limit": "much"})
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(bad)))
    assert main(["inject", "--image", IMAGE]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(
        "semhealth inject: -#1 Deployment/chat: semhealth.io/memory-limit: 'much'"
    )


def test_injector_rejects_a_bad_listen_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "injector",
        "--listen",
        "nowhere",
        "--tls-cert",
        "c",
        "--tls-key",
        "k",
        "--image",
        IMAGE,
    ]
    assert main(argv) == 2
    assert "--listen 'nowhere' is not HOST:PORT" in capsys.readouterr().err


async def test_injector_command_serves_mutate_until_sigterm(tmp_path: Path) -> None:
    ca = make_ca()
    write_server_pair(ca, tmp_path / "tls.crt", tmp_path / "tls.key", "semhealth-injector")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "injector",
        "--listen", f"127.0.0.1:{port}", "--tls-cert", str(tmp_path / "tls.crt"),
        "--tls-key", str(tmp_path / "tls.key"), "--image", IMAGE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        client = ssl.create_default_context(cadata=ca.pem().decode())
        request = admission_review(pod_from(pod_template(INJECT)))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client)) as session:
            answer = await _post_when_up(session, f"https://127.0.0.1:{port}/mutate", request)
        assert answer["response"]["allowed"] is True
        assert answer["response"]["patchType"] == "JSONPatch"
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0, stderr.decode()
    assert "shop/chat-7d9f8-*: injected" in stderr.decode()


async def _post_when_up(
    session: aiohttp.ClientSession, url: str, request: dict[str, object]
) -> dict[str, object]:
    for _ in range(200):  # the interpreter and aiohttp take a moment to start
        try:
            async with session.post(url, data=json.dumps(request)) as response:
                answer: dict[str, object] = await response.json()
                return answer
        except aiohttp.ClientConnectorError:
            await asyncio.sleep(0.05)
    raise AssertionError("semhealth injector did not start listening")
