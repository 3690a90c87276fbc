"""All-to-all over GIN only: every rank puts its block for peer ``p`` into ``p``'s window.

A port of NCCL's ``06_device_api/02_alltoall_gin`` example to flowdsl. Each rank
holds ``nranks`` blocks of ``count`` elements in its send window (block ``p``
is for rank ``p``). The kernel issues one GIN put per peer (spread over the
grid's threads) that writes the block into the peer's receive window at
``rank * count``, carrying a weak signal increment on the signal of one block;
the block ``receiving_cta`` of each rank waits until that signal has risen by
``nranks`` (one increment per sender, each covering its own put). The world
GIN barrier (``gin.world_barrier``, as NCCL's example: ``ncclGinBarrierSession``
on ``ncclTeamTagWorld``, ``world_gin_barrier_count``) before the puts keeps a
fast rank from writing into a peer that still reads an earlier result, and once
more after the flush keeps the windows alive until every peer is done.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, coop, gin, team

__all__ = ["alltoall_gin", "run", "run_alltoall", "signal_round", "put_blocks"]


@flowdsl.device
def signal_round(comm):
    """GIN context 0, this block's signal (its index is the block's) and the signal's value
    before this launch's increments."""
    ctx = gin.context(comm, 0)
    sig = cuda.blockIdx.x
    return ctx, sig, gin.read_signal(ctx, sig)


@flowdsl.device
def put_blocks(ctx, world, first, last, send_win, recv_win, size, sig):
    """This thread's share of the puts to world ranks ``first .. last-1``: peer ``p`` gets block
    ``p`` of ``send_win`` at this rank's place in its ``recv_win``, with a weak signal increment."""
    tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    for peer in range(first + tid, last, cuda.gridDim.x * cuda.blockDim.x):
        gin.put(ctx, world, peer, recv_win, world.rank * size, send_win, peer * size, size,
                remote=gin.weak_signal_inc(sig), coop=coop.thread())


@flowdsl.kernel
def alltoall_gin(comm, send_win, recv_win, count, itemsize):
    ctx, sig, base = signal_round(comm)
    cta = coop.cta()
    bar = gin.world_barrier(ctx, cta, cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQUIRE, GinFenceLevel.NONE)  # no peer still reads an earlier result
    world = team.world(comm)
    put_blocks(ctx, world, 0, world.nranks, send_win, recv_win, count * itemsize, sig)
    # The senders' thread `world.rank` (same on every rank) issues the put to this rank: its block
    # increments the signal whose index is that block's.
    receiving_cta = (world.rank % (cuda.gridDim.x * cuda.blockDim.x)) // cuda.blockDim.x
    if cuda.blockIdx.x == receiving_cta:
        gin.wait_signal(ctx, cta, sig, base + world.nranks)
    gin.flush(ctx, cta)
    bar.sync(MemoryOrder.RELEASE, GinFenceLevel.NONE)


def run(comm, count: int = 256, blocks: int = 2, threads: int = 32, seed: int = 0):
    """Run the all-to-all on ``comm``; return ``(result, reference)`` for this rank.

    ``result`` is this rank's receive buffer (block ``s`` came from rank ``s``);
    ``reference`` is what NumPy computes from every rank's (seeded) inputs.
    """
    return run_alltoall(alltoall_gin, comm, count, blocks, threads, seed, world_gin_barrier_count=blocks)


def run_alltoall(kernel, comm, count: int, blocks: int, threads: int, seed: int, **barriers):
    """Run all-to-all ``kernel`` (this module's signature) on ``comm`` over seeded float32 inputs, with one GIN
    signal per block and the barrier counts ``barriers``; return ``(result, reference)`` for this rank, as
    :func:`run` says."""
    n = comm.nranks
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((n, n, count)).astype(np.float32)  # inputs[src][dst]
    send = comm.alloc(n * count, np.float32)
    send.set(inputs[comm.rank].reshape(-1))
    recv = comm.alloc(n * count, np.float32)
    recv.set(np.full(n * count, np.nan, np.float32))
    with comm.register(send) as swin, comm.register(recv) as rwin, \
            comm.device_communicator(gin_signal_count=blocks, **barriers) as dcomm:
        kernel[blocks, threads](dcomm, swin, rwin, count, 4)
        comm.synchronize()
        result = recv.get()
    return result, inputs[:, comm.rank, :].reshape(-1)


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("alltoall_gin", run,
               "every rank put its block for each peer into that peer's window over GIN (NCCL's 02_alltoall_gin)",
               ranks=4, nodes=2)
