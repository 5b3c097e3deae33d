from __future__ import annotations

from typing import Any

import pytest

from semhealth.embeddings.config import (
    Batching,
    Config,
    Encoder,
    Local,
    Remote,
    default_config,
)


def test_the_default_config_is_valid() -> None:
    assert default_config().validate() == []


def test_the_default_config_has_minilm_on_auto_and_routes_cjk_to_use() -> None:
    config = default_config()
    assert [(encoder.name, encoder.backend) for encoder in config.encoders] == [
        ("default", "local"),
        ("multilingual", "use"),
    ]
    assert config.encoder == "default"
    assert config.route_cjk_to == "multilingual"
    assert config.encoders[0].local.device == "auto"


@pytest.mark.parametrize(
    ("config", "path", "message"),
    [
        (
            Config(encoders=(Encoder(batching=Batching(queue_size=0, max_batch=1)),)),
            "encoders[0].batching.queue_size",
            "queue_size must be at least 1, not 0",
        ),
        (
            Config(encoders=(Encoder(batching=Batching(queue_size=8, max_batch=16)),)),
            "encoders[0].batching.max_batch",
            "max_batch 16 is larger than queue_size 8",
        ),
        (
            Config(encoders=(Encoder(batching=Batching(max_batch_tokens=0)),)),
            "encoders[0].batching.max_batch_tokens",
            "max_batch_tokens must be at least 1, not 0",
        ),
        (
            Config(encoders=(Encoder(batching=Batching(flush_timeout_s=-0.001)),)),
            "encoders[0].batching.flush_timeout_s",
            "flush_timeout_s must be between 0 and 1, not -0.001",
        ),
        (
            Config(encoders=(Encoder(batching=Batching(workers=0)),)),
            "encoders[0].batching.workers",
            "workers must be at least 1, not 0",
        ),
        (
            Config(encoders=(Encoder(local=Local(device="gpu")),)),
            "encoders[0].local.device",
            "unknown device 'gpu'",
        ),
        (
            Config(encoders=(Encoder(local=Local(threads=0)),)),
            "encoders[0].local.threads",
            "threads must be at least 1, not 0",
        ),
        (
            Config(encoders=(Encoder(local=Local(model=" ")),)),
            "encoders[0].local.model",
            "model is empty",
        ),
        (
            Config(encoders=(Encoder(backend="onnx"),)),
            "encoders[0].backend",
            "unknown backend 'onnx'",
        ),
        (
            Config(encoder="zh", encoders=(Encoder(name="zh-cn"),)),
            "encoders[0].name",
            "encoder name 'zh-cn' is not a name",
        ),
        (
            Config(encoders=(Encoder(), Encoder())),
            "encoders[1].name",
            "encoder name 'default' is used twice",
        ),
        (
            Config(encoder="zh"),
            "encoder",
            "encoder 'zh' is not among the encoders",
        ),
        (Config(cache_entries=-1), "cache_entries", "cache_entries must be at least 0, not -1"),
        (Config(top_k=0), "top_k", "top_k must be at least 1, not 0"),
    ],
)
def test_each_bad_setting_is_named_with_its_path(config: Config, path: str, message: str) -> None:
    issues = config.validate()
    assert (path, message) in [(issue.path, issue.message) for issue in issues]


def test_every_issue_is_reported_at_once() -> None:
    config = Config(
        top_k=0,
        cache_entries=-1,
        encoders=(Encoder(local=Local(device="tpu")),),
        route_cjk_to="zh",
    )
    assert len(config.validate()) == 4


def test_an_issue_reads_as_path_message_and_fix() -> None:
    (issue,) = Config(top_k=0).validate()
    assert str(issue) == "top_k: top_k must be at least 1, not 0 (fix: use 1 or more)"


def test_two_encoders_with_their_own_names_are_valid() -> None:
    config = Config(
        encoder="en",
        route_cjk_to="zh",
        encoders=(
            Encoder(name="en"),
            Encoder(name="zh", local=Local(model="/models/multilingual"), batching=Batching()),
        ),
    )
    assert config.validate() == []


def _remote(backend: str, **settings: Any) -> Config:
    encoder = Encoder(backend=backend, remote=Remote(**settings))
    return Config(encoders=(encoder,), route_cjk_to=None)


@pytest.mark.parametrize(
    ("config", "path", "message"),
    [
        (_remote("scorer"), "encoders[0].remote.url", "url is empty"),
        (_remote("tei", url=" "), "encoders[0].remote.url", "url is empty"),
        (
            _remote("scorer", url="http://127.0.0.1:50051"),
            "encoders[0].remote.url",
            "url 'http://127.0.0.1:50051' is not a HOST:PORT address",
        ),
        (
            _remote("scorer", url="127.0.0.1:70000"),
            "encoders[0].remote.url",
            "url '127.0.0.1:70000' is not a HOST:PORT address",
        ),
        (
            _remote("tei", url="127.0.0.1:8080"),
            "encoders[0].remote.url",
            "url is not an http:// or https:// URL with a host",
        ),
        (
            _remote("openai", url="ftp://example.com", model="m"),
            "encoders[0].remote.url",
            "url is not an http:// or https:// URL with a host",
        ),
        (
            _remote("openai", url="https://api.example.com/v1"),
            "encoders[0].remote.model",
            "model is empty",
        ),
        (
            _remote("scorer", url="127.0.0.1:50051", timeout_s=0.0),
            "encoders[0].remote.timeout_s",
            "timeout_s must be more than 0, not 0",
        ),
        (
            _remote("tei", url="http://127.0.0.1:8080", max_connections=0),
            "encoders[0].remote.max_connections",
            "max_connections must be at least 1, not 0",
        ),
    ],
)
def test_each_bad_remote_setting_is_named_with_its_path(
    config: Config, path: str, message: str
) -> None:
    assert (path, message) in [(issue.path, issue.message) for issue in config.validate()]


@pytest.mark.parametrize(
    "config",
    [
        _remote("scorer", url="127.0.0.1:50051"),
        _remote("scorer", url="[::1]:50051", model="default"),
        _remote("tei", url="http://127.0.0.1:8080"),
        _remote("openai", url="https://api.example.com/v1", model="text-embedding-3-small"),
    ],
)
def test_a_complete_remote_encoder_is_valid(config: Config) -> None:
    assert config.validate() == []


def test_a_remote_section_is_not_judged_for_a_local_encoder() -> None:
    encoder = Encoder(remote=Remote(timeout_s=-1.0, max_connections=0))
    assert Config(encoders=(encoder,), route_cjk_to=None).validate() == []


def test_a_scorer_encoder_asks_for_its_own_name_unless_a_model_is_given() -> None:
    assert Encoder(name="zh", backend="scorer").model == "zh"
    assert Encoder(name="zh", backend="scorer", remote=Remote(model="multi")).model == "multi"
