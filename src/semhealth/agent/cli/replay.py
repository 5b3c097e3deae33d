"""``semhealth replay FILE...`` and ``semhealth run --record FILE``: their flags and the
replay command's main. Light to import: ``semhealth run`` builds its parser from here, so
the replay pipeline (and the encoder it may load) is imported only when replay runs.

Exit status of ``replay``: 0 done; 1 no record could be replayed; 2 usage or configuration
errors (a file that is not there, a bad ``--config``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from semhealth.agent.replay.settings import DEFAULT_KEEP, DEFAULT_MAX_BYTES, RecordSettings

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def byte_size(text: str) -> int:
    """``104857600``, ``100M``, ``100MiB``, ``1G``: bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(?:i?b)?\s*", text.lower())
    if match is None or int(match.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 104857600, 100MiB, 1G)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _keep(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of files (0 or more)")
    return int(text)


def add_record_flags(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--record",
        metavar="FILE",
        help="write every analysed exchange to FILE (JSONL, the format semhealth replay "
        "reads). Opt-in: the file HOLDS PROMPT AND RESPONSE TEXT; it is created mode 0600",
    )
    run.add_argument(
        "--record-max-bytes",
        type=byte_size,
        default=DEFAULT_MAX_BYTES,
        metavar="SIZE",
        help="rotate FILE past this size (default 100MiB; suffixes K, M, G)",
    )
    run.add_argument(
        "--record-keep",
        type=_keep,
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"rotated files kept, FILE.1 .. FILE.N (default {DEFAULT_KEEP})",
    )


def record_settings(args: argparse.Namespace) -> RecordSettings | None:
    """``--record``'s settings; None without the flag."""
    path = getattr(args, "record", None)
    if not path:
        return None
    return RecordSettings(path=path, max_bytes=args.record_max_bytes, keep=args.record_keep)


def check_record_file(args: argparse.Namespace) -> None:
    """Open (create, 0600) the ``--record`` file now, so a path that cannot be written stops
    ``semhealth run`` at start-up (``OSError``) instead of failing in the analysis process."""
    settings = record_settings(args)
    if settings is not None:
        fd = os.open(settings.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.close(fd)


def add_parser(commands: Any) -> None:
    replay = commands.add_parser(
        "replay",
        help="score recorded traffic offline (recordings, HAR, OTLP JSON) and evaluate the "
        "alert rules over it",
        description="Run recorded traffic through the sidecar's pipeline: --record files "
        "(JSONL), HAR 1.2 captures and OTLP JSON files (the Collector's file exporter). "
        "Writes per-record results (JSONL, no text), a summary table on stdout and, with "
        "--report, an HTML report; says which alerts would have fired, and when.",
    )
    replay.add_argument("files", nargs="+", metavar="FILE", help="input files")
    replay.add_argument(
        "-o", "--output", metavar="OUT", help="results JSONL, one line per record (- for stdout)"
    )
    replay.add_argument("--report", metavar="HTML", help="write a self-contained HTML report")
    replay.add_argument("--config", metavar="FILE", help="YAML configuration (routes, rules...)")
    replay.add_argument(
        "--otlp-push",
        metavar="ENDPOINT",
        help="push the resulting metrics once to this OTLP endpoint (gRPC, or OTLP/HTTP when "
        "it ends in /v1/metrics): a backfill",
    )
    replay.add_argument(
        "--no-relevance", action="store_true", help="do not score relevance (no model loads)"
    )


def main(args: argparse.Namespace) -> int:
    """``semhealth replay``; configuration errors are raised as ``ConfigError`` (exit 2)."""
    missing = [path for path in args.files if not os.path.isfile(path)]
    if missing:
        for path in missing:
            print(f"semhealth replay: {path}: no such file", file=sys.stderr)
        return 2
    from semhealth.agent.replay.main import load_replay_config, replay_main
    from semhealth.agent.runtime import run_async, setup_logging

    config = load_replay_config(args.config)
    setup_logging("warning")
    return run_async(replay_main(args, config))
