"""Fused ReduceScatter + RMSNorm + AllGather in one kernel, over multimem (NVLink SHARP).

:mod:`flowdsl.examples.rmsnorm_lsa`'s kernel with the LSA team reached through its multicast address
(NCCL's ``07_kernel_fusion/02_rmsnorm_multimem`` is this example's NCCL counterpart). Every rank holds a
``(tokens, hidden)`` tensor of partial sums in a symmetric window: float32, float16, or bfloat16 (its bits
in uint16). Block ``b`` of rank ``r`` owns token ``r * grid + b``:

1. Reduce-scatter: one ``multimem.ld_reduce`` per 16 bytes of the token returns the sum over every LSA
   rank's copy, added in the switch (16-bit floats in float32, rounded once, as the LSA example rounds
   its sum); the block writes it to its own copy.
2. RMSNorm of the summed token, in place (the LSA example's, unchanged).
3. All-gather: one ``multimem.st`` per 16 bytes writes the normalised token into every LSA rank's copy.

Where the LSA example loads ``lsa_size`` times per element and stores ``lsa_size - 1`` times, this one
loads and stores once per 16 bytes. The LSA barrier opens and closes the kernel as there. The device
communicator is made with ``lsa_multimem=True``: refused where the GPUs have no NVLink SHARP (the
simulator models a switch with ``spawn(..., multimem=True)``).
"""

from __future__ import annotations

from numba import cuda, float32

import flowdsl
from flowdsl import MemoryOrder, RedOp, coop, lsa, mem
from flowdsl.examples._block import rms_normalize
from flowdsl.examples.rmsnorm_lsa import ELEMENT_TYPES, TOLERANCE, THREADS, run_window_rmsnorm

__all__ = ["rmsnorm_multimem", "run", "THREADS", "ELEMENT_TYPES", "TOLERANCE"]


@flowdsl.kernel
def rmsnorm_multimem(comm, win, hidden, eps):
    partial = cuda.shared.array(THREADS, float32)
    cta = coop.cta()
    bar = lsa.barrier(comm, cta, cuda.blockIdx.x)
    # Every rank's input must be in place before the switch reads it.
    bar.sync(MemoryOrder.ACQUIRE)

    token = comm.rank * cuda.gridDim.x + cuda.blockIdx.x
    mine = lsa.local_view(win, token * hidden, hidden)
    every = lsa.multimem_view(comm, win, token * hidden, hidden)  # the token in every LSA rank's window
    lanes = 16 // mem.itemsize(mine)

    # Phase 1: reduce-scatter. One load per 16 bytes sums the token over all LSA ranks.
    for i in range(cuda.threadIdx.x * lanes, hidden, cuda.blockDim.x * lanes):
        mem.store_vec(mine, i, mem.multimem_ld_reduce_vec(every, i, RedOp.SUM))
    cta.sync()

    # Phase 2: RMSNorm of the reduced token (block-wide sum of squares).
    rms_normalize(partial, mine, hidden, eps)
    cta.sync()

    # Phase 3: all-gather. One store per 16 bytes writes the normalised token into every LSA rank's window.
    for i in range(cuda.threadIdx.x * lanes, hidden, cuda.blockDim.x * lanes):
        mem.multimem_store_vec(every, i, mem.load_vec(mine, i))
    # Release: the stores are visible to the peers once they pass the barrier.
    bar.sync(MemoryOrder.RELEASE)


def run(comm, tokens_per_rank: int = 8, hidden: int = 512, eps: float = 1e-6, seed: int = 0,
        dtype: str = "float32"):
    """Run the fused kernel on ``comm`` with elements of ``dtype`` (one of :data:`ELEMENT_TYPES`); return
    ``(result, reference)`` for this rank, both float32 arrays (the reference from the rounded inputs).
    ``hidden`` elements must fill whole 16-byte accesses (a multiple of 4 for float32, 8 for 16-bit floats)."""
    if dtype not in ELEMENT_TYPES:
        raise flowdsl.UsageError(f"Cannot run the RMSNorm example with dtype {dtype!r}: choose one of {ELEMENT_TYPES}")
    lanes = 16 // (4 if dtype == "float32" else 2)
    if hidden % lanes:
        raise flowdsl.UsageError(f"Cannot run the multimem RMSNorm example with hidden={hidden} {dtype} elements: "
                                 f"each token moves in 16-byte multimem accesses. Use a multiple of {lanes}")
    return run_window_rmsnorm(rmsnorm_multimem, comm, tokens_per_rank, hidden, eps, seed, dtype, lsa_multimem=True)


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("rmsnorm_multimem", run, "reduce-scatter, RMSNorm and all-gather fused in one kernel over multimem "
               "(NVLink SHARP; NCCL's 07 02_rmsnorm_multimem)", multimem=True)
