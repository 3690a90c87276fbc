"""Kernels and inputs that several GPU test modules launch."""

from __future__ import annotations

import numpy as np
from numba import cuda

import flowdsl


@flowdsl.kernel
def scale_shift(x, y, a, b):
    """``y = a * x + b``, one element a thread."""
    i = cuda.grid(1)
    if i < y.size:
        y[i] = a * x[i] + b


def random_values(seed: int, n: int) -> np.ndarray:
    """``n`` float32 standard normal values from ``seed``."""
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)
