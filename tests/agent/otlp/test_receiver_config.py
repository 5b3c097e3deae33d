"""``otlp_receiver:`` in the configuration: the file, the environment and the command line,
and issues that name the key and the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from semhealth.agent.cli import build_parser, main
from semhealth.agent.cli.run import overrides
from semhealth.agent.config import Address, ConfigError, default_config, load_config, schema_text
from semhealth.agent.otlp.intake import intake_settings

FULL = """\
otlp_receiver:
  grpc_listen: 0.0.0.0:4317
  http_listen: "[::1]:4318"
  max_message_bytes: 1048576
  max_spans_per_request: 512
  max_queue_bytes: 8388608
  max_pending_spans: 2000
  trace_wait_s: 5
  route_attribute: gen_ai.agent.name
  forward:
    endpoint: http://otel-collector:4318
    protocol: http/protobuf
    headers: {X-API-Key: secret}
    timeout_s: 3
    max_queue_bytes: 1048576
    max_age_s: 60
  evaluation:
    enabled: true
"""


def issues_of(text: str, tmp_path: Path, env: dict[str, str] | None = None) -> list[str]:
    path = tmp_path / "semhealth.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as failed:
        load_config(str(path), env or {}, {})
    # Without FILE:LINE:COL: the issues' paths say where.
    return [
        re.sub(r"^\d+:\d+: ", "", str(issue).removeprefix(f"{path}:")).strip()
        for issue in failed.value.issues
    ]


def test_the_full_section_is_read_and_an_upstream_is_not_needed(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(FULL)
    receiver = load_config(str(path), {}, {}).otlp_receiver
    assert receiver.enabled
    assert receiver.grpc_listen == Address(host="0.0.0.0", port=4317)
    assert receiver.http_listen == Address(host="::1", port=4318)
    assert (receiver.max_message_bytes, receiver.max_spans_per_request) == (1048576, 512)
    assert (receiver.max_queue_bytes, receiver.max_pending_spans) == (8388608, 2000)
    assert (receiver.trace_wait_s, receiver.route_attribute) == (5, "gen_ai.agent.name")
    forward = receiver.forward
    assert forward.endpoint == "http://otel-collector:4318"
    assert forward.headers == (("x-api-key", "secret"),)
    assert (forward.protocol, forward.timeout_s, forward.max_age_s) == ("http/protobuf", 3, 60)
    assert receiver.evaluation.enabled and receiver.evaluation.endpoint is None
    settings = intake_settings(receiver)
    assert settings.receiver.grpc_listen == ("0.0.0.0", 4317)
    assert settings.receiver.max_items_per_request == 512
    assert settings.genai.route_attribute == "gen_ai.agent.name"
    assert settings.forward is not None and settings.forward.max_queue_bytes == 1048576


def test_the_receiver_is_off_by_default_and_then_an_upstream_is_required() -> None:
    assert not default_config().otlp_receiver.enabled
    with pytest.raises(ConfigError) as failed:
        load_config(None, {}, {})
    assert [i.path for i in failed.value.issues] == ["upstream.url"]
    assert intake_settings(default_config().otlp_receiver).forward is None


def test_environment_and_command_line_set_the_receiver() -> None:
    env = {
        "SEMHEALTH_OTLP_RECEIVER__GRPC_LISTEN": "127.0.0.1:4317",
        "SEMHEALTH_OTLP_RECEIVER__FORWARD__ENDPOINT": "https://collector:4317",
        "SEMHEALTH_OTLP_RECEIVER__FORWARD__HEADERS": "{Authorization: Bearer t}",
        "SEMHEALTH_OTLP_RECEIVER__MAX_SPANS_PER_REQUEST": "100",
    }
    args = build_parser().parse_args(["run", "--otlp-http-listen", "127.0.0.1:4318"])
    receiver = load_config(None, env, overrides(args)).otlp_receiver
    assert receiver.grpc_listen == Address(host="127.0.0.1", port=4317)
    assert receiver.http_listen == Address(host="127.0.0.1", port=4318)
    assert receiver.forward.endpoint == "https://collector:4317"
    assert receiver.forward.headers == (("authorization", "Bearer t"),)
    assert receiver.max_spans_per_request == 100
    flags = build_parser().parse_args(["run", "--otlp-grpc-listen", "0.0.0.0:4317"])
    assert overrides(flags) == {"otlp_receiver.grpc_listen": "0.0.0.0:4317"}


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            "otlp_receiver: {grpc_listen: 'localhost'}",
            "otlp_receiver.grpc_listen: 'localhost' is not a valid HOST:PORT address"
            " (fix: write it like 0.0.0.0:4317)",
        ),
        (
            "otlp_receiver: {grpc_listen: '0.0.0.0:4317', http_listen: '0.0.0.0:4317'}",
            "otlp_receiver.http_listen: http_listen (0.0.0.0:4317) and grpc_listen",
        ),
        (
            "otlp_receiver: {grpc_listen: '127.0.0.1:9464'}",
            "otlp_receiver.grpc_listen: grpc_listen (127.0.0.1:9464) and listen.admin"
            " (127.0.0.1:9464) use the same port (fix: give grpc_listen a port of its own)",
        ),
        (
            "otlp_receiver: {grpc_listen: ':4317', mystery: 1}",
            "otlp_receiver: 'mystery' is not a setting",
        ),
        (
            "otlp_receiver: {http_listen: '0.0.0.0:4318', max_spans_per_request: 0}",
            "otlp_receiver.max_spans_per_request: must be at least 1, got 0",
        ),
        (
            "otlp_receiver: {http_listen: '0.0.0.0:4318',"
            " forward: {endpoint: 'http://c:4317/v1/traces'}}",
            "otlp_receiver.forward.endpoint: gRPC ignores the URL's path",
        ),
        (
            "otlp_receiver: {http_listen: '0.0.0.0:4318',"
            " forward: {endpoint: 'http://c:4318/v1/traces', protocol: http/protobuf}}",
            "otlp_receiver.forward.endpoint: the URL ends with a signal's path, but"
            " /v1/traces, /v1/logs and /v1/metrics are appended to it (fix: give the base URL,"
            " e.g. http://otel-collector:4318)",
        ),
        (
            "otlp_receiver: {http_listen: '0.0.0.0:4318',"
            " forward: {endpoint: 'http://user:pw@c:4317'}}",
            "otlp_receiver.forward.endpoint: the URL carries credentials (user:password@)"
            " (fix: remove them; send credentials in otlp_receiver.forward.headers)",
        ),
        (
            "otlp_receiver: {http_listen: '0.0.0.0:4318', forward: {protocol: http/json}}",
            "otlp_receiver.forward.protocol: unknown protocol 'http/json'",
        ),
        (
            "otlp_receiver: {http_listen: '0.0.0.0:4318', evaluation: {enabled: true}}",
            "otlp_receiver.evaluation.enabled: evaluation is on but has nowhere to send"
            " its events (fix: set otlp_receiver.evaluation.endpoint or"
            " otlp_receiver.forward.endpoint)",
        ),
    ],
)
def test_issues_name_the_key_and_the_fix(section: str, expected: str, tmp_path: Path) -> None:
    found = issues_of(section + "\n", tmp_path)
    assert any(issue.startswith(expected) for issue in found), found


def test_the_port_clash_message_names_both_listeners(tmp_path: Path) -> None:
    found = issues_of(
        "otlp_receiver: {grpc_listen: '0.0.0.0:4317', http_listen: '0.0.0.0:4317'}\n", tmp_path
    )
    assert found == [
        "otlp_receiver.http_listen: http_listen (0.0.0.0:4317) and grpc_listen"
        " (0.0.0.0:4317) use the same port (fix: give http_listen a port of its own)"
    ]


def test_a_bad_value_from_the_environment_names_the_variable() -> None:
    env = {
        "SEMHEALTH_OTLP_RECEIVER__HTTP_LISTEN": "0.0.0.0:4318",
        "SEMHEALTH_OTLP_RECEIVER__FORWARD__MAX_AGE_S": "0",
    }
    with pytest.raises(ConfigError) as failed:
        load_config(None, env, {})
    (issue,) = failed.value.issues
    assert str(issue) == (
        "$SEMHEALTH_OTLP_RECEIVER__FORWARD__MAX_AGE_S: otlp_receiver.forward.max_age_s:"
        " must be greater than 0, got 0 (fix: use a number above 0)"
    )


def test_config_check_accepts_a_receiver_only_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(FULL)
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.strip().endswith(": ok")
    path.write_text("log: {level: info}\n")
    assert main(["config", "check", str(path)]) == 1
    assert "upstream.url: no upstream URL is set" in capsys.readouterr().err


def test_every_setting_documents_its_default_as_the_code_has_it() -> None:
    node = json.loads(schema_text())["properties"]["otlp_receiver"]
    receiver = default_config().otlp_receiver
    expected = {
        "grpc_listen": "null (default)",
        "http_listen": "null (default)",
        "max_message_bytes": f"default {receiver.max_message_bytes}",
        "max_spans_per_request": f"default {receiver.max_spans_per_request}",
        "max_queue_bytes": f"default {receiver.max_queue_bytes}",
        "max_pending_spans": f"default {receiver.max_pending_spans}",
        "trace_wait_s": f"default {receiver.trace_wait_s:g}",
        "route_attribute": f"default {receiver.route_attribute}",
        "forward.endpoint": "null (default)",
        "forward.protocol": f"{receiver.forward.protocol} (default)",
        "forward.headers": "default none",
        "forward.timeout_s": f"default {receiver.forward.timeout_s:g}",
        "forward.insecure": "null (default)",
        "forward.max_queue_bytes": f"default {receiver.forward.max_queue_bytes}",
        "forward.max_age_s": f"default {receiver.forward.max_age_s:g}",
        "evaluation.enabled": f"default {str(receiver.evaluation.enabled).lower()}",
        "evaluation.endpoint": "null (default)",
    }
    found = {}
    for key, child in node["properties"].items():
        for sub, leaf in child.get("properties", {}).items():
            found[f"{key}.{sub}"] = leaf["description"]
        if "properties" not in child:
            found[key] = child["description"]
    assert set(found) == set(expected)
    for key, text in expected.items():
        assert re.search(re.escape(text) + r"(?![\w.])", found[key]), (key, found[key])
    assert receiver.grpc_listen is None and receiver.forward.endpoint is None
