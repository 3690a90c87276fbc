"""What ``flowdsl.mem`` does in the simulator: loads, stores, fences and atomics on window views and
arrays (with the spin points, write notes and race-detector events they make), 16-byte vectors, bits."""

from __future__ import annotations

import numpy as np

from .. import mem as mem_surface
from ..enums import MemoryOrder, RedOp
from . import _state, vectors
from .errors import KernelTypingError, UsageError, WindowAccessError, sim_error
from .memory import WindowView, address_key, as_dtype, raw
from .network import note_load
from .scheduler import block_sync
from .semantics import current, implements

__all__: list[str] = []


def _elem(arr, index, op):
    a = raw(arr)
    if isinstance(arr, WindowView):
        index = arr._index(index, op)
    return a, index


def _spin_point(arr, index, value):
    try:
        v = value.item()
    except AttributeError:
        v = value
    _state.sched.yield_spin(_state.cur, (address_key(arr, index), arr, index, v))


def _note_write(arr, index, value):
    """Who stored what at element ``index`` of ``arr`` last (the livelock report, ``flowdsl.wait.accepted``)."""
    sched = _state.sched
    sched.last_writer[address_key(arr, index)] = (current(), value)
    sched.stale = 0


def _note_read(array, i, n):
    """The writers of what a strong load of ``array[i:i + n]`` (a window view) returns, as the loading
    thread's: ``flowdsl.wait.accepted`` asks who wrote the words a wait took, and by then the writer may
    have stored this call's data over a stale line the thread had already loaded."""
    writers, mine = _state.sched.last_writer, current().loaded_from
    for k in range(i, i + n):
        key = address_key(array, k)
        mine[key] = writers.get(key)


def _load(array, index, order, name):
    a, i = _elem(array, index, name)
    v = a[i]
    _spin_point(array, i, v)
    if isinstance(array, WindowView):
        note_load(array, i)  # after the spin point: observes what the returned value includes
        _note_read(array, i, 1)
    rc = _state.race
    if rc is not None:
        rc.atomic(array, i, True, False, order)
    return a[i]


def _store(array, index, value, order, name):
    a, i = _elem(array, index, name)
    a[i] = value
    _note_write(array, i, a[i])
    rc = _state.race
    if rc is not None:
        rc.atomic(array, i, False, True, order)


@implements("flowdsl.mem.load_acquire")
def _mem_load_acquire(array, index, scope):
    return _load(array, index, MemoryOrder.ACQUIRE, "load_acquire")


@implements("flowdsl.mem.load_relaxed")
def _mem_load_relaxed(array, index, scope):
    return _load(array, index, MemoryOrder.RELAXED, "load_relaxed")


@implements("flowdsl.mem.store_release")
def _mem_store_release(array, index, value, scope):
    _store(array, index, value, MemoryOrder.RELEASE, "store_release")


@implements("flowdsl.mem.store_relaxed")
def _mem_store_relaxed(array, index, value, scope):
    _store(array, index, value, MemoryOrder.RELAXED, "store_relaxed")


@implements("flowdsl.mem.fence")
def _mem_fence(order, scope):
    rc = _state.race
    if rc is not None:
        rc.fence(current(), order)
    return None


def _rmw(array, index, op, name, order):
    a, i = _elem(array, index, name)
    _spin_point(array, i, a[i])
    old = a[i]
    new = op(old)
    if new is not None:
        a[i] = new
        if new != old:
            _note_write(array, i, a[i])
    rc = _state.race
    if rc is not None:  # a failed compare-and-swap only loads
        rc.atomic(array, i, True, new is not None, order)
    return old


@implements("flowdsl.mem.atomic_add")
def _mem_atomic_add(array, index, value, order, scope):
    return _rmw(array, index, lambda o: o + value, "atomic_add", order)


@implements("flowdsl.mem.atomic_cas")
def _mem_atomic_cas(array, index, expected, desired, order, scope):
    return _rmw(array, index, lambda o: desired if o == expected else None, "atomic_cas", order)


@implements("flowdsl.mem.atomic_exch")
def _mem_atomic_exch(array, index, value, order, scope):
    return _rmw(array, index, lambda o: value, "atomic_exch", order)


@implements("flowdsl.mem.red_add")
def _mem_red_add(array, index, value, order, scope):
    a, i = _elem(array, index, "red_add")
    a[i] = a[i] + value
    _note_write(array, i, a[i])
    rc = _state.race
    if rc is not None:  # a reduction returns nothing: it stores (and releases per its order), never acquires
        rc.atomic(array, i, False, True, order)


def _vec(array, index, op):
    a = raw(array)
    n = 16 // a.itemsize
    index = int(index)
    if a.itemsize not in (1, 2, 4, 8) or a.dtype.kind not in "iuf":
        raise sim_error(UsageError, f"Cannot {op} on {a.dtype.name} elements: 16-byte vectors need integer or "
                        "float elements of 1, 2, 4 or 8 bytes")
    if isinstance(array, WindowView):
        if index < 0 or index + n > array._n:
            array._oob(index + n - 1 if index >= 0 else index, op)
        off = (array.start + index) * a.itemsize
    else:
        if index < 0 or index + n > a.size:
            raise sim_error(WindowAccessError, f"Cannot {op} elements {index}..{index + n - 1}: the array has "
                            f"{a.size} elements. Keep the vector inside the array")
        off = a.__array_interface__["data"][0] + index * a.itemsize
    if off % 16:
        raise sim_error(UsageError, f"Cannot {op} at element {index}: byte offset {off} is not 16-byte aligned. "
                        f"Use an index that is a multiple of {n} (from a view at a 16-byte aligned start)")
    return a.reshape(-1), index, n


def _vec_access(array, i, n, write):
    rc = _state.race
    if rc is None:
        return
    for k in range(i, i + n):
        loc = rc.locate(array, k)
        if loc is None:
            return
        (rc.write if write else rc.read)(loc[0], loc[1], array, k)


@implements("flowdsl.mem.load_vec")
def _mem_load_vec(array, index):
    return _load_plain(array, index, "load_vec")


def _load_plain(array, index, op):
    a, i, n = _vec(array, index, op)
    _vec_access(array, i, n, False)
    return tuple(a[i:i + n])


@implements("flowdsl.mem.load_vec_relaxed")
def _mem_load_vec_relaxed(array, index, scope):
    return _load_relaxed(array, index, "load_vec_relaxed")


def _load_relaxed(array, index, op):
    a, i, n = _vec(array, index, op)
    _spin_point(array, i, a[i])  # polled as LL lines are: let the writer run
    if isinstance(array, WindowView):
        note_load(array, i)
        _note_read(array, i, n)
    rc = _state.race
    if rc is not None:
        for k in range(i, i + n):  # atomic per element, as the ld.relaxed.v* each element is
            rc.atomic(array, k, True, False, MemoryOrder.RELAXED)
    return tuple(a[i:i + n])


@implements("flowdsl.mem.store_vec_relaxed")
def _mem_store_vec_relaxed(array, index, values, scope):
    a, i, n = _vec(array, index, "store_vec_relaxed")
    if len(values) != n:
        raise sim_error(UsageError, f"Cannot store_vec_relaxed {len(values)} values: a 16-byte vector of "
                        f"{a.dtype.name} has {n}. Pass a tuple of {n} values")
    _store_relaxed(array, a, i, n, values)


def _store_relaxed(array, a, i, n, values):
    a[i:i + n] = values
    rc = _state.race
    for k in range(i, i + n):
        _note_write(array, k, a[k])
        if rc is not None:
            rc.atomic(array, k, False, True, MemoryOrder.RELAXED)


@implements("flowdsl.mem.warp_store_vec")
def _mem_warp_store_vec(array, index, values, scope):
    t = current()
    a, i, n = _vec(array, index, "warp_store_vec")
    if len(values) != n:
        raise sim_error(UsageError, f"Cannot warp_store_vec {len(values)} values: a 16-byte vector of "
                        f"{a.dtype.name} has {n}. Pass a tuple of {n} values")
    mine = {"store": (array, a, i, n, tuple(values))}
    lanes = block_sync(t, ("warp", t.warp, 0xFFFFFFFF), 32, "flowdsl.mem.warp_store_vec", mine,
                       shape=("warp", 0xFFFFFFFF), members=[t.warp * 32 + k for k in range(32)])
    # The lane that arrives last runs on before any other thread: it lands the whole warp's stores
    # at once, as one store instruction of a converged warp writes each line it fills whole.
    rc = _state.race
    for lane in lanes:
        store = lane.pop("store", None)
        if store is None:
            continue
        view, raw_a, k0, count, vals = store
        raw_a[k0:k0 + count] = vals
        for k in range(k0, k0 + count):
            _note_write(view, k, raw_a[k])
            if rc is not None:
                rc.atomic(view, k, False, True, MemoryOrder.RELAXED)


@implements("flowdsl.mem.vec_to_bits")
def _mem_vec_to_bits(values):
    dtype = _scalar_dtype(values[0])
    packed = np.array(values, dtype=dtype)
    if packed.nbytes != 16:
        raise sim_error(UsageError, f"Cannot take the bits of {len(values)} {dtype.name} values: vec_to_bits takes "
                        "a 16-byte tuple (from mem.load_vec)")
    lo, hi = packed.view(np.uint64)
    return np.uint64(lo), np.uint64(hi)


@implements("flowdsl.mem.vec_from_bits")
def _mem_vec_from_bits(low, high, dtype):
    return tuple(np.array([int(low), int(high)], np.uint64).view(as_dtype(dtype)))


@implements("flowdsl.mem.address")
def _mem_address(array, index):
    a = raw(array)
    start = array.start if isinstance(array, WindowView) else 0
    if isinstance(array, WindowView):  # windows are laid out from a 16-byte aligned base, as on the GPU
        return np.uint64((start + int(index)) * a.itemsize)
    return np.uint64(a.__array_interface__["data"][0] + int(index) * a.itemsize)


@implements("flowdsl.mem.itemsize")
def _mem_itemsize(array):
    return raw(array).itemsize


@implements("flowdsl.mem.store_vec")
def _mem_store_vec(array, index, values):
    a, i, n = _vec(array, index, "store_vec")
    if len(values) != n:
        raise sim_error(UsageError, f"Cannot store_vec {len(values)} values: a 16-byte vector of "
                        f"{a.dtype.name} has {n}. Pass a tuple of {n} values")
    a[i:i + n] = values
    _vec_access(array, i, n, True)



# ---- 16-byte vector values (numba-cuda's vector types), indexed by vector --------------------------------

def _first_element(array, index):
    """The element where vector ``index`` of ``array`` starts (the GPU's ``index * lanes``)."""
    return int(index) * (16 // raw(array).itemsize)


def _vector_value(op, a, value):
    """The lanes of ``value``, refused in the GPU's typing words unless it is the vector type of ``a``'s elements."""
    if not isinstance(value, vectors.SimVector) or value._name != mem_surface.vector_type_name(a.dtype.name):
        raise sim_error(KernelTypingError, mem_surface.vector_refusal(op, a.dtype.name, vectors.type_name(value)))
    return value.lanes


@implements("flowdsl.mem.load_vector")
def _mem_load_vector(array, index):
    return vectors.make(raw(array).dtype, _load_plain(array, _first_element(array, index), "load_vector"))


@implements("flowdsl.mem.store_vector")
def _mem_store_vector(array, index, value):
    a, i, n = _vec(array, _first_element(array, index), "store_vector")
    a[i:i + n] = _vector_value("store_vector", a, value)
    _vec_access(array, i, n, True)


@implements("flowdsl.mem.load_vector_relaxed")
def _mem_load_vector_relaxed(array, index, scope):
    return vectors.make(raw(array).dtype, _load_relaxed(array, _first_element(array, index), "load_vector_relaxed"))


@implements("flowdsl.mem.store_vector_relaxed")
def _mem_store_vector_relaxed(array, index, value, scope):
    a, i, n = _vec(array, _first_element(array, index), "store_vector_relaxed")
    _store_relaxed(array, a, i, n, _vector_value("store_vector_relaxed", a, value))


def _scalar_dtype(value):
    if isinstance(value, np.generic):
        return value.dtype
    return np.dtype(np.float64) if isinstance(value, float) else np.dtype(np.int64)


@implements("flowdsl.mem.to_bits")
def _mem_to_bits(value):
    source = _scalar_dtype(value)
    unsigned = np.dtype(f"u{source.itemsize}")
    return np.uint64(np.array(value, dtype=source).view(unsigned)[()])


@implements("flowdsl.mem.from_bits")
def _mem_from_bits(bits, dtype):
    target = as_dtype(dtype)
    low = np.array(int(bits) & ((1 << (8 * target.itemsize)) - 1), dtype=f"u{target.itemsize}")
    return low.view(target)[()]


#: Simulated nanoseconds per scheduler step (``mem.globaltimer`` only needs to be monotonic).
_NS_PER_STEP = 100


@implements("flowdsl.mem.globaltimer")
def _mem_globaltimer():
    return np.uint64(_state.sched.steps * _NS_PER_STEP)


# ---- multimem: each access reaches every member of the LSA team (flowdsl.lsa.multimem_view) -------------
# The switch applies a multimem access to every member's copy: ld_reduce and st are weak (plain) reads and
# writes of each copy, as the race detector sees them; red and st.relaxed are relaxed atomics on each (a
# 16-byte st.relaxed lands in every copy at one instant, whole). The switch's order of
# combining is unspecified on GPUs; here members combine in LSA rank order (sums of 16-bit floats in float32,
# rounded once, as ``.acc::f32``).

def _multimem_refused(name, view, op, vector):
    refusal = mem_surface.multimem_refusal(name, view.dtype.name, op, vector)
    if refusal is not None:
        raise sim_error(KernelTypingError, refusal)


def _bf16_to_f32(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x):
    """float32 to bfloat16 bits, rounded to nearest even (NaN stays a quiet NaN)."""
    u = np.asarray(x, np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, np.float32)), np.uint16(0x7FC0), rounded)


def _combine(values, op, dtype):
    """``values`` (one array per member, same shape) combined by ``op`` in ``dtype``'s arithmetic."""
    op = RedOp(int(op))
    if dtype == np.float16 or dtype == np.uint16:  # 16-bit floats: in float32, rounded once
        wide = [_bf16_to_f32(v) if dtype == np.uint16 else np.asarray(v, np.float32) for v in values]
        acc = wide[0].copy()
        for v in wide[1:]:
            acc = acc + v if op == RedOp.SUM else (np.fmin(acc, v) if op == RedOp.MIN else np.fmax(acc, v))
        return _f32_to_bf16(acc) if dtype == np.uint16 else acc.astype(np.float16)
    acc = np.array(values[0], dtype)
    with np.errstate(over="ignore"):
        for v in values[1:]:
            v = np.array(v, dtype)
            acc = (acc + v).astype(dtype) if op == RedOp.SUM else (np.minimum(acc, v) if op == RedOp.MIN
                                                                    else np.maximum(acc, v))
    return acc


def _member_reads(view, index, n, name):
    """Each member's ``n`` elements at ``index`` (bounds- and race-checked reads), in LSA rank order."""
    out = []
    for m in view.members:
        if n == 1:
            out.append(np.array(m[int(index)]))
        else:
            a, i, _ = _vec(m, index, name)
            _vec_access(m, i, n, False)
            out.append(a[i:i + n].copy())
    return out


def _member_writes(view, index, values, name):
    n = len(values) if isinstance(values, np.ndarray) and values.ndim else 1
    for m in view.members:
        if n == 1:
            m[int(index)] = values
        else:
            a, i, _ = _vec(m, index, name)
            a[i:i + n] = values
            _vec_access(m, i, n, True)


def _member_reds(view, index, values, op, name):
    """``element = element op value`` on each member, atomically (relaxed, as multimem.red.relaxed.sys)."""
    n = len(values)
    rc = _state.race
    for m in view.members:
        if n == 1:
            a, i = _elem(m, index, name)
        else:
            a, i, _ = _vec(m, index, name)
        old = a[i:i + n].copy()
        a[i:i + n] = _combine([old, values], op, a.dtype)
        for k in range(i, i + n):
            _note_write(m, k, a[k])
            if rc is not None:
                rc.atomic(m, k, False, True, MemoryOrder.RELAXED)


def _lanes(view):
    return 16 // view.dtype.itemsize


def _vector_values(name, view, values):
    n = _lanes(view)
    if not isinstance(values, tuple) or len(values) != n:
        raise sim_error(KernelTypingError, f"flowdsl.mem.{name} requires a tuple of {n} {view.dtype.name} values "
                        f"(16 bytes), got {values!r}")
    return np.array(values, view.dtype)


@implements("flowdsl.mem.multimem_address")
def _mem_multimem_address(view, index):
    # Every member's window starts 16-byte aligned, as the multicast address does on the GPU.
    first = view.members[0]
    return np.uint64((first.start + int(index)) * view.dtype.itemsize)


@implements("flowdsl.mem.multimem_ld_reduce")
def _mem_multimem_ld_reduce(view, index, op):
    _multimem_refused("multimem_ld_reduce", view, op, False)
    return view.dtype.type(_combine(_member_reads(view, index, 1, "multimem_ld_reduce"), op, view.dtype)[()])


@implements("flowdsl.mem.multimem_store")
def _mem_multimem_store(view, index, value):
    _multimem_refused("multimem_store", view, None, False)
    _member_writes(view, index, view.dtype.type(value), "multimem_store")


@implements("flowdsl.mem.multimem_red")
def _mem_multimem_red(view, index, value, op):
    _multimem_refused("multimem_red", view, op, False)
    _member_reds(view, index, np.array([value], view.dtype), op, "multimem_red")


@implements("flowdsl.mem.multimem_ld_reduce_vec")
def _mem_multimem_ld_reduce_vec(view, index, op):
    _multimem_refused("multimem_ld_reduce_vec", view, op, True)
    return tuple(_combine(_member_reads(view, index, _lanes(view), "multimem_ld_reduce_vec"), op, view.dtype))


@implements("flowdsl.mem.multimem_store_vec")
def _mem_multimem_store_vec(view, index, values):
    _multimem_refused("multimem_store_vec", view, None, True)
    _member_writes(view, index, _vector_values("multimem_store_vec", view, values), "multimem_store_vec")


@implements("flowdsl.mem.multimem_store_vec_relaxed")
def _mem_multimem_store_vec_relaxed(view, index, values, scope):
    _multimem_refused("multimem_store_vec_relaxed", view, None, True)
    values = _vector_values("multimem_store_vec_relaxed", view, values)
    rc = _state.race
    for m in view.members:  # every member's 16 bytes at this one instant: a poll sees them whole or not at all
        a, i, n = _vec(m, index, "multimem_store_vec_relaxed")
        a[i:i + n] = values
        for k in range(i, i + n):  # atomic per element, as the relaxed .v4 store each element is
            _note_write(m, k, a[k])
            if rc is not None:
                rc.atomic(m, k, False, True, MemoryOrder.RELAXED)


@implements("flowdsl.mem.multimem_red_vec")
def _mem_multimem_red_vec(view, index, values, op):
    _multimem_refused("multimem_red_vec", view, op, True)
    _member_reds(view, index, _vector_values("multimem_red_vec", view, values), op, "multimem_red_vec")
