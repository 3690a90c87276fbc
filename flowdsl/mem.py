"""Memory-model operations in device code (PTX ``ld``/``st``/``fence``/``atom``/``red``).

Each takes an array (a view or any device array) and an element index, and a
scope: :class:`flowdsl.ThreadScope` ``DEVICE`` (``.gpu``) or ``SYSTEM``
(``.sys``, needed for peers' memory over NVLink/PCIe and for the host), or
``BLOCK`` (``.cta``). Scope and order must be compile-time constants.
"""

from __future__ import annotations

from ._spec import (ARITHMETIC_ELEMENTS, CONSTANT_ORDER, FENCE_ORDER, INT, INTEGER_ELEMENTS, MEM_ARRAY, MULTIMEM_GATE,
                    MULTIMEM_OP, MULTIMEM_VIEW, SCOPE, VECTOR_ELEMENTS)
from ._stubs import primitive
from .enums import RedOp

_INTEGERS = MEM_ARRAY.but(dtypes=INTEGER_ELEMENTS)
_ARITHMETIC = MEM_ARRAY.but(dtypes=ARITHMETIC_ELEMENTS)
_VECTORS = MEM_ARRAY.but(dtypes=VECTOR_ELEMENTS)

__all__ = [
    "load_acquire", "load_relaxed", "store_release", "store_relaxed", "fence",
    "atomic_add", "atomic_cas", "atomic_exch", "red_add", "load_vec", "store_vec", "load_vec_relaxed",
    "store_vec_relaxed", "warp_store_vec", "load_vector", "store_vector", "load_vector_relaxed", "store_vector_relaxed",
    "vector_type_name", "vector_refusal", "vec_to_bits", "vec_from_bits", "to_bits", "from_bits", "address", "itemsize",
    "globaltimer", "multimem_ld_reduce", "multimem_store", "multimem_red", "multimem_ld_reduce_vec",
    "multimem_store_vec", "multimem_store_vec_relaxed", "multimem_red_vec", "multimem_address", "multimem_refusal", "multimem_forms",
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


# ---- 16-byte values: numba-cuda's vector types, indexed by vector (NCCL's uint4 / ulong2 pointers) -----------

@primitive(array=_ARITHMETIC, index=INT)
def load_vector(array, index):
    """Vector ``index`` of ``array`` (its 16 bytes from element ``index * 16 // itemsize``) in one 128-bit load,
    as numba-cuda's vector type of the array's elements (:func:`vector_type_name`): ``cuda.uint32x4`` (alias
    ``cuda.uint4``), ``int32x4``, ``float32x4`` for 4-byte elements, ``uint64x2``, ``int64x2``, ``float64x2`` for
    8-byte ones. Take it apart with ``.x``, ``.y``, ``.z``, ``.w``; build one with ``cuda.uint4(a, b, c, d)``.
    ``index`` counts vectors, as a C++ kernel indexes a ``uint4*``; the vector must be 16-byte aligned (it is
    in any array or window view that starts 16-byte aligned)."""


@primitive(array=_ARITHMETIC, index=INT)
def store_vector(array, index, value):
    """Store the vector ``value`` (the vector type of the array's elements) as vector ``index`` of ``array``, in one
    128-bit store. Not single-copy atomic: a reader may see some of its 16 bytes before others
    (:func:`store_vector_relaxed` is, per element)."""


@primitive(array=_ARITHMETIC, index=INT, scope=SCOPE)
def load_vector_relaxed(array, index, scope):
    """:func:`load_vector` as one ``ld.relaxed.<scope>.v*``: each element an atomic load (a value another thread
    or GPU may be writing, never served stale from the L1)."""


@primitive(array=_ARITHMETIC, index=INT, scope=SCOPE)
def store_vector_relaxed(array, index, value, scope):
    """:func:`store_vector` as one ``st.relaxed.<scope>.v*``: each element an atomic store, so a reader that
    polls one element of the vector sees that element whole (the guarantees, and what they do not cover, in
    docs/simulator.md's table of single-copy atomic accesses)."""


def vector_type_name(dtype: str) -> str:
    """numba-cuda's vector type of 16 bytes of ``dtype`` elements (4 or 8 bytes): ``"uint32x4"``, ``"float64x2"``."""
    import numpy as np  # noqa: PLC0415

    return f"{dtype}x{16 // np.dtype(dtype).itemsize}"


def vector_refusal(op: str, dtype: str, got: str) -> str:
    """How both layers refuse a value of ``op`` (``store_vector``, ``store_vector_relaxed``) that is not the vector
    type of the array's ``dtype`` elements (``got``: the other vector type's name, or what the value is)."""
    name = vector_type_name(dtype)
    return (f"flowdsl.mem.{op} requires a numba.cuda.{name} value for an array of {dtype} elements, got {got}. "
            f"Build one with numba.cuda.{name}(...) or take it from flowdsl.mem.load_vector (a tuple of elements "
            "goes to flowdsl.mem.store_vec)")


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


# ---- multimem: one instruction reaches every member of the LSA team (NVLink SHARP) -----------------
# A multimem view (flowdsl.lsa.multimem_view) is the multicast address of an LSA team's window: the
# NVLink switch applies each access to every member's copy. ld_reduce and st are weak accesses, as a
# plain load and store (order them with an LSA barrier, as NCCL's kernels do); red is a relaxed atomic
# at system scope. Which element types and operators each form has is PTX's (ptxas for sm_90):

_SUM_MIN_MAX = (RedOp.SUM, RedOp.MIN, RedOp.MAX)
#: One element: ``multimem.ld_reduce`` and ``multimem.red`` of these (int64 sums as ``.u64``, the same bits).
MULTIMEM_SCALAR_OPS = {"int32": _SUM_MIN_MAX, "uint32": _SUM_MIN_MAX, "int64": _SUM_MIN_MAX,
                       "uint64": _SUM_MIN_MAX, "float32": (RedOp.SUM,), "float64": (RedOp.SUM,)}
#: 16 bytes: ``.v4.f32``, ``.v4.f16x2`` and ``.v4.bf16x2`` (bfloat16 travels as uint16 bits, as in
#: flowdsl's collectives). float16 and bfloat16 sums add in float32 and round once (``.acc::f32``).
MULTIMEM_VECTOR_OPS = {"float32": (RedOp.SUM,), "float16": _SUM_MIN_MAX, "uint16": _SUM_MIN_MAX}
#: ``multimem.st`` of one element: 4 or 8 bytes (16 bytes of any element type: multimem_store_vec).
MULTIMEM_STORE_ELEMENTS = ARITHMETIC_ELEMENTS
#: ``multimem_store_vec``: 16 bytes of these (stored as ``.v4.f32`` bits).
MULTIMEM_STORE_VECTOR_ELEMENTS = VECTOR_ELEMENTS


def _element_name(dtype: str) -> str:
    return "bfloat16 (uint16 bits)" if dtype == "uint16" else dtype


def multimem_refusal(name: str, dtype: str, op=None, vector: bool = False) -> str | None:
    """Why PTX has no multimem form of primitive ``name`` (``"multimem_ld_reduce"``, ...) for ``dtype``
    elements (a NumPy name; uint16 is bfloat16 bits) and reduction ``op`` (None for stores), or None
    when it has one. The GPU's typing and the simulator refuse with this text."""
    full = f"flowdsl.mem.{name}"
    if op is None:  # a store
        allowed = MULTIMEM_STORE_VECTOR_ELEMENTS if vector else MULTIMEM_STORE_ELEMENTS
        if dtype in allowed:
            return None
        if not vector and dtype in MULTIMEM_STORE_VECTOR_ELEMENTS:
            return (f"{full} cannot store one {dtype} element: PTX's multimem.st stores 4 or 8 bytes at a time. "
                    f"Store 16 bytes with flowdsl.mem.multimem_store_vec")
        return f"{full} cannot store {dtype} elements: PTX's multimem.st has no such type. Use one of {', '.join(allowed)}"
    table = MULTIMEM_VECTOR_OPS if vector else MULTIMEM_SCALAR_OPS
    ops = table.get(dtype)
    instruction = "multimem.red" if name.startswith("multimem_red") else "multimem.ld_reduce"
    if ops is None:
        other = MULTIMEM_SCALAR_OPS if vector else MULTIMEM_VECTOR_OPS
        if dtype in other:
            form = ("one element at a time: use flowdsl.mem." + name.removesuffix("_vec")) if vector else \
                "16 bytes at a time: use flowdsl.mem." + name + "_vec"
            return f"{full} cannot reduce {_element_name(dtype)} elements this way: PTX's {instruction} takes them {form}"
        return (f"{full} cannot reduce {_element_name(dtype)} elements: PTX's {instruction} reduces "
                f"{', '.join(MULTIMEM_SCALAR_OPS)} one at a time and float32, float16, bfloat16 (uint16 bits) 16 "
                f"bytes at a time. Load each member's element through flowdsl.lsa.lsa_view and combine them")
    try:
        op = RedOp(int(op))
    except ValueError:
        return None  # not an operator at all: the spec's choice check refuses it
    if op not in ops:
        return (f"{full} cannot reduce {_element_name(dtype)} elements with {op.name}: PTX's {instruction} has "
                f"{' and '.join(o.name for o in ops)} for them. Use {' or '.join(o.name for o in ops)}, or load each "
                "member's element through flowdsl.lsa.lsa_view and combine them")
    return None


_BYTES = {"int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "int32": 4, "uint32": 4, "float32": 4,
          "int64": 8, "uint64": 8, "float64": 8}


def multimem_forms(dtype: str, op=None):
    """``(lanes, one)`` for ``dtype`` elements and reduction ``op`` (None: a store): ``lanes`` the elements of
    one 16-byte access, ``one`` True where PTX has the one-element form; each None where PTX lacks that form.
    What :func:`flowdsl.lsa.multimem_reduce_sum` and the other helpers choose from when the kernel compiles."""
    stem = "multimem_store" if op is None else "multimem_ld_reduce"
    lanes = 16 // _BYTES[dtype] if multimem_refusal(stem + "_vec", dtype, op, True) is None else None
    one = True if multimem_refusal(stem, dtype, op, False) is None else None
    return lanes, one


@primitive(gate=MULTIMEM_GATE, view=MULTIMEM_VIEW, index=INT)
def multimem_address(view, index):
    """The multicast address of element ``index`` of a multimem view as a uint64 (``multimem_address(v, i) % 16
    == 0``: a 16-byte multimem access may start there, as :func:`address` tells of an array). Nothing is
    accessed; ``index`` may be one past the end."""


@primitive(gate=MULTIMEM_GATE, view=MULTIMEM_VIEW, index=INT, op=MULTIMEM_OP)
def multimem_ld_reduce(view, index, op):
    """``multimem.ld_reduce``: element ``index`` of every LSA team member's window, combined by ``op``
    (``RedOp.SUM``, ``MIN`` or ``MAX``) in the switch, in one load. int32, uint32, int64, uint64 (every
    operator), float32 and float64 (``SUM``); 16-bit floats: :func:`multimem_ld_reduce_vec`."""


@primitive(gate=MULTIMEM_GATE, view=MULTIMEM_VIEW, index=INT)
def multimem_store(view, index, value):
    """``multimem.st``: ``value`` stored as element ``index`` of every LSA team member's window, in one
    store. Elements of 4 or 8 bytes; 16 bytes of any type: :func:`multimem_store_vec`."""


@primitive(gate=MULTIMEM_GATE, view=MULTIMEM_VIEW, index=INT, op=MULTIMEM_OP)
def multimem_red(view, index, value, op):
    """``multimem.red.relaxed.sys``: ``element = element op value`` atomically in every LSA team member's
    window (the types and operators of :func:`multimem_ld_reduce`); returns nothing."""


@primitive(gate=MULTIMEM_GATE, view=MULTIMEM_VIEW, index=INT, op=MULTIMEM_OP)
def multimem_ld_reduce_vec(view, index, op):
    """:func:`multimem_ld_reduce` of the 16 bytes at ``index`` (a tuple of ``16 // itemsize`` elements;
    ``index`` 16-byte aligned, as :func:`load_vec`'s): float32 (``SUM``), float16 and bfloat16 (uint16
    bits; ``SUM``, ``MIN``, ``MAX``; sums add in float32 and round once)."""


@primitive(gate=MULTIMEM_GATE, view=MULTIMEM_VIEW, index=INT)
def multimem_store_vec(view, index, values):
    """:func:`multimem_store` of a 16-byte tuple (from :func:`load_vec`), any element type."""


@primitive(gate=MULTIMEM_GATE, view=MULTIMEM_VIEW, index=INT, scope=SCOPE)
def multimem_store_vec_relaxed(view, index, values, scope):
    """:func:`multimem_store_vec` as one ``multimem.st.relaxed.<scope>.v4.f32``: 16 bytes that readers in every
    member poll (:func:`load_relaxed` of a word of them), as :func:`store_vec_relaxed` is for one window. Each
    member's copy gets the 16 bytes in one store; a relaxed access, so a poll of it is no data race where
    :func:`multimem_store_vec`'s weak store would be one."""


@primitive(gate=MULTIMEM_GATE, view=MULTIMEM_VIEW, index=INT, op=MULTIMEM_OP)
def multimem_red_vec(view, index, values, op):
    """:func:`multimem_red` of a 16-byte tuple: the types and operators of :func:`multimem_ld_reduce_vec`."""
