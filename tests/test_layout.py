"""The layering, enforced: the import-linter contracts in pyproject.toml, and no circle
between any two modules, counting every import (inside functions and under TYPE_CHECKING
too: a lazy import is still a dependency)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "src" / "semhealth" / "agent"


def test_the_import_contracts_are_kept() -> None:
    # The same check as CI's `lint-imports`, against pyproject.toml's contracts. In a process
    # of its own: import-linter's logging set-up would silence this session's loggers, and
    # the tests after it that read log lines.
    check = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(config_filename=%r, no_cache=True))"
    run = subprocess.run(
        [sys.executable, "-c", check % str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _circles(graph: grimp.ImportGraph) -> list[set[str]]:
    """Strongly connected sets of two or more modules (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(members)
    return found


def test_no_two_modules_import_each_other_even_through_others() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    graph = grimp.build_graph("semhealth", exclude_type_checking_imports=False, cache_dir=None)
    assert _circles(graph) == []


def test_the_agent_folder_shows_its_rooms_not_loose_modules() -> None:
    # The planes, the CLI and the configuration show from `ls`: a handful of modules at the
    # top (the lifecycle, the runtime, the tap wire, the relevance stage the analysis process
    # shares with replay and diff, errors, tasks), the rest in rooms.
    entries = sorted(p.name for p in AGENT.iterdir() if p.name != "__pycache__")
    modules = [name for name in entries if name.endswith(".py")]
    assert modules == [
        "__init__.py",
        "component.py",
        "errors.py",
        "relevance.py",
        "runtime.py",
        "tasks.py",
        "wire.py",
    ]
    assert {"admin", "analysis", "cli", "config", "dataplane", "demo", "telemetry"} <= set(entries)
