"""16-byte vector values on the simulator: numba-cuda's vector types (built, taken apart, refused where numba-cuda
refuses them) and ``flowdsl.mem.load_vector`` / ``store_vector`` and their relaxed forms, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
import flowdsl.sim as sim
from flowdsl import mem
from tests.vector_kernels import (CAST_EXPECTED, REFUSED, VECTOR_TYPES, built_from_halves, halves_reference, lanes_cast,
                                  lanes_reversed, random_array, reference, tuple_into_store_vector, wrong_vector_type)

pytestmark = pytest.mark.sim

N = 64  # elements: 16 vectors of 4-byte elements, 32 of 8-byte ones


def _run(kernel, src, *extra, poison=None):
    out = {}

    def main(comm):
        s = comm.alloc(src.size, src.dtype)
        s[:] = src
        d = comm.alloc(src.size, src.dtype)
        d[:] = poison if poison is not None else random_array(src.dtype, src.size, 99)  # poisoned
        kernel[2, 32](s, d, *extra)
        comm.synchronize()
        out["dst"] = np.array(d)

    sim.spawn(main, nranks=1)
    return out["dst"]


@pytest.mark.parametrize("relaxed", [False, True], ids=["plain", "relaxed"])
@pytest.mark.parametrize("dtype", list(VECTOR_TYPES), ids=[d.name for d in VECTOR_TYPES])
def test_vectors_load_and_store_whole(dtype, relaxed):
    src = random_array(dtype, N, 7)
    got = _run(lanes_reversed(dtype), src, relaxed)
    np.testing.assert_array_equal(got, reference(src))


def test_a_vector_is_built_from_smaller_ones_and_aliases():
    src = random_array(np.float32, N, 3)
    np.testing.assert_array_equal(_run(built_from_halves, src), halves_reference(src))


def test_lanes_convert_as_numbas_casts():
    got = {}

    def main(comm):
        out = comm.alloc(6, np.int64)
        lanes_cast[1, 1](out)
        comm.synchronize()
        got["out"] = np.array(out)

    sim.spawn(main, nranks=1)
    assert got["out"].tolist() == CAST_EXPECTED


@pytest.mark.parametrize("kernel, got", [(tuple_into_store_vector, "a tuple"), (wrong_vector_type, "int32x4")],
                         ids=["tuple", "int32x4"])
def test_store_vector_refuses_a_value_of_another_type_in_the_gpus_words(kernel, got):
    with pytest.raises(flowdsl.KernelTypingError) as caught:
        _run(kernel, random_array(np.float32, N, 1))
    assert mem.vector_refusal("store_vector", "float32", got) in str(caught.value)


@pytest.mark.parametrize("kernel, words", REFUSED, ids=[k.__name__ for k, _ in REFUSED])
def test_what_numba_cuda_refuses_of_a_vector_is_refused(kernel, words):
    def main(comm):
        out = comm.alloc(1, np.float32)
        kernel[1, 1](out)
        comm.synchronize()

    with pytest.raises(flowdsl.KernelTypingError) as caught:
        sim.spawn(main, nranks=1)
    assert words in str(caught.value)


def test_a_misaligned_vector_is_refused():
    @flowdsl.kernel
    def k(src, dst):
        mem.store_vector(dst[1:], 0, mem.load_vector(src, 0))

    with pytest.raises(sim.UsageError, match="not 16-byte aligned"):
        _run(k, random_array(np.float32, N, 2))
