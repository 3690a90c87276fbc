"""Fused ReduceScatter + RMSNorm + AllGather in one kernel, over LSA.

A flowdsl port of NCCL's ``docs/examples/07_kernel_fusion/01_rmsnorm_lsa``.
Every rank holds a ``(tokens, hidden)`` float32 tensor of partial sums in a
symmetric window. Block ``b`` of rank ``r`` owns token ``r * grid + b``: it
sums that token over all LSA ranks, normalises it by its root mean square,
and writes the result back into every rank's window. Afterwards every rank
holds ``rmsnorm(sum over ranks of the input)``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

import flowdsl
from flowdsl import MemoryOrder, coop, lsa

THREADS = 256


@flowdsl.kernel
def rmsnorm_lsa(comm, win, hidden, eps):
    partial = cuda.shared.array(THREADS, float32)
    cta = coop.cta()
    bar = lsa.barrier(comm, cta, cuda.blockIdx.x)
    # Every rank's input must be in place before anyone reads it.
    bar.sync(MemoryOrder.ACQUIRE)

    token = comm.rank * cuda.gridDim.x + cuda.blockIdx.x
    mine = lsa.local_view(win, token * hidden, hidden)

    # Phase 1: reduce-scatter. This block sums its token over all LSA ranks.
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        acc = mine[i]
        for peer in range(comm.lsa_size):
            if peer != comm.lsa_rank:
                acc += lsa.lsa_view(win, peer, token * hidden, hidden)[i]
        mine[i] = acc
    cta.sync()

    # Phase 2: RMSNorm of the reduced token (block-wide sum of squares).
    sq = float32(0.0)
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        sq += mine[i] * mine[i]
    partial[cuda.threadIdx.x] = sq
    cta.sync()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if cuda.threadIdx.x < stride:
            partial[cuda.threadIdx.x] += partial[cuda.threadIdx.x + stride]
        cta.sync()
        stride //= 2
    scale = float32(1.0) / math.sqrt(partial[0] / float32(hidden) + eps)
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        mine[i] = mine[i] * scale
    cta.sync()

    # Phase 3: all-gather. Write the normalised token into every rank's window.
    for peer in range(comm.lsa_size):
        if peer != comm.lsa_rank:
            out = lsa.lsa_view(win, peer, token * hidden, hidden)
            for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
                out[i] = mine[i]
    # Release: our writes are visible to the peers once they pass the barrier.
    bar.sync(MemoryOrder.RELEASE)


def reference(inputs: list[np.ndarray], eps: float) -> np.ndarray:
    """NumPy reference: rmsnorm(sum of the ranks' inputs), row by row, in float64."""
    total = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    rms = np.sqrt(np.mean(total * total, axis=1, keepdims=True) + eps)
    return total / rms


def run(comm, tokens_per_rank: int = 8, hidden: int = 512, eps: float = 1e-6, seed: int = 0):
    """Run the fused kernel on ``comm``; return ``(result, reference)`` for this rank."""
    tokens = tokens_per_rank * comm.nranks
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal((tokens, hidden)).astype(np.float32) for _ in range(comm.nranks)]
    buf = comm.alloc((tokens, hidden), np.float32)
    buf.set(inputs[comm.rank])
    with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=tokens_per_rank) as dcomm:
        rmsnorm_lsa[tokens_per_rank, THREADS](dcomm, win, hidden, np.float32(eps))
        comm.synchronize()
        result = buf.get()
    return result, reference(inputs, eps)
