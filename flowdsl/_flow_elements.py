"""Flow's reductions and element arithmetic: what :func:`flowdsl.flow.combine` and
:func:`flowdsl.flow.finish` mean, element by element.

:mod:`flowdsl.flow` re-exports every name here. The bodies are what the simulator runs; on the
GPU each is overloaded per element type (``lowering/flow.py``) so that the result keeps the
element type.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from . import _fp8
from ._spec import INT, RED_OP
from ._stubs import primitive
from .enums import RedOp

__all__ = ["Reduction", "reduction", "combine", "finish", "combine_packs", "finish_pack", "E4M3", "E5M2"]

Reduction = namedtuple("Reduction", ["op", "nranks", "fp8"])
Reduction.__doc__ = """A reduction operator (:class:`flowdsl.RedOp`) over ``nranks`` contributions.

``fp8`` says how to read uint8 elements: 0 as integers, :data:`E4M3` or :data:`E5M2` as fp8.
On the GPU, ``op`` and ``fp8`` given as constants are part of the value's type."""

#: fp8 format e4m3fn of uint8 elements (``Reduction.fp8``).
E4M3 = _fp8.E4M3
#: fp8 format e5m2 of uint8 elements (``Reduction.fp8``).
E5M2 = _fp8.E5M2


@primitive(module="flowdsl.flow", op=RED_OP, nranks=INT, fp8=INT)
def reduction(op, nranks, fp8=0):
    """A :class:`Reduction` for ``op`` over ``nranks`` ranks (``nranks`` divides for ``AVG``);
    ``fp8`` = :data:`E4M3` or :data:`E5M2` reads uint8 elements as fp8.

    On the GPU a constant ``op`` and ``fp8`` (a kernel factory's, as in the collectives)
    become part of the reduction's type: the steps given it are compiled for that
    operator alone. The simulator makes the :class:`Reduction` (``flowdsl/sim/flow.py``).
    """


def _bf16_to_float(bits):
    return np.array(np.uint32(int(bits) << 16)).view(np.float32)[()]


def _float_to_bf16(value):
    bits = int(np.array(np.float32(value)).view(np.uint32)[()])
    if (bits & 0x7FFFFFFF) > 0x7F800000:  # NaN stays a quiet NaN
        return np.uint16((bits >> 16) | 0x40)
    return np.uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)  # round to nearest even


def _fp8_op(fn, fmt, *codes):
    values = [np.float32(_fp8.from_fp8(c, fmt)) for c in codes]
    return np.uint8(_fp8.to_fp8(fn(*values), fmt))


def combine(op, a, b, fp8=0):
    """``a op b`` in the element type of ``a`` (wrapping for integers, bfloat16 for uint16,
    fp8 for uint8 when ``fp8`` names a format; 16- and 8-bit floats are combined in float32)."""
    if isinstance(a, np.uint16):
        return _float_to_bf16(combine(op, _bf16_to_float(a), _bf16_to_float(b)))
    if fp8 and isinstance(a, np.uint8):
        return _fp8_op(lambda x, y: combine(op, x, y), fp8, a, b)
    with np.errstate(over="ignore", invalid="ignore"):
        if op == RedOp.PROD:
            r = a * b
        elif op == RedOp.MIN:
            r = a if a < b else b
        elif op == RedOp.MAX:
            r = a if a > b else b
        else:
            r = a + b
    return np.asarray(r).astype(np.asarray(a).dtype)[()]


def finish(op, value, nranks, fp8=0):
    """The reduction's last touch: ``AVG`` divides by ``nranks`` (integers truncate); others keep."""
    if op != RedOp.AVG:
        return value
    if isinstance(value, np.uint16):
        with np.errstate(invalid="ignore"):  # a signalling NaN stays NaN, quietly (as on the GPU)
            return _float_to_bf16(_bf16_to_float(value) / nranks)
    if fp8 and isinstance(value, np.uint8):
        return _fp8_op(lambda x: np.float32(x / nranks), fp8, value)
    dt = np.asarray(value).dtype
    if dt.kind == "f":
        return dt.type(value / nranks)
    q = abs(int(value)) // nranks
    return np.array(-q if int(value) < 0 else q).astype(dt)[()]


def combine_packs(red, a, b):
    """Lane by lane :func:`combine` of two 16-byte packs (tuples from ``mem.load_vec``) by ``red``."""
    return tuple(combine(red.op, x, y, red.fp8) for x, y in zip(a, b))


def finish_pack(red, a):
    """Lane by lane :func:`finish` of a 16-byte pack by ``red``."""
    return tuple(finish(red.op, x, red.nranks, red.fp8) for x in a)
