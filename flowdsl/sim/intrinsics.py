"""numba-cuda's integer, floating-point and warp intrinsics as the GPU computes them, for the simulator.

Each takes what a simulated kernel holds (NumPy scalars, or Python ints and floats, which numba types as
int64 and float64) and returns the type numba-cuda's typing gives: ``popc``, ``clz`` the argument's
type, ``brev`` its unsigned type of at least 32 bits, ``ffs`` and ``lanemask_lt`` uint32, ``fma`` and
``cbrt`` the float type. ``fma`` rounds once, as the instruction does (the product and sum exact, then
one rounding to the result type), which ``a * b + c`` in NumPy does not. The builtin ``round`` is numba-cuda's
(:func:`round_`), not NumPy's, whose float32 ``round(x, n)`` rounds ``x * 10**n`` in float32.
"""

from __future__ import annotations

import builtins
import math
from fractions import Fraction

import numpy as np

from .errors import UsageError, sim_error

__all__ = ["round_", "popc", "brev", "clz", "ffs", "fma", "cbrt", "selp", "lanemask_lt", "atomic_max", "atomic_min",
           "atomic_nanmax", "atomic_nanmin", "Fp16"]


def round_(x, ndigits=None):
    """The builtin ``round`` as numba-cuda lowers it for floats: alone, ``llrint`` of ``x`` as a double (an int,
    half to even); with ``ndigits``, CPython's fallback ``double_round`` in double precision whatever ``x``'s
    type (a float32 ``x`` is widened first, and the result narrowed back). Integers are Python's."""
    if not isinstance(x, (float, np.floating)):
        return builtins.round(x) if ndigits is None else builtins.round(x, ndigits)
    if ndigits is None:
        return int(np.rint(np.float64(x)))
    xd, n = float(x), int(ndigits)
    if math.isinf(xd) or math.isnan(xd):
        return x
    if n >= 0:
        pow1, pow2 = (10.0 ** (n - 22), 1e22) if n > 22 else (10.0 ** n, 1.0)
        y = (xd * pow1) * pow2
        if math.isinf(y):
            return x
    else:
        pow1 = 10.0 ** (-n)
        y = xd / pow1
    z = float(np.rint(y))
    if math.fabs(y - z) == 0.5:
        z = 2.0 * float(np.rint(y / 2.0))
    z = (z / pow2) / pow1 if n >= 0 else z * pow1
    return type(x)(z) if isinstance(x, np.floating) else z


def _integer(x, name):
    """(dtype, the bits of ``x`` as a non-negative int, width in bits) of an integer value."""
    if not isinstance(x, (int, np.integer)) or isinstance(x, bool):
        raise sim_error(UsageError, f"Cannot compute cuda.{name} of a {type(x).__name__}: it takes an integer, as "
                        "numba-cuda types it. Pass an integer")
    dtype = x.dtype if isinstance(x, np.integer) else np.dtype(np.int64)
    width = dtype.itemsize * 8
    return dtype, int(x) & ((1 << width) - 1), width


def popc(x):
    dtype, bits, _ = _integer(x, "popc")
    return dtype.type(bin(bits).count("1"))


def brev(x):
    dtype, bits, width = _integer(x, "brev")
    width = max(width, 32)
    return np.dtype(f"u{width // 8}").type(int(format(bits, f"0{width}b")[::-1], 2))


def clz(x):
    dtype, bits, width = _integer(x, "clz")
    return dtype.type(width - bits.bit_length())


def ffs(x):
    _, bits, _ = _integer(x, "ffs")
    return np.uint32((bits & -bits).bit_length())  # 1-based position of the lowest set bit; 0 for 0


def _float_type(*values):
    return np.float32 if all(isinstance(v, np.float32) for v in values) else np.float64


def _nearest(exact: Fraction, ftype):
    """``exact`` rounded once to ``ftype``, to nearest, ties to even."""
    with np.errstate(over="ignore"):
        guess = ftype(float(exact))  # within one unit of the answer (float() rounds to float64 first)
    if not np.isfinite(guess):
        return guess
    candidates = (np.nextafter(guess, ftype(-np.inf)), guess, np.nextafter(guess, ftype(np.inf)))
    finite = [c for c in candidates if np.isfinite(c)]

    def key(c):
        even = int(np.asarray(c).view(f"u{np.dtype(ftype).itemsize}")) & 1
        return abs(Fraction(float(c)) - exact), even
    return min(finite, key=key)


def _fused(a, b, c, ftype):
    """``a * b + c`` of three ``ftype`` values rounded once to ``ftype`` (the product and sum exact)."""
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        with np.errstate(invalid="ignore", over="ignore"):
            return ftype(np.float64(a) * np.float64(b) + np.float64(c))  # inf and nan: the same rules unfused
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if exact == 0:  # the sign of a zero result: as a * b + c gives it
        return ftype(np.float64(a) * np.float64(b) + np.float64(c))
    return _nearest(exact, ftype)


def fma(a, b, c):
    ftype = _float_type(a, b, c)
    return _fused(ftype(a), ftype(b), ftype(c), ftype)


def cbrt(a):
    ftype = _float_type(a)
    return ftype(np.cbrt(ftype(a)))


def selp(pred, a, b):
    return a if pred else b


def lanemask_lt(lane: int):
    return np.uint32((1 << lane) - 1)


# cuda.atomic's max and min on floats (numba-cuda's compare-and-swap loops): max and min leave memory as
# it is when either value is a NaN; nanmax and nanmin ignore a NaN argument and replace a NaN in memory.
def _isnan(v) -> bool:
    return isinstance(v, (float, np.floating)) and bool(np.isnan(v))


def atomic_max(old, val):
    return old if _isnan(old) or _isnan(val) or not old < val else val


def atomic_min(old, val):
    return old if _isnan(old) or _isnan(val) or not old > val else val


def atomic_nanmax(old, val):
    return old if _isnan(val) or not (_isnan(old) or old < val) else val


def atomic_nanmin(old, val):
    return old if _isnan(val) or not (_isnan(old) or old > val) else val


# ---- cuda.fp16: half-precision arithmetic, each operation rounded once to float16 ------------------------------

def _half(x) -> np.float16:
    """A float64 result to float16: NumPy rounds a double to half once, to nearest even. The double holds the
    exact sum, difference and product of two halves, and their quotient and square root round safely through
    it (53 >= 2 * 11 + 2 bits)."""
    with np.errstate(over="ignore", invalid="ignore"):  # beyond 65504: inf, as the GPU rounds it
        return np.float16(np.float64(x))


def _ordered(a, b) -> bool:
    return not (np.isnan(a) or np.isnan(b))


class Fp16:
    """``cuda.fp16`` on the simulator: ``hadd`` .. ``hdiv`` and ``hsqrt`` correctly rounded (as the GPU's
    half instructions), ``hfma`` rounded once, the comparisons ordered (a NaN makes them false, ``hne`` too,
    as ``__hne`` is), ``hmax``/``hmin`` return the other argument of a NaN (``__hmax``); the transcendental
    functions go through float32, as the GPU's do, and may differ from it in the last bit."""

    @staticmethod
    def hadd(a, b):
        return _half(np.float64(a) + np.float64(b))

    @staticmethod
    def hsub(a, b):
        return _half(np.float64(a) - np.float64(b))

    @staticmethod
    def hmul(a, b):
        return _half(np.float64(a) * np.float64(b))

    @staticmethod
    def hdiv(a, b):
        with np.errstate(divide="ignore", invalid="ignore"):
            return _half(np.float64(a) / np.float64(b))

    @staticmethod
    def hfma(a, b, c):
        return _fused(np.float16(a), np.float16(b), np.float16(c), np.float16)

    @staticmethod
    def hneg(a):
        return np.float16(-np.float16(a))

    @staticmethod
    def habs(a):
        return np.float16(abs(np.float16(a)))

    @staticmethod
    def hsqrt(x):
        with np.errstate(invalid="ignore"):
            return _half(np.sqrt(np.float64(x)))

    @staticmethod
    def hrsqrt(x):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.float16(np.float32(1) / np.sqrt(np.float32(x)))

    @staticmethod
    def hrcp(x):
        with np.errstate(divide="ignore"):
            return _half(1.0 / np.float64(x))

    @staticmethod
    def heq(a, b):
        return bool(_ordered(a, b) and a == b)

    @staticmethod
    def hne(a, b):
        return bool(_ordered(a, b) and a != b)

    @staticmethod
    def hge(a, b):
        return bool(_ordered(a, b) and a >= b)

    @staticmethod
    def hgt(a, b):
        return bool(_ordered(a, b) and a > b)

    @staticmethod
    def hle(a, b):
        return bool(_ordered(a, b) and a <= b)

    @staticmethod
    def hlt(a, b):
        return bool(_ordered(a, b) and a < b)

    @staticmethod
    def hmax(a, b):
        return _pick(np.float16(a), np.float16(b), larger=True)

    @staticmethod
    def hmin(a, b):
        return _pick(np.float16(a), np.float16(b), larger=False)


def _pick(a, b, larger: bool):
    """``__hmax`` / ``__hmin``: a NaN gives the other argument; +0 counts above -0."""
    if np.isnan(a) or np.isnan(b):
        return b if np.isnan(a) else a
    if a == b == 0:
        return a if np.signbit(a) != larger else b
    return a if (a > b) == larger else b


def _through_float32(fn):
    def f(x):
        with np.errstate(all="ignore"):
            return np.float16(fn(np.float32(x)))
    return staticmethod(f)


def _quiet(fn):
    """IEEE's exceptions (overflow to inf, 0 * inf = NaN) are results on the GPU, not warnings."""
    def f(*args):
        with np.errstate(all="ignore"):
            return fn(*args)
    f.__name__ = fn.__name__
    return staticmethod(f)


for _name in ("hadd", "hsub", "hmul", "hdiv", "hfma", "hneg", "habs", "hsqrt", "hrsqrt", "hrcp", "heq", "hne", "hge",
              "hgt", "hle", "hlt", "hmax", "hmin"):
    setattr(Fp16, _name, _quiet(getattr(Fp16, _name)))

for _name, _fn in (("hsin", np.sin), ("hcos", np.cos), ("hlog", np.log), ("hlog2", np.log2), ("hlog10", np.log10),
                   ("hexp", np.exp), ("hexp2", np.exp2), ("hexp10", lambda x: np.float32(10) ** x),
                   ("hceil", np.ceil), ("hfloor", np.floor), ("htrunc", np.trunc), ("hrint", np.rint)):
    setattr(Fp16, _name, _through_float32(_fn))
