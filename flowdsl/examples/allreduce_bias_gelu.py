"""A collective fused with computation: ring all-reduce with a bias + GELU epilogue.

``y = gelu(sum over ranks of x + bias)`` on every rank, in one kernel. It is the ring
all-reduce of ``flowdsl/collectives/programs.py`` (its two halves of a round) with one change. Once a rank holds
the fully reduced piece of a round (``recv_reduce_copy``), it applies the epilogue to
that piece in place, then starts the all-gather half with it (``copy_send``).
So each element is transformed once, by one rank, before it travels; NCCL followed by
a separate kernel would read and write the whole output again.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

import flowdsl
from flowdsl import Protocol, RedOp, flow
from flowdsl.collectives.programs import (channel_range, chunk_elements, gin_context, no_gin_context, piece,
                                         ring_connections, ring_gather_after_own_piece, ring_reduce_to_own_piece)

__all__ = ["allreduce_bias_gelu", "run"]


@flowdsl.device
def _gelu(x):
    # float32 constants: a Python float would promote the whole expression to float64.
    return float32(0.5) * x * (float32(1.0) + math.tanh(float32(0.7978845608028654) *
                                                        (x + float32(0.044715) * x * x * x)))


@functools.cache
def allreduce_bias_gelu(gin_peers=False):
    """The kernel; ``gin_peers`` when the ring leaves the LSA team (several nodes)."""
    context = gin_context if gin_peers else no_gin_context

    @flowdsl.kernel(max_registers=128)
    def allreduce_bias_gelu(comm, stage, x, bias, y, count, channels, nslots, slot_words, protocol):
        n, r = comm.nranks, comm.rank
        if n == 1:  # nothing to exchange: one pass over the whole grid
            stride = cuda.gridDim.x * cuda.blockDim.x
            for i in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, count, stride):
                y[i] = _gelu(x[i] + bias[i])
            return
        proc = flow.processor(comm, stage, context(comm), channels, nslots, slot_words, protocol)
        red = flow.reduction(RedOp.SUM, n)
        lo, hi = channel_range(count, proc)
        nxt, prv = ring_connections(proc)
        chunk = chunk_elements(proc, y.itemsize)
        base = lo
        while base < hi:
            size = min(n * chunk, hi - base)
            per = (size + n - 1) // n
            # Reduce-scatter half: this rank ends with piece r of the round summed.
            ring_reduce_to_own_piece(proc, nxt, prv, x, base, size, per, red)
            start, mine = base + r * per, piece(size, per, r)
            flow.recv_reduce_copy(proc, prv, x, y, start, mine, red)
            # The epilogue, on this rank's finished piece only.
            for i in range(start + cuda.threadIdx.x, start + mine, cuda.blockDim.x):
                y[i] = _gelu(y[i] + bias[i])
            # All-gather half: the transformed pieces go around the ring (copy_send's own
            # barrier orders the epilogue's stores before the piece is sent).
            flow.copy_send(proc, nxt, y, y, start, mine)
            ring_gather_after_own_piece(proc, nxt, prv, y, base, size, per)
            base += size

    return allreduce_bias_gelu


def run(comm, count=1000, channels=2, threads=64, nslots=2, slot_bytes=512, protocol=Protocol.SIMPLE,
        seed=0, blocks=None):
    """Run it on ``comm`` (GPU or simulator); return ``(result, reference)``.

    ``blocks`` defaults to ``channels``; with one rank any number may be used.
    """
    from flowdsl.collectives import FlowConfig  # noqa: PLC0415
    from flowdsl.flow import MAX_CONNECTIONS  # noqa: PLC0415

    n = comm.nranks
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    b = rng.standard_normal(count).astype(np.float32)
    x, bias, y = comm.alloc(count, np.float32), comm.alloc(count, np.float32), comm.alloc(count, np.float32)
    gin_peers = getattr(comm, "lsa_size", n) < n
    if hasattr(x, "set"):  # CuPy
        x.set(xs[comm.rank])
        bias.set(b)
        y.fill(np.nan)
    else:  # the simulator's buffers
        x[:] = xs[comm.rank]
        bias[:] = b
    reqs = {"gin_context_count": 1, "gin_signal_count": 2 * channels * MAX_CONNECTIONS} if gin_peers else {}
    config = FlowConfig(channels=channels, nslots=nslots, slot_bytes=slot_bytes, threads=threads)
    with flow.staging(comm, config, gin=gin_peers) as win, comm.device_communicator(**reqs) as dcomm:
        allreduce_bias_gelu(gin_peers)[blocks or channels, threads](dcomm, win, x, bias, y, count, channels, nslots,
                                                          slot_bytes // 8, int(protocol))
        comm.synchronize()
        result = y.get() if hasattr(y, "get") else np.array(y)
    s = np.sum(xs, axis=0, dtype=np.float64) + b
    reference = 0.5 * s * (1.0 + np.tanh(0.7978845608028654 * (s + 0.044715 * s ** 3)))
    return result, reference


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("allreduce_bias_gelu", run, "an all-reduce fused with a bias and GELU, over Flow", ranks=4, nodes=2)
