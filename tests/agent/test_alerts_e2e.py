"""Alerting end to end: traffic through the real sidecar, the shipped default rules (only
shortened), a real Alertmanager (Debian's ``prometheus-alertmanager``) paging a
webhook receiver on loopback. Issue 5's "How it will be checked", through the agent.

Relevance is scored by the real model (all-MiniLM-L6-v2), loaded once for the module and
handed to each agent as ``Settings.loaded_encoders``. The rules are the defaults with
``window``, ``for`` and ``min_samples`` overridden by name, so what pages is what ships.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.config import load_config
from semhealth.agent.demo.simulator import RawScript, Script, ScriptRequest, SimulatedUpstream
from semhealth.agent.relevance import LoadedEncoders
from semhealth.alerts.rules import default_rule_entries
from tests.agent.conftest import ScriptFor
from tests.agent.test_relevance_e2e import (
    RELEVANT,
    UNRELATED_CONTEXT,
    chat,
    metrics,
    post,
    value,
    wait_for,
)
from tests.alerts.alertmanager_server import (
    AlertmanagerServer,
    Payload,
    WebhookReceiver,
    alert_in,
    dead_url,
    page,
)

ROUTE = "chat_completions"  # the route the agent names OpenAI chat completions
PAGE_TIMEOUT_S = 15.0  # scoring, evaluation, Alertmanager's group_interval, and a loaded CI box
# The defaults, shortened so each test takes seconds: same signals, thresholds, labels and
# annotations as shipped.
SHORT = {"window": "3s", "for": "0s", "min_samples": 3}
ENV = {"K8S_POD_NAME": "sh-0", "K8S_NAMESPACE_NAME": "ml"}


def shortened(name: str, **changes: object) -> dict[str, object]:
    """An ``alerts.rules`` entry naming a default rule: only what it sets changes."""
    return {"name": name, **SHORT, **changes}


# -- the upstream's answers ----------------------------------------------------------------------


JSON_MODEL = "json-bot"


def _chunk(model: str, delta: Mapping[str, str], finish: str | None = None) -> bytes:
    chunk = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": dict(delta), "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def broken_json_chunks(text: str = "the refund is", model: str = JSON_MODEL) -> tuple[bytes, ...]:
    """A complete stream whose content is JSON cut off inside a string; ``model`` is the
    model the answer names, which becomes the alert's ``model`` label."""
    return (
        _chunk(model, {"role": "assistant", "content": '{"answer": '}),
        _chunk(model, {"content": f'"{text}'}),
        _chunk(model, {}, "stop"),
        b"data: [DONE]\n\n",
    )


def broken_json(request: ScriptRequest) -> RawScript:
    """Broken JSON in the requested model's name."""
    chunks = broken_json_chunks(model=request.json["model"])
    return RawScript(chunks=chunks, content_type="text/event-stream")


def answer(_request: ScriptRequest) -> Script:
    return Script(pieces=("Here is ", "what the documents say."))


def json_chat(model: str, query: str, context: str) -> dict[str, Any]:
    """A JSON-mode request: its answer has to parse."""
    return {**chat(model, query, context), "response_format": {"type": "json_object"}}


# -- the stack -----------------------------------------------------------------------------------


@asynccontextmanager
async def alerting_agent(
    script_for: ScriptFor,
    *,
    rules: Sequence[Mapping[str, object]],
    alertmanagers: Sequence[str] = (),
    loaded: LoadedEncoders | None = None,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[Agent]:
    """A scripted upstream and the agent in front of it, evaluating the default rules (as
    ``rules`` change them) every 0.2 s and resending every second. ``env`` is the process
    environment the configuration reads (the downward API's ``K8S_*``)."""
    upstream = SimulatedUpstream(script_for)
    await upstream.start()
    overrides: dict[str, object] = {
        "upstream.url": upstream.url,
        "listen.proxy": "127.0.0.1:0",
        "listen.admin": "127.0.0.1:0",
        "relevance.enabled": loaded is not None,
        # The loaded encoders are the fast profile's.
        "relevance.profile": "fast",
        "alerts.default_rules": True,
        "alerts.rules": [dict(rule) for rule in rules],
        "alerts.evaluation_interval_s": 0.2,
        "alerts.resend_delay_s": 1,
        "alerts.alertmanager.urls": list(alertmanagers),
        "alerts.alertmanager.timeout_s": 2,
    }
    config = load_config(None, dict(env or {}), overrides)
    agent = Agent(config, Settings(loaded_encoders=loaded or {}))
    try:
        await agent.start()
        yield agent
    finally:
        await agent.shutdown()
        await upstream.shutdown()


@dataclass
class Traffic:
    """Requests through the proxy one after another, cycling through ``bodies`` (which a
    test may swap on the way) until stopped; every answer is kept."""

    session: aiohttp.ClientSession
    url: str
    bodies: Sequence[dict[str, Any]]
    pause_s: float = 0.05
    answers: list[bytes] = field(default_factory=list)

    async def run(self) -> None:
        sent = 0
        while True:
            body = self.bodies[sent % len(self.bodies)]
            self.answers.append(await post(self.session, self.url, body))
            sent += 1
            await asyncio.sleep(self.pause_s)

    def answered_more(self, more: int) -> Callable[[], Awaitable[bool]]:
        """A ``wait_for`` check: ``more`` answers beyond those received so far."""
        target = len(self.answers) + more

        async def check() -> bool:
            return len(self.answers) >= target

        return check


@asynccontextmanager
async def flowing(traffic: Traffic) -> AsyncIterator[Traffic]:
    """``traffic`` runs in the background for the block; a failed request fails the test."""
    task = asyncio.create_task(traffic.run())
    try:
        yield traffic
    finally:
        if task.done():
            task.result()  # raises what ended it (a request that did not answer 200)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def alerts_body(session: aiohttp.ClientSession, agent: Agent) -> bytes:
    async with session.get(agent.admin_url + "/alerts") as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        return await response.read()


async def alerts_doc(session: aiohttp.ClientSession, agent: Agent) -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads(await alerts_body(session, agent))
    return document


def rule_in(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    rule: dict[str, Any] = next(r for r in document["rules"] if r["name"] == name)
    return rule


def group_in(document: Mapping[str, Any], rule: str, **labels: str) -> dict[str, Any] | None:
    """The group of ``rule`` whose labels include ``labels``, if it exists yet."""
    groups = rule_in(document, rule)["groups"]
    return next((g for g in groups if labels.items() <= g["labels"].items()), None)


def group_state(
    session: aiohttp.ClientSession, agent: Agent, rule: str, state: str, **labels: str
) -> Callable[[], Awaitable[bool]]:
    """A ``wait_for`` check: the group is in ``state``."""

    async def check() -> bool:
        group = group_in(await alerts_doc(session, agent), rule, **labels)
        return group is not None and group["state"] == state

    return check


def relevant_chats(model: str) -> list[dict[str, Any]]:
    return [chat(model, query, context) for query, context in RELEVANT]


def unrelated_chats(model: str) -> list[dict[str, Any]]:
    return [
        chat(model, query, unrelated)
        for (query, _), unrelated in zip(RELEVANT, UNRELATED_CONTEXT, strict=True)
    ]


# -- 1. irrelevant context pages ContextRelevanceLow; relevant context resolves it ---------------


async def test_irrelevant_context_pages_context_relevance_low_and_relevant_context_resolves_it(
    fast_encoders: LoadedEncoders, alertmanager: AlertmanagerServer, webhook: WebhookReceiver
) -> None:
    model = "rag-bot"
    async with (
        alerting_agent(
            answer,
            rules=[shortened("ContextRelevanceLow")],
            alertmanagers=[alertmanager.url],
            loaded=fast_encoders,
            env=ENV,
        ) as agent,
        aiohttp.ClientSession() as session,
    ):
        traffic = Traffic(session, agent.proxy_url, unrelated_chats(model))
        async with flowing(traffic):
            payload = await webhook.wait_for(page("ContextRelevanceLow"), PAGE_TIMEOUT_S)
            firing = alert_in(payload, "ContextRelevanceLow")
            now = group_in(await alerts_doc(session, agent), "ContextRelevanceLow", model=model)
            traffic.bodies = relevant_chats(model)
            ended = await webhook.wait_for(page("ContextRelevanceLow", "resolved"), PAGE_TIMEOUT_S)
            after = group_in(await alerts_doc(session, agent), "ContextRelevanceLow", model=model)

    assert firing["labels"] == {
        "alertname": "ContextRelevanceLow",
        "route": ROUTE,
        "model": model,
        "severity": "warning",
        "pod": "sh-0",
        "namespace": "ml",
    }
    assert firing["generatorURL"] == agent.admin_url + "/alerts"
    annotations = firing["annotations"]
    assert annotations["summary"] == f"Context relevance is low on {ROUTE} ({model})"
    rendered = re.search(r"is (\d+\.\d\d):", annotations["description"])
    assert rendered is not None, annotations["description"]
    assert now is not None and float(rendered.group(1)) == pytest.approx(now["value"], abs=0.01)
    assert float(rendered.group(1)) < 0.75
    assert annotations["runbook_url"].endswith("/operations/runbooks/context-relevance-low/")
    resolved = alert_in(ended, "ContextRelevanceLow")
    assert resolved["labels"] == firing["labels"]
    assert resolved["startsAt"] == firing["startsAt"] < resolved["endsAt"]
    # Resolved by the relevant traffic's scores, not by an empty window.
    assert after is not None
    assert after["state"] == "resolved"
    assert after["samples"] >= SHORT["min_samples"]
    assert after["value"] >= 0.75


# -- 2. broken JSON pages OutputValidityLow ------------------------------------------------------


async def test_broken_json_pages_output_validity_low(
    alertmanager: AlertmanagerServer, webhook: WebhookReceiver
) -> None:
    model = JSON_MODEL
    async with (
        alerting_agent(
            broken_json,
            rules=[shortened("OutputValidityLow")],
            alertmanagers=[alertmanager.url],
        ) as agent,
        aiohttp.ClientSession() as session,
    ):
        query, context = RELEVANT[1]
        traffic = Traffic(session, agent.proxy_url, [json_chat(model, query, context)])
        async with flowing(traffic):
            payload = await webhook.wait_for(page("OutputValidityLow"), PAGE_TIMEOUT_S)

    alert = alert_in(payload, "OutputValidityLow")
    assert alert["labels"]["severity"] == "critical"
    assert (alert["labels"]["route"], alert["labels"]["model"]) == (ROUTE, model)
    # Every output was invalid: the rendered rate is 0 %.
    assert alert["annotations"]["description"].startswith("Only 0% of the structured outputs")


# -- 3. an Alertmanager outage: traffic flows, failures are counted, pages come later -----------


def fires_for(model: str) -> Callable[[Payload], bool]:
    """A ``wait_for`` predicate: OutputValidityLow pages for ``model``."""
    fired = page("OutputValidityLow")
    return lambda payload: (
        fired(payload) and any(alert["labels"].get("model") == model for alert in payload["alerts"])
    )


async def test_alertmanager_outage_keeps_the_proxy_serving_and_pages_once_it_is_back(
    alertmanager: AlertmanagerServer, webhook: WebhookReceiver
) -> None:
    # A long window: both alerts keep firing through the outage with no traffic to hold them.
    rule = shortened("OutputValidityLow", window="60s")
    query, context = RELEVANT[0]
    async with (
        alerting_agent(broken_json, rules=[rule], alertmanagers=[alertmanager.url]) as agent,
        aiohttp.ClientSession() as session,
    ):
        before = Traffic(session, agent.proxy_url, [json_chat("before", query, context)])
        async with flowing(before):
            await webhook.wait_for(fires_for("before"), PAGE_TIMEOUT_S)
        await alertmanager.stop()  # while "before" fires
        during = Traffic(session, agent.proxy_url, [json_chat("during", query, context)])
        async with flowing(during):
            await wait_for(
                group_state(session, agent, "OutputValidityLow", "firing", model="during")
            )

            async def failures_counted() -> bool:
                (delivery,) = (await alerts_doc(session, agent))["alertmanagers"]
                return bool(delivery["errors"] > 0 and delivery["retries"] > 0)

            await wait_for(failures_counted)
            await wait_for(during.answered_more(3))
        (delivery,) = (await alerts_doc(session, agent))["alertmanagers"]
        samples = await metrics(session, agent)
        assert not any(map(fires_for("during"), webhook.payloads))

        await alertmanager.start()  # on the same port, holding no alerts
        await webhook.wait_for(fires_for("during"), PAGE_TIMEOUT_S)

        async def both_held_again() -> bool:
            held = await alertmanager.alerts()
            return {alert["labels"]["model"] for alert in held} == {"before", "during"}

        await wait_for(both_held_again)  # the resends carried the alert fired before, too

    assert during.answers == [b"".join(broken_json_chunks(model="during"))] * len(during.answers)
    assert delivery["url"] == alertmanager.url
    assert delivery["last_error"].startswith("connection failed")
    failed = value(
        samples,
        "semhealth_alertmanager_alerts_total",
        alertmanager=alertmanager.url,
        outcome="failed",
    )
    assert failed >= delivery["errors"]  # read later: more resends may have failed since


# -- 4. /alerts ----------------------------------------------------------------------------------


async def test_alerts_page_shows_every_rule_and_the_group_going_from_pending_to_firing() -> None:
    model = JSON_MODEL
    # "for" long enough that polling sees the group pending on a loaded machine too.
    rule = shortened("OutputValidityLow", window="60s", **{"for": "2s"})
    async with (
        alerting_agent(broken_json, rules=[rule]) as agent,
        aiohttp.ClientSession() as session,
    ):
        query, context = RELEVANT[2]
        for _ in range(3):
            await post(session, agent.proxy_url, json_chat(model, query, context))
        states: list[str] = []

        async def fired() -> bool:
            group = group_in(await alerts_doc(session, agent), "OutputValidityLow", model=model)
            if group is not None and group["state"] not in states:
                states.append(group["state"])
            return "firing" in states

        await wait_for(fired)
        document = await alerts_doc(session, agent)

    assert [r["name"] for r in document["rules"]] == [e["name"] for e in default_rule_entries()]
    assert states[-2:] == ["pending", "firing"]
    group = group_in(document, "OutputValidityLow", model=model)
    assert group is not None
    assert group["labels"] == {"route": ROUTE, "model": model}
    assert (group["value"], group["samples"]) == (0.0, 3)
    assert group["active_at"] < group["fired_at"]
    assert rule_in(document, "OutputValidityLow")["for_s"] == 2.0
    assert document["stats"]["evaluations"] > 1


# -- 5. privacy ----------------------------------------------------------------------------------

# Random tokens, one per place the traffic carries text; none may leave the process.
CANARIES = {"query": "Zq7VxK3pTn", "context": "Wm4RbJ8sLd", "answer": "Hc2NyF6gQa"}


def leaked(text: str) -> list[str]:
    return [canary for canary in CANARIES.values() if canary in text]


async def test_no_text_from_the_traffic_reaches_pages_alerts_or_logs(
    fast_encoders: LoadedEncoders,
    alertmanager: AlertmanagerServer,
    webhook: WebhookReceiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    chunks = broken_json_chunks(f"the refund is {CANARIES['answer']}")
    model = JSON_MODEL
    bodies = [
        json_chat(model, f"{query} {CANARIES['query']}", f"{unrelated} {CANARIES['context']}")
        for (query, _), unrelated in zip(RELEVANT, UNRELATED_CONTEXT, strict=True)
    ]
    rules = [shortened("ContextRelevanceLow"), shortened("OutputValidityLow")]
    async with (
        alerting_agent(
            lambda _: RawScript(chunks=chunks, content_type="text/event-stream"),
            rules=rules,
            alertmanagers=[alertmanager.url],
            loaded=fast_encoders,
            env=ENV,
        ) as agent,
        aiohttp.ClientSession() as session,
    ):
        async with flowing(Traffic(session, agent.proxy_url, bodies)) as traffic:
            for name in ("ContextRelevanceLow", "OutputValidityLow"):
                await webhook.wait_for(page(name), PAGE_TIMEOUT_S)
            status = await alerts_body(session, agent)
            async with session.get(agent.admin_url + "/metrics") as response:
                exported = await response.text()
            held = await alertmanager.alerts()
        assert all(leaked(answer.decode()) == [CANARIES["answer"]] for answer in traffic.answers)

    assert leaked(orjson.dumps(webhook.payloads).decode()) == []
    assert leaked(orjson.dumps(held).decode()) == []
    assert leaked(status.decode()) == []
    assert leaked(exported) == []
    assert leaked(caplog.text) == []
    assert [r.getMessage() for r in caplog.records if leaked(r.getMessage())] == []


# -- 6. an Alertmanager that was never there -----------------------------------------------------


async def test_unreachable_alertmanager_neither_stops_the_proxy_nor_the_evaluator() -> None:
    model = JSON_MODEL
    nowhere = dead_url()
    expected = b"".join(broken_json_chunks())
    async with (
        alerting_agent(
            broken_json, rules=[shortened("OutputValidityLow")], alertmanagers=[nowhere]
        ) as agent,
        aiohttp.ClientSession() as session,
    ):
        query, context = RELEVANT[0]
        traffic = Traffic(session, agent.proxy_url, [json_chat(model, query, context)])
        async with flowing(traffic):
            await wait_for(group_state(session, agent, "OutputValidityLow", "firing"))

            async def failures_counted() -> bool:
                (delivery,) = (await alerts_doc(session, agent))["alertmanagers"]
                return bool(delivery["errors"] > 0)

            await wait_for(failures_counted)
            before = (await alerts_doc(session, agent))["stats"]["evaluations"]

            async def still_evaluating() -> bool:
                return bool(
                    (await alerts_doc(session, agent))["stats"]["evaluations"] >= before + 5
                )

            await wait_for(still_evaluating)
            await wait_for(traffic.answered_more(3))

    assert traffic.answers == [expected] * len(traffic.answers)
