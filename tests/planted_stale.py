"""A planted freshness bug: the one-shot all-reduce with its LL flag counted per block.

Which lines a block reads depends on the call's grid, but each block counts its own calls:
after a call with another grid a block's count can equal the count an earlier call's writer
stamped on the lines it reads, and those lines pass for fresh. The library's one-shot kernel
counts its calls once for the whole window (``flowdsl/collectives/programs.py``); this copy
keeps the bug so that ``tests/sim/test_freshness.py`` shows the simulator catches the class
(:class:`flowdsl.sim.StaleDataError`) where the bits match and a GPU would be silently wrong.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

import flowdsl
from flowdsl import ThreadScope, flow, lsa, mem

#: Per-block counters at the start of the window, then 2 buffers of LINES lines per rank.
BLOCKS = 16
LINES = 1024


@flowdsl.kernel
def per_block_epoch_all_reduce(comm, win, src, dst, count):
    """float32 sum over the LSA team, every line stamped with this block's own call count (the bug)."""
    n, me = comm.lsa_size, comm.lsa_rank
    words = lsa.local_view(win)
    epoch = int64(words[cuda.blockIdx.x]) + 1
    flag = uint64(epoch & 0xFFFFFFFF)
    buffer = BLOCKS + (epoch % 2) * n * LINES
    first = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    stride = cuda.gridDim.x * cuda.blockDim.x
    for step in range(1, n):
        theirs = lsa.lsa_view(win, (me + step) % n, buffer + me * LINES, LINES)
        for i in range(first, count, stride):
            mem.store_relaxed(theirs, i, flow.ll_line(mem.to_bits(src[i]), flag), ThreadScope.SYSTEM)
    for i in range(first, count, stride):
        acc = np.float32(0)
        for q in range(n):
            if q == me:
                acc += src[i]
            else:
                peer = comm.rank - me + q
                acc += mem.from_bits(flow.ll_read(comm, words, buffer + q * LINES + i, flag, peer), dst.dtype)
        dst[i] = acc
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        words[cuda.blockIdx.x] = uint64(epoch)


def run(comm, calls=((1, 128), (2, 129)), threads=64):
    """The calls ``(grid, count)`` one after another; returns each call's result and its NumPy sum."""
    buf = comm.alloc(BLOCKS + 2 * comm.nranks * LINES, np.uint64)
    buf.fill(0)
    comm.synchronize()
    out = []
    with comm.register(buf) as win, comm.device_communicator() as dcomm:
        for k, (grid, count) in enumerate(calls):
            rng = np.random.default_rng(k)
            ins = [rng.standard_normal(count).astype(np.float32) for _ in range(comm.nranks)]
            src, dst = comm.alloc(count, np.float32), comm.alloc(count, np.float32)
            src[:] = ins[comm.rank]
            dst.fill(np.nan)
            per_block_epoch_all_reduce[grid, threads](dcomm, win, src, dst, count)
            comm.synchronize()
            out.append((np.array(dst), np.sum(ins, axis=0, dtype=np.float32)))
    return out
