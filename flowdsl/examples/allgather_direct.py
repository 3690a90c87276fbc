"""Ring all-gather with Flow's direct steps: blocks go straight into the peers' output window.

The output is a registered window, laid out the same on every rank, so block
``j`` has one place everywhere: the rank that owns it writes it there on its
ring neighbour (``direct_copy_send``), every rank in between forwards it from its
own copy (``direct_recv_copy_send``), and the last one only waits for it
(``direct_recv``). No staging slot is used; the connection's flags and credits
are the same as for the staged steps, so over GIN the writes are puts from this
rank's copy of the window with a strong signal.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

import flowdsl
from flowdsl import Protocol, flow
from flowdsl.collectives.programs import gin_context, no_gin_context

__all__ = ["allgather_direct", "run"]


@functools.cache
def allgather_direct(gin_peers=False):
    """The kernel; ``gin_peers`` when the ring leaves the LSA team (several nodes)."""
    context = gin_context if gin_peers else no_gin_context

    @flowdsl.kernel
    def allgather_direct(comm, stage, src, out, count, chunk, channels, nslots, slot_words):
        proc = flow.processor(comm, stage, context(comm), channels, nslots, slot_words, Protocol.SIMPLE)
        n, r = comm.nranks, comm.rank
        nxt = flow.connect(proc, (r + 1) % n, 0, 0)
        prv = flow.connect(proc, (r + n - 1) % n, 0, 0)
        per = (count + cuda.gridDim.x - 1) // cuda.gridDim.x
        lo = min(cuda.blockIdx.x * per, count)
        hi = min(lo + per, count)
        for base in range(lo, hi, chunk):
            m = min(chunk, hi - base)
            if n == 1:
                flow.copy(src, base, flowdsl.lsa.local_view(out, r * count, count), base, m,
                          cuda.threadIdx.x, cuda.blockDim.x, 0)
                continue
            flow.direct_copy_send(proc, nxt, src, base, out, r * count + base, m)
            for s in range(1, n - 1):
                j = (r + n - s) % n
                flow.direct_recv_copy_send(proc, prv, nxt, out, j * count + base, m)
            j = (r + 1) % n
            flow.direct_recv(proc, prv, out, j * count + base, m)

    return allgather_direct


def run(comm, count=1000, chunk=96, blocks=2, threads=32, nslots=2, seed=0):
    """Run it on ``comm`` (GPU or simulator); return ``(result, reference)``."""
    from flowdsl.collectives import FlowConfig  # noqa: PLC0415

    n = comm.nranks
    rng = np.random.default_rng(seed)
    blocks_in = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    src = comm.alloc(count, np.float32)
    out = comm.alloc(n * count, np.float32)
    if hasattr(src, "set"):  # CuPy
        src.set(blocks_in[comm.rank])
        out.fill(np.nan)
    else:  # the simulator's buffers
        src[:] = blocks_in[comm.rank]
    gin_peers = getattr(comm, "lsa_size", n) < n
    reqs = {"gin_context_count": 1, "gin_signal_count": 2 * blocks * flow.MAX_CONNECTIONS} if gin_peers else {}
    config = FlowConfig(channels=blocks, nslots=nslots, slot_bytes=128, threads=threads)  # direct steps use no slot
    with comm.register(out) as out_win, flow.staging(comm, config, gin=gin_peers) as stage_win, \
            comm.device_communicator(**reqs) as dcomm:
        comm.synchronize()  # every rank's window is ready before a neighbour writes into it
        allgather_direct(gin_peers)[blocks, threads](dcomm, stage_win, src, out_win, count, chunk, blocks,
                                                     nslots, 16)
        comm.synchronize()
        result = out.get() if hasattr(out, "get") else np.array(out)
    return result, np.concatenate(blocks_in)


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("allgather_direct", run,
               "every rank gathered every rank's block through Flow's direct steps", ranks=4, nodes=2)
