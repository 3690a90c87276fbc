"""fp8 (e4m3fn, e5m2) by table: every code's value, and rounding to the nearest code.

The meaning of fp8 for the simulator and the reference the tests compare with; the GPU
converts by bit arithmetic instead (``lowering/flow.py``), so the tests check
one against the other. Rounding is to nearest, ties to the even code, saturating at
the largest finite value (NCCL's reductions convert with ``__NV_SATFINITE``); NaN
stays NaN.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["E4M3", "E5M2", "values", "to_fp8", "from_fp8"]

#: Format codes (also the ``fp8`` field of :class:`flowdsl.flow.Reduction`).
E4M3, E5M2 = 1, 2
_SHAPE = {E4M3: (4, 3, 7), E5M2: (5, 2, 15)}  # exponent bits, mantissa bits, bias


@functools.cache
def values(fmt: int) -> np.ndarray:
    """float64 value of each of the 256 codes (NaN for NaN codes; e5m2 has infinities)."""
    ebits, mbits, bias = _SHAPE[fmt]
    out = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
        if fmt == E4M3 and e == 15 and m == 7:
            v = np.nan
        elif fmt == E5M2 and e == 31:
            v = np.inf if m == 0 else np.nan
        elif e == 0:
            v = m * 2.0 ** (1 - bias - mbits)
        else:
            v = (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
        out[code] = sign * v
    return out


@functools.cache
def _finite(fmt: int):
    v = values(fmt)
    codes = np.array([c for c in range(128) if np.isfinite(v[c])])
    order = np.argsort(v[codes])
    return v[codes][order], codes[order]


def to_fp8(x, fmt: int) -> np.ndarray:
    """Nearest fp8 codes (uint8) of float values ``x``."""
    x = np.asarray(x, np.float64)
    mags, codes = _finite(fmt)
    a = np.minimum(np.abs(x), mags[-1])  # saturate
    hi = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
    lo = hi - 1
    dlo, dhi = a - mags[lo], mags[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (codes[hi] % 2 == 0))
    code = np.where(pick_hi, codes[hi], codes[lo]).astype(np.uint8)
    code = np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)


def from_fp8(codes, fmt: int) -> np.ndarray:
    """float64 values of fp8 codes."""
    return values(fmt)[np.asarray(codes, np.uint8)]
