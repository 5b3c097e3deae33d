"""Write semhealth's Grafana dashboards: ``python3 grafana/generate.py [--check]``.

The dashboards are built in code (``semhealth_grafana``, with grafana-foundation-sdk) and the
JSON is committed twice: ``grafana/dashboards/`` to import by hand, and
``helm/semhealth/dashboards/`` for the chart's Grafana-sidecar ConfigMaps. ``--check`` writes
nothing and exits 1 when a committed file differs from what the code builds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as a script from anywhere, or imported by the tests
    sys.path.insert(0, str(HERE))

from semhealth_grafana import dashboards  # noqa: E402

REPO = HERE.parent
OUTPUTS = (HERE / "dashboards", REPO / "helm" / "semhealth" / "dashboards")


def stale(outputs: tuple[Path, ...] = OUTPUTS) -> list[Path]:
    """Committed files that differ from what the code builds (or are missing)."""
    built = dashboards()
    return [
        folder / name
        for folder in outputs
        for name, text in built.items()
        if not (folder / name).is_file() or (folder / name).read_text() != text
    ]


def write(outputs: tuple[Path, ...] = OUTPUTS) -> list[Path]:
    """Write every dashboard into every output folder; returns the files written."""
    written = []
    for folder in outputs:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in dashboards().items():
            path = folder / name
            path.write_text(text)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed JSON; write nothing"
    )
    args = parser.parse_args(argv)
    if args.check:
        differ = stale()
        for path in differ:
            print(f"out of date: {path.relative_to(REPO)}", file=sys.stderr)
        if differ:
            print("run: python3 grafana/generate.py", file=sys.stderr)
        return 1 if differ else 0
    for path in write():
        print(path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
