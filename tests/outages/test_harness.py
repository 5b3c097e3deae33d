"""The outage harness itself: a traffic loop that dies fails the test that runs it, whatever
killed it and whenever it died, instead of leaving ``traffic.wrong`` empty."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from tests.outages.harness import PIECES, Traffic, eventually, flowing


class Answering:
    """A loopback server that streams the scripted answer, or, once ``garbled``, a line no
    JSON parser reads (what a broken upstream or relay could send)."""

    def __init__(self) -> None:
        self.garbled = False
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.garbled:
            await response.write(b'data: {"choices": [\n\n')
        for piece in PIECES:
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def answering() -> AsyncIterator[Answering]:
    server = Answering()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


async def test_a_crashed_traffic_loop_is_a_wrong_answer(answering: Answering) -> None:
    with pytest.raises(AssertionError):  # at the block's exit: the next test's subject
        async with flowing(answering.url) as traffic:
            answering.garbled = True
            await eventually(lambda: _dead(traffic))
            wrong = list(traffic.wrong)
    assert len(wrong) == 1
    assert wrong[0].startswith("the traffic loop crashed: JSONDecodeError: ")


async def test_a_traffic_loop_that_crashes_after_the_last_check_fails_the_block(
    answering: Answering,
) -> None:
    with pytest.raises(AssertionError, match="the traffic loop crashed: JSONDecodeError"):
        async with flowing(answering.url) as traffic:
            assert traffic.wrong == []  # the test's last look: all well so far
            answering.garbled = True
            await eventually(lambda: _dead(traffic))


async def test_waiting_for_answers_from_a_dead_loop_says_why_it_died(
    answering: Answering,
) -> None:
    with pytest.raises(AssertionError):  # at the block's exit
        async with flowing(answering.url) as traffic:
            answering.garbled = True
            with pytest.raises(AssertionError) as waited:
                await eventually(traffic.answered(1000), timeout_s=60)
    assert str(waited.value).startswith("the traffic loop crashed: JSONDecodeError")


async def _dead(traffic: Traffic) -> bool:
    return traffic.crashed is not None
