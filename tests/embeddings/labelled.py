"""The project's three labelled relevance sets, as the relevance bench reads them.

``bench/relevance_profiles.py`` names them ``base``, ``hard`` and ``unseen``: 320 short pairs,
224 harder ones (near misses, 300-word contexts, mixed languages) and 144 pairs the
calibrations never saw (``data/README.md`` in each folder says how they were written).
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import orjson

_SHIPPED = importlib.resources.files("semhealth.embeddings") / "data"
_SETS = {
    "base": _SHIPPED / "relevance_pairs.jsonl",
    "hard": _SHIPPED / "hard_pairs.jsonl",
    "unseen": Path(__file__).parent / "data" / "unseen_pairs.jsonl",
}
SET_NAMES = tuple(_SETS)


@dataclass(frozen=True, slots=True)
class Pair:
    query: str
    context: str
    label: int
    lang: str


def labelled_pairs(name: str) -> list[Pair]:
    """Every pair of the set ``name`` (one of ``SET_NAMES``), in file order."""
    lines = _SETS[name].read_bytes().splitlines()
    rows = [orjson.loads(line) for line in lines if line.strip()]
    return [Pair(r["query"], r["context"], int(r["label"]), r["lang"]) for r in rows]
