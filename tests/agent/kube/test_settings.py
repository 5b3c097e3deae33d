"""Annotations read into Options: defaults, sizes, the takeover port, and every bad value
named with its annotation."""

from __future__ import annotations

from decimal import Decimal

import pytest

from semhealth.agent.kube import AnnotationError, Settings, read_options
from semhealth.agent.kube.settings import quantity_value, wants_injection

SETTINGS = Settings(image="semhealth/semhealth:0.1.0")


def test_defaults_are_the_documented_ports_configmap_and_local_sizes() -> None:
    options = read_options({}, SETTINGS)
    assert (options.upstream_port, options.proxy_port) == (8000, 8080)
    assert options.config_map == "semhealth-config"
    assert options.scorer is None
    sizes = options.resources
    assert (sizes.cpu_request, sizes.cpu_limit) == ("100m", None)
    assert (sizes.memory_request, sizes.memory_limit) == ("256Mi", "512Mi")


def test_a_scorer_shrinks_the_memory_defaults_as_no_model_is_loaded() -> None:
    options = read_options({"semhealth.io/scorer": "semhealth-scorer.semhealth:50051"}, SETTINGS)
    assert options.scorer == "semhealth-scorer.semhealth:50051"
    assert (options.resources.memory_request, options.resources.memory_limit) == (
        "160Mi",
        "320Mi",
    )


def test_annotations_beat_the_flags() -> None:
    settings = Settings(image="img", config_map="fleet", scorer="scorer.a:50051")
    options = read_options(
        {
            "semhealth.io/config-map": "chat-semhealth",
            "semhealth.io/scorer": "scorer.b:50051",
            "semhealth.io/upstream-port": "11434",
            "semhealth.io/proxy-port": "8081",
            "semhealth.io/cpu-request": "250m",
            "semhealth.io/cpu-limit": "1",
            "semhealth.io/memory-request": "300Mi",
            "semhealth.io/memory-limit": "1Gi",
        },
        settings,
    )
    assert (options.config_map, options.scorer) == ("chat-semhealth", "scorer.b:50051")
    assert (options.upstream_port, options.proxy_port) == (11434, 8081)
    sizes = options.resources
    assert (sizes.cpu_request, sizes.cpu_limit, sizes.memory_request, sizes.memory_limit) == (
        "250m",
        "1",
        "300Mi",
        "1Gi",
    )


def test_takeover_port_makes_the_sidecar_listen_on_the_model_servers_old_port() -> None:
    options = read_options(
        {"semhealth.io/takeover-port": "8000", "semhealth.io/upstream-port": "8001"}, SETTINGS
    )
    assert (options.proxy_port, options.upstream_port) == (8000, 8001)


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"semhealth.io/upstream-port": "http"},
            "semhealth.io/upstream-port: 'http' is not a port",
        ),
        ({"semhealth.io/proxy-port": "70000"}, "semhealth.io/proxy-port: '70000' is not a port"),
        ({"semhealth.io/proxy-port": "8000"}, "semhealth.io/proxy-port: 8000 is taken"),
        ({"semhealth.io/proxy-port": "9464"}, "semhealth.io/proxy-port: 9464 is taken"),
        (
            {"semhealth.io/takeover-port": "8000"},
            "semhealth.io/takeover-port: 8000 needs semhealth.io/upstream-port",
        ),
        (
            {"semhealth.io/takeover-port": "8000", "semhealth.io/upstream-port": "8000"},
            "semhealth.io/takeover-port: 8000 needs semhealth.io/upstream-port",
        ),
        (
            {
                "semhealth.io/takeover-port": "8000",
                "semhealth.io/upstream-port": "8001",
                "semhealth.io/proxy-port": "8080",
            },
            "semhealth.io/takeover-port: 8000 and semhealth.io/proxy-port: 8080 disagree",
        ),
        (
            {"semhealth.io/scorer": "http://scorer:50051"},
            "semhealth.io/scorer: 'http://scorer:50051' is not HOST:PORT",
        ),
        (
            {"semhealth.io/memory-limit": "lots"},
            "semhealth.io/memory-limit: 'lots' is not a Kubernetes quantity",
        ),
        ({"semhealth.io/cpu-limit": ""}, "semhealth.io/cpu-limit: '' is not a Kubernetes quantity"),
        (
            {"semhealth.io/memory-request": "1Gi", "semhealth.io/memory-limit": "512Mi"},
            "semhealth.io/memory-request 1Gi is above semhealth.io/memory-limit 512Mi",
        ),
        (
            {"semhealth.io/memory-request": "600Mi"},
            "semhealth.io/memory-request 600Mi is above semhealth.io/memory-limit 512Mi",
        ),
        (
            {"semhealth.io/cpu-request": "1.5", "semhealth.io/cpu-limit": "1000m"},
            "semhealth.io/cpu-request 1.5 is above semhealth.io/cpu-limit 1000m",
        ),
        (
            {"semhealth.io/config-map": "Not_A_Name"},
            "semhealth.io/config-map: 'Not_A_Name' is not a ConfigMap name",
        ),
    ],
)
def test_a_bad_annotation_is_named_with_its_fix(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(AnnotationError) as raised:
        read_options(annotations, SETTINGS)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("value", "inject_all", "wanted"),
    [
        ("true", False, True),
        ("True", False, True),
        ("false", True, False),
        (None, False, False),
        (None, True, True),
    ],
)
def test_inject_annotation_and_inject_all(
    value: str | None, inject_all: bool, wanted: bool
) -> None:
    annotations = {} if value is None else {"semhealth.io/inject": value}
    settings = Settings(image="img", inject_all=inject_all)
    assert wants_injection(annotations, settings) is wanted


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("256Mi", 268435456),
        ("250m", 0.25),
        ("1Gi", 1073741824),
        ("1G", 10**9),
        ("1.5", 1.5),
        (".5", 0.5),
    ],
)
def test_quantities_compare_as_kubernetes_reads_them(text: str, value: float) -> None:
    assert quantity_value(text) == Decimal(str(value))


def test_inject_annotation_must_be_true_or_false() -> None:
    with pytest.raises(AnnotationError) as raised:
        wants_injection({"semhealth.io/inject": "yes"}, SETTINGS)
    assert str(raised.value) == 'semhealth.io/inject: \'yes\' is neither "true" nor "false"'
