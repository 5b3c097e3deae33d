"""The proxy fuzzer, standalone: seeded raw cases through one ``semhealth run``.

Each seed makes one case (``tests/fuzz/proxy_cases.py``): a raw client request, valid or
hostile, and the raw response a socket-level upstream writes to it, split anywhere, maybe
cut off or badly framed. The case goes straight to the upstream and through the sidecar;
the client's bytes must be the same (or differ only as the case's ``Expect`` says), no case
may hang, the sidecar must stay up and ready, and no canary from a body or header may reach
its logs. Every failure prints its seed and the command that reruns it alone.

    python bench/fuzz_proxy.py                       # 1,000 cases from seed 0 (the CI run)
    nice -n 19 python bench/fuzz_proxy.py --cases 10000      # the deep run
    python bench/fuzz_proxy.py --seed 4711 --cases 1         # rerun one failure

The last line reads ``fuzz_proxy: <cases> cases from seed <seed>, <failures> failures``;
the exit status is 1 when there were failures.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

# Run from a checkout: the harness lives with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzz.proxy_harness import run_seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--cases", type=int, default=1000, help="number of cases (default 1000)")
    parser.add_argument("--concurrency", type=int, default=8, help="cases in flight (default 8)")
    args = parser.parse_args()
    started = time.monotonic()
    result = asyncio.run(
        run_seeds(range(args.seed, args.seed + args.cases), concurrency=args.concurrency)
    )
    for failure in result.failures:
        print(f"FAIL {failure}")
    spent = time.monotonic() - started
    for answer, count in sorted(result.answers.items()):
        print(f"  {count:5d}  {answer}")
    print(f"sidecar log: {result.log_bytes} bytes at debug level, no canary in it")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(result.by_expect.items()))
    print(f"cases by expectation: {kinds}; {spent:.1f} s")
    print(
        f"fuzz_proxy: {result.cases} cases from seed {args.seed}, {len(result.failures)} failures"
    )
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
