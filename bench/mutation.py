"""Mutation testing of the alert evaluator, the collectors and the relay (the deep profile).

Runs mutmut 3 over each target module with the tests that own it, and prints per-module
figures (mutants, killed, survived, timeout, no tests, kill rate).

mutmut mutates in place, so each target gets its own scratch tree outside the repository:
``<workdir>/<target>/semhealth`` (``src/semhealth``) and ``tests/`` copied from this
checkout. mutmut puts its ``mutants/`` copy first on ``sys.path``, so the tests import the
mutated ``semhealth`` ahead of the editable install; the checkout is never touched.

Usage::

    python bench/mutation.py                       # every target
    python bench/mutation.py --target evaluator    # one (repeatable)
    python bench/mutation.py --show-survivors      # list each survivor's diff too

Kill rate = killed / (mutants - no tests): a mutant no selected test reaches is reported
separately, not counted as survived. Each target runs only the test files listed for it in
``TARGETS`` (the relay's: the byte-level relay tests and its connection limits, not the
whole proxy suite), so a survivor may still be killed by a test elsewhere; widen a selection
there to check. A whole run takes about 2 minutes per 400 mutants of the collectors and
evaluator and about an hour for the relay's 1,300 or so on 2 shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    """One module to mutate and the tests that own it."""

    name: str
    module: str
    tests: tuple[str, ...]


TARGETS = (
    Target(
        "evaluator",
        "semhealth/alerts/evaluator.py",
        (
            "tests/alerts/test_evaluator.py",
            "tests/alerts/test_window.py",
            "tests/alerts/test_evaluator_mutants.py",
        ),
    ),
    Target(
        "continuity",
        "semhealth/collectors/continuity.py",
        ("tests/collectors/test_continuity.py", "tests/collectors/test_mutants.py"),
    ),
    Target(
        "validity",
        "semhealth/collectors/validity.py",
        ("tests/collectors/test_validity.py", "tests/collectors/test_mutants.py"),
    ),
    Target(
        "relay",
        "semhealth/agent/dataplane/relay.py",
        (
            "tests/agent/test_relay.py",
            "tests/agent/test_proxy_promises.py",
            "tests/agent/test_relay_mutants.py",
            "tests/agent/test_relay_client.py",
            "tests/agent/test_relay_upstream.py",
            "tests/agent/test_relay_tap.py",
            "tests/agent/test_relay_lifecycle.py",
            "tests/agent/test_connection_limits.py",
        ),
    ),
)


@dataclass(frozen=True)
class Figures:
    """mutmut's counts for one target."""

    total: int
    killed: int
    survived: int
    timeout: int
    no_tests: int

    @property
    def kill_rate(self) -> float:
        reached = self.total - self.no_tests
        return self.killed / reached if reached else 0.0


def _pyproject(target: Target) -> str:
    """The scratch tree's pyproject: the repository's pytest options plus mutmut's."""
    tests = [t for t in target.tests if (REPO / t).exists()]
    return "\n".join(
        [
            "[tool.pytest.ini_options]",
            'asyncio_mode = "auto"',
            'asyncio_default_fixture_loop_scope = "function"',
            "timeout = 120",
            'addopts = "-ra --strict-markers"',
            'filterwarnings = ["error::pytest.PytestUnraisableExceptionWarning"]',
            "",
            "[tool.mutmut]",
            'source_paths = ["semhealth"]',
            f"only_mutate = [{json.dumps(target.module)}]",
            f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]',
            "",
        ]
    )


def _prepare(target: Target, workdir: Path) -> Path:
    """A fresh scratch tree for one target (the previous run's results are discarded)."""
    tree = workdir / target.name
    if tree.exists():
        shutil.rmtree(tree)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "src" / "semhealth", tree / "semhealth", ignore=ignore)
    shutil.copytree(REPO / "tests", tree / "tests", ignore=ignore)
    (tree / "pyproject.toml").write_text(_pyproject(target))
    return tree


def _mutmut(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mutmut", *args], cwd=tree, capture_output=True, text=True, check=False)


def _figures(tree: Path) -> Figures:
    _mutmut(tree, "export-cicd-stats")
    stats = json.loads((tree / "mutants" / "mutmut-cicd-stats.json").read_text())
    return Figures(
        total=stats["total"],
        killed=stats["killed"],
        survived=stats["survived"],
        timeout=stats["timeout"],
        no_tests=stats["no_tests"],
    )


def _survivors(tree: Path) -> list[str]:
    out = _mutmut(tree, "results").stdout
    return [line.split(":")[0].strip() for line in out.splitlines() if "survived" in line]


def run_target(target: Target, workdir: Path, children: int, show: bool) -> Figures:
    """Mutate one module, run its tests against every mutant, and return the counts."""
    tree = _prepare(target, workdir)
    done = _mutmut(tree, "run", "--max-children", str(children))
    if not (tree / "mutants" / "mutmut-stats.json").exists():
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"mutation: mutmut did not run for {target.name} (output above)")
    figures = _figures(tree)
    if show:
        for name in _survivors(tree):
            print(_mutmut(tree, "show", name).stdout)
    return figures


def _line(name: str, f: Figures) -> str:
    return (
        f"mutation: {name}: {f.total} mutants, {f.killed} killed, {f.survived} survived, "
        f"{f.timeout} timeout, {f.no_tests} no tests, kill rate {f.kill_rate:.1%}"
    )


def main() -> int:
    names = [t.name for t in TARGETS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", choices=names, help="default: all")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/semhealth-mutation"))
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--show-survivors", action="store_true")
    args = parser.parse_args()
    if shutil.which("mutmut") is None:
        raise SystemExit("mutation: mutmut 3 is not installed (pip install 'mutmut>=3.3,<4')")
    chosen = [t for t in TARGETS if args.target is None or t.name in args.target]
    for target in chosen:
        figures = run_target(target, args.workdir, args.max_children, args.show_survivors)
        print(_line(target.name, figures), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
