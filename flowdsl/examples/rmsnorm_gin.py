"""Fused ReduceScatter + RMSNorm + AllGather in one kernel, over GIN.

A port of NCCL's ``07_kernel_fusion/03_rmsnorm_gin``. Every rank holds partial sums of all ``ranks x tokens``
tokens (``hidden`` float32 each) in its send window; block ``b`` of rank ``r`` owns token ``r * tokens + b``.

1. Reduce-scatter: for each rank ``p`` (the block's threads share the ranks), a put sends this rank's partial of
   the token rank ``p``'s block ``b`` owns into ``p``'s receive window, at this rank's slot; each put raises the
   receiver's signal ``b`` by one (a weak increment). The block waits until its signal has risen by the number of
   ranks, and sums the slots in rank order.
2. RMSNorm of the summed token, in place.
3. All-gather: after a world barrier (every rank has normalised), a put per rank sends the normalised token into
   that rank's send window, at the token's place; the signal rises by the ranks once more.

A world GIN barrier (``gin.world_barrier``, NCCL's ``ncclGinBarrierSession`` on the world team, at fence level
``NONE``, as NCCL's example passes ``Relaxed``: the signals cover the puts) opens the kernel, separates the phases and closes it; ``gin.flush``
after each phase lets the windows' put sources be written again. Blocks spread over the device communicator's GIN
contexts (``comm.gin_context_count``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, coop, gin, lsa, team
from flowdsl.examples._block import block_sum

__all__ = ["rmsnorm_gin", "run", "run_rmsnorm", "THREADS"]

THREADS = 64
_F32 = 4


@flowdsl.device
def _normalise(row, hidden, eps, partial):
    """``row`` (``hidden`` float32) scaled in place by the inverse of its root mean square."""
    sq = float32(0.0)
    for j in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        sq += row[j] * row[j]
    scale = float32(1.0) / math.sqrt(block_sum(partial, sq) / float32(hidden) + eps)
    for j in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        row[j] = row[j] * scale
    cuda.syncthreads()


@flowdsl.kernel
def rmsnorm_gin(comm, send_win, recv_win, hidden, eps):
    partial = cuda.shared.array(THREADS, float32)
    cta = coop.cta()
    ctx = gin.context(comm, cuda.blockIdx.x % comm.gin_context_count)
    sig = cuda.blockIdx.x
    base = gin.read_signal(ctx, sig)
    world = team.world(comm)
    n, blocks = world.nranks, cuda.gridDim.x
    token = world.rank * blocks + cuda.blockIdx.x
    row = hidden * _F32
    bar = gin.world_barrier(ctx, cta, cuda.blockIdx.x)
    # every rank's partials are in place, and no rank still reads a result
    bar.sync(MemoryOrder.ACQUIRE, GinFenceLevel.NONE)

    # 1. reduce-scatter: my partial of rank p's token b goes to my slot of p's receive window
    for p in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        gin.put(ctx, world, p, recv_win, token * row, send_win, (p * blocks + cuda.blockIdx.x) * row, row,
                remote=gin.weak_signal_inc(sig), coop=coop.thread())
    gin.wait_signal(ctx, cta, sig, base + n)
    gin.flush(ctx, cta)
    mine = lsa.local_view(recv_win, cuda.blockIdx.x * hidden, hidden)  # rank 0's slot holds the sum
    for p in range(1, n):
        theirs = lsa.local_view(recv_win, (p * blocks + cuda.blockIdx.x) * hidden, hidden)
        for j in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
            mine[j] += theirs[j]
    cuda.syncthreads()

    # 2. RMSNorm of the summed token
    _normalise(mine, hidden, eps, partial)

    # 3. all-gather: the normalised token into every rank's send window, at the token's place
    bar.sync(MemoryOrder.RELEASE, GinFenceLevel.NONE)
    for p in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        gin.put(ctx, world, p, send_win, token * row, recv_win, cuda.blockIdx.x * row, row,
                remote=gin.weak_signal_inc(sig), coop=coop.thread())
    gin.wait_signal(ctx, cta, sig, base + 2 * n)
    gin.flush(ctx, cta)
    bar.sync(MemoryOrder.RELEASE, GinFenceLevel.NONE)


def run(comm, tokens: int = 4, hidden: int = 96, eps: float = 1e-6, seed: int = 0):
    """Run it on ``comm`` (``tokens`` per rank, one block each); return ``(result, reference)`` for this rank:
    its send window afterwards (every token normalised), and NumPy's RMSNorm of every rank's partials summed in
    rank order (float32)."""
    return run_rmsnorm(rmsnorm_gin, comm, tokens, hidden, eps, seed, world_gin_barrier_count=tokens)


def run_rmsnorm(kernel, comm, tokens, hidden, eps, seed, **barriers):
    """:func:`run` of ``kernel`` (this one or :mod:`flowdsl.examples.rmsnorm_hybrid`'s), its device communicator
    made with ``tokens`` GIN signals and ``barriers`` (the barrier counts it asks for)."""
    n = comm.nranks
    rng = np.random.default_rng(seed)
    partials = rng.standard_normal((n, n * tokens, hidden)).astype(np.float32)
    send = comm.alloc(n * tokens * hidden, np.float32)
    send.set(partials[comm.rank].reshape(-1))
    recv = comm.alloc(n * tokens * hidden, np.float32)
    recv.set(np.full(n * tokens * hidden, np.nan, np.float32))
    with comm.register(send) as swin, comm.register(recv) as rwin, \
            comm.device_communicator(gin_signal_count=tokens, **barriers) as dcomm:
        kernel[tokens, THREADS](dcomm, swin, rwin, hidden, float(eps))
        comm.synchronize()
        result = send.get().reshape(n * tokens, hidden)
    summed = np.zeros((n * tokens, hidden), np.float32)
    for x in partials:  # the kernel's order: rank 0's slot first
        summed += x
    rms = np.sqrt((summed.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps)
    return result, (summed / rms).astype(np.float32)


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("rmsnorm_gin", run, "reduce-scatter, RMSNorm and all-gather fused in one GIN kernel (NCCL's 07 "
               "03_rmsnorm_gin)", ranks=4, nodes=2)
