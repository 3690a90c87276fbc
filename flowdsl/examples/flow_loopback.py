"""Flow's protocols through a real connection on one GPU: a rank sends to itself.

Block 0 sends ``src`` on connection 1 of channel 0 to this same rank; block 1 holds
the other end of that connection (``processor(..., channel=0)``) and receives,
combining what arrives with ``src`` by ``op`` into ``dst`` (``recv_reduce_copy``).
The message is many slots long, so the two blocks run the credit and flag
protocol against each other through memory exactly as two ranks would. The
expected result is ``finish(op, src op src)``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import flowdsl
from flowdsl import Protocol, flow
from flowdsl.collectives import check

__all__ = ["loopback", "run"]


@flowdsl.kernel
def loopback(comm, stage, src, dst, n, op, channels, nslots, slot_words, protocol):
    proc = flow.processor(comm, stage, None, channels, nslots, slot_words, protocol, 0)
    conn = flow.connect(proc, comm.rank, 1, 1)
    if cuda.blockIdx.x == 0:
        flow.send(proc, conn, src, 0, n)
    else:
        flow.recv_reduce_copy(proc, conn, src, dst, 0, n, flow.reduction(op, 2))


def run(comm, protocol=Protocol.SIMPLE, dtype="float32", op="sum", n=None, seed=0,
        nslots=4, slot_bytes=4096, threads=None):
    """Run the loopback on ``comm``; return ``(result, reference)`` (values as float64/int64). ``n`` and
    ``threads`` default to a GPU's shape (100,003 elements, 256 threads) on a GPU and to one the simulator runs
    in a second (4,099 elements, 64 threads) on simulated ranks."""
    from flowdsl.collectives._config import OPS, FlowConfig  # noqa: PLC0415

    on_gpu = getattr(comm, "memory_device", "cuda") != "cpu"
    n = n if n is not None else 100_003 if on_gpu else 4_099
    threads = threads if threads is not None else 256 if on_gpu else 64

    rng = np.random.default_rng(seed)
    x = check.inputs(rng, dtype, op, 2, n)[0]
    store = check.storage_dtype(dtype)
    src = comm.alloc(n, store)
    if hasattr(src, "set"):  # CuPy
        src.set(x)
    else:  # the simulator's buffers
        src[:] = x
    dst = comm.alloc(n, store)
    config = FlowConfig(channels=1, nslots=nslots, slot_bytes=slot_bytes, threads=threads)
    with flow.staging(comm, config, gin=False) as win, comm.device_communicator() as dcomm:
        loopback[2, threads](dcomm, win, src, dst, n, int(OPS[op]), 1, nslots, slot_bytes // 8, int(protocol))
        comm.synchronize()
        result = dst.get() if hasattr(dst, "get") else np.array(dst)
    expected = check.reference("all_reduce", [x, x], dtype, op)[0]
    return result, expected


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("flow_loopback", run, "a rank sent to itself through a Flow connection", ranks=1, nodes=1)
