"""Labels: every one whose values come from traffic is bounded by ``telemetry.max_label_values``,
through the real sidecar: an upstream that names a new ``X-RateLimit-Source`` on every 429,
and models that change on every answer, fold into ``other`` past the limit; and every
semantic series carries the semantic labels, the validity gauge and the failure reasons
included."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.demo.simulator import Script, ScriptRequest
from tests.agent.conftest import running_stack

LIMIT = 5
REQUESTS = 30


def _label_values(metrics: str, family: str, label: str) -> set[str]:
    return {
        sample.labels[label]
        for parsed in text_string_to_metric_families(metrics)
        if parsed.name == family
        for sample in parsed.samples
        if label in sample.labels
    }


async def test_thirty_ratelimit_sources_fold_into_five_error_types_and_other() -> None:
    serial = iter(range(REQUESTS))

    def throttled(_request: ScriptRequest) -> Script:
        source = "src" + "abcdefghijklmnopqrstuvwxyzABCDEFGH"[next(serial)]
        return Script(status=429, headers={"X-RateLimit-Source": source})

    settings = {"telemetry.max_label_values": LIMIT}
    async with running_stack(throttled, **settings) as stack, aiohttp.ClientSession() as client:
        for _ in range(REQUESTS):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(stack.agent.proxy_url + "/v1/chat/completions", json=body) as r:
                assert r.status == 429
        await stack.wait_records(REQUESTS)
        metrics = stack.agent.telemetry.render_prometheus().decode()
    error_types = _label_values(metrics, "semantic_health_requests", "error_type")
    assert len(error_types) == LIMIT + 1 and "other" in error_types
    assert {e for e in error_types if e != "other"} == {f"429_src{c}" for c in "abcde"}
    durations = _label_values(metrics, "gen_ai_client_operation_duration_seconds", "error_type")
    assert durations == error_types


async def test_thirty_models_fold_into_five_and_other_on_every_series() -> None:
    serial = iter(range(REQUESTS))

    def renamed(_request: ScriptRequest) -> Script:
        return Script(pieces=("ok",), model=f"model-{next(serial):02d}")

    settings = {"telemetry.max_label_values": LIMIT}
    async with running_stack(renamed, **settings) as stack, aiohttp.ClientSession() as client:
        for _ in range(REQUESTS):
            # No model asked for: the request model is the answer's (one guard for both).
            body = {"messages": [{"role": "user", "content": "hi"}]}
            async with client.post(stack.agent.proxy_url + "/v1/chat/completions", json=body) as r:
                await r.read()
        await stack.wait_records(REQUESTS)
        metrics = stack.agent.telemetry.render_prometheus().decode()
    models = _label_values(metrics, "semantic_health_requests", "model")
    assert models == {f"model-{i:02d}" for i in range(LIMIT)} | {"other"}
    responses = _label_values(
        metrics, "gen_ai_client_operation_duration_seconds", "gen_ai_response_model"
    )
    assert responses == models


async def test_the_validity_gauge_and_failure_reasons_carry_every_semantic_label() -> None:
    def broken_json(_request: ScriptRequest) -> Script:
        return Script(pieces=('{"a": ', "1"), model="gpt-x")

    async with running_stack(broken_json) as stack, aiohttp.ClientSession() as client:
        body = {
            "model": "gpt-x",
            "stream": True,
            "response_format": {"type": "json_object"},
            "messages": [{"role": "user", "content": "json please"}],
        }
        async with client.post(stack.agent.proxy_url + "/v1/chat/completions", json=body) as r:
            await r.read()
        await stack.wait_records(1)
        metrics = stack.agent.telemetry.render_prometheus().decode()
    wanted = {
        "route": "chat_completions",
        "model": "gpt-x",
        "provider": "openai_chat",
        "prompt_class": "short",
        "source": "proxy",
    }
    for family in (
        "semantic_health_model_output_validity_rate",
        "semantic_health_output_failure_reasons",
    ):
        (labels,) = [
            sample.labels
            for parsed in text_string_to_metric_families(metrics)
            if parsed.name == family
            for sample in parsed.samples
        ]
        assert {key: labels.get(key) for key in wanted} == wanted, family
