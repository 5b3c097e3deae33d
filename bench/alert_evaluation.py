"""What evaluating the alert rules costs, next to what recording a stream costs.

Three measurements in one run, each figure a median over several repeats:

1. **Per finished stream.** Recording a stream (``Recorder.consume_record`` on the 55-chunk
   JSON-mode OpenAI stream of ``bench/record_cost.py``) against what alerting adds for it:
   on the event loop, ``AlertingStage.observe`` for each of its samples (a deque append); on
   the alerting worker, ``Evaluator.observe`` for the same samples with the default rules,
   also with the two relevance samples that follow once embeddings are back. ``x record``
   is the share of the recording's cost. The rows take turns in short slices.
2. **One evaluation.** ``Evaluator.evaluate`` with the default rules over 10, 100 and 1000
   groups (distinct routes), every window filled at ``--rate`` samples per second per group
   and signal: 5 minutes for the absolute rules, 5 minutes plus the hour's baseline for
   RelevanceRegression. The values are healthy, so every group stays inactive and no
   annotation is rendered. The five absolute rules and the relative one are timed apart
   (``all six`` adds the two, timed in the same repeat). ``+snapshot`` adds
   ``Evaluator.snapshot``, which the stage runs after every evaluation for ``/alerts``;
   ``% of 15 s`` is the share of the default interval the worker spends.
3. **Loop delay.** While an ``AlertingStage`` holding 1000 groups evaluates on its worker
   thread, how late a task on the event loop wakes from ``asyncio.sleep(1 ms)``, against
   the idle loop, in rounds that take turns. The worker shares the GIL with the loop, so
   this is what an evaluation does to forwarding while it runs; how long it runs is part
   2's figure. To keep the run short this stage is filled at ``--loop-rate`` (0.1 sample/s
   per group and signal, enough for every rule's ``min_samples``), so its evaluations are
   shorter than part 2's; how late the loop wakes during one does not depend on that. It
   runs in a child process, on uvloop when it is installed (as the agent does), which fills
   its stage while this process fills part 2's, and measures once parts 1 and 2 are done.

    python bench/alert_evaluation.py            # under 2 minutes on 2 cores
    python bench/alert_evaluation.py --quick    # about 20 s: part 2 up to 100 groups, part 3 300
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import gc
import itertools
import math
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from _workload import MODEL, analyse, json_mode_request, json_mode_stream, per_call_us

from semhealth.agent.analysis.alerting import AlertingStage
from semhealth.agent.analysis.alerting import Settings as AlertingSettings
from semhealth.agent.telemetry.pipeline import Settings, Telemetry
from semhealth.alerts import Alert, Evaluator, Rule, RuleStatus, Sample, load_rules
from semhealth.alerts.evaluator import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_GROUPS_PER_RULE,
    SLOTS_PER_WINDOW,
)
from semhealth.collectors.record import StreamRecord
from semhealth.embeddings.relevance import RelevanceScores

T = TypeVar("T")

BATCH = 50  # calls timed together, so the clock's own cost stays out of the figure
RECORD_BATCH = 5  # recording takes milliseconds: smaller batches give more figures
SLICES = 5  # part 1: each repeat's seconds per row, in this many turns
PROBE_SLEEP_S = 0.001
NOW = 1_800_000_000.0  # the evaluation time of parts 2 and 3, in wall-clock Unix seconds
# Samples the stage may hold while its fill waits for a drain: about 100 MB of them.
FILL_PENDING = 1_000_000
# What the fill gives each signal the default rules watch: healthy values, far enough under
# every threshold that even a 30-sample p95 stays under it, so no group goes pending and
# evaluation measures windows, not annotation templates.
VALUES: dict[str, Callable[[random.Random], float]] = {
    "context_relevance_score": lambda r: min(max(r.gauss(0.85, 0.05), 0.0), 1.0),
    "answer_relevance_score": lambda r: min(max(r.gauss(0.85, 0.05), 0.0), 1.0),
    # A ratio window keeps no buckets, so values do not change its cost: all valid keeps
    # the rule quiet however few samples a window holds.
    "model_output_validity_rate": lambda _r: 1.0,
    "stream_continuity_index": lambda r: abs(r.gauss(0.006, 0.002)),
    "operation_duration": lambda r: r.lognormvariate(math.log(0.02), 0.25),
    "time_to_first_token": lambda r: r.lognormvariate(math.log(0.035), 0.2),
}
VALUE_POOL = 4096  # values drawn once per signal and cycled: the fill's hot loop draws none


# --------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    repeats: int
    seconds: float  # per part-1 row and repeat
    groups: tuple[int, ...]  # part 2
    rate: float  # part 2: samples per second per group and signal
    loop_groups: int  # part 3
    loop_rate: float
    probe_rounds: int
    idle_s: float  # per idle probe round


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (~20 s)")
    parser.add_argument("--repeats", type=int, help="repeats per figure (default 3, quick 2)")
    parser.add_argument(
        "--seconds", type=float, help="part 1: seconds per row and repeat (default 0.8, quick 0.4)"
    )
    parser.add_argument(
        "--groups", type=int, nargs="+", help="part 2: group counts (default 10 100 1000)"
    )
    parser.add_argument(
        "--rate", type=float, help="part 2: samples/s per group and signal (default 1)"
    )
    parser.add_argument("--loop-groups", type=int, help="part 3: groups (default 1000, quick 300)")
    parser.add_argument(
        "--loop-rate", type=float, help="part 3: samples/s per group and signal (default 0.1)"
    )
    parser.add_argument(
        "--probe-rounds", type=int, help="part 3: idle and busy rounds (default 3, quick 2)"
    )
    return parser


def options_from(args: argparse.Namespace) -> Options:
    quick: bool = args.quick
    return Options(
        repeats=_pick(args.repeats, 2 if quick else 3),
        seconds=_pick(args.seconds, 0.4 if quick else 0.8),
        groups=tuple(sorted(set(args.groups or ((10, 100) if quick else (10, 100, 1000))))),
        rate=_pick(args.rate, 1.0),
        loop_groups=_pick(args.loop_groups, 300 if quick else 1000),
        loop_rate=_pick(args.loop_rate, 0.1),
        probe_rounds=_pick(args.probe_rounds, 2 if quick else 3),
        idle_s=0.5 if quick else 1.0,
    )


def _pick(given: T | None, default: T) -> T:
    return default if given is None else given


def check_options(options: Options) -> list[str]:
    problems = []
    if options.repeats < 1:
        problems.append("--repeats must be at least 1")
    if options.seconds <= 0:
        problems.append("--seconds must be positive")
    most = DEFAULT_MAX_GROUPS_PER_RULE
    if any(not 1 <= groups <= most for groups in (*options.groups, options.loop_groups)):
        problems.append(f"--groups and --loop-groups must be 1 to {most}, the evaluator's limit")
    if not all(0 < rate <= 100 for rate in (options.rate, options.loop_rate)):
        problems.append("--rate and --loop-rate must be above 0 and at most 100")
    if options.probe_rounds < 1:
        problems.append("--probe-rounds must be at least 1")
    return problems


# --------------------------------------------------------------------------- the stream


def timed_s(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# --------------------------------------------------------------------------- part 1


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    figures: list[float]  # µs per stream, one per batch, pooled over the repeats

    @property
    def median(self) -> float:
        return statistics.median(self.figures)

    @property
    def p90(self) -> float:
        return percentile(self.figures, 0.9)


@dataclass(frozen=True, slots=True)
class StreamSamples:
    recorded: tuple[Sample, ...]  # what consume_record emits
    relevance: tuple[Sample, ...]  # what record_relevance adds once embeddings are back


def stream_samples(record: StreamRecord) -> StreamSamples:
    """The samples one stream hands the alerting stage, captured from a real recorder."""
    captured: list[Sample] = []
    telemetry = _telemetry(captured.append)
    telemetry.recorder.consume_record(record)
    recorded = tuple(captured)
    scores = RelevanceScores(context=0.86, answer=0.8, context_raw=0.7, answer_raw=0.6, chunks=4)
    telemetry.recorder.record_relevance(record, scores)
    telemetry.shutdown()
    return StreamSamples(recorded, tuple(captured[len(recorded) :]))


def _telemetry(consume_sample: Callable[[Sample], None] | None) -> Telemetry:
    return Telemetry(Settings(), consume_sample=consume_sample)


class _LoopSide:
    """``AlertingStage.observe`` for one stream's samples, timed in batches.

    This stage holds no rules, so draining it between batches is quick; the append on the
    loop never looks at the rules.
    """

    def __init__(self, samples: Sequence[Sample]) -> None:
        settings = AlertingSettings(rules=())
        self._samples = samples
        self._stage = AlertingStage(settings)
        # Drain at half the limit: a full stage sheds, which skips the append measured here.
        per_batch = BATCH * len(samples)
        self._batches_per_drain = max(1, settings.max_pending_samples // (2 * per_batch))

    async def measure(self, seconds: float) -> list[float]:
        figures: list[float] = []
        observe, samples = self._stage.observe, self._samples
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(self._batches_per_drain):
                began = time.perf_counter_ns()
                for _ in range(BATCH):
                    for sample in samples:
                        observe(sample)
                figures.append((time.perf_counter_ns() - began) / BATCH / 1000)
            await self._stage.evaluate_now()
        return figures

    async def shutdown(self) -> int:
        """Shut the stage down; the samples it shed, which must be none."""
        shed = self._stage.stats().samples_shed
        await self._stage.shutdown()
        return shed


def _observing(evaluator: Evaluator, samples: Sequence[Sample]) -> Callable[[], None]:
    def observe_all() -> None:
        for sample in samples:
            evaluator.observe(sample)

    return observe_all


async def per_stream(options: Options, record: StreamRecord, samples: StreamSamples) -> list[Row]:
    """Part 1: the rows, their first one the recording every other is compared with."""
    stage = AlertingStage(AlertingSettings(rules=load_rules()))
    recording, bare = _telemetry(stage.observe), _telemetry(None)
    evaluator = Evaluator(load_rules(), notify=_ignore)
    loop_side = _LoopSide(samples.recorded)
    everything = samples.recorded + samples.relevance
    n, m = len(samples.recorded), len(everything)
    record_it, record_bare = "record it, samples to the stage", "record it, alerting off"
    loop, worker = f"loop: AlertingStage.observe x{n}", f"worker: Evaluator.observe x{n}"
    worker_all = f"worker: Evaluator.observe x{m}, +relevance"
    figures: dict[str, list[float]] = {name: [] for name in (record_it, record_bare, loop)}
    figures.update({worker: [], worker_all: []})
    seconds = options.seconds / SLICES
    for _ in range(options.repeats * SLICES):
        figures[record_it] += per_call_us(
            lambda: recording.recorder.consume_record(record), seconds, RECORD_BATCH
        )
        await stage.evaluate_now()  # drains what the recording handed over
        figures[record_bare] += per_call_us(
            lambda: bare.recorder.consume_record(record), seconds, RECORD_BATCH
        )
        figures[loop] += await loop_side.measure(seconds)
        figures[worker] += per_call_us(_observing(evaluator, samples.recorded), seconds)
        figures[worker_all] += per_call_us(_observing(evaluator, everything), seconds)
    shed = stage.stats().samples_shed + await loop_side.shutdown()
    await stage.shutdown()
    recording.shutdown()
    bare.shutdown()
    if shed:
        raise RuntimeError(f"the stages shed {shed} samples: the loop figure is not an append")
    return [Row(name, values) for name, values in figures.items()]


def _ignore(_alerts: Sequence[Alert]) -> None:
    """The evaluators' ``notify``: healthy values raise no alert, and delivery is not measured."""


# --------------------------------------------------------------------------- filling windows


def history_s(rules: Sequence[Rule]) -> dict[str, float]:
    """How far back each signal needs samples for every window of ``rules`` to be full."""
    spans: dict[str, float] = {}
    for rule in rules:
        span = rule.window_s
        if rule.baseline is not None and rule.baseline.window_s is not None:
            # The baseline's coarse slots may end up to one slot before the window begins.
            # A peer baseline reads the rule's own window: nothing further back.
            span += rule.baseline.window_s * (1 + 1 / SLOTS_PER_WINDOW)
        spans[rule.signal] = max(spans.get(rule.signal, 0.0), span)
    return spans


def group_labels(groups: int) -> list[dict[str, str]]:
    """One distinct route per group: every default rule groups by route (and model)."""
    return [
        {"route": f"route-{i}", "model": MODEL, "provider": "openai", "prompt_class": "short"}
        for i in range(groups)
    ]


def fill(
    sink: Callable[[Sample], None], rules: Sequence[Rule], groups: int, rate: float
) -> Iterator[float]:
    """Hand ``sink`` the samples of ``groups`` at ``rate`` per signal, oldest first, up to
    ``NOW``; yields each time step's time, so a caller can drain between steps."""
    spans = history_s(rules)
    missing = sorted(set(spans) - set(VALUES))
    if missing:
        raise RuntimeError(f"no bench values for the rule signals {missing}")
    pools = {name: itertools.cycle(_pool(name)) for name in spans}
    labels = group_labels(groups)
    step_s = 1.0 / rate
    for index in range(math.ceil(max(spans.values()) * rate) - 1, -1, -1):
        # Half a step before a whole one, so no sample sits on a slot's edge.
        t = NOW - (index + 0.5) * step_s
        for name, span in spans.items():
            if NOW - t <= span:
                # Groups innermost: the long loop, and the fill's hot one.
                pool = pools[name]
                for group in labels:
                    sink(Sample(name, next(pool), group, t))
        yield t


def _pool(signal: str) -> list[float]:
    draw, rng = VALUES[signal], random.Random(signal)
    return [draw(rng) for _ in range(VALUE_POOL)]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic GC off while windows fill: filling creates hundreds of thousands of
    long-lived objects, and collections walking them would take most of the fill's time."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


# --------------------------------------------------------------------------- part 2


@dataclass(frozen=True, slots=True)
class Evaluators:
    groups: int
    absolute: Evaluator
    relative: Evaluator


def build_evaluators(groups: int, rate: float) -> Evaluators:
    rules = load_rules()
    absolute = tuple(rule for rule in rules if rule.baseline is None)
    relative = tuple(rule for rule in rules if rule.baseline is not None)
    built = Evaluators(
        groups, Evaluator(absolute, notify=_ignore), Evaluator(relative, notify=_ignore)
    )
    with _collector_paused():
        collections.deque(fill(built.absolute.observe, absolute, groups, rate), maxlen=0)
        collections.deque(fill(built.relative.observe, relative, groups, rate), maxlen=0)
    for evaluator in (built.absolute, built.relative):
        evaluator.evaluate(NOW)  # the first evaluation prunes the fill's oldest slots
    return built


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Seconds per repeat, for one group count."""

    groups: int
    absolute: list[float]
    absolute_snapshot: list[float]
    relative: list[float]
    relative_snapshot: list[float]
    window_samples: int  # in the relative rule's 5-minute window, median over its groups
    baseline_samples: int  # in its baseline, likewise
    active: int  # groups pending or firing: 0, or the values were not healthy


def measure_evaluation(evaluators: Evaluators, repeats: int) -> Evaluation:
    figures: dict[str, list[float]] = collections.defaultdict(list)
    statuses: dict[str, list[RuleStatus]] = {}
    for _ in range(repeats):
        for name, evaluator in (
            ("absolute", evaluators.absolute),
            ("relative", evaluators.relative),
        ):
            figures[name].append(timed_s(functools.partial(evaluator.evaluate, NOW)))
            began = time.perf_counter()
            statuses[name] = evaluator.snapshot(NOW)
            figures[f"{name}_snapshot"].append(time.perf_counter() - began)
    relative_groups = statuses["relative"][0].groups
    return Evaluation(
        groups=evaluators.groups,
        absolute=figures["absolute"],
        absolute_snapshot=figures["absolute_snapshot"],
        relative=figures["relative"],
        relative_snapshot=figures["relative_snapshot"],
        window_samples=round(statistics.median(g.samples for g in relative_groups)),
        baseline_samples=round(statistics.median(g.baseline_samples or 0 for g in relative_groups)),
        active=sum(
            group.state != "inactive"
            for rule in (*statuses["absolute"], *statuses["relative"])
            for group in rule.groups
        ),
    )


# --------------------------------------------------------------------------- part 3


@dataclass(frozen=True, slots=True)
class LoopDelay:
    """``asyncio.sleep(1 ms)`` overshoots in µs per round, idle and during one evaluation."""

    loop: str
    idle: list[list[float]]
    busy: list[list[float]]
    evaluation_s: list[float]  # the stage's own figure: drain, evaluate and snapshot
    groups: int
    active: int


class _Clock:
    """The stage's wall clock: the fill's time while filling, then ``NOW``."""

    def __init__(self) -> None:
        self.now = NOW

    def read(self) -> float:
        return self.now


async def _filled_stage(groups: int, rate: float) -> AlertingStage:
    clock = _Clock()
    rules = load_rules()
    stage = AlertingStage(
        AlertingSettings(rules=rules, max_pending_samples=FILL_PENDING), clock=clock.read
    )
    pending = 0

    def observe(sample: Sample) -> None:
        nonlocal pending
        pending += 1
        stage.observe(sample)

    most_per_step = groups * len(history_s(rules))
    with _collector_paused():
        for t in fill(observe, rules, groups, rate):
            if pending + most_per_step > FILL_PENDING:
                clock.now = t  # the stage evaluates at the fill's time, as it would have live
                await stage.evaluate_now()
                pending = 0
        clock.now = NOW
        await stage.evaluate_now()
    if stage.stats().samples_shed:
        raise RuntimeError("the stage shed samples while filling")
    return stage


async def _probe_while(work: Coroutine[Any, Any, object]) -> list[float]:
    """How late, in µs, each ``asyncio.sleep(1 ms)`` wakes while ``work`` runs."""
    task = asyncio.ensure_future(work)
    overshoots = []
    while not task.done():
        began = time.perf_counter()
        await asyncio.sleep(PROBE_SLEEP_S)
        overshoots.append((time.perf_counter() - began - PROBE_SLEEP_S) * 1e6)
    await task
    return overshoots


async def _loop_delay(
    conn: Connection, groups: int, rate: float, rounds: int, idle_s: float
) -> dict[str, Any]:
    stage = await _filled_stage(groups, rate)
    conn.send("ready")
    conn.recv()  # blocks the loop on purpose: nothing else runs until the parent has measured
    idle: list[list[float]] = []
    busy: list[list[float]] = []
    evaluation_s = []
    for _ in range(rounds):
        idle.append(await _probe_while(asyncio.sleep(idle_s)))
        busy.append(await _probe_while(stage.evaluate_now()))
        evaluation_s.append(stage.stats().evaluation_seconds)
    stats = stage.stats()
    await stage.shutdown()
    # Plain data: the parent cannot unpickle classes of the child's copy of this script.
    return {
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "idle": idle,
        "busy": busy,
        "evaluation_s": evaluation_s,
        "groups": stats.evaluator.groups // len(stage.rules),
        "active": stats.pending + stats.firing,
    }


def loop_delay_child(
    conn: Connection, groups: int, rate: float, rounds: int, idle_s: float
) -> None:
    """The child process of part 3: fill, say ready, wait for the go, measure, reply."""
    try:
        conn.send(_run(_loop_delay(conn, groups, rate, rounds, idle_s)))
    finally:
        conn.close()


def _run(main: Coroutine[Any, Any, T]) -> T:
    """On uvloop when it is installed, as the agent runs."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result


# --------------------------------------------------------------------------- report


def print_per_stream(rows: Sequence[Row], record: StreamRecord, samples: StreamSamples) -> None:
    base = rows[0].median
    names = sorted({sample.name for sample in samples.recorded + samples.relevance})
    print(
        f"1. per finished stream: {len(json_mode_stream())}-chunk JSON-mode OpenAI chat stream, "
        f"{len(record.delta_ns)} deltas; {len(samples.recorded)} samples recorded "
        f"(+{len(samples.relevance)} with relevance scores): {', '.join(names)}"
    )
    print(f"{'':<44}{'median µs':>10}{'p90 µs':>9}{'x record':>10}")
    for row in rows:
        print(f"{row.name:<44}{row.median:>10.2f}{row.p90:>9.2f}{row.median / base:>10.4f}")


def print_evaluations(evaluations: Sequence[Evaluation], rate: float) -> None:
    first = evaluations[0]
    print()
    print(
        f"2. one evaluation, default rules, windows filled at {rate:g} sample/s per group and "
        f"signal ({first.window_samples} samples per 5-min window, {first.baseline_samples} "
        f"in RelevanceRegression's baseline); interval {DEFAULT_INTERVAL_S:g} s"
    )
    header = (
        "groups",
        "rules",
        "evaluate ms",
        "µs/group",
        "% of 15 s",
        "+snapshot ms",
        "% of 15 s",
    )
    print(f"{header[0]:>6}  {header[1]:<14}" + "".join(f"{h:>13}" for h in header[2:]))
    for evaluation in evaluations:
        for name, evaluate, snapshot in _evaluation_rows(evaluation):
            both = statistics.median(e + s for e, s in zip(evaluate, snapshot, strict=True))
            alone = statistics.median(evaluate)
            print(
                f"{evaluation.groups:>6}  {name:<14}{alone * 1e3:>13.1f}"
                f"{alone / evaluation.groups * 1e6:>13.1f}{_share(alone):>13.2f}"
                f"{both * 1e3:>13.1f}{_share(both):>13.2f}"
            )
        if evaluation.active:
            print(f"        ({evaluation.active} groups pending or firing: values not healthy)")


def _evaluation_rows(evaluation: Evaluation) -> list[tuple[str, list[float], list[float]]]:
    pairs = zip(evaluation.absolute, evaluation.relative, strict=True)
    snapshots = zip(evaluation.absolute_snapshot, evaluation.relative_snapshot, strict=True)
    return [
        ("absolute (5)", evaluation.absolute, evaluation.absolute_snapshot),
        ("relative (1)", evaluation.relative, evaluation.relative_snapshot),
        ("all six", [a + r for a, r in pairs], [a + r for a, r in snapshots]),
    ]


def _share(seconds: float) -> float:
    return seconds / DEFAULT_INTERVAL_S * 100


@dataclass(frozen=True, slots=True)
class DelayFigures:
    idle_p50: float
    idle_p99: float
    busy_p50: float
    busy_p99: float
    idle_max: float
    busy_max: float
    probes: tuple[int, int]
    evaluation_s: float  # the child's own, at its lighter fill


def delay_figures(delay: LoopDelay) -> DelayFigures:
    return DelayFigures(
        idle_p50=statistics.median(percentile(r, 0.5) for r in delay.idle),
        idle_p99=statistics.median(percentile(r, 0.99) for r in delay.idle),
        busy_p50=statistics.median(percentile(r, 0.5) for r in delay.busy),
        busy_p99=statistics.median(percentile(r, 0.99) for r in delay.busy),
        idle_max=max(max(r) for r in delay.idle),
        busy_max=max(max(r) for r in delay.busy),
        probes=(sum(map(len, delay.idle)), sum(map(len, delay.busy))),
        evaluation_s=statistics.median(delay.evaluation_s),
    )


def print_loop_delay(delay: LoopDelay, figures: DelayFigures, rate: float) -> None:
    print()
    print(
        f"3. loop delay: asyncio.sleep(1 ms) overshoot on {delay.loop} while an AlertingStage "
        f"evaluates {delay.groups} groups x 6 rules on its worker thread, windows filled at "
        f"{rate:g} sample/s; GIL switch interval {sys.getswitchinterval() * 1e3:g} ms; "
        f"medians of {len(delay.busy)} rounds each"
    )
    print(f"{'':<22}{'probes':>8}{'p50 µs':>10}{'p99 µs':>10}{'max µs':>10}")
    print(
        f"{'idle loop':<22}{figures.probes[0]:>8}{figures.idle_p50:>10.0f}"
        f"{figures.idle_p99:>10.0f}{figures.idle_max:>10.0f}"
    )
    print(
        f"{'during an evaluation':<22}{figures.probes[1]:>8}{figures.busy_p50:>10.0f}"
        f"{figures.busy_p99:>10.0f}{figures.busy_max:>10.0f}"
    )
    print(
        f"{'x idle':<22}{'':>8}{figures.busy_p50 / figures.idle_p50:>10.1f}"
        f"{figures.busy_p99 / figures.idle_p99:>10.1f}{figures.busy_max / figures.idle_max:>10.1f}"
    )
    print(f"each probed evaluation (drain, evaluate, snapshot) took {figures.evaluation_s:.2f} s")
    if delay.active:
        print(f"({delay.active} alerts pending or firing: values not healthy)")


def print_reading(
    rows: Sequence[Row], evaluations: Sequence[Evaluation], figures: DelayFigures
) -> None:
    record, loop, worker = rows[0].median, rows[2].median, rows[4].median
    largest = evaluations[-1]
    stage_s = statistics.median(
        sum(run)
        for run in zip(
            largest.absolute,
            largest.absolute_snapshot,
            largest.relative,
            largest.relative_snapshot,
            strict=True,
        )
    )
    per_group = [
        statistics.median(a + r for a, r in zip(e.absolute, e.relative, strict=True)) / e.groups
        for e in evaluations
    ]
    absolute = statistics.median(largest.absolute) / largest.groups / 5
    relative = statistics.median(largest.relative) / largest.groups
    switch_ms = sys.getswitchinterval() * 1e3
    print()
    print(
        f"Reading: per stream, alerting costs the loop {loop / record * 100:.2f} % of what "
        f"recording the stream costs (a deque append per sample) and the worker "
        f"{worker / record * 100:.1f} % (windowing the samples, relevance included). The cost "
        f"is in evaluation, {_per_group(per_group, evaluations)}; per rule and group the "
        f"relative rule costs {relative / absolute:.1f}x an "
        f"absolute one (it measures a baseline window too, with finer sketches). "
        f"At {largest.groups} "
        f"groups, evaluation plus the /alerts snapshot keeps the worker busy "
        f"{stage_s:.2f} s of every {DEFAULT_INTERVAL_S:g} s ({_share(stage_s):.0f} %). The "
        f"worker shares the GIL with the loop; while it evaluates, a 1 ms timer wakes "
        f"p50 {figures.busy_p50:.0f} µs late against {figures.idle_p50:.0f} µs idle, p99 "
        f"{figures.busy_p99:.0f} µs against {figures.idle_p99:.0f} µs "
        f"(x{figures.busy_p99 / figures.idle_p99:.0f}). {_verdict(figures, switch_ms)} "
        f"At {largest.groups} groups that is {_share(stage_s):.0f} % of the time, and the "
        f"share falls in proportion with fewer groups."
    )


def _per_group(per_group: Sequence[float], evaluations: Sequence[Evaluation]) -> str:
    if len(evaluations) == 1:
        return f"{per_group[0] * 1e6:.0f} µs per group for all six rules"
    return (
        f"{min(per_group) * 1e6:.0f}-{max(per_group) * 1e6:.0f} µs per group for all six rules "
        f"from {evaluations[0].groups} to {evaluations[-1].groups} groups, so linear in groups"
    )


def _verdict(figures: DelayFigures, switch_ms: float) -> str:
    if figures.busy_p50 < 2 * figures.idle_p50 and figures.busy_p99 < 2 * figures.idle_p99:
        return "So evaluation does not measurably stall forwarding."
    if figures.busy_p50 * 1e-3 >= switch_ms / 2:
        return (
            "So evaluation stalls forwarding: the loop waits for the GIL in steps of the "
            f"{switch_ms:g} ms switch interval, and every chunk handled meanwhile is that "
            "much later."
        )
    return (
        "So evaluation delays forwarding by a fraction of a millisecond: the worker hands "
        f"the GIL over every 0.5 ms of work, well inside the {switch_ms:g} ms switch interval "
        "the loop would otherwise wait."
    )


# --------------------------------------------------------------------------- main


def main() -> None:
    args = build_parser().parse_args()
    options = options_from(args)
    problems = check_options(options)
    if problems:
        raise SystemExit("\n".join(problems))
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    child = context.Process(
        target=loop_delay_child,
        args=(
            child_conn,
            options.loop_groups,
            options.loop_rate,
            options.probe_rounds,
            options.idle_s,
        ),
        name="alert-evaluation-loop-delay",
    )
    child.start()
    child_conn.close()  # so a child that dies is an EOFError here, not a hang
    try:
        report(options, conn)
    finally:
        conn.close()
        child.join(timeout=10)
        if child.is_alive():
            child.terminate()


def report(options: Options, conn: Connection) -> None:
    started = time.perf_counter()
    # Filled while the child fills its stage: the two processes use both cores.
    evaluators = [build_evaluators(groups, options.rate) for groups in options.groups]
    gc.freeze()  # part 1 measures code, not collections walking part 2's windows
    if conn.recv() != "ready":
        raise RuntimeError("the loop-delay child did not get ready")
    filled = time.perf_counter() - started
    record = analyse(json_mode_stream(), json_mode_request())
    if not (record.output_text and record.request.structure):
        raise RuntimeError("the bench stream must be a structured (JSON mode) one")
    samples = stream_samples(record)
    rows = asyncio.run(per_stream(options, record, samples))
    evaluations = [measure_evaluation(e, options.repeats) for e in evaluators]
    conn.send("go")
    delay = LoopDelay(**conn.recv())
    figures = delay_figures(delay)
    print(
        f"alert evaluation bench: {options.repeats} repeats, windows filled in {filled:.0f} s, "
        f"Python {sys.version.split()[0]}"
    )
    print_per_stream(rows, record, samples)
    print_evaluations(evaluations, options.rate)
    print_loop_delay(delay, figures, options.loop_rate)
    print_reading(rows, evaluations, figures)
    print(f"(run took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
