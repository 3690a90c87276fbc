"""GPU meaning of Flow's element arithmetic (:func:`flowdsl.flow.combine`, :func:`flowdsl.flow.finish`)
and of its strong signal (:func:`flowdsl.flow.strong_signal_inc`, per NCCL release).

The Python bodies in ``flowdsl/flow.py`` are what the simulator runs; here each is
overloaded per element type so the result keeps the element's type (an ``int8``
sum wraps in 8 bits, a ``float16`` product rounds to half). uint16 elements are
bfloat16 bits: they are widened to float32, combined, and rounded back to nearest
even (NCCL has no uint16, NumPy no bfloat16). uint8 elements are fp8 (e4m3fn or
e5m2) when the reduction says so, converted by bit arithmetic here and by table in
``flowdsl/_fp8.py`` (the tests hold one against the other).

Contents: :func:`bind`.
"""

from __future__ import annotations

import math

from numba import float32, int32, uint8, uint16, uint64
from numba.core import types
from numba.core.errors import NumbaTypeError
from numba.cuda.extending import overload, register_jitable

from .. import gin, mem
from ..enums import RedOp
from .gin_surface import STRONG_SIGNAL_FEATURE
from .intrinsics import feature_marker
from .target import current, note_feature

__all__ = ["bind"]

_PROD, _MIN, _MAX, _AVG = int(RedOp.PROD), int(RedOp.MIN), int(RedOp.MAX), int(RedOp.AVG)


def _apply(op, a, b):
    if op == _PROD:
        return a * b
    if op == _MIN:
        return a if a < b else b
    if op == _MAX:
        return a if a > b else b
    return a + b


def _bf16_to_float(bits):
    return mem.from_bits(mem.to_bits(bits) << uint64(16), float32)


def _float_to_bf16(value):
    bits = mem.to_bits(float32(value))
    if (bits & uint64(0x7FFFFFFF)) > uint64(0x7F800000):
        return uint16((bits >> uint64(16)) | uint64(0x40))
    return uint16((bits + uint64(0x7FFF) + ((bits >> uint64(16)) & uint64(1))) >> uint64(16))


# fp8: (exponent bits, mantissa bits, bias, largest finite value, its code). e4m3fn has no
# infinities (0x7F is NaN); e5m2 is IEEE-like.
_E4M3, _E5M2 = 1, 2


def _fp8_to_float(code, fmt):
    """float32 value of an fp8 code (bit arithmetic; ``flowdsl/_fp8.py`` is the table it must match)."""
    c = int32(code)
    negative = (c & 0x80) != 0
    if fmt == _E4M3:
        e, m = (c >> 3) & 0xF, c & 7
        if e == 15 and m == 7:
            return float32(math.nan)
        v = math.ldexp(float32(m), -9) if e == 0 else math.ldexp(float32(8 + m), e - 10)
    else:
        e, m = (c >> 2) & 0x1F, c & 3
        if e == 31:
            return float32(math.nan) if m != 0 else (float32(-math.inf) if negative else float32(math.inf))
        v = math.ldexp(float32(m), -16) if e == 0 else math.ldexp(float32(4 + m), e - 17)
    return float32(-v) if negative else float32(v)


def _float_to_fp8(value, fmt):
    """Nearest fp8 code of a float32: ties to the even code, saturating at the largest finite."""
    x = float32(value)
    sign = uint8(0x80) if (mem.to_bits(x) >> uint64(31)) != uint64(0) else uint8(0)
    if x != x:
        return uint8(uint8(0x7F) | sign)
    mbits, emin, largest, largest_code = (3, -6, float32(448.0), 0x7E) if fmt == _E4M3 else \
        (2, -14, float32(57344.0), 0x7B)
    bias = 7 if fmt == _E4M3 else 15
    a = abs(x)
    if a >= largest:
        return uint8(uint8(largest_code) | sign)
    e = max(int32((mem.to_bits(a) >> uint64(23)) & uint64(0xFF)) - 127, emin)
    steps = round(math.ldexp(a, mbits - e))  # a in units of the spacing at exponent e, to even
    if steps >= (2 << mbits):  # rounded up into the next binade
        e += 1
        steps = steps // 2
    if e > emin or steps >= (1 << mbits):  # normal
        code = ((e + bias) << mbits) | (steps - (1 << mbits))
    else:
        code = steps
    if code > largest_code:
        code = largest_code
    return uint8(uint8(code) | sign)


def _element(op, ty):
    if not isinstance(ty, (types.Integer, types.Float)):
        raise NumbaTypeError(f"flowdsl.flow.{op} requires integer or float elements, got {ty}")


def bind():
    """Register the overloads (idempotent through :func:`flowdsl.lowering.surface.bind`)."""
    from .. import flow  # noqa: PLC0415 (flow imports the kernel decorator, which imports lowering)

    apply = register_jitable(_apply)
    to_float = register_jitable(_bf16_to_float)
    to_bf16 = register_jitable(_float_to_bf16)

    fp8_to_float = register_jitable(_fp8_to_float)
    float_to_fp8 = register_jitable(_float_to_fp8)

    @overload(flow.combine)
    def _combine(op, a, b, fp8=0):
        _element("combine", a)
        if a == types.uint16:
            return lambda op, a, b, fp8=0: to_bf16(apply(op, to_float(a), to_float(b)))
        ty = a
        if a == types.float16:  # in float32 (exact for one operation, then rounded once)
            return lambda op, a, b, fp8=0: ty(apply(op, float32(a), float32(b)))
        if a == types.uint8:
            def byte(op, a, b, fp8=0):
                if fp8 != 0:
                    return float_to_fp8(apply(op, fp8_to_float(a, fp8), fp8_to_float(b, fp8)), fp8)
                return ty(apply(op, a, b))
            return byte
        return lambda op, a, b, fp8=0: ty(apply(op, a, b))

    @overload(flow.strong_signal_inc)
    def _strong_signal_inc(signal):
        target = current()
        note_feature(STRONG_SIGNAL_FEATURE)  # refused at launch on a weak-only backend
        if target is not None and target.nccl < (2, 32, 0):
            def legacy(signal):
                feature_marker("gin.strong_signals")  # legacy signals are relied on to be strong
                return gin.signal_inc(signal)
            return legacy
        return lambda signal: gin.strong_signal_inc(signal)

    @overload(flow.finish)
    def _finish(op, value, nranks, fp8=0):
        _element("finish", value)
        ty = value
        if value == types.uint16:
            def bf16(op, value, nranks, fp8=0):
                return to_bf16(to_float(value) / nranks) if op == _AVG else value
            return bf16
        if value == types.float16:
            def half(op, value, nranks, fp8=0):
                return ty(float32(value) / nranks) if op == _AVG else value
            return half
        if isinstance(value, types.Float):
            def floating(op, value, nranks, fp8=0):
                return ty(value / nranks) if op == _AVG else value
            return floating

        def integer(op, value, nranks, fp8=0):
            if op != _AVG:
                return value
            q = ty(abs(value) // nranks)  # C division: truncate toward zero
            return ty(-q) if value < 0 else q

        if value == types.uint8:
            def byte(op, value, nranks, fp8=0):
                if op != _AVG:
                    return value
                if fp8 != 0:
                    return float_to_fp8(fp8_to_float(value, fp8) / float32(nranks), fp8)
                return ty(value // nranks)
            return byte
        return integer
