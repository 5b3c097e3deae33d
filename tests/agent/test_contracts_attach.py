"""Route contracts reach the collectors: ``attach_contracts`` loads each route's file into
the collectors' config, and the record comes out of the collector already judged by it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from semhealth.agent.config.contracts import ContractError, attach_contracts
from semhealth.collectors.collector import StreamCollector
from semhealth.collectors.config import Config, Route
from semhealth.collectors.exchange import Exchange

RISK = """\
type: object
required: [amount, risk_level]
if:
  properties: {amount: {exclusiveMinimum: 1000000}}
then:
  properties: {risk_level: {const: high}}
else:
  properties: {risk_level: {const: low}}
"""


def _answer(config: Config, answer: dict[str, object]) -> list[str]:
    body = orjson.dumps(
        {"model": "m", "stream": True, "response_format": {"type": "json_object"},
         "messages": [{"role": "user", "content": "assess this loan"}]}
    )  # fmt: skip
    exchange = Exchange(
        method="POST", path="/v1/chat/completions", start_ns=0, status=200,
        content_type="text/event-stream", content_encoding=None, response_ns=1,
        request_body=body,
    )  # fmt: skip
    collector = StreamCollector(exchange, config)
    delta = {"choices": [{"index": 0, "delta": {"content": orjson.dumps(answer).decode()}}]}
    collector.feed(b"data: " + orjson.dumps(delta) + b"\n\ndata: [DONE]\n\n", 10)
    return [result.result for result in collector.finish(20).validity]


def test_attached_contracts_judge_the_records_the_collectors_build(tmp_path: Path) -> None:
    (tmp_path / "risk.yaml").write_text(RISK)
    route = Route(name="loans", match="*/chat/completions", provider="openai_chat",
                  contract=str(tmp_path / "risk.yaml"))  # fmt: skip
    config = attach_contracts(Config(routes=(route, Route(name="other", match="*"))))
    assert config.routes[0].contract_schema is not None
    assert config.routes[0].contract_schema["required"] == ["amount", "risk_level"]
    assert config.routes[1].contract_schema is None
    assert _answer(config, {"amount": 2_000_000, "risk_level": "high"}) == ["valid"]
    assert _answer(config, {"amount": 2_000_000, "risk_level": "low"}) == ["contract"]
    # Without the loaded contract only the request's own structure is checked.
    assert _answer(Config(routes=(route,)), {"amount": 2_000_000, "risk_level": "low"}) == ["valid"]


def test_a_contract_that_cannot_be_read_is_refused_at_start_up(tmp_path: Path) -> None:
    route = Route(name="loans", match="*", contract=str(tmp_path / "missing.yaml"))
    with pytest.raises(ContractError, match="cannot read"):
        attach_contracts(Config(routes=(route,)))
