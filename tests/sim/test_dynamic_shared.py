"""Dynamic shared memory: ``cuda.shared.array(0, dtype)`` holds the launch's ``k[grid, block, stream, nbytes]``
bytes, every such array of a block starting at its first byte (as on the GPU); an index past them is an error
naming the array and the user's line; a launch asking for what CUDA refuses is refused on both paths alike."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, float32, int32

import flowdsl
from flowdsl.sim import IndexAccessError
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim


@flowdsl.kernel
def through_dynamic_shared(src, out, n):
    """Each thread stores its float into dynamic shared memory; the next thread reads it back as int32 bits,
    through a second dynamic array (the same bytes)."""
    floats = cuda.shared.array(0, float32)
    bits = cuda.shared.array(0, int32)
    t = cuda.threadIdx.x
    floats[t] = src[t]
    cuda.syncthreads()
    out[t] = bits[(t + 1) % n]


def run(threads, nbytes, n=None):
    src = np.random.default_rng(threads).standard_normal(threads).astype(np.float32)

    def main(comm):
        out = np.zeros(threads, np.int32)
        through_dynamic_shared[1, threads, None, nbytes](src, out, n or threads)
        comm.synchronize()
        return out
    return src, run_ranks(main, nranks=1)[0]


def test_dynamic_arrays_share_the_launchs_bytes():
    src, out = run(64, 64 * 4)
    np.testing.assert_array_equal(out, np.roll(src, -1).view(np.int32))


def test_an_index_past_the_launchs_bytes_names_the_array_and_the_line():
    with pytest.raises(IndexAccessError) as err:
        run(64, 32 * 4)
    msg = str(err.value)
    assert "dynamic shared array #0 of rank 0 block 0 (32 float32: the launch's 128 bytes of dynamic shared memory)" \
        in msg, msg
    assert "test_dynamic_shared.py:25 (through_dynamic_shared)" in msg, msg
    assert "launch with enough bytes: k[grid, block, stream, nbytes]" in msg, msg


def test_without_dynamic_bytes_the_array_is_empty():
    with pytest.raises(IndexAccessError) as err:
        run(32, 0)
    assert "(0 float32: the launch's 0 bytes of dynamic shared memory)" in str(err.value)


@pytest.mark.parametrize("nbytes,message", [
    (48 * 1024 + 4, "with 49156 bytes of dynamic shared memory: a launch takes at most 49152 (48 KiB) without "
                    "opting in to more. Use at most 49152 bytes"),
    (-1, "with -1 bytes of dynamic shared memory: give a non-negative int (k[grid, block, stream, nbytes])"),
    (1.5, "with 1.5 bytes of dynamic shared memory: give a non-negative int"),
])
def test_a_launch_cuda_refuses_is_refused_before_it(nbytes, message):
    # The check is made where the launch is configured, before the GPU or the simulator is chosen.
    with pytest.raises(flowdsl.UsageError) as err:
        through_dynamic_shared[1, 32, None, nbytes]
    assert f"Cannot launch through_dynamic_shared {message}" in str(err.value)
