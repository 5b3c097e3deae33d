"""``semhealth score`` and ``semhealth calibrate``: relevance over JSONL records, scored as the
sidecar scores traffic. They read only the ``relevance:`` section of the configuration and
import the embedding backends when they run."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semhealth.agent.cli.files import input_lines, output_file
from semhealth.agent.config import ConfigError, Relevance, load_relevance
from semhealth.agent.errors import ConfigIssue
from semhealth.agent.runtime import setup_logging

if TYPE_CHECKING:
    from semhealth.embeddings.config import Encoder


def add_parser(commands: Any) -> None:
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


async def score(args: argparse.Namespace) -> int:
    from semhealth.agent.relevance import plan_relevance
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
    with input_lines(args.file) as lines, output_file(args.output) as out:
        async with open_scorer(plan.embeddings, calibration_path=plan.calibration) as scorer:
            summary = await score_jsonl(lines, out, scorer, progress=True, total=total)
    print(
        f"semhealth score: {summary.written} of {summary.records} records scored, "
        f"{summary.errors} skipped",
        file=sys.stderr,
    )
    return 0 if summary.errors == 0 else 1


async def calibrate(args: argparse.Namespace) -> int:
    from semhealth.embeddings import calibrate_from_jsonl, open_scorer
    from semhealth.embeddings.calibration import identity_calibration

    relevance = load_relevance(args.config, os.environ)
    setup_logging("warning")
    encoder = _encoder(relevance, args.encoder)
    # Only the calibrated encoder, unrouted: its raw cosine is what is fitted.
    embeddings = dataclasses.replace(relevance.embeddings, encoder=encoder.name, route_cjk_to=None)
    async with open_scorer(embeddings, calibration=identity_calibration(encoder.model)) as scorer:
        with input_lines(args.file) as lines:
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
