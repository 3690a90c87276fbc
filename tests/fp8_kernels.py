"""A kernel that runs :func:`flowdsl.flow.combine` on fp8 codes, for the compile and GPU tests."""

from __future__ import annotations

from numba import cuda

import flowdsl
from flowdsl import flow


@flowdsl.kernel
def fp8_combine(a, b, out, op, fmt):
    """``out[i] = combine(op, a[i], b[i])`` for fp8 codes of format ``fmt`` (run-time operator and format)."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = flow.combine(op, a[i], b[i], fmt)
