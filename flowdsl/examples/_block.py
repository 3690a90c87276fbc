"""A device function the examples share: a block-wide sum."""

from __future__ import annotations

from numba import cuda

import flowdsl

__all__ = ["block_sum"]


@flowdsl.device
def block_sum(partial, value):
    """``value`` summed over the block's threads, for every thread; ``partial``: shared scratch of a slot per
    thread (a power of two of them), of the sum's type."""
    t = cuda.threadIdx.x
    partial[t] = value
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if t < stride:
            partial[t] += partial[t + stride]
        cuda.syncthreads()
        stride //= 2
    total = partial[0]
    cuda.syncthreads()  # every thread has read it before the scratch is written again
    return total
