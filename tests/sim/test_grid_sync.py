"""``cuda.cg.this_grid().sync()``: a barrier of every thread of the launch, on the simulator (all blocks run at
once, as a cooperative launch guarantees on GPUs) and compiled as numba-cuda compiles it (cudadevrt linked, the
kernel marked cooperative so that its launch is). The kernel is numba-cuda's own test's: each row of a matrix
reads the row above, written by other blocks before the grid's barrier."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim


@flowdsl.kernel
def sequential_rows(M):
    col = cuda.grid(1)
    g = cuda.cg.this_grid()
    rows, cols = M.shape
    for row in range(1, rows):
        M[row, col] = M[row - 1, cols - col - 1] + 1
        g.sync()


@flowdsl.kernel
def rows_without_sync(M):
    col = cuda.grid(1)  # no grid group: not cooperative, no cudadevrt (numba-cuda's rule too)
    rows, cols = M.shape
    for row in range(1, rows):
        M[row, col] = M[row - 1, cols - col - 1] + 1


def reference(shape):
    return np.tile(np.arange(shape[0]), (shape[1], 1)).T


def test_a_grid_sync_orders_every_block_of_the_launch():
    def main(comm):
        m = comm.alloc((8, 96), np.int32)
        m.set(np.zeros((8, 96), np.int32))
        sequential_rows[3, 32](m)  # three blocks: each row reads columns written by the others
        comm.synchronize()
        return m.get()
    np.testing.assert_array_equal(run_ranks(main, nranks=1)[0], reference((8, 96)))


def test_without_the_grid_sync_the_race_is_reported():
    def main(comm):
        m = comm.alloc((8, 96), np.int32)
        m.set(np.zeros((8, 96), np.int32))
        rows_without_sync[3, 32](m)
        comm.synchronize()
    with pytest.raises(flowdsl.sim.DataRaceError):
        run_ranks(main, nranks=1)


def test_overloads_inside_a_simulated_rank_are_the_simulators_and_ask_no_gpu():
    """numba-cuda's own test sizes its grid with ``overloads[sig].max_cooperative_grid_blocks``: on the simulator
    that is the simulator's answer (1, which every GPU holds), never a compile for a GPU's architecture (numba-cuda's
    simulator stands in a device of sm_52, which flowdsl's support library does not build for)."""
    from numba import types

    sig = (types.int32[:, ::1],)
    declared = flowdsl.kernel([sig])(sequential_rows.py_func)

    def main(comm):
        code = declared.overloads[sig]
        sizes = [code.max_cooperative_grid_blocks(b) for b in (256, (16, 16), (16, 4, 4), 1025)]
        m = comm.alloc((8, 32), np.int32)
        m.set(np.zeros((8, 32), np.int32))
        declared[sizes[0], 32](m)
        comm.synchronize()
        with pytest.raises(flowdsl.sim.UnsupportedFeatureError) as e:
            code.regs_per_thread  # noqa: B018 - a figure of GPU code, refused by name
        return sizes, m.get(), str(e.value)
    sizes, m, refusal = run_ranks(main, nranks=1)[0]
    assert sizes == [1, 1, 1, 0]  # a block of more than 1024 threads launches nowhere
    np.testing.assert_array_equal(m, reference((8, 32)))
    assert "Cannot read regs_per_thread of kernel 'sequential_rows' on the simulator" in refusal
    assert "Read it on a GPU (flowdsl.init())" in refusal


@pytest.mark.compile
def test_a_grid_sync_links_cudadevrt_and_marks_the_kernel_cooperative():
    from numba import types

    argtypes = (types.int32[:, ::1],)
    synced = sequential_rows.compile(argtypes, arch="sm_90", nccl="2.28.9")
    plain = rows_without_sync.compile(argtypes, arch="sm_90", nccl="2.28.9")
    assert "cooperative" in synced.features and "cooperative" not in plain.features
    assert len(plain.cubin) < len(synced.cubin)  # cudadevrt's code only where the grid syncs
