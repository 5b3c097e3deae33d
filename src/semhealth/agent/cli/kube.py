"""``semhealth inject`` (manifests in, manifests with the sidecar out) and ``semhealth
injector`` (the mutating admission webhook)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from semhealth.agent.config import Address
from semhealth.agent.runtime import serve_until_signal, setup_logging

log = logging.getLogger("semhealth")


def add_parser(commands: Any) -> None:
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


def inject(args: argparse.Namespace) -> int:
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


async def injector(args: argparse.Namespace) -> int:
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
        await serve_until_signal(None)
    finally:
        await injector.shutdown()
    return 0
