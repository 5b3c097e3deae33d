"""Route contracts: JSON Schema rules about what a valid answer means, end to end."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.config import ConfigError, load_config
from semhealth.agent.config.contracts import ContractError, load_contract
from semhealth.agent.demo.simulator import Script, ScriptRequest
from tests.agent.conftest import running_stack

# "risk_level is high exactly when amount > 1,000,000"
RISK_CONTRACT = """\
type: object
required: [amount, risk_level]
properties:
  amount: {type: number}
  risk_level: {enum: [low, high]}
if:
  properties: {amount: {exclusiveMinimum: 1000000}}
then:
  properties: {risk_level: {const: high}}
else:
  properties: {risk_level: {const: low}}
"""


def test_a_contract_file_loads_as_a_schema(tmp_path: Path) -> None:
    path = tmp_path / "risk.yaml"
    path.write_text(RISK_CONTRACT)
    assert load_contract(str(path))["if"]["properties"]["amount"] == {"exclusiveMinimum": 1000000}


def test_a_contract_that_is_not_a_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"type": 12}')
    with pytest.raises(ContractError, match="is not a valid JSON Schema"):
        load_contract(str(path))


def test_a_config_naming_a_missing_contract_stops_start_up(tmp_path: Path) -> None:
    config = tmp_path / "semhealth.yaml"
    config.write_text(
        "upstream: {url: 'http://127.0.0.1:1'}\n"
        "routes:\n  - {name: loans, match: '*/chat/completions', contract: missing.yaml}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(str(config), {}, {})
    assert "routes[0].contract" in str(caught.value)
    assert "does not exist" in str(caught.value)


def test_relative_contract_paths_are_read_from_the_config_files_folder(tmp_path: Path) -> None:
    (tmp_path / "risk.yaml").write_text(RISK_CONTRACT)
    config = tmp_path / "semhealth.yaml"
    config.write_text(
        "upstream: {url: 'http://127.0.0.1:1'}\n"
        "routes:\n  - {name: loans, match: '*/chat/completions', contract: risk.yaml}\n"
    )
    loaded = load_config(str(config), {}, {})
    assert loaded.collectors.routes[0].contract == str(tmp_path / "risk.yaml")


async def test_answers_breaking_the_contract_count_as_contract_failures(tmp_path: Path) -> None:
    (tmp_path / "risk.yaml").write_text(RISK_CONTRACT)
    answers = iter(
        [
            {"amount": 2_000_000, "risk_level": "high"},  # keeps the rule
            {"amount": 2_000_000, "risk_level": "low"},  # breaks it
            {"amount": 10, "risk_level": "low"},  # keeps it
        ]
    )

    def script(_request: ScriptRequest) -> Script:
        return Script(pieces=(orjson.dumps(next(answers)).decode(),))

    routes = [
        {"name": "loans", "match": "*/chat/completions", "provider": "openai_chat",
         "contract": str(tmp_path / "risk.yaml")}
    ]  # fmt: skip
    async with running_stack(script, routes=routes) as stack:
        async with aiohttp.ClientSession() as client:
            body = {"model": "m", "response_format": {"type": "json_object"},
                    "messages": [{"role": "user", "content": "assess this loan"}]}  # fmt: skip
            for _ in range(3):
                async with client.post(
                    stack.agent.proxy_url + "/v1/chat/completions", json=body
                ) as r:
                    await r.read()
            await stack.wait_records(3)
            async with client.get(stack.agent.admin_url + "/metrics") as r:
                text = await r.text()
    outputs = {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "semantic_health_outputs"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert outputs == {"valid": 2.0, "contract": 1.0}
    reasons = [
        sample.labels["reason"]
        for family in text_string_to_metric_families(text)
        if family.name == "semantic_health_output_failure_reasons"
        for sample in family.samples
        if sample.name.endswith("_total")
    ]
    assert reasons == ["const"]


def test_a_contract_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    bomb = tmp_path / "contract.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ContractError, match="expand to more than"):
        load_contract(str(bomb))
