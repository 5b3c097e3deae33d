"""API keys of remote encoders: named in the YAML, read from the environment once, never shown.

The YAML names the variable (``remote.api_key_env``); ``agent/config`` reads it when it
loads. An unset or empty variable is a config issue that names it; the key itself never
reaches ``repr()``, ``semhealth config check``, a log line or ``/metrics``. End to end, a
sidecar scores through a TEI server on loopback that refuses any request without the key.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import aiohttp
import pytest

from semhealth.agent import cli
from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import ConfigError, check_config_file, load_config, load_relevance
from semhealth.agent.demo.simulator import SimulatedUpstream
from semhealth.embeddings.local import LocalBackend
from tests.agent.test_relevance_e2e import (
    answer,
    post_one_and_wait_scored,
)
from tests.embeddings.bearer import KEY, Gate, keyed_server

VARIABLE = "SEMHEALTH_TEST_TEI_KEY"


def keyed_yaml(
    tmp_path: Path,
    url: str = "http://tei.internal:8080",
    *,
    backend: str = "tei",
    key_line: str = f"api_key_env: {VARIABLE}",
    upstream_url: str = "http://127.0.0.1:9",
) -> str:
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            upstream:
              url: {upstream_url}
            relevance:
              enabled: true
              route_cjk_to: null
              encoders:
                - name: default
                  backend: {backend}
                  remote:
                    url: "{url}"
                    model: all-MiniLM-L6-v2
                    {key_line}
            """
        ),
        "utf-8",
    )
    return str(path)


def relevance_issues(path: str, env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_relevance(path, env)
    return [str(issue) for issue in caught.value.issues]


# -- reading the variable --------------------------------------------------------------------


def test_the_key_is_read_from_the_variable_the_yaml_names(tmp_path: Path) -> None:
    relevance = load_relevance(keyed_yaml(tmp_path), {VARIABLE: KEY})
    (encoder,) = relevance.embeddings.encoders
    assert (encoder.remote.api_key_env, encoder.remote.api_key) == (VARIABLE, KEY)


def test_a_trailing_newline_from_a_secret_file_is_not_part_of_the_key(tmp_path: Path) -> None:
    relevance = load_relevance(keyed_yaml(tmp_path), {VARIABLE: f" {KEY}\n"})
    assert relevance.embeddings.encoders[0].remote.api_key == KEY


def test_an_unset_variable_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = keyed_yaml(tmp_path)
    assert relevance_issues(path, {}) == [
        f"{path}:12:9: relevance.encoders[0].remote.api_key_env: environment variable"
        f" {VARIABLE}, named by api_key_env, is not set (fix: set {VARIABLE} to the server's"
        " API key in the agent's environment (for example from a Kubernetes Secret), or"
        " remove api_key_env if the server takes no key)"
    ]


def test_an_empty_variable_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (issue,) = relevance_issues(keyed_yaml(tmp_path), {VARIABLE: ""})
    assert f"environment variable {VARIABLE}, named by api_key_env, is empty" in issue


def test_a_key_written_in_the_yaml_is_not_a_setting_and_is_not_echoed(tmp_path: Path) -> None:
    path = keyed_yaml(tmp_path, key_line=f"api_key: {KEY}")
    (issue,) = relevance_issues(path, {})
    assert "'api_key' is not a setting" in issue
    assert "did you mean 'api_key_env'?" in issue
    assert KEY not in issue


def test_a_key_pasted_into_api_key_env_is_not_echoed(tmp_path: Path) -> None:
    (issue,) = relevance_issues(keyed_yaml(tmp_path, key_line=f"api_key_env: {KEY}"), {})
    assert "api_key_env is not the name of an environment variable" in issue
    assert KEY not in issue


def test_a_scorer_encoder_takes_a_key_as_its_bearer_token(tmp_path: Path) -> None:
    path = keyed_yaml(tmp_path, "127.0.0.1:50051", backend="scorer")
    (encoder,) = load_relevance(path, {VARIABLE: KEY}).embeddings.encoders
    assert encoder.remote.api_key == KEY


def test_a_key_variable_with_the_semhealth_prefix_is_not_an_unknown_setting(
    tmp_path: Path,
) -> None:
    # VARIABLE starts with SEMHEALTH_, the prefix of the settings' own variables.
    env = {VARIABLE: KEY, "SEMHEALTH_TEST_OTHER": "1"}
    issues = check_config_file(keyed_yaml(tmp_path), env)
    assert [str(issue) for issue in issues] == [
        "$SEMHEALTH_TEST_OTHER: test_other: unknown setting (fix: did you mean SEMHEALTH_ROUTES?)"
    ]


def test_the_loaded_configs_repr_does_not_show_the_key(tmp_path: Path) -> None:
    config = load_config(keyed_yaml(tmp_path), {VARIABLE: KEY}, {})
    assert config.relevance.embeddings.encoders[0].remote.api_key == KEY
    assert KEY not in repr(config)


# -- semhealth config check ------------------------------------------------------------------


def test_config_check_passes_with_the_variable_set_and_never_prints_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    path = keyed_yaml(tmp_path)
    assert cli.main(["config", "check", path]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: ok\n"
    assert KEY not in out + err


def test_config_check_names_an_unset_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    assert cli.main(["config", "check", keyed_yaml(tmp_path)]) == 1
    assert f"environment variable {VARIABLE}, named by api_key_env, is not set" in (
        capsys.readouterr().err
    )


# -- a sidecar scoring through a keyed TEI server --------------------------------------------


async def test_a_sidecar_scores_through_a_keyed_tei_server_without_showing_the_key(
    minilm: LocalBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gate = Gate(KEY)
    upstream = SimulatedUpstream(answer)
    await upstream.start()
    try:
        async with keyed_server(minilm, gate) as tei:
            path = keyed_yaml(tmp_path, tei.base_url, upstream_url=upstream.url)
            listen = {"listen.proxy": "127.0.0.1:0", "listen.admin": "127.0.0.1:0"}
            agent = Agent(load_config(path, {VARIABLE: KEY}, listen), Settings())
            await agent.start()
            try:
                async with aiohttp.ClientSession() as session:
                    await post_one_and_wait_scored(session, agent)
                    async with session.get(agent.admin_url + "/metrics") as response:
                        exposition = await response.text()
            finally:
                await agent.shutdown()
    finally:
        await upstream.shutdown()
    assert "POST /embed" in gate.passed
    assert gate.refused == []
    assert KEY not in exposition
    assert KEY not in caplog.text
