"""The OTLP tap as configured: the receiver, the GenAI mapping it feeds and the next hop.

``Intake`` is what the agent starts and stops: the next hop first (so that nothing
received is refused for want of it), then the receiver; at shutdown the receiver first
(its queued requests are analysed and traces still waiting become records), then the
next hop, which sends what is queued within what is left of the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from semhealth.agent.config.model import Address, OTLPReceiver
from semhealth.agent.otlp.forward import ForwardSettings, ForwardStats, NextHop
from semhealth.agent.otlp.genai import GenAISettings, GenAIStats, GenAITraces
from semhealth.agent.otlp.receiver import Receiver, ReceiverSettings, ReceiverStats
from semhealth.collectors import Config as CollectorsConfig
from semhealth.collectors import StreamRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class IntakeSettings:
    receiver: ReceiverSettings
    genai: GenAISettings
    forward: ForwardSettings | None  # None: nothing is forwarded


@dataclass(frozen=True, slots=True)
class IntakeStats:
    """The parts' counters, read by telemetry at collection time."""

    receiver: ReceiverStats
    genai: GenAIStats
    forward: ForwardStats | None  # None: no next hop


def intake_settings(config: OTLPReceiver) -> IntakeSettings:
    """The settings of ``otlp_receiver:`` as the parts take them."""
    forward = config.forward
    return IntakeSettings(
        receiver=ReceiverSettings(
            grpc_listen=_address(config.grpc_listen),
            http_listen=_address(config.http_listen),
            max_message_bytes=config.max_message_bytes,
            max_items_per_request=config.max_spans_per_request,
            max_queue_bytes=config.max_queue_bytes,
        ),
        genai=GenAISettings(
            trace_wait_s=config.trace_wait_s,
            max_pending_spans=config.max_pending_spans,
            route_attribute=config.route_attribute,
        ),
        forward=None
        if forward.endpoint is None
        else ForwardSettings(
            endpoint=forward.endpoint,
            protocol=forward.protocol,
            headers=forward.headers,
            timeout_s=forward.timeout_s,
            insecure=forward.insecure,
            max_queue_bytes=forward.max_queue_bytes,
            max_age_s=forward.max_age_s,
        ),
    )


def _address(value: Address | None) -> tuple[str, int] | None:
    return None if value is None else (value.host, value.port)


class Intake:
    """Receiver -> (GenAI mapping -> ``consume_record``) and (next hop)."""

    def __init__(
        self,
        settings: IntakeSettings,
        consume_record: Callable[[StreamRecord], None],
        *,
        collectors: CollectorsConfig | None = None,
        on_task_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.genai = GenAITraces(settings.genai, consume_record, collectors=collectors)
        self.next_hop = (
            None
            if settings.forward is None
            else NextHop(settings.forward, on_task_failure=on_task_failure)
        )
        self.receiver = Receiver(
            settings.receiver,
            analysis=self.genai,
            forward=self.next_hop.submit if self.next_hop is not None else None,
            on_task_failure=on_task_failure,
        )

    @property
    def stats(self) -> IntakeStats:
        forward = self.next_hop.stats if self.next_hop is not None else None
        return IntakeStats(self.receiver.stats, self.genai.stats, forward)

    async def start(self) -> None:
        if self.next_hop is not None:
            await self.next_hop.start()
        try:
            await self.receiver.start()
        except BaseException:
            if self.next_hop is not None:
                await self.next_hop.shutdown(0.0)
            raise

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Receiver first, then the next hop, within ``timeout_s`` together."""
        deadline = time.monotonic() + timeout_s
        await self.receiver.shutdown(timeout_s / 2)
        if self.next_hop is not None:
            await self.next_hop.shutdown(max(deadline - time.monotonic(), 0.1))
