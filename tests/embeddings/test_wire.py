"""The scorer's wire format: round trips, and bad bytes that become values, never exceptions."""

from __future__ import annotations

import struct

import numpy as np
import orjson
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from semhealth.embeddings import _wire

# Strings UTF-8 can carry: no lone surrogates.
utf8_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
matrices = hnp.arrays(
    np.float32,
    st.tuples(st.integers(0, 6), st.integers(1, 8)),
    elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
)


@given(utf8_text, st.lists(utf8_text, max_size=8))
def test_an_embed_request_round_trips(encoder: str, texts: list[str]) -> None:
    request = _wire.EmbedRequest(encoder, tuple(texts))
    assert _wire.decode_embed_request(_wire.encode_embed_request(request)) == request


def test_a_lone_surrogate_is_replaced_not_raised() -> None:
    data = _wire.encode_embed_request(_wire.EmbedRequest("e", ("ok", "bad \ud800")))
    assert _wire.decode_embed_request(data) == _wire.EmbedRequest("e", ("ok", "bad ?"))


@given(matrices)
def test_vectors_round_trip_bit_for_bit(matrix: np.ndarray) -> None:
    decoded = _wire.decode_vectors(_wire.encode_vectors(matrix))
    assert isinstance(decoded, np.ndarray)
    assert decoded.dtype == np.float32
    assert decoded.shape == matrix.shape
    assert decoded.tobytes() == matrix.astype("<f4").tobytes()


def test_vectors_go_as_raw_little_endian_floats_after_a_header() -> None:
    data = _wire.encode_vectors(np.array([[1.0, -2.0]], dtype=np.float32))
    assert data == b"SHv1" + struct.pack("<II", 2, 1) + struct.pack("<2f", 1.0, -2.0)


@given(st.binary(max_size=64))
def test_any_bytes_decode_to_a_request_or_malformed(data: bytes) -> None:
    decoded = _wire.decode_embed_request(data)
    assert isinstance(decoded, _wire.EmbedRequest | _wire.Malformed)


@given(st.binary(max_size=64))
def test_any_bytes_decode_to_vectors_or_malformed(data: bytes) -> None:
    decoded = _wire.decode_vectors(data)
    assert isinstance(decoded, np.ndarray | _wire.Malformed)


@given(st.binary(max_size=64))
def test_any_bytes_decode_to_info_or_malformed(data: bytes) -> None:
    assert isinstance(_wire.decode_info(data), _wire.Info | _wire.Malformed)
    assert isinstance(_wire.decode_info_request(data), _wire.InfoRequest | _wire.Malformed)


def test_a_truncated_response_is_malformed_with_its_size() -> None:
    data = _wire.encode_vectors(np.ones((2, 4), dtype=np.float32))[:-1]
    decoded = _wire.decode_vectors(data)
    assert decoded == _wire.Malformed("response of 2 rows of width 4 should have 44 bytes", 43)


def test_a_response_without_the_magic_is_malformed() -> None:
    decoded = _wire.decode_vectors(b"XXXX" + struct.pack("<II", 0, 0))
    assert isinstance(decoded, _wire.Malformed)
    assert "magic" in decoded.reason


def test_a_request_whose_texts_are_not_strings_is_malformed() -> None:
    data = orjson.dumps({"encoder": "e", "texts": ["a", 1]})
    decoded = _wire.decode_embed_request(data)
    assert decoded == _wire.Malformed("'texts' is not a list of strings", len(data))


@given(utf8_text, utf8_text, st.integers(1, 10_000), utf8_text)
def test_info_round_trips(encoder: str, model: str, dim: int, device: str) -> None:
    info = _wire.Info(encoder, model, dim, device)
    assert _wire.decode_info(_wire.encode_info(info)) == info


def test_info_with_a_width_that_is_not_a_positive_integer_is_malformed() -> None:
    for dim in (0, True, 3.5, "384"):
        body = {"encoder": "e", "model": "m", "dim": dim, "device": "cpu"}
        assert isinstance(_wire.decode_info(orjson.dumps(body)), _wire.Malformed)


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_overload_figures_round_trip(requested: int, free: int, queue_size: int) -> None:
    value = _wire.encode_overload(requested, free, queue_size)
    assert _wire.decode_overload(value) == (requested, free, queue_size)


def test_overload_figures_that_do_not_parse_are_none() -> None:
    assert _wire.decode_overload("1/2") is None
    assert _wire.decode_overload("a/b/c") is None
