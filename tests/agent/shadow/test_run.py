"""Live shadowing as ``semhealth run`` runs it: the ``shadow:`` block of a YAML file, a
forwarding process that copies each request over the tap wire, and an analysis process that
sends it again to the candidate; the real ``openai`` SDK as the client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from semhealth.agent.demo.simulator import SimulatedUpstream
from tests.agent.shadow.test_live import (
    API_HEADERS,
    CREDENTIALS,
    LYON,
    PARIS,
    ROUTE,
    _scrape,
    answering,
    ask,
)
from tests.agent.test_planes import _until, sidecar


def _shadow_yaml(path: Path, candidate_url: str, extra: str = "") -> Path:
    path.write_text(
        "shadow:\n"
        f"  upstream:\n    url: {candidate_url}\n{extra}"
        "  routes: [chat_completions]\n"
        "  sample_rate: 1.0\n"
        "  max_per_minute: 1000\n"
    )
    return path


async def test_the_candidate_gets_the_clients_headers_across_the_tap_wire(tmp_path: Path) -> None:
    primary, candidate = SimulatedUpstream(answering(PARIS)), SimulatedUpstream(answering(PARIS))
    await primary.start()
    await candidate.start()
    config = _shadow_yaml(
        tmp_path / "semhealth.yaml",
        candidate.url,
        "    headers: {anthropic-version: '2024-10-22'}\n    drop_headers: [X-Internal-Token]\n",
    )
    try:
        async with sidecar(primary.url, "--config", str(config)) as running:
            client = openai.AsyncOpenAI(
                base_url=running.proxy + "/v1",
                api_key="client-bearer",
                default_headers={**API_HEADERS, **CREDENTIALS},
            )
            await ask(client)
            await client.close()

            async def shadowed() -> bool:
                return len(candidate.received) == 1

            await _until(shadowed)
    finally:
        await primary.shutdown()
        await candidate.shutdown()
    (shadow,) = candidate.received
    assert shadow.headers["OpenAI-Beta"] == "assistants=v2"
    assert shadow.headers["X-Tenant"] == "blue"
    assert shadow.headers.getall("anthropic-version") == ["2024-10-22"]
    for name in ("Authorization", *CREDENTIALS):
        assert name not in shadow.headers, name


async def test_semhealth_run_shadows_as_its_yaml_block_says_and_serves_the_pairs(
    tmp_path: Path,
) -> None:
    primary, candidate = SimulatedUpstream(answering(PARIS)), SimulatedUpstream(answering(LYON))
    await primary.start()
    await candidate.start()
    config = _shadow_yaml(tmp_path / "semhealth.yaml", candidate.url, "  rewrite: {model: m2}\n")
    try:
        async with sidecar(primary.url, "--config", str(config)) as running:
            client = openai.AsyncOpenAI(base_url=running.proxy + "/v1", api_key="k")
            for _ in range(3):
                assert (await ask(client))[0] == "".join(PARIS)
            await client.close()
            async with aiohttp.ClientSession() as session:

                async def summary() -> dict[str, Any] | None:
                    async with session.get(running.admin + "/shadow") as response:
                        assert response.status == 200, await response.text()
                        document: dict[str, Any] = await response.json()
                    routes = document["routes"]
                    return document if routes and routes[0]["pairs"] == 3 else None

                await _until(summary)
                document = await summary()
            samples = await _scrape(running.admin)
    finally:
        await primary.shutdown()
        await candidate.shutdown()
    assert [request.json["model"] for request in candidate.received] == ["m2"] * 3
    assert document is not None
    (route,) = document["routes"]
    assert route["route"] == ROUTE
    assert route["token_distance"]["mean"] == pytest.approx(1 / 7)
    assert document["counts"]["pairs"] == {ROUTE: {"differs": 3}}
    pairs = (
        "semantic_health_shadow_pairs_total",
        frozenset({("route", ROUTE), ("result", "differs")}),
    )
    assert samples[pairs] == 3.0
