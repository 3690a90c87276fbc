"""One GIN put with a completion signal: rank 0 writes its send window into one peer's receive window.

A port of nccl4py's CuTe DSL example (``bindings/nccl4py/examples/cute``, a 1 MiB put between two ranks) to
flowdsl. Each rank registers a send and a receive window (registration is collective, so every rank makes
both, used or not). Rank 0's block issues one put of its whole send window, as a CTA, into rank ``dst``'s
receive window, with a signal increment that fires at ``dst`` once the data has landed; ``dst`` waits until
that signal reaches its value before the put plus one, then reads its receive window. The kernel reads the
signal's starting value before a world GIN barrier, so that no put can arrive before it is read: the same
device communicator runs the example again. Every other rank takes part in the barrier only.
"""

from __future__ import annotations

import numpy as np

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, coop, gin, team

__all__ = ["gin_put", "run", "SIGNAL"]

#: The signal the put increments at the destination (NCCL's example uses signal 1 of 2).
SIGNAL = 1


@flowdsl.kernel
def gin_put(comm, send_win, recv_win, nbytes, dst):
    ctx = gin.context(comm, 0)
    cta = coop.cta()
    before = gin.read_signal(ctx, SIGNAL)
    # every rank has read its signal's start
    gin.world_barrier(ctx, cta, 0).sync(MemoryOrder.RELAXED, GinFenceLevel.NONE)
    world = team.world(comm)
    if world.rank == 0:
        gin.put(ctx, world, dst, recv_win, 0, send_win, 0, nbytes, remote=gin.signal_inc(SIGNAL), coop=cta)
        gin.flush(ctx, cta)  # the send window may be reused once the kernel ends
    if world.rank == dst:
        gin.wait_signal(ctx, cta, SIGNAL, before + 1)  # the put's data is visible from here on


def run(comm, count: int = 1024 * 1024 // 8, dst: int = 1, threads: int = 32, calls: int = 1, seed: int = 0):
    """Put rank 0's ``count`` int64 values (1 MiB by default, as nccl4py's example) into rank ``dst``'s receive
    window, ``calls`` times on one device communicator (new values each time); return ``(result, reference)``
    for this rank, a list of them for several calls: on ``dst`` its receive window and rank 0's values; on every
    other rank its receive window, untouched (poisoned with -1 before each launch)."""
    if not 0 < dst < comm.nranks:
        raise flowdsl.UsageError(f"Cannot put from rank 0 to rank {dst}: the destination must be another rank, "
                                 f"1 to {comm.nranks - 1}. Run with at least 2 ranks and pass dst in that range")
    rng = np.random.default_rng(seed)
    send = comm.alloc(count, np.int64)
    recv = comm.alloc(count, np.int64)
    pairs = []
    with comm.register(send) as swin, comm.register(recv) as rwin, \
            comm.device_communicator(gin_signal_count=SIGNAL + 1, world_gin_barrier_count=1) as dcomm:
        for _ in range(calls):
            values = rng.integers(-2**62, 2**62, count, dtype=np.int64)  # rank 0's, the same on every rank
            send.set(values if comm.rank == 0 else np.zeros(count, np.int64))
            recv.set(np.full(count, -1, np.int64))
            gin_put[1, threads](dcomm, swin, rwin, count * 8, dst)
            comm.synchronize()
            pairs.append((recv.get(), values if comm.rank == dst else np.full(count, -1, np.int64)))
    return pairs if calls > 1 else pairs[0]


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("gin_put", run, "rank 0 put 1 MiB into rank 1's window over GIN, with a completion signal "
               "(nccl4py's CuTe GIN example)", ranks=2, nodes=2)
