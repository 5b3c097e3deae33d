"""One ``semhealth replay``: files in, a ``ReplayRun`` out (see ``pipeline`` for how).

The progress bars (tqdm, on stderr, only where stderr is a terminal): input lines while
the collectors rebuild records, then records twice over: once while their relevance is
scored, once while they are recorded and the rules evaluated.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from semhealth.agent.config import Config
from semhealth.agent.relevance import LoadedEncoders
from semhealth.agent.replay.inputs import Input, read_file
from semhealth.agent.replay.pipeline import (
    ReplayAlerts,
    ReplayMetrics,
    Scored,
    build_records,
    otlp_push_settings,
    record_result,
    score_records,
)
from semhealth.agent.replay.results import RecordResult, ReplayRun
from semhealth.alerts import Rule

DEFAULT_THRESHOLD = 0.75


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    relevance: bool = True  # False: --no-relevance
    otlp_push: str | None = None  # endpoint to push the resulting metrics to, once
    progress: bool = False  # a progress bar on stderr (only where it is a terminal)
    loaded_encoders: LoadedEncoders = field(default_factory=dict)  # see LoadedEncoders


@dataclass(frozen=True, slots=True)
class Outcome:
    run: ReplayRun
    pushed: bool | None  # the OTLP push: True done, False failed, None not asked
    relevance_off: str | None  # why relevance was not scored at all


def _inputs(files: Sequence[str]) -> Iterator[Input]:
    for path in files:
        yield from read_file(path)


def _counted(items: Iterator[Input], bar: tqdm[Any]) -> Iterator[Input]:
    for item in items:
        bar.update(1)
        yield item


def relevance_threshold(rules: Sequence[Rule]) -> float:
    """The context-relevance threshold the first absolute rule on that signal pages on."""
    for rule in rules:
        if (
            rule.signal == "context_relevance_score"
            and rule.baseline is None
            and isinstance(rule.threshold, float | int)
        ):
            return float(rule.threshold)
    return DEFAULT_THRESHOLD


async def replay(files: Sequence[str], config: Config, options: Options) -> Outcome:
    """Replay ``files`` through the pipeline ``config`` describes."""
    disable = None if options.progress else True  # None: only where stderr is a terminal
    with tqdm(unit="line", desc="semhealth replay: reading", disable=disable, leave=False) as read:
        built = build_records(_counted(_inputs(files), read), config)
    ordered = sorted(built.records, key=lambda replayed: replayed.record.end_ns)
    bar = tqdm(
        total=2 * len(ordered),
        unit="rec",
        desc="semhealth replay: scoring",
        disable=disable,
        leave=False,
    )
    with bar:
        scored = (
            await score_records(
                ordered,
                config,
                loaded=options.loaded_encoders,
                progress=lambda n: bar.update(n),
            )
            if options.relevance
            else Scored(off="--no-relevance")
        )
        bar.update(len(ordered) - bar.n)  # records not scored count as done too
        bar.set_description("semhealth replay: recording and evaluating")
        rules = config.alerts.load_rules() if config.alerts.enabled else ()
        alerts = ReplayAlerts(
            rules,
            interval_s=config.alerts.evaluation_interval_s,
            resend_delay_s=config.alerts.resend_delay_s,
        )
        push = otlp_push_settings(options.otlp_push, config) if options.otlp_push else None
        metrics = ReplayMetrics(config, push)
        metrics.recorder.consume_sample = alerts.observe
        results: list[RecordResult] = []
        try:
            for index, replayed in enumerate(ordered):
                record = replayed.record
                at = record.end_ns / 1e9  # when the live agent recorded it
                alerts.advance(at)
                metrics.clock.now = at
                metrics.recorder.consume_record(record)
                scores = scored.scores.get(index)
                if scores is not None:
                    metrics.recorder.record_relevance(record, scores)
                skipped = None
                if scores is None:
                    skipped = scored.skipped.get(index, "off" if scored.off else None)
                results.append(record_result(replayed, scores, skipped))
                bar.update(1)
            end = ordered[-1].record.end_ns / 1e9 if ordered else None
            if end is not None:
                alerts.finish(end)
            pushed = metrics.push()
        finally:
            metrics.close()
    run = ReplayRun(
        files=tuple(files),
        results=tuple(results),
        alerts=tuple(alerts.transitions),
        problems=tuple(built.problems),
        threshold=relevance_threshold(rules),
        start=min((r.time for r in results), default=None),
        end=end,
    )
    return Outcome(run, pushed, scored.off)
