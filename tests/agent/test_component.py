"""The agent's one lifecycle: parts start in order, stop in reverse on one deadline, and
every failure is reported together."""

from __future__ import annotations

import asyncio
import time

import pytest

from semhealth.agent.component import RESERVE_S, Components, Part


class Recorded:
    """A part that notes when it starts and stops, and the deadline it was given."""

    def __init__(self, name: str, events: list[str], *, fail: str | None = None) -> None:
        self.name = name
        self.events = events
        self.fail = fail
        self.deadline: float | None = None

    async def start(self) -> None:
        if self.fail == "start":
            raise RuntimeError(f"{self.name} cannot start")
        self.events.append(f"start {self.name}")

    async def shutdown(self, deadline: float) -> None:
        self.deadline = deadline
        self.events.append(f"stop {self.name}")
        if self.fail == "stop":
            raise RuntimeError(f"{self.name} cannot stop")


def runner(*parts: Recorded) -> Components:
    components = Components()
    for part in parts:
        components.add(part.name, part)
    return components


async def test_parts_start_in_order_and_stop_in_reverse() -> None:
    events: list[str] = []
    components = runner(*(Recorded(name, events) for name in ("sink", "stage", "source")))
    await components.start(1.0)
    await components.shutdown(1.0)
    assert events == [
        "start sink",
        "start stage",
        "start source",
        "stop source",
        "stop stage",
        "stop sink",
    ]


async def test_a_part_that_fails_to_start_stops_those_started_and_raises() -> None:
    events: list[str] = []
    components = runner(
        Recorded("sink", events), Recorded("stage", events, fail="start"), Recorded("x", events)
    )
    with pytest.raises(RuntimeError, match="stage cannot start"):
        await components.start(1.0)
    assert events == ["start sink", "stop sink"]


async def test_shutdown_without_start_and_twice_stops_nothing_more() -> None:
    events: list[str] = []
    components = runner(Recorded("only", events))
    await components.shutdown(1.0)
    await components.start(1.0)
    await components.shutdown(1.0)
    await components.shutdown(1.0)
    assert events == ["start only", "stop only"]


async def test_every_part_stops_and_every_failure_is_reported_together() -> None:
    events: list[str] = []
    components = runner(
        Recorded("a", events, fail="stop"),
        Recorded("b", events),
        Recorded("c", events, fail="stop"),
    )
    await components.start(1.0)
    with pytest.raises(ExceptionGroup) as raised:
        await components.shutdown(1.0)
    assert events[-3:] == ["stop c", "stop b", "stop a"]
    assert sorted(str(e) for e in raised.value.exceptions) == ["a cannot stop", "c cannot stop"]


async def test_each_part_gets_the_one_deadline_less_a_reserve_per_part_after_it() -> None:
    events: list[str] = []
    parts = [Recorded(name, events) for name in ("first", "second", "third")]
    components = runner(*parts)
    await components.start(1.0)
    before = time.monotonic()
    await components.shutdown(5.0)
    first, second, third = (part.deadline for part in parts)
    assert first is not None and second is not None and third is not None
    # Stopped in reverse: "third" stops first and keeps a reserve for the two after it.
    assert before + 5.0 - 2 * RESERVE_S <= third <= time.monotonic() + 5.0 - 2 * RESERVE_S
    assert second == pytest.approx(third + RESERVE_S)
    assert first == pytest.approx(third + 2 * RESERVE_S)


async def test_a_part_that_hangs_is_cut_at_its_deadline_and_the_rest_still_stop() -> None:
    events: list[str] = []
    hung = asyncio.Event()

    async def hang(_deadline: float) -> None:
        hung.set()
        await asyncio.sleep(3600)

    components = Components()
    components.add("sink", Recorded("sink", events))
    components.add("stuck", Part(None, hang))
    await components.start(1.0)
    started = time.monotonic()
    with pytest.raises(ExceptionGroup) as raised:
        await components.shutdown(0.5)
    assert hung.is_set() and events[-1] == "stop sink"
    assert isinstance(raised.value.exceptions[0], TimeoutError)
    assert time.monotonic() - started < 2.0  # the hang was cut, not waited out
