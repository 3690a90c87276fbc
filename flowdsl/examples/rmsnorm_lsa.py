"""Fused ReduceScatter + RMSNorm + AllGather in one kernel, over LSA.

A flowdsl port of NCCL's ``docs/examples/07_kernel_fusion/01_rmsnorm_lsa``.
Every rank holds a ``(tokens, hidden)`` tensor of partial sums in a symmetric
window: float32, float16, or bfloat16 (stored as its bits in uint16, as NCCL and
PyTorch store it). Block ``b`` of rank ``r`` owns token ``r * grid + b``: it
sums that token over all LSA ranks, normalises it by its root mean square,
and writes the result back into every rank's window. Afterwards every rank
holds ``rmsnorm(sum over ranks of the input)``. The arithmetic is float32 for
every element type (``flow.to_float``); results are rounded to the element type
once per phase (``flow.from_float``), as a bfloat16 ReduceScatter would return
its sum.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

import flowdsl
from flowdsl import MemoryOrder, coop, flow, lsa
from flowdsl.examples._block import rms_normalize

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
        acc = flow.to_float(mine[i])
        for peer in range(comm.lsa_size):
            if peer != comm.lsa_rank:
                acc += flow.to_float(lsa.lsa_view(win, peer, token * hidden, hidden)[i])
        mine[i] = flow.from_float(acc, mine[i])
    cta.sync()

    # Phase 2: RMSNorm of the reduced token (block-wide sum of squares).
    rms_normalize(partial, mine, hidden, eps)
    cta.sync()

    # Phase 3: all-gather. Write the normalised token into every rank's window.
    for peer in range(comm.lsa_size):
        if peer != comm.lsa_rank:
            out = lsa.lsa_view(win, peer, token * hidden, hidden)
            for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
                out[i] = mine[i]
    # Release: our writes are visible to the peers once they pass the barrier.
    bar.sync(MemoryOrder.RELEASE)


#: Element types of the example: the window's NumPy dtype, and how float32 values become its elements.
ELEMENT_TYPES = ("float32", "float16", "bfloat16")


def to_elements(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``x`` as the window's elements: rounded to nearest even (bfloat16 as uint16 bits)."""
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return x.astype(np.dtype(dtype))


def to_float32(elements: np.ndarray, dtype: str) -> np.ndarray:
    """The window's elements as float32 (exact)."""
    if dtype == "bfloat16":
        return (elements.astype(np.uint32) << 16).view(np.float32)
    return elements.astype(np.float32)


def reference(inputs: list[np.ndarray], eps: float) -> np.ndarray:
    """NumPy reference: rmsnorm(sum of the ranks' inputs), row by row, in float64."""
    total = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    rms = np.sqrt(np.mean(total * total, axis=1, keepdims=True) + eps)
    return total / rms


#: How close each element type's result comes to the float64 reference: the inputs are exact in the element
#: type, the sum and the normalised value are rounded to it once each (a relative 2**-8 for bfloat16, 2**-11
#: for float16), the sum of squares is float32.
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def run(comm, tokens_per_rank: int = 8, hidden: int = 512, eps: float = 1e-6, seed: int = 0,
        dtype: str = "float32"):
    """Run the fused kernel on ``comm`` with elements of ``dtype`` (one of :data:`ELEMENT_TYPES`); return
    ``(result, reference)`` for this rank, both float32 arrays (the reference from the rounded inputs)."""
    return run_window_rmsnorm(rmsnorm_lsa, comm, tokens_per_rank, hidden, eps, seed, dtype)


def run_window_rmsnorm(kernel, comm, tokens_per_rank, hidden, eps, seed, dtype, **options):
    """Run ``kernel`` (:func:`rmsnorm_lsa`'s arguments, a block a token) on ``comm`` over a window of random
    inputs of ``dtype``, with a device communicator of an LSA barrier per block and ``options``; return
    ``(result, reference)`` for this rank, as :func:`run` does."""
    if dtype not in ELEMENT_TYPES:
        raise flowdsl.UsageError(f"Cannot run the RMSNorm example with dtype {dtype!r}: choose one of {ELEMENT_TYPES}")
    tokens = tokens_per_rank * comm.nranks
    rng = np.random.default_rng(seed)
    inputs = [to_elements(rng.standard_normal((tokens, hidden)).astype(np.float32), dtype)
              for _ in range(comm.nranks)]
    buf = comm.alloc((tokens, hidden), inputs[0].dtype)
    buf.set(inputs[comm.rank])
    with comm.register(buf) as win, \
            comm.device_communicator(lsa_barrier_count=tokens_per_rank, **options) as dcomm:
        kernel[tokens_per_rank, THREADS](dcomm, win, hidden, np.float32(eps))
        comm.synchronize()
        result = to_float32(buf.get(), dtype)
    return result, reference([to_float32(x, dtype) for x in inputs], eps).astype(np.float32)

if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("rmsnorm_lsa", run,
               "reduce-scatter, RMSNorm and all-gather fused in one LSA kernel (NCCL's 07 01_rmsnorm_lsa)")
