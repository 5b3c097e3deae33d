"""``semhealth diff``: compare a candidate upstream with recorded traffic, or two recordings of
the same requests, and print the per-route comparison with its verdict.

    semhealth diff --candidate http://candidate:8000/v1 traffic.jsonl
    semhealth diff primary.jsonl candidate.jsonl

Exit status: 0 when every route with a verdict passes, 1 when one fails, 2 on usage errors
(missing files, a bad configuration or tokenizer file).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any

# The parser is built in every process, the forwarding one included, which must not load
# analysis dependencies: the comparison's modules are imported when ``diff`` runs.
if TYPE_CHECKING:
    from semhealth.agent.config import Tolerances
    from semhealth.agent.shadow.offline import Compared


def add_parser(commands: Any) -> None:
    diff = commands.add_parser(
        "diff",
        help="compare a candidate upstream with recorded traffic, or two recordings",
        description="Send recorded requests (--record files or HAR) to a candidate upstream "
        "and compare its answers with the recorded ones, or compare two recordings of the "
        "same requests: tokens, JSON, tool calls, meaning and timing, per route, with a "
        "verdict against the tolerances. Prints no text from the traffic.",
    )
    diff.add_argument(
        "files", nargs="+", metavar="FILE", help="recording(s); two with no --candidate"
    )
    diff.add_argument("--candidate", metavar="URL", help="base URL of the candidate upstream")
    diff.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="a header sent to the candidate (repeatable), e.g. an Authorization the "
        "recording does not keep",
    )
    diff.add_argument("--rewrite-model", metavar="MODEL", help="send this model name instead")
    diff.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    diff.add_argument("--tokenizer", metavar="FILE", help="count tokens with this tokenizer.json")
    diff.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration: routes, relevance and the verdict's shadow.tolerances",
    )
    diff.add_argument("--json", metavar="OUT", help="also write the comparison as JSON")
    diff.add_argument("--no-relevance", action="store_true", help="no semantic agreement")


def _headers(items: list[str]) -> dict[str, str] | str:
    headers = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            return f"--header {item!r}: expected NAME:VALUE"
        headers[name.strip()] = value.strip()
    return headers


def _usage(args: argparse.Namespace) -> str | None:
    missing = [path for path in args.files if not os.path.isfile(path)]
    if missing:
        return f"{missing[0]}: no such file"
    if args.candidate is None and len(args.files) != 2:
        return "give two recordings to compare, or --candidate URL and the recording(s)"
    if args.concurrency < 1:
        return "--concurrency must be at least 1"
    return None


def main(args: argparse.Namespace) -> int:
    problem = _usage(args)
    headers = _headers(args.header)
    if isinstance(headers, str):
        problem = problem or headers
    from semhealth.agent.shadow.diff import Segmenter, default_segmenter, tokenizer_segmenter

    segment: Segmenter = default_segmenter()
    if problem is None and args.tokenizer is not None:
        try:
            segment = tokenizer_segmenter(args.tokenizer)
        except ValueError as exc:
            problem = str(exc)
    if problem is not None or isinstance(headers, str):
        print(f"semhealth diff: {problem}", file=sys.stderr)
        return 2
    from tqdm import tqdm

    from semhealth.agent.replay.main import load_replay_config
    from semhealth.agent.runtime import run_async, setup_logging
    from semhealth.agent.shadow.offline import Candidate, diff_candidate, diff_recordings

    config = load_replay_config(args.config)
    if args.no_relevance:
        config = dataclasses.replace(
            config, relevance=dataclasses.replace(config.relevance, enabled=False)
        )
    setup_logging("warning")
    bar = tqdm(desc="pairs", unit="pair", file=sys.stderr, disable=not sys.stderr.isatty())

    async def run() -> int:
        if args.candidate is not None:
            candidate = Candidate(
                url=args.candidate,
                headers=headers,
                rewrite_model=args.rewrite_model,
                concurrency=args.concurrency,
            )
            compared = await diff_candidate(
                args.files, candidate, config, segment, progress=bar.update
            )
        else:
            first, second = args.files
            compared = await diff_recordings(first, second, config, segment, progress=bar.update)
        bar.close()
        return _report(args, compared, config.shadow.tolerances if config.shadow else None)

    return run_async(run())


def _all_not_found(compared: Compared) -> bool:
    return bool(compared.pairs) and all(pair.shadow.status == 404 for pair in compared.pairs)


def _report(args: argparse.Namespace, compared: Compared, tolerances: Tolerances | None) -> int:
    """``tolerances``: the configuration's ``shadow.tolerances``; None: the defaults."""
    import orjson

    from semhealth.agent.config import Tolerances
    from semhealth.agent.shadow.summary import as_json, summarise, table

    for problem in compared.problems:
        print(
            f"semhealth diff: {problem.source_file}:{problem.line}: {problem.error}",
            file=sys.stderr,
        )
    if compared.unpaired:
        print(f"semhealth diff: {compared.unpaired} requests had no partner", file=sys.stderr)
    if compared.relevance_off is not None:
        print(f"semhealth diff: no semantic agreement: {compared.relevance_off}", file=sys.stderr)
    if args.candidate is not None and _all_not_found(compared):
        # Said before the table: a wrong base URL makes every row look like a broken model.
        print(
            f"semhealth diff: the candidate answered 404 to every request: is {args.candidate} "
            "the base URL its API is served under?"
        )
    tolerances = tolerances or Tolerances()
    summaries = summarise(compared.pairs, tolerances)
    print(table(summaries))
    if args.json is not None:
        with open(args.json, "wb") as out:
            out.write(orjson.dumps(as_json(summaries, tolerances), option=orjson.OPT_INDENT_2))
    if not compared.pairs:
        return 1
    return 1 if any(s.verdict.verdict == "fail" for s in summaries) else 0
