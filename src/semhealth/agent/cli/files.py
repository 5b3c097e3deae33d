"""Where a command reads and writes: a path, or ``-`` for standard input and output."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import IO, Any


@contextlib.contextmanager
def input_lines(path: str) -> Iterator[Any]:
    if path == "-":
        yield sys.stdin
        return
    with open(path, "rb") as lines:
        yield lines


@contextlib.contextmanager
def output_file(path: str) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdout
        return
    with open(path, "w", encoding="utf-8") as out:
        yield out
