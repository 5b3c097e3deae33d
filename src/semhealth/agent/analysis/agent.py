"""The agent process: builds every component, hands each its downstream, and
runs them under one lifecycle.

Start is downstream-first (telemetry, the relevance scorer, tap, upstream
session, admin, alert evaluation and delivery, then the proxy listener that
lets traffic in); shutdown is upstream-first and shares one deadline,
reporting every failure together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from semhealth.agent.admin.app import build_admin_app, observe_auth_failures, start_site
from semhealth.agent.admin.gate import AdminAccess, AdminGate
from semhealth.agent.analysis.alerting import AlertingStage, observe_alerting
from semhealth.agent.analysis.alerting import Settings as AlertingSettings
from semhealth.agent.analysis.health import Health, observe_health
from semhealth.agent.analysis.receiver import TapReceiver
from semhealth.agent.analysis.tap import ConsumeRecord, Tap, TapStats, observe_tap
from semhealth.agent.component import RESERVE_S, Components, Part, seconds_left
from semhealth.agent.config import Address, Config, ShadowSettings
from semhealth.agent.config.contracts import attach_contracts
from semhealth.agent.dataplane.relay import ListenSettings, Relay, RelayStats
from semhealth.agent.dataplane.settings import listen_settings, upstream_settings
from semhealth.agent.errors import ConfigError, RelevanceStartError
from semhealth.agent.otlp.evaluation import (
    EvaluationEmitter,
    EvaluationSettings,
    EvaluationStats,
    observe_evaluation,
    relevance_threshold,
    settings_from_config,
)
from semhealth.agent.relevance import (
    ENCODER_NOT_SERVED,
    LoadedEncoders,
    RelevanceStage,
    RelevanceStats,
    Unscored,
    observe_relevance,
    plan_relevance,
    used,
)
from semhealth.agent.relevance import Settings as RelevanceSettings
from semhealth.agent.replay.recording import Recording, RecordingStats, observe_recording
from semhealth.agent.replay.settings import RecordSettings
from semhealth.agent.telemetry.batching import FLUSH_INSTRUMENT
from semhealth.agent.telemetry.instruments import SPECS, Instruments
from semhealth.agent.telemetry.observe import CatalogueMeter, Family, Shed
from semhealth.agent.telemetry.pipeline import OTLPSettings, Telemetry, observe_telemetry
from semhealth.agent.telemetry.pipeline import Settings as TelemetrySettings
from semhealth.agent.telemetry.recorder import Recorder, RecorderSettings
from semhealth.alerts.model import Rule
from semhealth.collectors.record import StreamRecord
from semhealth.embeddings import EmbeddingError, EncoderNotServed

if TYPE_CHECKING:
    # Each stage below is imported where it is built, so that an agent without it never
    # loads what it brings: numpy (scoring), grpc and protobuf (the OTLP receiver), the
    # tokenizers and rapidfuzz (shadowing). tests/agent/test_planes.py reads the running
    # process's memory map for them.
    from semhealth.agent.otlp.intake import Intake
    from semhealth.agent.shadow.live import Shadow
    from semhealth.embeddings import CacheStats, MicroBatcher

log = logging.getLogger(__name__)

_Part = TypeVar("_Part")
_Value = TypeVar("_Value")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What code (not the YAML) hands the agent."""

    consumers: Sequence[ConsumeRecord] = ()  # after the recorder and the relevance stage
    telemetry: TelemetrySettings | None = None  # None: from the configuration
    shutdown_timeout_s: float = 10.0
    loaded_encoders: LoadedEncoders = field(default_factory=dict)  # see LoadedEncoders
    # The analysis process: no relay; copies come from forwarders over ``tap_socket`` and the
    # admin app listens on ``admin_socket`` (the forwarder's admin front relays to it).
    tap_socket: str | None = None
    admin_socket: str | None = None
    # A background task died (Health): the analysis process stops here so that it is
    # started again whole; None (one process): /readyz answers 503 from then on.
    on_background_failure: Callable[[str], None] | None = None
    # The admin listener's web config (TLS, basic auth) and /alerts; in the analysis
    # process the forwarder's admin front applies them instead.
    admin: AdminAccess = field(default_factory=AdminAccess)
    listen: ListenSettings | None = None  # the relay's timeouts and limits; None: config's
    # ``semhealth run --record FILE``: every analysed exchange, written in the replay format.
    record: RecordSettings | None = None
    # Live shadowing to a candidate upstream; None: the configuration's ``shadow:``, if any.
    shadow: ShadowSettings | None = None


def telemetry_settings(config: Config) -> TelemetrySettings:
    """The telemetry pipeline as configured."""
    telemetry = config.telemetry
    otlp = telemetry.otlp
    return TelemetrySettings(
        service_name=telemetry.service_name,
        resource_attributes=telemetry.resource_attributes,
        otlp=None
        if otlp.endpoint is None
        else OTLPSettings(
            endpoint=otlp.endpoint,
            protocol=otlp.protocol,
            headers=otlp.headers,
            interval_s=otlp.interval_s,
            timeout_s=otlp.timeout_s,
            insecure=otlp.insecure,
        ),
        recorder=RecorderSettings(
            validity_window_s=telemetry.validity_window_s,
            max_label_values=telemetry.max_label_values,
            variant=telemetry.variant or None,
        ),
    )


def alerting_settings(config: Config) -> AlertingSettings:
    """The alert rules in force and where they page; the config was validated, so the
    rules load."""
    alerts = config.alerts
    resource = dict(config.telemetry.resource_attributes)
    # The downward API's pod and namespace, as the labels Alertmanager routes on.
    external = {
        "pod": resource.get("k8s.pod.name", ""),
        "namespace": resource.get("k8s.namespace.name", ""),
    }
    return AlertingSettings(
        rules=alerts.load_rules(),
        alertmanagers=alerts.alertmanager.urls,
        interval_s=alerts.evaluation_interval_s,
        resend_delay_s=alerts.resend_delay_s,
        timeout_s=alerts.alertmanager.timeout_s,
        external_labels={name: value for name, value in external.items() if value},
    )


def evaluation_settings(config: Config) -> EvaluationSettings | None:
    """``otlp_receiver.evaluation`` as the emitter takes it, labelling relevance against the
    relevance alert's floor; None while it is off (or the configuration has no such block)."""
    receiver = getattr(config, "otlp_receiver", None)
    block = getattr(receiver, "evaluation", None)
    if block is None or not getattr(block, "enabled", False):
        return None
    telemetry = config.telemetry
    settings = settings_from_config(
        block,
        forward=getattr(receiver, "forward", None),
        service_name=telemetry.service_name,
        resource_attributes=telemetry.resource_attributes,
        threshold=relevance_threshold(config.alerts.load_rules()),
    )
    issues = settings.validate()
    if issues:
        raise ConfigError(issues)
    return settings


def _stop_by(shutdown: Callable[[float], Awaitable[None]]) -> Callable[[float], Awaitable[None]]:
    """A part's stop for a shutdown that takes the seconds it may use."""

    async def stop(deadline: float) -> None:
        await shutdown(seconds_left(deadline))

    return stop


def _stop(shutdown: Callable[[], Awaitable[None]]) -> Callable[[float], Awaitable[None]]:
    """A part's stop for a shutdown that keeps its own short deadline."""

    async def stop(_deadline: float) -> None:
        await shutdown()

    return stop


async def _nothing(_deadline: float) -> None:
    return None


def observe_stages(
    meter: Any,
    shed: Shed,
    *,
    tap: TapStats,
    active_streams: Callable[[], int],
    health: Health,
    relevance: Callable[[], RelevanceStage | Unscored | None],
    cache: Callable[[], CacheStats | None],
    intake: Callable[[], Intake | None],
    alerting: AlertingStage | None,
) -> None:
    """The instruments of the stages every agent has (tap, health, relevance, alerting), on
    ``meter``, and what each sheds on ``shed``, the OTLP intake's included (its own
    instruments come with it: ``observe_otlp``)."""
    observe_tap(meter, tap, active_streams)
    observe_health(meter, health)

    def relevance_stats() -> RelevanceStats | None:
        stage = relevance()
        return stage.stats if stage is not None else None

    observe_relevance(meter, relevance_stats, cache)
    observe_alerting(meter, alerting.stats if alerting is not None else lambda: None)
    shed.add("tap", lambda: tap.chunks_dropped)
    # Streams whose end found the tap's budget of ends full: no record was built.
    shed.add("records", lambda: tap.records_shed)
    shed.add("relevance", lambda: _field(relevance_stats(), lambda stats: stats.dropped) or 0)
    # Samples the evaluator never saw: its buffer was full, or a rule held its maximum of
    # groups.
    shed.add("alerts", lambda: _alerts_shed(alerting))
    # Spans received over OTLP (and forwarded) that the GenAI mapping never saw.
    shed.add(
        "otlp",
        lambda: _field(intake(), lambda part: sum(part.stats.receiver.shed.values())) or 0,
    )


def metric_families() -> list[Family]:
    """Every metric family the sidecar can export, from the same registrations as a running
    agent's (its instrument table and each stage's ``observe_*``), the optional stages'
    included; nothing runs and no value is read. The manual's metrics reference is this."""
    from semhealth.agent.otlp.metrics import observe_otlp
    from semhealth.agent.shadow.live import ShadowStats
    from semhealth.agent.shadow.metrics import observe_shadow

    meter = CatalogueMeter()
    Instruments(meter)
    observe_telemetry(meter, dict, lambda: 0, lambda: 0)
    observe_stages(
        meter,
        Shed(meter),
        tap=TapStats(),
        active_streams=lambda: 0,
        health=Health(),
        relevance=lambda: None,
        cache=lambda: None,
        intake=lambda: None,
        alerting=None,
    )
    observe_otlp(meter, lambda: None)
    observe_shadow(meter, ShadowStats())
    observe_recording(meter, RecordingStats())
    observe_evaluation(meter, EvaluationStats)
    observe_auth_failures(meter, lambda: 0)
    families = dict(meter.families)
    del families[FLUSH_INSTRUMENT]  # reports nothing: its callback hands held measurements over
    for spec in SPECS:  # their labels are the allow-list each instrument's View enforces
        families[spec.name] = replace(families[spec.name], labels=tuple(spec.attributes))
    return sorted(families.values(), key=lambda family: family.prometheus_name)


def _field(part: _Part | None, read: Callable[[_Part], _Value]) -> _Value | None:
    """``read(part)``, or None while the part is off."""
    return read(part) if part is not None else None


def _alerts_shed(alerting: AlertingStage | None) -> int:
    if alerting is None:
        return 0
    stats = alerting.stats()
    return stats.samples_shed + stats.evaluator.groups_dropped


def _cache_stats(batchers: tuple[MicroBatcher, ...]) -> CacheStats | None:
    """Hits and misses over the batchers' caches, each counted once (encoders share one)."""
    caches = {id(batcher.cache): batcher.cache for batcher in batchers}
    if not caches:
        return None
    from semhealth.embeddings import CacheStats  # loaded with the scorer already

    stats = [cache.stats() for cache in caches.values()]
    return CacheStats(
        entries=sum(s.entries for s in stats),
        max_entries=sum(s.max_entries for s in stats),
        hits=sum(s.hits for s in stats),
        misses=sum(s.misses for s in stats),
    )


class Agent:
    """The sidecar's planes in one process (tests, the demo, embedding), or, with
    ``Settings.tap_socket``, the analysis process that forwarders feed.

    Either way: admin listener, tap, relevance scoring, alerting and telemetry.
    """

    def __init__(self, config: Config, settings: Settings | None = None) -> None:
        self._config = config
        self._settings = settings or Settings()
        stats = TapStats()
        self.relevance: RelevanceStage | None = None  # set by start() when scoring runs
        # Set instead when scoring cannot run for a reason that is counted (see Unscored).
        self._unscored: Unscored | None = None
        self._scoring: AsyncExitStack | None = None  # closes the batcher, then the backend
        self._batchers: tuple[MicroBatcher, ...] = ()  # their caches feed the cache counters
        self.health = Health(self._settings.on_background_failure)
        evaluation = evaluation_settings(config)
        # gen_ai.evaluation.result events on traced records' spans; None: off.
        self.evaluation = EvaluationEmitter(evaluation) if evaluation is not None else None
        alerting = self.alerting = (
            AlertingStage(alerting_settings(config), on_task_failure=self.health.reporter("alerts"))
            if config.alerts.enabled
            else None
        )
        self.telemetry = Telemetry(
            self._telemetry_settings(),
            consume_sample=alerting.observe if alerting is not None else None,
        )
        self._observe(stats, alerting)
        self._consumers = (self.telemetry.recorder.consume_record, *self._settings.consumers)
        record = self._settings.record
        self.recording = (
            None
            if record is None
            else Recording(
                record, max_exchange_bytes=config.collectors.limits.max_response_bytes + 1
            )
        )
        if self.recording is not None:
            observe_recording(self.telemetry.meter, self.recording.stats)
        collectors = attach_contracts(config.collectors)
        self.shadow = self._build_shadow(collectors)
        self.tap = Tap(
            collectors,
            self._consume_record,
            stats=stats,
            observe_analysis=self.telemetry.observe_analysis,
            on_task_failure=self.health.reporter("tap"),
            tee=self.recording,
            on_open=self.shadow.on_open if self.shadow is not None else None,
        )
        in_process = self._settings.tap_socket is None
        # In one process the relay counts the requests it rejects straight into the tap's
        # stats; forwarders report theirs over the wire.
        relay_stats = RelayStats(rejected=stats.requests_rejected)
        listen = self._settings.listen or listen_settings(config)
        # Without an upstream (an OTLP receiver alone) there is nothing to proxy.
        proxied = in_process and config.upstream.url is not None
        self.proxy = (
            Relay(
                upstream_settings(config, self._shadow_settings()),
                self.tap,
                listen=listen,
                stats=relay_stats,
            )
            if proxied
            else None
        )
        self.intake = self._build_intake(collectors)
        # Loaded now: a bad web config stops start-up before anything listens.
        self.admin_gate = AdminGate(self._settings.admin)
        if self._settings.admin_socket is None:  # else the front counts and exports these
            observe_auth_failures(self.telemetry.meter, lambda: self.admin_gate.failures)
        self.receiver = None if in_process else TapReceiver(self.tap)
        self._components = Components()  # shutdown() before start() stops nothing
        self._admin_runner: web.BaseRunner | None = None
        self._ready = False
        self.proxy_address: tuple[str, int] | None = None
        self.admin_address: tuple[str, int] | None = None

    def _observe(self, stats: TapStats, alerting: AlertingStage | None) -> None:
        """Each stage's instruments on the one meter, and what each sheds: zero while a
        stage is off, so no series vanishes."""
        observe_stages(
            self.telemetry.meter,
            self.telemetry.shed,
            tap=stats,
            active_streams=self._active_streams,
            health=self.health,
            relevance=lambda: self.relevance or self._unscored,
            cache=lambda: _cache_stats(self._batchers),
            intake=lambda: self.intake,
            alerting=alerting,
        )

    def _shadow_settings(self) -> ShadowSettings | None:
        """The code's settings, else the configuration's ``shadow:`` block, else off."""
        return self._settings.shadow or self._config.shadow

    def _telemetry_settings(self) -> TelemetrySettings:
        settings = self._settings.telemetry or telemetry_settings(self._config)
        if self._shadow_settings() is None or settings.recorder.variant is not None:
            return settings
        # Shadowing: what the client got is variant="primary", beside the candidate's "shadow"
        # (a configured variant, a canary's say, stays the primary's).
        return replace(settings, recorder=replace(settings.recorder, variant="primary"))

    def _build_intake(self, collectors: Any) -> Intake | None:
        """The OTLP receiver, if configured, and its instruments on the agent's meter: its
        records join the proxy's, through the same consumers."""
        receiver = self._config.otlp_receiver
        if not receiver.enabled:
            return None
        from semhealth.agent.otlp.intake import Intake, intake_settings
        from semhealth.agent.otlp.metrics import observe_otlp

        intake = Intake(
            intake_settings(receiver),
            self._consume_record,
            collectors=collectors,
            on_task_failure=self.health.reporter("otlp"),
        )
        observe_otlp(self.telemetry.meter, lambda: intake.stats)
        return intake

    def _build_shadow(self, collectors: Any) -> Shadow | None:
        """Live shadowing, its metrics on the agent's meter, and a recorder that writes the
        candidate's own records with ``variant="shadow"`` (never fed to the alerts)."""
        settings = self._shadow_settings()
        if settings is None:
            return None
        from semhealth.agent.shadow.live import Shadow
        from semhealth.agent.shadow.metrics import PairMetrics, observe_shadow

        recorder = replace(self._telemetry_settings().recorder, variant="shadow")
        shadow_recorder = Recorder(self.telemetry.instruments, recorder)
        shadow = Shadow(
            settings,
            collectors,
            scorer=lambda: self.relevance.scorer if self.relevance is not None else None,
            record_shadow=shadow_recorder.consume_record,
            record_shadow_scores=shadow_recorder.record_relevance,
            observe_pair=PairMetrics(self.telemetry.instruments).observe,
        )
        observe_shadow(self.telemetry.meter, shadow.stats)
        return shadow

    def _active_streams(self) -> int:
        if self.proxy is not None:
            return self.proxy.active_streams
        return self.receiver.active_streams() if self.receiver is not None else 0

    def _consume_record(self, record: StreamRecord) -> None:
        for consume in self._consumers:
            consume(record)

    async def _start_relevance(self) -> None:
        """Load the encoder (off the loop) and put the relevance stage after the recorder."""
        relevance = self._config.relevance
        plan = plan_relevance(relevance)
        if plan.embeddings is None:
            if relevance.enabled == "auto":
                log.info("relevance scoring is off: %s", plan.off)
            return
        if plan.fallback is not None:
            log.info("relevance: %s", plan.fallback)
        from semhealth.embeddings import CalibrationError, open_scorer

        names = ", ".join(f"'{encoder.name}'" for encoder in plan.encoders)
        stack = AsyncExitStack()
        try:
            scorer = await stack.enter_async_context(
                open_scorer(
                    plan.embeddings,
                    calibration_path=plan.calibration,
                    backends=used(plan, self._settings.loaded_encoders),
                    on_task_failure=self.health.reporter("relevance"),
                )
            )
        except (EmbeddingError, ValueError) as exc:
            await stack.aclose()
            if isinstance(exc, EncoderNotServed) and relevance.enabled == "auto":
                self._unscored = Unscored(ENCODER_NOT_SERVED)
                log.warning(
                    "relevance scoring is off: this sidecar asks the scorer at %s for %s; "
                    "it serves: %s. Set relevance.profile to the scorer's, or serve these "
                    "encoders there; streams are counted in "
                    'semhealth_relevance_skipped_total{reason="%s"}',
                    exc.target,
                    ", ".join(encoder.name for encoder in plan.encoders),
                    ", ".join(exc.served) or "nothing",
                    ENCODER_NOT_SERVED,
                )
                return
            if relevance.enabled is True or isinstance(exc, CalibrationError):
                raise RelevanceStartError(
                    f"relevance scoring could not start encoder {names}: {exc}"
                ) from exc
            log.info(
                "relevance scoring is off: encoder %s could not start (%s); "
                "fix it and set relevance.enabled: true, or set it to false",
                names,
                exc,
            )
            return
        self._scoring = stack
        self._batchers = scorer.batchers()
        self.relevance = stage = RelevanceStage(
            scorer,
            RelevanceSettings(
                sample_rate=relevance.sample_rate,
                max_in_flight=relevance.max_in_flight,
                cpu_budget=relevance.cpu_budget,
            ),
            self.telemetry.recorder.record_relevance,
        )
        if self.evaluation is not None:
            # Started before this stage: its relevance events follow each record's scores.
            stage.also_record(self.evaluation.record_relevance)
        stage.start()
        log.info("relevance scoring on: encoder %s", names)

    async def _stop_relevance(self, deadline: float) -> None:
        """Stop the stage (scores in flight finish by the deadline, less a moment to close
        the scorer), then the scorer."""
        if self.relevance is not None:
            await self.relevance.shutdown(seconds_left(deadline - RESERVE_S))
        scoring, self._scoring = self._scoring, None
        if scoring is not None:
            await scoring.aclose()

    async def _start_evaluation(self) -> None:
        """Evaluation events: a record's validity when it is built, its relevance when its
        scores arrive."""
        assert self.evaluation is not None
        self.evaluation.start()
        observe_evaluation(self.telemetry.meter, self.evaluation.snapshot)

    async def _chain_consumers(self) -> None:
        """Every record, in this order: the recorder, relevance, the code's own consumers,
        evaluation events (after every other consumer saw the record), and last shadowing
        (a primary record joins its shadow after all the rest)."""
        chain: list[ConsumeRecord] = [self.telemetry.recorder.consume_record]
        if self.relevance is not None:
            chain.append(self.relevance.consume_record)
        elif self._unscored is not None:
            chain.append(self._unscored.consume_record)
        chain += self._settings.consumers
        if self.evaluation is not None:
            chain.append(self.evaluation.consume_record)
        if self.shadow is not None:
            chain.append(self.shadow.consume_record)
        self._consumers = tuple(chain)

    async def reload_alerts(self, rules: Sequence[Rule]) -> None:
        """Evaluate ``rules`` from now on (``Alerts.load_rules()`` of a configuration loaded
        again); nothing else is reloaded."""
        if self.alerting is None:
            raise RuntimeError("alerts were off at start-up; restart to turn them on")
        await self.alerting.reload(rules)

    @property
    def proxy_url(self) -> str:
        assert self.proxy_address is not None, "agent not started"
        return _url(self.proxy_address)

    @property
    def admin_url(self) -> str:
        assert self.admin_address is not None, "agent not started"
        return _url(self.admin_address, self.admin_gate.scheme)

    def ready(self) -> bool:
        return self._ready and not self.health.failed

    async def start(self) -> None:
        """Start every part, downstream first: telemetry and the admin port, then what
        consumes records (alerting, evaluation, relevance, recording, shadowing), the tap,
        and last what lets traffic in (the tap receiver, OTLP intake, the proxy listener)."""
        self._components = parts = Components()
        parts.add("telemetry", Part(self._start_telemetry, self._stop_telemetry))
        parts.add("admin listener", Part(self._start_admin, self._stop_admin))
        if self.alerting is not None:
            parts.add("alerting", Part(self._start_alerting, _stop_by(self.alerting.shutdown)))
        if self.evaluation is not None:
            parts.add(
                "evaluation", Part(self._start_evaluation, _stop_by(self.evaluation.shutdown))
            )
        parts.add("relevance", Part(self._start_relevance, self._stop_relevance))
        if self.recording is not None:
            parts.add("recording", Part(self._start_recording, self._stop_recording))
        if self.shadow is not None:
            parts.add("shadow", Part(self.shadow.start, _stop_by(self.shadow.shutdown)))
        parts.add("consumers", Part(self._chain_consumers, _nothing))
        parts.add("tap", Part(self.tap.start, _stop_by(self.tap.shutdown)))
        if self.receiver is not None:
            parts.add("tap receiver", Part(self._start_receiver, _stop(self.receiver.shutdown)))
        if self.intake is not None:
            parts.add("otlp receiver", Part(self._start_intake, _stop_by(self.intake.shutdown)))
        if self.proxy is not None:
            parts.add("proxy listener", Part(self._start_proxy, _stop_by(self.proxy.shutdown)))
        await parts.start(self._settings.shutdown_timeout_s)
        self._ready = True
        if self.proxy is not None:
            log.info(
                "semhealth listening: proxy %s -> upstream %s, admin %s",
                self.proxy_url,
                self._config.upstream.url,
                self.admin_url,
            )

    async def _start_telemetry(self) -> None:
        self.telemetry.start()

    async def _stop_telemetry(self, deadline: float) -> None:
        # The final OTLP export blocks: off the loop, within the deadline.
        await asyncio.to_thread(self.telemetry.shutdown, seconds_left(deadline))

    async def _start_admin(self) -> None:
        admin = build_admin_app(
            ready=self.ready,
            render_metrics=self.telemetry.render_prometheus,
            render_alerts=self.alerting.status_json if self.alerting is not None else None,
            render_shadow=self.shadow.render_json if self.shadow is not None else None,
            gate=self.admin_gate,
        )
        self._admin_runner = web.AppRunner(
            admin, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        self.admin_address = await _listen(
            self._admin_runner,
            self._config.listen.admin,
            self._settings.admin_socket,
            self.admin_gate,
        )

    async def _stop_admin(self, _deadline: float) -> None:
        admin_runner, self._admin_runner = self._admin_runner, None
        if admin_runner is not None:
            await admin_runner.cleanup()

    async def _start_alerting(self) -> None:
        assert self.alerting is not None
        alerts = self._config.alerts
        base = alerts.external_url or self.admin_url
        if alerts.external_url is None and alerts.alertmanager.urls:
            log.warning(
                "alerts link to %s/alerts, which people may not reach: "
                "set alerts.external_url to the admin address as seen from outside",
                base,
            )
        await self.alerting.start(generator_url=base.rstrip("/") + "/alerts")

    async def _start_recording(self) -> None:
        assert self.recording is not None
        self.recording.start()

    async def _stop_recording(self, deadline: float) -> None:
        assert self.recording is not None
        # Its last exchanges are in the writer's queue: the writer thread drains them.
        await asyncio.to_thread(self.recording.close, seconds_left(deadline))

    async def _start_receiver(self) -> None:
        assert self.receiver is not None and self._settings.tap_socket is not None
        await self.receiver.start(self._settings.tap_socket)

    async def _start_intake(self) -> None:
        assert self.intake is not None
        await self.intake.start()
        self._log_receiver()

    async def _start_proxy(self) -> None:
        assert self.proxy is not None
        listen = self._config.listen.proxy
        self.proxy_address = await self.proxy.start(listen.host, listen.port)

    def _log_receiver(self) -> None:
        assert self.intake is not None
        receiver = self.intake.receiver
        listening = [
            f"{name} {_url(address)}"
            for name, address in (("gRPC", receiver.grpc_address), ("HTTP", receiver.http_address))
            if address is not None
        ]
        forward = self._config.otlp_receiver.forward.endpoint
        log.info(
            "semhealth OTLP receiver listening: %s; forwarding to %s",
            ", ".join(listening),
            forward or "nowhere (otlp_receiver.forward.endpoint is not set)",
        )

    async def shutdown(self) -> None:
        """Stop upstream first on one deadline (``Settings.shutdown_timeout_s``): intake
        stops, open exchanges finish, analysis flushes, the last alerts and metrics go out.
        Safe without ``start`` and safe twice."""
        self._ready = False
        try:
            await self._components.shutdown(self._settings.shutdown_timeout_s)
        finally:
            self.admin_gate.close()  # built with the agent (its web config is read then)


async def _listen(
    runner: web.BaseRunner, address: Address, unix_path: str | None, gate: AdminGate
) -> tuple[str, int]:
    await runner.setup()
    if unix_path is not None:
        await web.UnixSite(runner, unix_path).start()
        return address.host, address.port  # the forwarder's admin front listens there
    return await start_site(runner, address.host, address.port, gate)


def _url(address: tuple[str, int], scheme: str = "http") -> str:
    host, port = address
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
