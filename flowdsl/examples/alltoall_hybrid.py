"""All-to-all over LSA inside a node and GIN across nodes.

A port of NCCL's ``06_device_api/03_alltoall_hybrid`` example to flowdsl. Each
rank holds ``nranks`` blocks of ``count`` elements (block ``p`` is for rank
``p``). Peers outside this rank's node get their block by a GIN put into their
receive window at ``rank * count``, each carrying a weak signal increment;
peers of the node (the LSA team, this rank included) get it by plain stores
through LSA views. The block ``receiving_cta`` waits for one signal increment
per remote peer. Its barriers are NCCL's example's: ``ncclBarrierSession`` over
the world (``gin.hybrid_barrier``: LSA inside the node, GIN across, ``barrier_count``);
the closing one publishes the LSA stores.
"""

from __future__ import annotations

from numba import cuda

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, coop, gin, lsa, team
from flowdsl.examples.alltoall_gin import put_blocks, run_alltoall, signal_round

__all__ = ["alltoall_hybrid", "run"]


@flowdsl.kernel
def alltoall_hybrid(comm, send_win, recv_win, count, itemsize):
    ctx, sig, base = signal_round(comm)
    cta = coop.cta()
    bar = gin.hybrid_barrier(ctx, cta, cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQUIRE, GinFenceLevel.NONE)  # no peer still reads an earlier result
    world = team.world(comm)
    local = team.lsa(comm)
    start_lsa = world.rank - local.rank
    # Remote peers: the world ranks before and after this node's LSA range.
    put_blocks(ctx, world, 0, start_lsa, send_win, recv_win, count * itemsize, sig)
    put_blocks(ctx, world, start_lsa + local.nranks, world.nranks, send_win, recv_win, count * itemsize, sig)
    tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    nthreads = cuda.gridDim.x * cuda.blockDim.x
    # Local peers: stores through LSA views.
    mine = lsa.local_view(send_win)
    for i in range(tid, count, nthreads):
        for lp in range(local.nranks):
            dst = lsa.lsa_view(recv_win, lp, world.rank * count, count)
            dst[i] = mine[(start_lsa + lp) * count + i]
    remote_peers = world.nranks - local.nranks
    receiving_cta = (world.rank % nthreads) // cuda.blockDim.x
    if cuda.blockIdx.x == receiving_cta:
        gin.wait_signal(ctx, cta, sig, base + remote_peers)
    gin.flush(ctx, cta)
    bar.sync(MemoryOrder.RELEASE, GinFenceLevel.NONE)


def run(comm, count: int = 256, blocks: int = 2, threads: int = 32, seed: int = 0):
    """Run the hybrid all-to-all on ``comm``; return ``(result, reference)`` for this rank."""
    return run_alltoall(alltoall_hybrid, comm, count, blocks, threads, seed, barrier_count=blocks)


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("alltoall_hybrid", run,
               "all-to-all over LSA within a node and GIN across nodes (NCCL's 03_alltoall_hybrid)", ranks=4, nodes=2)
