"""Memory-model operations in device code (PTX ``ld``/``st``/``fence``/``atom``/``red``).

Each takes an array (a view or any device array) and an element index, and a
scope: :class:`flowdsl.ThreadScope` ``DEVICE`` (``.gpu``) or ``SYSTEM``
(``.sys``, needed for peers' memory over NVLink/PCIe and for the host), or
``BLOCK`` (``.cta``). Scope and order must be compile-time constants.
"""

from __future__ import annotations

from ._stubs import primitive

__all__ = [
    "load_acquire", "load_relaxed", "store_release", "store_relaxed", "fence",
    "atomic_add", "atomic_cas", "atomic_exch", "red_add", "load_vec", "store_vec", "to_bits", "from_bits", "address",
    "globaltimer",
]


@primitive
def load_acquire(array, index, scope):
    """``ld.acquire.<scope>``: later accesses are not reordered before this load."""


@primitive
def load_relaxed(array, index, scope):
    """``ld.relaxed.<scope>``: an atomic load with no ordering."""


@primitive
def store_release(array, index, value, scope):
    """``st.release.<scope>``: earlier accesses are visible before this store."""


@primitive
def store_relaxed(array, index, value, scope):
    """``st.relaxed.<scope>``: an atomic store with no ordering."""


@primitive
def fence(order, scope):
    """``fence.acq_rel.<scope>`` (or ``fence.sc.<scope>`` for ``SEQ_CST``)."""


@primitive
def atomic_add(array, index, value, order, scope):
    """``atom.<order>.<scope>.add``; returns the old value."""


@primitive
def atomic_cas(array, index, expected, desired, order, scope):
    """``atom.<order>.<scope>.cas``; returns the old value."""


@primitive
def atomic_exch(array, index, value, order, scope):
    """``atom.<order>.<scope>.exch``; returns the old value."""


@primitive
def red_add(array, index, value, order, scope):
    """``red.<order>.<scope>.add``: an atomic add whose result is not needed."""


@primitive
def load_vec(array, index):
    """16 bytes at ``array[index:]`` in one load: a tuple of ``16 // itemsize`` elements.

    ``array[index]`` must be 16-byte aligned (window views from offset 0 are, so any
    ``index`` that is a multiple of ``16 // itemsize`` is). Element types of 4 or 8 bytes.
    """


@primitive
def store_vec(array, index, values):
    """Store a tuple of ``16 // itemsize`` elements at ``array[index:]`` in one 16-byte store."""


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


@primitive
def address(array, index):
    """Byte address of ``array[index]`` as a uint64 (``address(a, i) % 16 == 0``: a 16-byte
    vector may start there). Nothing is read; ``index`` may be one past the end."""


@primitive
def globaltimer():
    """The GPU's global nanosecond timer as a uint64 (PTX ``%globaltimer``; on the simulator a
    clock that advances with the simulation). Only differences are meaningful."""
