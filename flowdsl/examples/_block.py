"""Device functions the examples share: a block-wide sum, and RMSNorm of one token by a block."""

from __future__ import annotations

import math

from numba import cuda, float32

import flowdsl
from flowdsl import flow

__all__ = ["block_sum", "rms_normalize"]


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


@flowdsl.device
def rms_normalize(partial, token, hidden, eps):
    """``token`` (``hidden`` elements) divided by its root mean square, in place, by the block: float32
    arithmetic, rounded to the element type once (``flow.from_float``); ``partial``: :func:`block_sum`'s
    scratch."""
    sq = float32(0.0)
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        x = flow.to_float(token[i])
        sq += x * x
    scale = float32(1.0) / math.sqrt(block_sum(partial, sq) / float32(hidden) + eps)
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        token[i] = flow.from_float(flow.to_float(token[i]) * scale, token[i])
