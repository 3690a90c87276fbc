"""All-gather over LSA: every rank writes its block into every peer's window.

Each rank owns ``count`` elements at ``rank * count`` of a symmetric window of
``nranks * count`` elements. The kernel copies this rank's block into the same
place of every LSA peer's window, then a release/acquire barrier makes the
peers' blocks visible. Afterwards every rank holds all blocks.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import flowdsl
from flowdsl import MemoryOrder, coop, lsa


@flowdsl.kernel
def allgather_lsa(comm, win, count):
    cta = coop.cta()
    bar = lsa.barrier(comm, cta, cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQUIRE)  # peers are not still reading an earlier result
    mine = lsa.local_view(win, comm.rank * count, count)
    nthreads = cuda.gridDim.x * cuda.blockDim.x
    first = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    for peer in range(comm.lsa_size):
        if peer != comm.lsa_rank:
            dst = lsa.lsa_view(win, peer, comm.rank * count, count)
            for i in range(first, count, nthreads):
                dst[i] = mine[i]
    bar.sync(MemoryOrder.RELEASE)


def run(comm, count: int = 4096, dtype=np.float32, blocks: int = 4, seed: int = 0):
    """Run the all-gather on ``comm``; return ``(result, reference)`` for this rank."""
    rng = np.random.default_rng(seed)
    blocks_in = [rng.standard_normal(count).astype(dtype) for _ in range(comm.nranks)]
    buf = comm.alloc(comm.nranks * count, dtype)
    poison = np.full(comm.nranks * count, np.nan, dtype) if np.dtype(dtype).kind == "f" else \
        np.full(comm.nranks * count, -1, dtype)
    poison[comm.rank * count:(comm.rank + 1) * count] = blocks_in[comm.rank]
    buf.set(poison)
    with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=blocks) as dcomm:
        allgather_lsa[blocks, 256](dcomm, win, count)
        comm.synchronize()
        result = buf.get()
    return result, np.concatenate(blocks_in)
