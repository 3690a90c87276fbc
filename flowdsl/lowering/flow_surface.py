"""GPU meaning of Flow's element arithmetic (:func:`flowdsl.flow.combine`, :func:`flowdsl.flow.finish`)
and of its strong signal (:func:`flowdsl.flow.strong_signal_inc`, per NCCL release).

The Python bodies in ``flowdsl/flow.py`` are what the simulator runs; here each is
overloaded per element type so the result keeps the element's type (an ``int8``
sum wraps in 8 bits, a ``float16`` product rounds to half). uint16 elements are
bfloat16 bits: they are widened to float32, combined, and rounded back to nearest
even (NCCL has no uint16, NumPy no bfloat16).

Contents: :func:`bind`.
"""

from __future__ import annotations

from numba import float32, uint16, uint64
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


def _element(op, ty):
    if not isinstance(ty, (types.Integer, types.Float)):
        raise NumbaTypeError(f"flowdsl.flow.{op} requires integer or float elements, got {ty}")


def bind():
    """Register the overloads (idempotent through :func:`flowdsl.lowering.surface.bind`)."""
    from .. import flow  # noqa: PLC0415 (flow imports the kernel decorator, which imports lowering)

    apply = register_jitable(_apply)
    to_float = register_jitable(_bf16_to_float)
    to_bf16 = register_jitable(_float_to_bf16)

    @overload(flow.combine)
    def _combine(op, a, b):
        _element("combine", a)
        if a == types.uint16:
            return lambda op, a, b: to_bf16(apply(op, to_float(a), to_float(b)))
        ty = a
        if a == types.float16:  # in float32 (exact for one operation, then rounded once)
            return lambda op, a, b: ty(apply(op, float32(a), float32(b)))
        return lambda op, a, b: ty(apply(op, a, b))

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
    def _finish(op, value, nranks):
        _element("finish", value)
        ty = value
        if value == types.uint16:
            def bf16(op, value, nranks):
                return to_bf16(to_float(value) / nranks) if op == _AVG else value
            return bf16
        if value == types.float16:
            def half(op, value, nranks):
                return ty(float32(value) / nranks) if op == _AVG else value
            return half
        if isinstance(value, types.Float):
            def floating(op, value, nranks):
                return ty(value / nranks) if op == _AVG else value
            return floating

        def integer(op, value, nranks):
            if op != _AVG:
                return value
            q = ty(abs(value) // nranks)  # C division: truncate toward zero
            return ty(-q) if value < 0 else q
        return integer
