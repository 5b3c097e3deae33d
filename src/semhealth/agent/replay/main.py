"""``semhealth replay``'s body, once its arguments are checked: configuration, the replay,
and what it prints and writes. Problems with the input go to stderr, one line each, naming
the file and line; the summary table goes to stdout (unless the results do)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import IO

from semhealth.agent.config import Config, ConfigError
from semhealth.agent.config.load import load as load_document
from semhealth.agent.replay.results import ReplayRun
from semhealth.agent.replay.run import Options, Outcome, replay
from semhealth.agent.replay.summary import summary_table, write_results

# The sections replay has no use for: a file written for a sidecar may leave them unset.
_NOT_READ = ("upstream", "listen", "dataplane")


def load_replay_config(path: str | None) -> Config:
    """The configuration as the sidecar loads it, minus what only a running proxy needs."""
    config, issues = load_document(path, os.environ, {})
    own = [issue for issue in issues if issue.path.split(".")[0].split("[")[0] not in _NOT_READ]
    if own:
        raise ConfigError(own)
    return config


async def replay_main(args: argparse.Namespace, config: Config) -> int:
    """Replay ``args.files`` under ``config`` (``load_replay_config``), then report."""
    options = Options(
        relevance=not args.no_relevance,
        otlp_push=args.otlp_push,
        progress=True,
    )
    return _report(args, await replay(args.files, config, options))


def _report(args: argparse.Namespace, outcome: Outcome) -> int:
    run = outcome.run
    for problem in run.problems:
        print(
            f"semhealth replay: {problem.source_file}:{problem.line}: {problem.error}",
            file=sys.stderr,
        )
    if outcome.relevance_off is not None:
        print(f"semhealth replay: relevance not scored: {outcome.relevance_off}", file=sys.stderr)
    if args.output:
        with _binary_output(args.output) as out:
            write_results(run.results, out)
    table = summary_table(run)
    # With results on stdout, the table moves to stderr so the JSONL stays parseable.
    print(table, end="", file=sys.stderr if args.output == "-" else sys.stdout)
    _say_alerts(run)
    if outcome.pushed is not None:
        verdict = "pushed to" if outcome.pushed else "could NOT be pushed to"
        print(f"semhealth replay: metrics {verdict} {args.otlp_push}", file=sys.stderr)
        if not outcome.pushed:
            return 1  # the backfill asked for did not happen
    if args.report and not _write_report(run, args.report):
        return 1
    if not run.results:
        print("semhealth replay: no record could be replayed", file=sys.stderr)
        return 1
    return 0


def _say_alerts(run: ReplayRun) -> None:
    fired = [alert for alert in run.alerts if alert.state == "firing"]
    print(
        f"semhealth replay: {len(run.results)} records, {len(run.problems)} input problems, "
        f"{len(fired)} alerts would have fired",
        file=sys.stderr,
    )


def _write_report(run: ReplayRun, path: str) -> bool:
    try:
        from semhealth.agent.replay.report import write_report
    except ImportError as exc:
        print(f"semhealth replay: --report is not available here ({exc})", file=sys.stderr)
        return False
    write_report(run, path)
    logging.getLogger("semhealth").info("report written to %s", path)
    return True


@contextlib.contextmanager
def _binary_output(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.flush()
        return
    with open(path, "wb") as out:
        yield out
