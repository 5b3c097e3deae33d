"""How two answers to the same request differ: token by token, as JSON, and in tool calls.

Pure functions over text and plain values; the pairing, the relevance agreement and the
metrics are elsewhere. Nothing here keeps or returns text: results are counts, ratios,
positions and JSON paths (built from the documents' keys and indexes, which are structure
the request's schema asked for, not free text).

Tokens come from a Unicode-aware default segmentation, words and punctuation apart and
CJK ideographs and kana one per token (the ``tokenizers`` library's pre-tokenizers: BERT's
whitespace and punctuation rule after an isolating split on CJK), or from a tokenizer file
the user names (a ``tokenizer.json``, read with ``tokenizers``), so that distances can be in
the candidate model's own tokens. Edit distance is rapidfuzz's Levenshtein over the token
sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from rapidfuzz.distance import Levenshtein
from tokenizers import Regex
from tokenizers.pre_tokenizers import BertPreTokenizer, Split
from tokenizers.pre_tokenizers import Sequence as PreTokenizers

from semhealth.agent.config.files import read_tokenizer

Segmenter = Callable[[str], Sequence[Any]]

# Han, hiragana and katakana are written without spaces: one token per character, as the
# issue asks ("CJK per character"); Hangul is written with spaces and stays in words.
_CJK = r"[\p{Han}\p{Hiragana}\p{Katakana}]"


def default_segmenter() -> Segmenter:
    """Words and punctuation apart, each CJK ideograph or kana its own token."""
    splitter = PreTokenizers([Split(Regex(_CJK), behavior="isolated"), BertPreTokenizer()])

    def segment(text: str) -> list[str]:
        return [token for token, _span in splitter.pre_tokenize_str(text)]

    return segment


def tokenizer_segmenter(path: str) -> Segmenter:
    """The token ids of a ``tokenizer.json`` (Hugging Face ``tokenizers`` format), without
    special tokens. Raises ``ValueError`` naming the file when it cannot be read (the
    configuration check reads it with the same ``read_tokenizer``)."""
    tokenizer = read_tokenizer(path)
    # Files made for a model's input often pad or truncate to its length: an answer is
    # compared whole, in its own number of tokens.
    tokenizer.no_padding()
    tokenizer.no_truncation()

    def segment(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    return segment


@dataclass(frozen=True, slots=True)
class TokenDiff:
    """``distance``: Levenshtein distance over tokens divided by the longer sequence's
    length (0 equal, 1 nothing in common). ``first_divergence``: the index of the first
    token that differs, None when the sequences are equal. ``length_ratio``: shadow tokens
    over primary tokens, None when the primary has none."""

    exact: bool
    distance: float
    first_divergence: int | None
    length_ratio: float | None
    primary_tokens: int
    shadow_tokens: int


def token_diff(primary: str, shadow: str, segment: Segmenter) -> TokenDiff:
    ours, theirs = segment(primary), segment(shadow)
    exact = list(ours) == list(theirs)
    return TokenDiff(
        exact=exact,
        distance=0.0 if exact else Levenshtein.normalized_distance(ours, theirs),
        first_divergence=None if exact else _first_divergence(ours, theirs),
        length_ratio=len(theirs) / len(ours) if ours else None,
        primary_tokens=len(ours),
        shadow_tokens=len(theirs),
    )


def _first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))  # one is a prefix of the other


# --------------------------------------------------------------------------- JSON

_MISSING = object()


@dataclass(frozen=True, slots=True)
class JSONDiff:
    """Both outputs as JSON documents. ``equal`` is None unless both parse. ``paths`` are
    the JSONPaths (``$.a[0].b``) where the documents differ, at most ``max_paths`` of them,
    ``more_paths`` counting the rest."""

    primary_valid: bool
    shadow_valid: bool
    equal: bool | None
    paths: tuple[str, ...] = ()
    more_paths: int = 0


def json_diff(primary: str, shadow: str, max_paths: int = 20) -> JSONDiff:
    ours, theirs = _parse(primary), _parse(shadow)
    if ours is _MISSING or theirs is _MISSING:
        return JSONDiff(ours is not _MISSING, theirs is not _MISSING, None)
    paths = list(_differences(ours, theirs, "$"))
    return JSONDiff(True, True, not paths, tuple(paths[:max_paths]), max(len(paths) - max_paths, 0))


def _parse(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _MISSING


def _differences(a: Any, b: Any, path: str) -> Iterator[str]:
    """Paths where two JSON values differ, shallowest first per branch. Values of different
    JSON types differ at their own path (1 and 1.0 are equal, as JSON numbers)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            child = _member(path, key)
            if key not in a or key not in b:
                yield child
            else:
                yield from _differences(a[key], b[key], child)
    elif isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            if index >= len(a) or index >= len(b):
                yield f"{path}[{index}]"
            else:
                yield from _differences(a[index], b[index], f"{path}[{index}]")
    elif _kind(a) != _kind(b) or a != b:
        yield path


def _member(path: str, key: str) -> str:
    """``$.name`` for an identifier key, ``$["odd key"]`` (a JSON string) for any other."""
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{orjson.dumps(key).decode()}]"


def _kind(value: Any) -> str:
    # bool is an int in Python and not a number in JSON.
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


# --------------------------------------------------------------------------- tool calls


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call as the record has it: the tool's name and its arguments' JSON text."""

    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolDiff:
    """``same_tools``: the same tool names in the same order. ``same_arguments``: each call's
    arguments equal as JSON (as text when either does not parse). ``argument_paths``: where
    the arguments differ, as ``<call index>:<JSONPath>``."""

    same_tools: bool
    same_arguments: bool
    primary_calls: int
    shadow_calls: int
    argument_paths: tuple[str, ...] = ()


def tool_diff(primary: Sequence[Call], shadow: Sequence[Call], max_paths: int = 20) -> ToolDiff:
    same_tools = [c.name for c in primary] == [c.name for c in shadow]
    paths: list[str] = []
    same_arguments = len(primary) == len(shadow)
    for index, (ours, theirs) in enumerate(zip(primary, shadow, strict=False)):
        found = json_diff(ours.arguments, theirs.arguments, max_paths)
        if found.equal is None:
            if ours.arguments != theirs.arguments:
                same_arguments = False
                paths.append(f"{index}:$")
        elif not found.equal:
            same_arguments = False
            paths.extend(f"{index}:{path}" for path in found.paths)
    return ToolDiff(same_tools, same_arguments, len(primary), len(shadow), tuple(paths[:max_paths]))
