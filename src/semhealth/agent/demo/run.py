"""``semhealth demo``: the sidecar in front of a built-in simulated LLM, with traffic.

A newcomer sees live numbers without owning an LLM server: the simulated
upstream streams OpenAI- and Anthropic-style answers with realistic timing
(some JSON, some malformed, some stalls, some 429s), a traffic generator sends
requests through the real proxy, and a summary of the analysed streams is
printed to the terminal: continuity, errors, validity and context relevance per route.
The admin endpoint serves ``/metrics`` meanwhile.

Relevance needs no extra: without sentence-transformers (the ``local`` extra) every
request is scored with USE multilingual, a dependency of semhealth itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from semhealth.agent.analysis.agent import Agent, Settings
from semhealth.agent.analysis.alerting import ActiveAlert
from semhealth.agent.config import Relevance, load_config
from semhealth.agent.demo.simulator import (
    DemoProfile,
    ScriptRequest,
    SimulatedUpstream,
    demo_script,
)
from semhealth.agent.demo.traffic import TrafficGenerator
from semhealth.agent.relevance import plan_relevance
from semhealth.collectors import StreamRecord, measure_continuity, quantile
from semhealth.embeddings import RelevanceScores

WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class _Seen:
    t: float
    record: StreamRecord


@dataclass(frozen=True, slots=True)
class _Scored:
    t: float
    key: tuple[str, str]  # route, provider
    context: float  # calibrated context_relevance_score


class DemoSummary:
    """Rolling one-minute view of the records, rendered as a small text table."""

    def __init__(
        self,
        stall_threshold_s: float,
        validity: Callable[[], dict[tuple[str, ...], tuple[int, int]]] = dict,
        alerts: Callable[[], list[ActiveAlert]] = list,
    ) -> None:
        self._stall_threshold_s = stall_threshold_s
        self.validity = validity  # the gauge's label values -> (valid, checked)
        self.alerts = alerts  # pending and firing, as /alerts shows them
        self._recent: collections.deque[_Seen] = collections.deque()
        self._scored: collections.deque[_Scored] = collections.deque()
        self.total = 0

    def consume_record(self, record: StreamRecord) -> None:
        self.total += 1
        self._recent.append(_Seen(time.monotonic(), record))

    def consume_scores(self, record: StreamRecord, scores: RelevanceScores) -> None:
        """A record's relevance scores, when its scoring finishes (after ``consume_record``)."""
        if scores.context is not None:
            key = (record.route, record.provider)
            self._scored.append(_Scored(time.monotonic(), key, scores.context))

    def _window(self) -> list[StreamRecord]:
        horizon = time.monotonic() - WINDOW_S
        while self._recent and self._recent[0].t < horizon:
            self._recent.popleft()
        while self._scored and self._scored[0].t < horizon:
            self._scored.popleft()
        return [seen.record for seen in self._recent]

    def render(self) -> str:
        records = self._window()
        lines = [f"streams analysed: {self.total} total, {len(records)} in the last minute"]
        by_route: dict[tuple[str, str], list[StreamRecord]] = collections.defaultdict(list)
        for record in records:
            by_route[(record.route, record.provider)].append(record)
        header = (
            f"{'route':<18}{'provider':<20}{'n':>5}{'ttft p50':>10}{'ttft p95':>10}"
            f"{'cont p50':>10}{'cont p95':>10}{'stalls':>8}{'errors':>8}{'valid':>13}"
            f"{'ctx rel':>9}"
        )
        lines.append(header)
        validity: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
        for (route, _model, provider, *_rest), (ok, total) in self.validity().items():
            validity[(route, provider)][0] += ok
            validity[(route, provider)][1] += total
        relevance: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        for scored in self._scored:
            relevance[scored.key].append(scored.context)
        for (route, provider), group in sorted(by_route.items()):
            ok, total = validity.get((route, provider), (0, 0))
            context = relevance.get((route, provider), [])
            lines.append(self._row(route, provider, group) + _share(ok, total) + _mean(context))
        lines += _alert_lines(self.alerts())
        return "\n".join(lines)

    def _row(self, route: str, provider: str, group: list[StreamRecord]) -> str:
        continuity = [measure_continuity(r, self._stall_threshold_s) for r in group]
        ttft = sorted(c.ttft_s for c in continuity if c.ttft_s is not None)
        index = sorted(c.index_s for c in continuity if c.index_s is not None)
        stalls = sum(c.stalls for c in continuity)
        errors = sum(1 for r in group if r.error_type or r.upstream_aborted)
        return (
            f"{route:<18}{provider:<20}{len(group):>5}{_ms(ttft, 0.5):>10}{_ms(ttft, 0.95):>10}"
            f"{_ms(index, 0.5):>10}{_ms(index, 0.95):>10}{stalls:>8}{errors:>8}"
        )


def _alert_lines(alerts: list[ActiveAlert], limit: int = 5) -> list[str]:
    if not alerts:
        return ["alerts: none pending or firing (default rules judge 5-minute windows)"]
    lines = [f"alerts: {len(alerts)} pending or firing"]
    for alert in alerts[:limit]:
        labels = " ".join(f"{k}={v}" for k, v in sorted(alert.labels.items()))
        value = "-" if alert.value is None else f"{alert.value:.3g}"
        lines.append(f"  {alert.state:<8}{alert.rule:<22}{labels}  value={value}")
    return lines


def _share(ok: int, total: int) -> str:
    """Structured outputs that were valid, over the validity window."""
    if not total:
        return f"{'-':>13}"
    return f"{f'{ok}/{total} {ok / total:.0%}':>13}"


def _mean(values: list[float]) -> str:
    """Mean calibrated context relevance over the window (0.75 is the default alert's line)."""
    if not values:
        return f"{'-':>9}"
    return f"{sum(values) / len(values):>9.2f}"


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    return f"{quantile(values, q) * 1000:.0f}ms"


async def run_demo(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    profile = DemoProfile()

    def script_for(request: ScriptRequest) -> object:
        return demo_script(request, rng, profile)

    upstream = SimulatedUpstream(script_for)  # type: ignore[arg-type]
    await upstream.start()
    overrides: dict[str, object] = {"upstream.url": upstream.url}
    overrides["listen.proxy"] = args.listen or "127.0.0.1:8080"
    overrides["listen.admin"] = args.admin_listen or "127.0.0.1:9464"
    if args.log_level:
        overrides["log.level"] = args.log_level
    config = load_config(None, os.environ, overrides)
    summary = DemoSummary(config.collectors.analysis.stall_threshold_s)
    agent = Agent(config, Settings(consumers=[summary.consume_record]))
    summary.validity = agent.telemetry.recorder.validity_counts
    if agent.alerting is not None:
        summary.alerts = agent.alerting.active
    traffic: TrafficGenerator | None = None
    try:
        await agent.start()
        if agent.relevance is not None:
            agent.relevance.also_record(summary.consume_scores)
        traffic = TrafficGenerator(
            agent.proxy_url,
            profile,
            rng,
            concurrency=args.concurrency,
            rate_per_s=args.rate,
        )
        await traffic.start()
        print(
            f"semhealth demo (seed {seed}): proxy {agent.proxy_url}"
            f" -> simulated LLM {upstream.url}\n"
            f"metrics: {agent.admin_url}/metrics   alerts: {agent.admin_url}/alerts"
            "   stop: Ctrl-C\n"
            f"{_relevance_line(config.relevance, scoring=agent.relevance is not None)}",
            file=out,
        )
        await _show(summary, out, args.duration)
    finally:
        if traffic is not None:
            await traffic.shutdown()
        await agent.shutdown()
        await upstream.shutdown()
    print(summary.render(), file=out)
    return 0


def _relevance_line(relevance: Relevance, *, scoring: bool) -> str:
    """Which encoders score the demo's traffic, or why none does."""
    plan = plan_relevance(relevance)
    if not scoring:
        return f"context relevance: off ({plan.off or 'its encoders did not start; see the log'})"
    encoders = ", ".join(f"'{encoder.name}' ({encoder.model})" for encoder in plan.encoders)
    routed = plan.embeddings is not None and plan.embeddings.routes_cjk
    how = "CJK requests to the second" if routed else "every request, in every language"
    line = f"context relevance: encoder {encoders}, {how}"
    # The demo sets up no logging: the agent's log line about the fallback would not show.
    return line if plan.fallback is None else f"{line}\n  ({plan.fallback})"


async def _show(summary: DemoSummary, out: TextIO, duration_s: float | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    interactive = out.isatty()
    period = 1.0 if interactive else 5.0
    deadline = None if duration_s is None else loop.time() + duration_s
    drawn = 0
    while not stop.is_set():
        timeout = period if deadline is None else min(period, max(deadline - loop.time(), 0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout)
        if deadline is not None and loop.time() >= deadline:
            break
        text = summary.render()
        if interactive:
            # Redraw in place: move up over the previous table and clear to the end.
            out.write(f"\x1b[{drawn}F\x1b[J" if drawn else "")
            drawn = text.count("\n") + 1
        out.write(text + "\n")
        out.flush()
