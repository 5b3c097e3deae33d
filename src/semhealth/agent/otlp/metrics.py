"""The OTLP tap's own instruments: observable counters and gauges over the parts' stats.

Nothing here counts: the receiver, the GenAI mapping and the next hop keep plain counters
(``IntakeStats``), read at collection time. While the receiver is off (``read`` returns
None) every series is absent; while it is on, the per-signal counts and the next hop's
outcomes are present from zero, so rates and alerts have a series before the first event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from semhealth.agent.otlp.codec import SIGNALS
from semhealth.agent.otlp.forward import OUTCOMES
from semhealth.agent.otlp.intake import IntakeStats
from semhealth.agent.telemetry.observe import Labelled

Read = Callable[[], IntakeStats | None]
Pick = Callable[[IntakeStats], dict[Any, int] | None]
Callback = Callable[[CallbackOptions], Iterable[Observation]]

_SIGNAL_NAMES = tuple(signal.name for signal in SIGNALS)


def _by(read: Read, pick: Pick, labels: tuple[str, ...], zeros: Iterable[Any] = ()) -> Callback:
    zero = dict.fromkeys(zeros, 0)

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        stats = read()
        picked = pick(stats) if stats is not None else None
        if picked is None:  # the receiver (or this part of it) is off
            return []
        # A copy: the OTLP push thread collects while the event loop counts.
        counts = {**zero, **dict(picked)}
        return [
            Observation(
                n, dict(zip(labels, key if isinstance(key, tuple) else (key,), strict=True))
            )
            for key, n in counts.items()
        ]

    return Labelled(callback, *labels)


def _gauge(read: Read, pick: Callable[[IntakeStats], int | None]) -> Callback:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        stats = read()
        value = pick(stats) if stats is not None else None
        return [] if value is None else [Observation(value)]

    return callback


def _genai_counts(stats: IntakeStats) -> dict[Any, int]:
    """The mapping's integer counters by field name (``malformed`` has a metric of its own)."""
    fields = {name: getattr(stats.genai, name) for name in stats.genai.__dataclass_fields__}
    return {name: value for name, value in fields.items() if isinstance(value, int)}


def observe_otlp(meter: Meter, read: Read) -> None:
    """Register the OTLP tap's instruments on ``meter``."""
    counters: dict[str, tuple[Pick, tuple[str, ...], Iterable[Any], str]] = {
        "semhealth_otlp_received": (
            lambda s: s.receiver.received,
            ("signal",),
            _SIGNAL_NAMES,
            "Items accepted by the OTLP receiver: spans, log records, metric data points.",
        ),
        "semhealth_otlp_requests": (
            lambda s: s.receiver.requests,
            ("signal",),
            _SIGNAL_NAMES,
            "OTLP export requests accepted.",
        ),
        "semhealth_otlp_rejected": (
            lambda s: s.receiver.rejected,
            ("signal", "reason"),
            (),
            "OTLP export requests refused, neither forwarded nor analysed, by reason: "
            "too_large, too_many_items, malformed, unsupported.",
        ),
        "semhealth_otlp_shed": (
            lambda s: s.receiver.shed,
            ("signal", "reason"),
            (),
            "Items accepted and forwarded but not analysed, by reason: queue_full (the "
            "analysis queue), pending_full (the GenAI mapping's limit), error (a bug).",
        ),
        "semhealth_otlp_forward": (
            lambda s: s.forward.outcomes if s.forward is not None else None,
            ("signal", "outcome"),
            [(signal, outcome) for signal in _SIGNAL_NAMES for outcome in OUTCOMES],
            "Requests for the next hop by outcome: forwarded, retried (per failed attempt), "
            "rejected (refused for good), dropped_full, dropped_expired, dropped_shutdown.",
        ),
        "semhealth_otlp_genai": (
            _genai_counts,
            ("event",),
            (),
            "What the GenAI mapping saw and built from OTLP input, by event: spans_seen, "
            "genai_spans, retriever_spans, records, shed, oversized, orphan_events ...",
        ),
        "semhealth_otlp_genai_malformed": (
            lambda s: s.genai.malformed,
            ("reason",),
            (),
            "GenAI attribute values the mapping could not read and skipped, by reason.",
        ),
    }
    for name, (pick, labels, zeros, description) in counters.items():
        callback = _by(read, pick, labels, zeros)
        meter.create_observable_counter(name, [callback], description=description)
    meter.create_observable_up_down_counter(
        "semhealth_otlp_analysis_queue_bytes",
        [_gauge(read, lambda s: s.receiver.queue_bytes)],
        unit="By",
        description="Bytes of OTLP requests waiting for the GenAI mapping.",
    )
    meter.create_observable_up_down_counter(
        "semhealth_otlp_forward_queue_bytes",
        [_gauge(read, lambda s: s.forward.queue_bytes if s.forward is not None else None)],
        unit="By",
        description="Bytes of OTLP requests waiting for, or in flight to, the next hop.",
    )
