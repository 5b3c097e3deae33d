"""Telemetry's lifecycle: building it starts nothing, ``start`` starts the OTLP pushes,
``shutdown`` pushes what is left and is safe without ``start`` and twice. A real OTLP/HTTP
receiver on loopback counts the pushes."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

import pytest

from semhealth.agent.analysis.tap import TapStats, observe_tap
from semhealth.agent.telemetry.pipeline import OTLPSettings, Settings, Telemetry
from tests.agent.otlp_receiver import HttpReceiver

INTERVAL_S = 0.1


@pytest.fixture
async def receiver() -> AsyncIterator[HttpReceiver]:
    receiver = HttpReceiver()
    await receiver.start()
    try:
        yield receiver
    finally:
        await receiver.shutdown()


def _telemetry(receiver: HttpReceiver) -> Telemetry:
    otlp = OTLPSettings(
        endpoint=receiver.endpoint, protocol="http/protobuf", interval_s=INTERVAL_S, timeout_s=2.0
    )
    telemetry = Telemetry(Settings(otlp=otlp))
    observe_tap(telemetry.meter, TapStats(), lambda: 0)
    return telemetry


def _push_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "otlp-push" in t.name or "Otel" in t.name]


async def _shutdown(telemetry: Telemetry) -> None:
    await asyncio.to_thread(telemetry.shutdown, 5.0)


async def test_building_telemetry_starts_no_thread_and_pushes_nothing(
    receiver: HttpReceiver,
) -> None:
    before = _push_threads()
    telemetry = _telemetry(receiver)
    await asyncio.sleep(INTERVAL_S * 4)
    assert _push_threads() == before
    assert receiver.attempts == 0
    await _shutdown(telemetry)


async def test_start_pushes_on_the_interval_and_twice_is_once(receiver: HttpReceiver) -> None:
    before = len(_push_threads())
    telemetry = _telemetry(receiver)
    telemetry.start()
    telemetry.start()
    assert len(_push_threads()) == before + 1
    await receiver.wait_requests(2, timeout_s=5.0)
    await _shutdown(telemetry)
    assert len(_push_threads()) == before


async def test_shutdown_without_start_is_safe_and_pushes_nothing(
    receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = _telemetry(receiver)
    with caplog.at_level(logging.WARNING):
        await _shutdown(telemetry)
        await _shutdown(telemetry)
    assert receiver.attempts == 0
    assert caplog.records == []


async def test_shutdown_pushes_the_last_values_and_twice_is_once(
    receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = _telemetry(receiver)
    telemetry.start()
    telemetry.observe_analysis(0.001)
    with caplog.at_level(logging.WARNING):
        await _shutdown(telemetry)
        await _shutdown(telemetry)
    assert caplog.records == []  # the SDK warns on a second shutdown; ours does not reach it
    names = {
        metric.name
        for request in receiver.requests
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert "semhealth_analysis_duration" in names


async def test_start_after_shutdown_does_nothing(receiver: HttpReceiver) -> None:
    before = len(_push_threads())
    telemetry = _telemetry(receiver)
    await _shutdown(telemetry)
    telemetry.start()
    assert len(_push_threads()) == before
    await asyncio.sleep(INTERVAL_S * 3)
    assert receiver.attempts == 0


async def test_start_shutdown_then_a_fresh_instance_on_the_same_settings(
    receiver: HttpReceiver,
) -> None:
    for round_ in (1, 2):
        telemetry = _telemetry(receiver)
        telemetry.start()
        await receiver.wait_requests(round_, timeout_s=5.0)
        await _shutdown(telemetry)


async def test_without_start_records_and_scrapes_work_but_nothing_is_pushed(
    receiver: HttpReceiver,
) -> None:
    telemetry = _telemetry(receiver)
    telemetry.observe_analysis(0.001)
    assert b"semhealth_analysis_duration_seconds_count 1.0" in telemetry.render_prometheus()
    await asyncio.sleep(INTERVAL_S * 4)
    assert receiver.attempts == 0
    await _shutdown(telemetry)


async def test_a_telemetry_without_otlp_starts_and_stops() -> None:
    telemetry = Telemetry(Settings())
    observe_tap(telemetry.meter, TapStats(), lambda: 0)
    before = len(_push_threads())
    telemetry.start()
    assert len(_push_threads()) == before
    assert b"semhealth_records_total" in telemetry.render_prometheus()
    await _shutdown(telemetry)
    await _shutdown(telemetry)
