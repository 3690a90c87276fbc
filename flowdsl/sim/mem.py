"""What ``flowdsl.mem`` does in the simulator: loads, stores, fences and atomics on window views and
arrays (with the spin points, write notes and race-detector events they make), 16-byte vectors, bits."""

from __future__ import annotations

import numpy as np

from ..enums import MemoryOrder
from . import _state
from .errors import UsageError, WindowAccessError, sim_error
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
    a, i, n = _vec(array, index, "load_vec")
    _vec_access(array, i, n, False)
    return tuple(a[i:i + n])


@implements("flowdsl.mem.load_vec_relaxed")
def _mem_load_vec_relaxed(array, index, scope):
    a, i, n = _vec(array, index, "load_vec_relaxed")
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
