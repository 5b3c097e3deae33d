from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from semhealth.embeddings.backend import normalize_rows


def test_rows_are_scaled_to_unit_length() -> None:
    rows = normalize_rows(np.array([[3.0, 4.0], [0.0, 2.0]]))
    np.testing.assert_allclose(rows, [[0.6, 0.8], [0.0, 1.0]])


def test_an_all_zero_row_stays_zero() -> None:
    rows = normalize_rows(np.zeros((1, 3), dtype=np.float16))
    np.testing.assert_array_equal(rows, np.zeros((1, 3)))


def test_half_precision_rows_come_back_as_float32() -> None:
    assert normalize_rows(np.ones((2, 3), dtype=np.float16)).dtype == np.float32


@given(arrays(np.float32, (3, 8), elements=st.floats(-1e3, 1e3, width=32)))
def test_every_nonzero_row_has_unit_norm(vectors: np.ndarray) -> None:
    norms = np.linalg.norm(normalize_rows(vectors), axis=1)
    nonzero = np.linalg.norm(vectors.astype(np.float64), axis=1) > 1e-6
    np.testing.assert_allclose(norms[nonzero], 1.0, atol=1e-5)
