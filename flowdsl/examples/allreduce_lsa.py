"""All-reduce over LSA, every rank reading every peer and writing every peer's result.

A port of NCCL's ``06_device_api/01_allreduce_lsa`` example. The elements are shared out over the threads of
every rank at once: thread ``t`` of block ``b`` on rank ``r`` is global thread ``t + threads * (r + b *
nranks)``, and each global thread takes the elements ``i, i + all threads, ...``. For each of its elements a
thread reads it from every LSA rank's send window (``peer`` 0 to ``n - 1``, its own included, in that order),
sums, and writes the sum into every rank's receive window. An acquire barrier at the start keeps a fast rank
from reading a send window its owner still fills (the launch before wrote it); a release barrier at the end
publishes the writes before any rank's stream goes on. One LSA barrier per block (``lsa_barrier_count``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

import flowdsl
from flowdsl import MemoryOrder, coop, lsa

__all__ = ["allreduce_lsa", "run"]


@flowdsl.kernel
def allreduce_lsa(comm, send_win, recv_win, count):
    bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQUIRE)
    n = comm.lsa_size
    first = cuda.threadIdx.x + cuda.blockDim.x * (comm.lsa_rank + cuda.blockIdx.x * n)
    for i in range(first, count, cuda.blockDim.x * cuda.gridDim.x * n):
        v = float32(0.0)
        for peer in range(n):
            v += lsa.lsa_view(send_win, peer, 0, count)[i]
        for peer in range(n):
            lsa.lsa_view(recv_win, peer, 0, count)[i] = v
    bar.sync(MemoryOrder.RELEASE)


def run(comm, count: int = 4096, blocks: int = 4, threads: int = 128, seed: int = 0):
    """Run the all-reduce on ``comm`` (its ranks one LSA team); return ``(result, reference)`` for this rank:
    the receive window, and NumPy's float32 sum of every rank's (seeded) input in rank order."""
    lsa_size = getattr(comm, "lsa_size", comm.nranks)  # the simulator's; a GPU communicator does not tell yet
    if lsa_size != comm.nranks:
        raise flowdsl.UsageError(f"Cannot run allreduce_lsa on {comm.nranks} ranks in LSA teams of {lsa_size}: "
                                 "it reads every rank's memory directly. Run it within one node")
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((comm.nranks, count)).astype(np.float32)
    send, recv = comm.alloc(count, np.float32), comm.alloc(count, np.float32)
    send.set(inputs[comm.rank])
    recv.set(np.full(count, np.nan, np.float32))
    with comm.register(send) as swin, comm.register(recv) as rwin, \
            comm.device_communicator(lsa_barrier_count=blocks) as dcomm:
        allreduce_lsa[blocks, threads](dcomm, swin, rwin, count)
        comm.synchronize()
        result = recv.get()
    reference = np.zeros(count, np.float32)
    for x in inputs:  # the kernel's order: peer 0 first
        reference += x
    return result, reference


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("allreduce_lsa", run,
               "every rank summed every rank's input over LSA and wrote the sums into every rank's window "
               "(NCCL's 01_allreduce_lsa)")
