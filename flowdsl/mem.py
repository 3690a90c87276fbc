"""Memory-model operations in device code (PTX ``ld``/``st``/``fence``/``atom``/``red``).

Each takes an array (a view or any device array) and an element index, and a
scope: :class:`flowdsl.ThreadScope` ``DEVICE`` (``.gpu``) or ``SYSTEM``
(``.sys``, needed for peers' memory over NVLink/PCIe and for the host), or
``BLOCK`` (``.cta``). Scope and order must be compile-time constants.
"""

from __future__ import annotations

from ._spec import (ARITHMETIC_ELEMENTS, CONSTANT_ORDER, FENCE_ORDER, INT, INTEGER_ELEMENTS, MEM_ARRAY, SCOPE,
                    VECTOR_ELEMENTS)
from ._stubs import primitive

_INTEGERS = MEM_ARRAY.but(dtypes=INTEGER_ELEMENTS)
_ARITHMETIC = MEM_ARRAY.but(dtypes=ARITHMETIC_ELEMENTS)
_VECTORS = MEM_ARRAY.but(dtypes=VECTOR_ELEMENTS)

__all__ = [
    "load_acquire", "load_relaxed", "store_release", "store_relaxed", "fence",
    "atomic_add", "atomic_cas", "atomic_exch", "red_add", "load_vec", "store_vec", "load_vec_relaxed",
    "store_vec_relaxed", "warp_store_vec", "vec_to_bits", "vec_from_bits", "to_bits", "from_bits", "address", "itemsize",
    "globaltimer",
]


@primitive(array=_INTEGERS, index=INT, scope=SCOPE)
def load_acquire(array, index, scope):
    """``ld.acquire.<scope>``: later accesses are not reordered before this load."""


@primitive(array=_INTEGERS, index=INT, scope=SCOPE)
def load_relaxed(array, index, scope):
    """``ld.relaxed.<scope>``: an atomic load with no ordering."""


@primitive(array=_INTEGERS, index=INT, scope=SCOPE)
def store_release(array, index, value, scope):
    """``st.release.<scope>``: earlier accesses are visible before this store."""


@primitive(array=_INTEGERS, index=INT, scope=SCOPE)
def store_relaxed(array, index, value, scope):
    """``st.relaxed.<scope>``: an atomic store with no ordering."""


@primitive(order=FENCE_ORDER, scope=SCOPE)
def fence(order, scope):
    """``fence.acq_rel.<scope>`` (or ``fence.sc.<scope>`` for ``SEQ_CST``)."""


@primitive(array=_ARITHMETIC, index=INT, order=CONSTANT_ORDER, scope=SCOPE)
def atomic_add(array, index, value, order, scope):
    """``atom.<order>.<scope>.add``; returns the old value."""


@primitive(array=_INTEGERS, index=INT, order=CONSTANT_ORDER, scope=SCOPE)
def atomic_cas(array, index, expected, desired, order, scope):
    """``atom.<order>.<scope>.cas``; returns the old value."""


@primitive(array=_INTEGERS, index=INT, order=CONSTANT_ORDER, scope=SCOPE)
def atomic_exch(array, index, value, order, scope):
    """``atom.<order>.<scope>.exch``; returns the old value."""


@primitive(array=_ARITHMETIC, index=INT, order=CONSTANT_ORDER, scope=SCOPE)
def red_add(array, index, value, order, scope):
    """``red.<order>.<scope>.add``: an atomic add whose result is not needed."""


@primitive(array=_VECTORS, index=INT)
def load_vec(array, index):
    """16 bytes at ``array[index:]`` in one load: a tuple of ``16 // itemsize`` elements.

    ``array[index]`` must be 16-byte aligned (window views from offset 0 are, so any
    ``index`` that is a multiple of ``16 // itemsize`` is). Element types of 4 or 8 bytes.
    """


@primitive(array=_VECTORS, index=INT)
def store_vec(array, index, values):
    """Store a tuple of ``16 // itemsize`` elements at ``array[index:]`` in one 16-byte store."""


@primitive(array=_VECTORS, index=INT, scope=SCOPE)
def load_vec_relaxed(array, index, scope):
    """:func:`load_vec` as one ``ld.relaxed.<scope>.v*`` (a word another thread or GPU may be writing:
    a spin loop's load, never served stale from the L1; LL lines are read so)."""


@primitive(array=_VECTORS, index=INT, scope=SCOPE)
def store_vec_relaxed(array, index, values, scope):
    """:func:`store_vec` as one ``st.relaxed.<scope>.v*``: 16 bytes that a reader polls (an LL line
    of data beside its flags is written so, in one store)."""


@primitive(array=_VECTORS, index=INT, scope=SCOPE)
def warp_store_vec(array, index, values, scope):
    """:func:`store_vec_relaxed` by every lane of a converged warp at once, one instruction: each
    128-byte line that eight lanes fill lands whole (NVLink and HBM write it as one transaction; what
    LL128 relies on). All 32 lanes must call it together. The simulator lands the warp's 32 stores
    at one instant; the same stores made by lanes one by one may be seen half done there."""


@primitive
def vec_to_bits(values):
    """The bits of a 16-byte tuple (from :func:`load_vec`) as two uint64, ``(low 8 bytes, high 8 bytes)``."""


@primitive
def vec_from_bits(low, high, dtype):
    """The 16-byte tuple of ``dtype`` elements whose bits are ``low`` then ``high`` (inverse of
    :func:`vec_to_bits`)."""


@primitive
def to_bits(value):
    """``value``'s bits, zero-extended to a uint64 (``__float_as_uint`` and friends).

    Any integer or float scalar of 1, 2, 4 or 8 bytes.
    """


@primitive
def from_bits(bits, dtype):
    """The ``dtype`` whose bits are the low bits of the uint64 ``bits`` (inverse of :func:`to_bits`).

    ``dtype`` is a numba or NumPy scalar type, e.g. ``numba.float32``.
    """


@primitive(array=MEM_ARRAY, index=INT)
def address(array, index):
    """Byte address of ``array[index]`` as a uint64 (``address(a, i) % 16 == 0``: a 16-byte
    vector may start there). Nothing is read; ``index`` may be one past the end."""


@primitive(array=MEM_ARRAY)
def itemsize(array):
    """Bytes of one element of ``array``, a constant of the compiled code: an array's
    ``.itemsize`` attribute is a field read at run time on the GPU, so every division by it (what a
    slot or a 16-byte pack holds) would be a division instruction in the loop."""


@primitive
def globaltimer():
    """The GPU's global nanosecond timer as a uint64 (PTX ``%globaltimer``; on the simulator a
    clock that advances with the simulation). Only differences are meaningful."""
