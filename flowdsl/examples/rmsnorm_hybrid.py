"""Fused ReduceScatter + RMSNorm + AllGather in one kernel: LSA inside a node, GIN across nodes.

A port of NCCL's ``07_kernel_fusion/04_rmsnorm_hybrid``: :mod:`flowdsl.examples.rmsnorm_gin`'s algorithm, with the
ranks of this rank's node (its LSA team) reached by stores through LSA views instead of puts. Every rank holds
partial sums of all ``ranks x tokens`` tokens (``hidden`` float32 each) in its send window; block ``b`` of rank
``r`` owns token ``r * tokens + b``.

1. Reduce-scatter: a rank ``p`` on another node gets this rank's partial of the token its block ``b`` owns by a put
   into its receive window, at this rank's slot, raising its signal ``b`` by one (a weak increment); a rank of this
   node gets it by stores into that slot through an LSA view. The block waits for one increment per rank on other
   nodes, flushes, and syncs the hybrid barrier's LSA part alone (``bar.lsa_barrier()``, NCCL's
   ``ncclBarrierSession::lsaBarrier()``): this node's stores are then visible, and no GIN round trip is paid for
   what the signals already ordered. It then sums the slots in rank order.
2. RMSNorm of the summed token, in place.
3. All-gather: after a world barrier, the normalised token goes into every rank's send window at the token's place,
   by puts across nodes and LSA stores inside this one; the signal rises by the remote ranks once more.

The hybrid barrier (``gin.hybrid_barrier``, NCCL's ``ncclBarrierSession`` over the world at fence level ``NONE``, as NCCL's
example passes ``Relaxed``) opens
the kernel, separates the phases and closes it; ``gin.flush`` after each phase lets the windows' put sources be
written again. Blocks spread over the device communicator's GIN contexts (``comm.gin_context_count``).
"""

from __future__ import annotations

from numba import cuda, float32

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, coop, gin, lsa, team
from flowdsl.examples.rmsnorm_gin import THREADS, _normalise, run_rmsnorm

__all__ = ["rmsnorm_hybrid", "run", "THREADS"]

_F32 = 4


@flowdsl.kernel
def rmsnorm_hybrid(comm, send_win, recv_win, hidden, eps):
    partial = cuda.shared.array(THREADS, float32)
    cta = coop.cta()
    b, tid = cuda.blockIdx.x, cuda.threadIdx.x
    ctx = gin.context(comm, b % comm.gin_context_count)
    sig = b
    base = gin.read_signal(ctx, sig)
    world, node = team.world(comm), team.lsa(comm)
    n, blocks = world.nranks, cuda.gridDim.x
    first = world.rank - node.rank  # this node's ranks are first .. first + node.nranks - 1
    remote = n - node.nranks
    token = world.rank * blocks + b
    row = hidden * _F32
    bar = gin.hybrid_barrier(ctx, cta, b)
    # every rank's partials are in place, and no rank still reads a result
    bar.sync(MemoryOrder.ACQUIRE, GinFenceLevel.NONE)

    # 1. reduce-scatter: my partial of rank p's token b goes to my slot of p's receive window
    for p in range(tid, n, cuda.blockDim.x):
        if p < first or p >= first + node.nranks:
            gin.put(ctx, world, p, recv_win, token * row, send_win, (p * blocks + b) * row, row,
                    remote=gin.weak_signal_inc(sig), coop=coop.thread())
    for lp in range(node.nranks):
        theirs = lsa.lsa_view(recv_win, lp, token * hidden, hidden)
        mine_for_them = lsa.local_view(send_win, ((first + lp) * blocks + b) * hidden, hidden)
        for j in range(tid, hidden, cuda.blockDim.x):
            theirs[j] = mine_for_them[j]
    gin.wait_signal(ctx, cta, sig, base + remote)
    gin.flush(ctx, cta)
    bar.lsa_barrier().sync(MemoryOrder.ACQ_REL)  # this node's stores into my slots are visible
    mine = lsa.local_view(recv_win, b * hidden, hidden)  # rank 0's slot holds the sum
    for p in range(1, n):
        slot = lsa.local_view(recv_win, (p * blocks + b) * hidden, hidden)
        for j in range(tid, hidden, cuda.blockDim.x):
            mine[j] += slot[j]
    cuda.syncthreads()

    # 2. RMSNorm of the summed token
    _normalise(mine, hidden, eps, partial)

    # 3. all-gather: the normalised token into every rank's send window, at the token's place
    bar.sync(MemoryOrder.RELEASE, GinFenceLevel.NONE)
    for p in range(tid, n, cuda.blockDim.x):
        if p < first or p >= first + node.nranks:
            gin.put(ctx, world, p, send_win, token * row, recv_win, b * row, row,
                    remote=gin.weak_signal_inc(sig), coop=coop.thread())
    for lp in range(node.nranks):
        theirs = lsa.lsa_view(send_win, lp, token * hidden, hidden)
        for j in range(tid, hidden, cuda.blockDim.x):
            theirs[j] = mine[j]
    gin.wait_signal(ctx, cta, sig, base + 2 * remote)
    gin.flush(ctx, cta)
    bar.sync(MemoryOrder.RELEASE, GinFenceLevel.NONE)


def run(comm, tokens: int = 4, hidden: int = 96, eps: float = 1e-6, seed: int = 0):
    """:func:`flowdsl.examples.rmsnorm_gin.run` for this kernel (the hybrid barriers: ``barrier_count``)."""
    return run_rmsnorm(rmsnorm_hybrid, comm, tokens, hidden, eps, seed, barrier_count=tokens)


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("rmsnorm_hybrid", run, "reduce-scatter, RMSNorm and all-gather fused in one kernel, LSA inside a "
               "node and GIN across (NCCL's 07 04_rmsnorm_hybrid)", ranks=4, nodes=2)
