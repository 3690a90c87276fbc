"""16-byte vector values on the GPU: ``flowdsl.mem.load_vector`` / ``store_vector`` and their relaxed forms for every
element type they take, against NumPy (outputs poisoned first); the simulator runs the same kernels
(``tests/sim/test_vectors.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.vector_kernels import CAST_EXPECTED, VECTOR_TYPES, built_from_halves, halves_reference, lanes_cast, \
    lanes_reversed, random_array, reference

pytestmark = pytest.mark.gpu

N = 1 << 12


@pytest.mark.parametrize("relaxed", [False, True], ids=["plain", "relaxed"])
@pytest.mark.parametrize("dtype", list(VECTOR_TYPES), ids=[d.name for d in VECTOR_TYPES])
def test_vectors_load_and_store_whole(dtype, relaxed):
    import cupy

    src = random_array(dtype, N, 11)
    d_src, d_dst = cupy.asarray(src), cupy.asarray(random_array(dtype, N, 12))  # poisoned
    lanes = 16 // src.itemsize
    lanes_reversed(dtype)[(N // lanes + 127) // 128, 128](d_src, d_dst, relaxed)
    np.testing.assert_array_equal(cupy.asnumpy(d_dst), reference(src))


def test_a_vector_is_built_from_smaller_ones_and_aliases():
    import cupy

    src = random_array(np.float32, N, 13)
    d_src, d_dst = cupy.asarray(src), cupy.full(N, np.nan, np.float32)
    built_from_halves[N // 4 // 128, 128](d_src, d_dst)
    np.testing.assert_array_equal(cupy.asnumpy(d_dst), halves_reference(src))


def test_lanes_convert_as_the_simulator_converts_them():
    import cupy

    out = cupy.zeros(6, np.int64)
    lanes_cast[1, 1](out)
    assert cupy.asnumpy(out).tolist() == CAST_EXPECTED
