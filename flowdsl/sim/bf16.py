"""``numba.cuda.bf16`` on the simulator: bfloat16 values and the functions numba-cuda binds from ``cuda_bf16.h``.

NumPy has no bfloat16, so a value is a :class:`BFloat16` holding its 16 bits. Every result is rounded as
the GPU rounds it: conversions by their mode (``_rn`` to nearest even, ``_rz``, ``_rd``, ``_ru``),
arithmetic correctly rounded to nearest even (the exact sum, difference, product and fused multiply-add
of bfloat16 values, and their quotient and square root, round safely through a double: 53 >= 2 * 8 + 2
bits), comparisons ordered (a NaN makes them false) or unordered (``hequ`` .. : true), ``hmax``/``hmin``
returning the other argument of a NaN (``hmax_nan``/``hmin_nan`` the NaN), the ``_sat`` forms clamped to
[0, 1] (NaN to 0). The transcendental functions go through float32, as the GPU's do, and may differ from it
in the last bit at a halfway point. A kernel uses it as numba-cuda's: ``from numba.cuda import bf16``.
"""

from __future__ import annotations

import math
import operator
from fractions import Fraction

import numpy as np

__all__ = ["BFloat16", "SimBf16"]

_NAN_BITS = 0x7FFF  # the canonical NaN that the GPU's conversions produce


def _f32(bits: int) -> np.float32:
    return np.array(np.uint32((bits & 0xFFFF) << 16)).view(np.float32)[()]


_MAX = Fraction(float(_f32(0x7F7F)))  # the largest finite bfloat16
_MIN_QUANTUM = Fraction(1, 2 ** 133)  # the spacing of bfloat16's subnormals (float32's exponent range)


def _round(x, mode: str = "rn") -> "BFloat16":
    """The bfloat16 nearest ``x`` (a float, int or Fraction; NaN and infinities as they are) by ``mode``."""
    if isinstance(x, (float, np.floating)):
        if math.isnan(x):
            return BFloat16(_NAN_BITS)
        if math.isinf(x):
            return BFloat16(0x7F80 if x > 0 else 0xFF80)
        if x == 0:
            return BFloat16(0x8000 if math.copysign(1.0, float(x)) < 0 else 0)
    exact = Fraction(x) if not isinstance(x, Fraction) else x
    if exact == 0:
        return BFloat16(0)
    sign = -1 if exact < 0 else 1
    magnitude = abs(exact)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1  # now 2**exponent <= magnitude < 2**(exponent + 1)
    quantum = max(Fraction(2) ** (exponent - 7), _MIN_QUANTUM)
    steps = magnitude / quantum
    floor = steps.numerator // steps.denominator
    if mode == "rz" or (mode == "rd" and sign > 0) or (mode == "ru" and sign < 0):
        n = floor
    elif mode in ("rd", "ru"):
        n = floor if steps == floor else floor + 1
    else:  # to nearest, ties to even
        rest = steps - floor
        n = floor + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2) else 0)
    value = n * quantum
    if value > _MAX:  # past the largest finite value: infinity when rounding away, else the largest
        toward_zero = mode == "rz" or (mode == "rd" and sign > 0) or (mode == "ru" and sign < 0)
        value = _MAX if toward_zero else None
    if value is None:
        return BFloat16(0x7F80 if sign > 0 else 0xFF80)
    bits = int(np.array(np.float32(float(sign * value))).view(np.uint32)[()]) >> 16
    if value == 0 and sign < 0:
        bits = 0x8000
    return BFloat16(bits)


def _operator(op, reflected: bool = False):
    """A method of :class:`BFloat16`: ``op`` of the two values, rounded once (``reflected``: ``other op self``)."""
    if reflected:
        return lambda self, other: _arith(other, self, op)
    return lambda self, other: _arith(self, other, op)


def _via(name: str):
    """A method of :class:`BFloat16` that is ``bf16.<name>`` of the two values."""
    return lambda self, other: getattr(SimBf16, name)(self, other)


class BFloat16:
    """A bfloat16 value on the simulator: its bits; its arithmetic rounds as the GPU's (``__hadd`` ...)."""

    __slots__ = ("bits",)

    def __init__(self, bits: int):
        self.bits = int(bits) & 0xFFFF

    def __float__(self) -> float:
        return float(_f32(self.bits))

    def f32(self) -> np.float32:
        return _f32(self.bits)

    def isnan(self) -> bool:
        return (self.bits & 0x7FFF) > 0x7F80

    def __repr__(self):
        return f"bfloat16({float(self)!r})"

    # numba-cuda's operators are cuda_bf16.h's: each rounds once (``a * b + c`` twice, as __hmul then __hadd).
    __add__, __radd__ = _operator(operator.add), _operator(operator.add, reflected=True)
    __sub__, __rsub__ = _operator(operator.sub), _operator(operator.sub, reflected=True)
    __mul__, __rmul__ = _operator(operator.mul), _operator(operator.mul, reflected=True)
    __truediv__ = _via("hdiv")
    __eq__, __ne__, __lt__ = _via("heq"), _via("hne"), _via("hlt")
    __le__, __gt__, __ge__ = _via("hle"), _via("hgt"), _via("hge")

    def __neg__(self):
        return BFloat16(self.bits ^ 0x8000)

    def __abs__(self):
        return BFloat16(self.bits & 0x7FFF)

    __hash__ = None


def _as_bf16(x) -> BFloat16:
    return x if isinstance(x, BFloat16) else _round(float(x))


def _arith(a, b, op) -> BFloat16:
    """``op`` of two bfloat16 values rounded once (NaN and infinities by float64's rules, then rounded)."""
    a, b = _as_bf16(a), _as_bf16(b)
    fa, fb = float(a), float(b)
    if not (math.isfinite(fa) and math.isfinite(fb)):
        with np.errstate(invalid="ignore", over="ignore"):
            return _round(float(op(np.float64(fa), np.float64(fb))))
    exact = op(Fraction(fa), Fraction(fb))
    if exact == 0:  # the sign of a zero: as the double operation gives it
        return _round(float(op(np.float64(fa), np.float64(fb))))
    return _round(exact)


def _ordered(a, b) -> bool:
    return not (_as_bf16(a).isnan() or _as_bf16(b).isnan())


def _float32_function(fn):
    def apply(x):
        with np.errstate(all="ignore"):
            return _round(float(fn(np.float32(float(_as_bf16(x))))))
    return staticmethod(apply)


def _sat(x: BFloat16) -> BFloat16:
    """Clamped to [0, 1] (NaN to 0), as the ``_sat`` forms."""
    if x.isnan() or float(x) <= 0:
        return BFloat16(0)
    return BFloat16(0x3F80) if float(x) > 1 else x


def _to_int(kind, mode):
    """``bfloat16_to_<kind>_<mode>``: the value rounded by ``mode`` to an integer of ``kind``, saturating; NaN 0."""
    dtype = np.dtype(kind)
    info = np.iinfo(dtype)

    def convert(x):
        x = _as_bf16(x)
        if x.isnan():
            return dtype.type(0)
        f = float(x)
        if math.isinf(f):
            return dtype.type(info.max if f > 0 else info.min)
        n = {"rn": lambda v: int(round(v)), "rz": math.trunc, "rd": math.floor, "ru": math.ceil}[mode](f)
        return dtype.type(min(max(n, info.min), info.max))
    return staticmethod(convert)


def _from_int(mode):
    return staticmethod(lambda n: _round(Fraction(int(n)), mode))


def _from_float(mode):
    return staticmethod(lambda x: _round(float(x), mode))


def _bits_as(kind):
    return staticmethod(lambda x: np.dtype(kind).type(np.array(np.uint16(_as_bf16(x).bits)).view(kind)[()]))


def _from_bits(kind):
    return staticmethod(lambda b: BFloat16(int(np.array(np.dtype(kind).type(b)).view(np.uint16)[()])))


def _pick_max(a: BFloat16, b: BFloat16) -> BFloat16:
    fa, fb = float(a), float(b)
    if fa == fb == 0:  # +0 is the larger zero
        return a if not (a.bits & 0x8000) else b
    return a if fa > fb else b


def _pick_min(a: BFloat16, b: BFloat16) -> BFloat16:
    fa, fb = float(a), float(b)
    if fa == fb == 0:
        return a if a.bits & 0x8000 else b
    return a if fa < fb else b


def _compare(op, unordered: bool):
    def compare(a, b):
        if not _ordered(a, b):
            return unordered
        return op(float(_as_bf16(a)), float(_as_bf16(b)))
    return staticmethod(compare)


def _extremum(pick, nan_wins: bool):
    """``pick`` of two bfloat16 values; with a NaN argument the other one (``nan_wins``: the NaN)."""
    def extremum(a, b):
        a, b = _as_bf16(a), _as_bf16(b)
        if a.isnan() or b.isnan():
            if nan_wins or (a.isnan() and b.isnan()):
                return BFloat16(_NAN_BITS)
            return b if a.isnan() else a
        return pick(a, b)
    return staticmethod(extremum)



class SimBf16:
    """The simulated ``numba.cuda.bf16`` module."""

    @staticmethod
    def bfloat16(x):
        return _as_bf16(x)

    @staticmethod
    def bfloat16_to_float32(x):
        return _as_bf16(x).f32()

    bfloat162float = bfloat16_to_float32
    float32_to_bfloat16 = float2bfloat16 = float32_to_bfloat16_rn = float2bfloat16_rn = _from_float("rn")
    float32_to_bfloat16_rz = float2bfloat16_rz = _from_float("rz")
    float32_to_bfloat16_rd = float2bfloat16_rd = _from_float("rd")
    float32_to_bfloat16_ru = float2bfloat16_ru = _from_float("ru")
    float64_to_bfloat16 = double2bfloat16 = _from_float("rn")

    bfloat16_as_int16 = bfloat16_as_short = _bits_as("int16")
    bfloat16_as_uint16 = bfloat16_as_ushort = _bits_as("uint16")
    int16_as_bfloat16 = short_as_bfloat16 = _from_bits("int16")
    uint16_as_bfloat16 = ushort_as_bfloat16 = _from_bits("uint16")

    @staticmethod
    def hadd(a, b):
        return _arith(a, b, lambda x, y: x + y)

    @staticmethod
    def hsub(a, b):
        return _arith(a, b, lambda x, y: x - y)

    @staticmethod
    def hmul(a, b):
        return _arith(a, b, lambda x, y: x * y)

    hadd_rn, hsub_rn, hmul_rn = hadd, hsub, hmul  # never contracted into an fma: the same value here

    @staticmethod
    def hdiv(a, b):
        fa, fb = float(_as_bf16(a)), float(_as_bf16(b))
        with np.errstate(divide="ignore", invalid="ignore"):
            return _round(float(np.float64(fa) / np.float64(fb)))

    @staticmethod
    def hfma(a, b, c):
        a, b, c = _as_bf16(a), _as_bf16(b), _as_bf16(c)
        if not all(math.isfinite(float(v)) for v in (a, b, c)):
            with np.errstate(invalid="ignore", over="ignore"):
                return _round(float(np.float64(float(a)) * float(b) + float(c)))
        exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
        if exact == 0:
            return _round(float(np.float64(float(a)) * float(b) + float(c)))
        return _round(exact)

    @staticmethod
    def hadd_sat(a, b):
        return _sat(SimBf16.hadd(a, b))

    @staticmethod
    def hsub_sat(a, b):
        return _sat(SimBf16.hsub(a, b))

    @staticmethod
    def hmul_sat(a, b):
        return _sat(SimBf16.hmul(a, b))

    @staticmethod
    def hfma_sat(a, b, c):
        return _sat(SimBf16.hfma(a, b, c))

    @staticmethod
    def hfma_relu(a, b, c):
        r = SimBf16.hfma(a, b, c)
        return r if r.isnan() or float(r) > 0 else BFloat16(0)

    @staticmethod
    def hneg(a):
        return -_as_bf16(a)

    @staticmethod
    def habs(a):
        return abs(_as_bf16(a))

    # Ordered comparisons (a NaN makes them false) and unordered ones (a NaN makes them true).
    heq, hne, hlt = _compare(operator.eq, False), _compare(operator.ne, False), _compare(operator.lt, False)
    hle, hgt, hge = _compare(operator.le, False), _compare(operator.gt, False), _compare(operator.ge, False)
    hequ, hneu, hltu = _compare(operator.eq, True), _compare(operator.ne, True), _compare(operator.lt, True)
    hleu, hgtu, hgeu = _compare(operator.le, True), _compare(operator.gt, True), _compare(operator.ge, True)
    # With one NaN argument the other (__hmax), or the NaN (__hmax_nan).
    hmax, hmin = _extremum(_pick_max, nan_wins=False), _extremum(_pick_min, nan_wins=False)
    hmax_nan, hmin_nan = _extremum(_pick_max, nan_wins=True), _extremum(_pick_min, nan_wins=True)

    @staticmethod
    def hisnan(a):
        return _as_bf16(a).isnan()

    @staticmethod
    def hisinf(a):
        f = float(_as_bf16(a))
        return np.int32(0 if not math.isinf(f) else (1 if f > 0 else -1))

    @staticmethod
    def hsqrt(x):
        with np.errstate(invalid="ignore"):
            return _round(float(np.sqrt(np.float64(float(_as_bf16(x))))))

    @staticmethod
    def hrcp(x):
        with np.errstate(divide="ignore"):
            return _round(float(1.0 / np.float64(float(_as_bf16(x)))))



#: Functions computed on the value as a float32, then rounded: exact where the result is a bfloat16 already
#: (trunc, ceil, floor, rint); the others through float32 as the GPU's (whose float32 functions may differ from
#: NumPy's in the last float32 bit: it shows only where the two land on either side of a halfway point).
for _name, _fn in (("htrunc", np.trunc), ("hceil", np.ceil), ("hfloor", np.floor), ("hrint", np.rint),
                   ("hrsqrt", lambda v: np.float32(1) / np.sqrt(v)), ("hexp", np.exp), ("hexp2", np.exp2),
                   ("hexp10", lambda v: np.power(np.float32(10), v)), ("hlog", np.log), ("hlog2", np.log2),
                   ("hlog10", np.log10), ("hsin", np.sin), ("hcos", np.cos), ("htanh", np.tanh),
                   ("htanh_approx", np.tanh)):
    setattr(SimBf16, _name, _float32_function(_fn))


for _kind, _names in (("int8", ("char",)), ("int16", ("short",)), ("int32", ("int",)), ("int64", ("ll",)),
                      ("uint8", ("uchar",)), ("uint16", ("ushort",)), ("uint32", ("uint",)), ("uint64", ("ull",))):
    for _mode in ("rn", "rz", "rd", "ru"):
        setattr(SimBf16, f"bfloat16_to_{_kind}_{_mode}", _to_int(_kind, _mode))
        setattr(SimBf16, f"bfloat162{_names[0]}_{_mode}", _to_int(_kind, _mode))
        setattr(SimBf16, f"{_kind}_to_bfloat16_{_mode}", _from_int(_mode))
        setattr(SimBf16, f"{_names[0]}2bfloat16_{_mode}", _from_int(_mode))
