"""numba-cuda's built-in vector types (``cuda.float32x4``, ``cuda.uint4``, ...) as the simulator runs them.

A vector is a value of one to four lanes of one scalar type, named ``x``, ``y``, ``z``, ``w``: built by its
constructor from scalars and smaller vectors of its type (``cuda.uint32x4(v2, a, b)``, numba-cuda's overloads),
read by attribute, never written or indexed (numba-cuda types neither). Lanes are converted to the base type as
numba's casts convert (integers wrap, floats truncate toward zero into integers).
"""

from __future__ import annotations

import numpy as np
from numba.cuda.stubs import _vector_type_stubs

from .._spec import vector_write_refusal
from .errors import KernelTypingError, sim_error

__all__ = ["SimVector", "CONSTRUCTORS", "make", "type_name"]

_ATTRS = ("x", "y", "z", "w")


class SimVector:
    """A vector value: its type's name and lanes (NumPy scalars of the base type)."""

    __slots__ = ("_name", "_lanes")

    def __init__(self, name: str, lanes: tuple):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_lanes", lanes)

    def __getattr__(self, attr):
        lanes = object.__getattribute__(self, "_lanes")
        if attr in _ATTRS[:len(lanes)]:
            return lanes[_ATTRS.index(attr)]
        raise sim_error(KernelTypingError, f"Cannot read .{attr} of a numba.cuda.{self._name}: it has "
                        f"{', '.join('.' + a for a in _ATTRS[:len(lanes)])}")

    def __setattr__(self, attr, value):
        raise sim_error(KernelTypingError, vector_write_refusal(self._name, attr))

    def __getitem__(self, index):
        raise sim_error(KernelTypingError, f"Cannot index a numba.cuda.{self._name}: numba-cuda reads its lanes by name. "
                        f"Use {', '.join('.' + a for a in _ATTRS[:len(self._lanes)])}")

    def __repr__(self):
        return f"{self._name}({', '.join(repr(v.item()) for v in self._lanes)})"

    @property
    def lanes(self) -> tuple:
        return self._lanes


def _convert(value, dtype: np.dtype):
    """``value`` in ``dtype`` as numba's cast gives it (integers wrap, floats truncate)."""
    if isinstance(value, (bool, np.bool_)):
        value = int(value)
    return np.asarray(value).astype(dtype)[()]


def make(dtype, values) -> SimVector:
    """The vector of ``values`` (as many as its lanes) of ``dtype`` elements."""
    dtype = np.dtype(dtype)
    return SimVector(f"{dtype.name}x{len(values)}", tuple(_convert(v, dtype) for v in values))


def type_name(value) -> str:
    """What a refusal says a value is: a vector type's name, ``a tuple``, or the value's type."""
    if isinstance(value, SimVector):
        return value._name
    if isinstance(value, tuple):
        return "a tuple"
    return type(value).__name__


def _constructor(name: str):
    dtype = np.dtype(name[:-2])
    count = int(name[-1])
    base = name[:-1]

    def construct(*args):
        lanes = []
        for a in args:
            if isinstance(a, SimVector):
                if a._name[:-1] != base:
                    raise sim_error(KernelTypingError, f"Cannot build a numba.cuda.{name} from a {a._name}: numba-cuda "
                                    f"builds it from {dtype.name} scalars and {base}N vectors only")
                lanes.extend(a._lanes)
            else:
                lanes.append(a)
        if len(lanes) != count:
            raise sim_error(KernelTypingError, f"Cannot build a numba.cuda.{name} from {len(lanes)} lanes: it has {count}. "
                            f"Pass {count} {dtype.name} values (or smaller {base}N vectors that add up to {count})")
        return SimVector(name, tuple(_convert(v, dtype) for v in lanes))

    construct.__name__ = construct.__qualname__ = name
    return construct


#: The simulated constructor of each numba-cuda vector type stub, by the stub (aliases share it).
CONSTRUCTORS = {stub: _constructor(stub.__name__) for stub in _vector_type_stubs}
