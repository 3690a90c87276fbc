"""A simulated ``numba.cuda`` for running unchanged kernels on the CPU.

Kernels are rebuilt with globals in which ``numba.cuda`` (and the names
imported from it) are replaced by :data:`cuda`, whose ``threadIdx`` etc. read
the running simulated thread.

Modelled: ``threadIdx``, ``blockIdx``, ``blockDim``, ``gridDim``, ``grid``,
``gridsize``, ``laneid``, ``warpsize``, ``syncthreads`` (and ``_count``,
``_and``, ``_or``), ``syncwarp``, ``shfl_sync`` / ``shfl_up_sync`` /
``shfl_down_sync`` / ``shfl_xor_sync``, ``ballot_sync``, ``all_sync``,
``any_sync``, ``match_any_sync``, ``match_all_sync``, ``activemask``, ``lanemask_lt``,
``threadfence*``, ``nanosleep``, ``shared.array``, ``local.array``, ``const.array_like``,
``atomic.*`` (with CUDA's NaN rules for ``max``/``min`` and ``nanmax``/``nanmin``), the integer and
float intrinsics ``popc``, ``brev``, ``clz``, ``ffs``, ``fma`` (one rounding), ``cbrt`` and ``selp``
(:mod:`flowdsl.sim.intrinsics`), the scalar types, the vector types (``float32x4``, ``uint4``, ...:
:mod:`flowdsl.sim.vectors`). Any
other ``numba.cuda`` device function raises
:class:`~flowdsl.sim.errors.UnsupportedFeatureError` when called.
"""

from __future__ import annotations

import builtins
import dis
import functools
import math
import os
import types

import numpy as np
from numba import cuda as _nb_cuda
from numba.core import types as _nb_types
from numba.core.typing.typeof import Purpose as _Purpose
from numba.core.typing.typeof import typeof as _typeof
from numba.cuda.stubs import Stub as _Stub  # the simulator shims numba.cuda, whose stubs user code names

from .._devices import code_names
from .._spec import NUMPY_ALLOCATING, numpy_allocation_allowed, numpy_allocation_refusal
from . import _state, division, intrinsics, vectors
from .bf16 import SimBf16
from .errors import KernelTypingError, UnsupportedFeatureError, UsageError, sim_error
from .memory import as_dtype, poisoned, raw
from .scheduler import block_sync

__all__ = ["cuda", "SimCuda", "simulate_function"]


class _ThreadIdx:
    __slots__ = ()
    x = property(lambda self: _state.cur.tx)
    y = property(lambda self: _state.cur.ty)
    z = property(lambda self: _state.cur.tz)


class _BlockIdx:
    __slots__ = ()
    x = property(lambda self: _state.cur.blk.idx[0])
    y = property(lambda self: _idx3(_state.cur.blk)[1])
    z = property(lambda self: _idx3(_state.cur.blk)[2])


def _idx3(blk):
    i = blk.idx
    return i if len(i) == 3 else (i[0], 0, 0)


class _BlockDim:
    __slots__ = ()
    x = property(lambda self: _state.cur.launch.block[0])
    y = property(lambda self: _state.cur.launch.block[1])
    z = property(lambda self: _state.cur.launch.block[2])


class _GridDim:
    __slots__ = ()
    x = property(lambda self: _state.cur.launch.grid[0])
    y = property(lambda self: _state.cur.launch.grid[1])
    z = property(lambda self: _state.cur.launch.grid[2])


def _thread():
    t = _state.cur
    if t is None or not hasattr(t, "blk"):
        raise UsageError("Cannot use numba.cuda device functions outside a simulated kernel thread: none is "
                         "running. Call them inside a kernel launched under flowdsl.sim.spawn")
    return t


def _aligned_copy(a, alignment):
    """``a``'s contents in memory aligned to ``alignment`` bytes (CFT needs 16-byte aligned shared memory)."""
    raw = np.empty(a.nbytes + alignment, np.uint8)
    start = -raw.__array_interface__["data"][0] % alignment
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _dynamic(t, dtype):
    """The block's dynamic shared memory (the launch's ``shared`` bytes, 16-byte aligned) as ``dtype``: every
    ``cuda.shared.array(0, dtype)`` of a block starts at its first byte, as on the GPU."""
    blk = t.blk
    if blk.dynamic is None:
        blk.dynamic = _aligned_copy(poisoned(blk.launch.shared, np.uint8), 16)
        _state.sched.world.add_region(blk.dynamic, f"the dynamic shared memory of rank {t.rank} {blk.name()}")
    return blk.dynamic[:blk.launch.shared // dtype.itemsize * dtype.itemsize].view(dtype)


def _checked_alignment(alignment, kind: str):
    """``alignment`` of ``cuda.<kind>.array`` as numba-cuda's typing and lowering take it (``cudadecl``,
    ``cudaimpl._validate_alignment``): an integer constant, positive, a power of 2 and a multiple of the pointer
    size (8), or None; anything else refused in numba-cuda's words, as compiling for a GPU refuses it."""
    if alignment is None:
        return None
    fix = ("Give a power of 2 that is a multiple of 8 (8, 16, 32, ...), written in the kernel or held in a global "
           "or closure variable, or leave alignment out")
    if isinstance(alignment, (bool, np.bool_)) or not isinstance(alignment, (int, np.integer)):
        raise sim_error(KernelTypingError, (
            f"RequireLiteralValue: alignment must be a constant integer, not {alignment!r} "
            f"(cuda.{kind}.array(..., alignment={alignment!r})). {fix}"))
    alignment = int(alignment)
    problem = ("positive" if alignment <= 0 else "a power of 2" if alignment & (alignment - 1)
               else "a multiple of 8" if alignment % 8 else None)
    if problem is not None:
        raise sim_error(UsageError, f"Alignment must be {problem}: cuda.{kind}.array(..., alignment={alignment}). {fix}")
    return alignment


class _Shared:
    @staticmethod
    def array(shape, dtype, alignment=None):
        """Block-shared array: the k-th call in a block returns the block's k-th array. Shape 0 is the
        launch's dynamic shared memory (:func:`_dynamic`): as many elements as its bytes hold, so an index
        past them is an error naming the array."""
        alignment = _checked_alignment(alignment, "shared")
        t = _thread()
        blk = t.blk
        k = t.nshared
        t.nshared = k + 1
        if k < len(blk.shared):
            return blk.shared[k]
        if shape == 0 or shape == (0,):
            a = _dynamic(t, as_dtype(dtype))
            name = (f"dynamic shared array #{k} of rank {t.rank} {blk.name()} ({a.size} {a.dtype.name}: the "
                    f"launch's {blk.launch.shared} bytes of dynamic shared memory)")
            a = _state.race.track(a, name) if _state.race is not None else a
            blk.shared.append(a)
            return a
        a = poisoned(shape, as_dtype(dtype))
        if alignment and a.__array_interface__["data"][0] % alignment:
            a = _aligned_copy(a, alignment)
        name = f"shared array #{k} of rank {t.rank} {blk.name()}"
        _state.sched.world.add_region(a, name)
        if _state.race is not None:  # its element accesses are checked for races
            a = _state.race.track(a, name)
        blk.shared.append(a)
        return a


class _Local:
    @staticmethod
    def array(shape, dtype, alignment=None):
        """Thread-private array (poisoned), ``alignment`` bytes aligned if given."""
        alignment = _checked_alignment(alignment, "local")
        a = poisoned(shape, as_dtype(dtype))
        if alignment and a.__array_interface__["data"][0] % alignment:
            a = _aligned_copy(a, alignment)
        return a


class _Const:
    @staticmethod
    def array_like(ary):
        return np.asarray(ary)


def _spin(arr, idx, value):
    from .memory import address_key
    _state.sched.yield_spin(_state.cur, (address_key(arr, idx), arr, idx, _plain(value)))


def _plain(v):
    try:
        return v.item()
    except AttributeError:
        return v


_RELAXED = 0  # MemoryOrder.RELAXED: numba's atomics order nothing (fences do)


def _rmw(op):
    def f(ary, idx, val):
        a = raw(ary)
        old = a[idx]
        a[idx] = op(old, val)
        _state.sched.stale = 0
        if _state.race is not None:
            _state.race.atomic(ary, idx, True, True, _RELAXED)
        return old
    return f


class _Atomic:
    """``cuda.atomic``: read-modify-write, relaxed (order with ``cuda.threadfence``); returns the old value."""

    add = staticmethod(_rmw(lambda o, v: o + v))
    sub = staticmethod(_rmw(lambda o, v: o - v))
    max = staticmethod(_rmw(intrinsics.atomic_max))  # CUDA's NaN rules, not Python's max
    min = staticmethod(_rmw(intrinsics.atomic_min))
    nanmax = staticmethod(_rmw(intrinsics.atomic_nanmax))
    nanmin = staticmethod(_rmw(intrinsics.atomic_nanmin))
    exch = staticmethod(_rmw(lambda o, v: v))
    and_ = staticmethod(_rmw(lambda o, v: o & v))
    or_ = staticmethod(_rmw(lambda o, v: o | v))
    xor = staticmethod(_rmw(lambda o, v: o ^ v))
    inc = staticmethod(_rmw(lambda o, v: 0 if o >= v else o + 1))
    dec = staticmethod(_rmw(lambda o, v: v if (o == 0 or o > v) else o - 1))

    @staticmethod
    def cas(ary, idx, old, val):
        a = raw(ary)
        cur = a[idx]
        swapped = bool(cur == old)
        if swapped:
            a[idx] = val
            _state.sched.stale = 0
        else:
            _spin(ary, idx, cur)
        if _state.race is not None:  # a failed compare-and-swap only loads
            _state.race.atomic(ary, idx, True, swapped, _RELAXED)
        return cur

    @staticmethod
    def compare_and_swap(ary, old, val):
        return _Atomic.cas(ary, 0, old, val)


def _warp_members(t, mask):
    n = t.blk.nthreads
    base = t.warp * 32
    lanes = [i for i in range(32) if (mask >> i) & 1 and base + i < n]
    return lanes


def _warp_exchange(t, mask, value, label):
    lanes = _warp_members(t, mask)
    if t.lane not in lanes:
        raise sim_error(UsageError, f"Cannot {label}: lane {t.lane} is not in mask {mask:#x}. "
                        "Include the calling lane in the mask")
    vals = block_sync(t, ("warp", t.warp, mask), len(lanes), label, (t.lane, value),
                      shape=("warp", mask), members=[t.warp * 32 + i for i in lanes])
    return dict(vals)


class _GridGroup:
    """``cuda.cg.this_grid()``: every thread of the launch (a cooperative launch on GPUs)."""

    @staticmethod
    def sync():
        t = _thread()
        (gx, gy, gz), (bx, by, bz) = t.launch.grid, t.launch.block
        everyone = gx * gy * gz * bx * by * bz
        block_sync(t, ("grid",), everyone, "cuda.cg.this_grid().sync()", shape="grid", scope=t.launch)


class _CooperativeGroups:
    """``cuda.cg``: the grid group."""

    @staticmethod
    def this_grid():
        return _GridGroup()


class SimCuda(types.ModuleType):
    """The simulated ``numba.cuda`` module."""

    threadIdx = _ThreadIdx()
    blockIdx = _BlockIdx()
    blockDim = _BlockDim()
    gridDim = _GridDim()
    shared = _Shared()
    local = _Local()
    const = _Const()
    atomic = _Atomic()
    fp16 = intrinsics.Fp16()
    bf16 = SimBf16
    cg = _CooperativeGroups()
    warpsize = 32

    @property
    def laneid(self):
        return _thread().lane

    @staticmethod
    def grid(ndim):
        t = _thread()
        lau = t.launch
        b = _idx3(t.blk)
        g = [b[k] * lau.block[k] + (t.tx, t.ty, t.tz)[k] for k in range(3)]
        return g[0] if ndim == 1 else tuple(g[:ndim])

    @staticmethod
    def gridsize(ndim):
        lau = _thread().launch
        g = [lau.grid[k] * lau.block[k] for k in range(3)]
        return g[0] if ndim == 1 else tuple(g[:ndim])

    @staticmethod
    def syncthreads():
        t = _thread()
        block_sync(t, ("cta",), t.blk.nthreads, "cuda.syncthreads()", shape="cta")

    @staticmethod
    def syncthreads_count(pred):
        t = _thread()
        return sum(1 for v in block_sync(t, ("cta",), t.blk.nthreads, "cuda.syncthreads_count()",
                                         bool(pred), shape="cta") if v)

    @staticmethod
    def syncthreads_and(pred):
        t = _thread()
        return int(all(block_sync(t, ("cta",), t.blk.nthreads, "cuda.syncthreads_and()", bool(pred),
                                  shape="cta")))

    @staticmethod
    def syncthreads_or(pred):
        t = _thread()
        return int(any(block_sync(t, ("cta",), t.blk.nthreads, "cuda.syncthreads_or()", bool(pred),
                                  shape="cta")))

    @staticmethod
    def syncwarp(mask=0xFFFFFFFF):
        t = _thread()
        _warp_exchange(t, mask, None, "cuda.syncwarp()")

    @staticmethod
    def shfl_sync(mask, value, src_lane):
        t = _thread()
        vals = _warp_exchange(t, mask, value, "cuda.shfl_sync()")
        return vals.get(src_lane % 32, value)

    @staticmethod
    def shfl_up_sync(mask, value, delta):
        t = _thread()
        vals = _warp_exchange(t, mask, value, "cuda.shfl_up_sync()")
        src = t.lane - delta
        return vals.get(src, value) if src >= 0 else value

    @staticmethod
    def shfl_down_sync(mask, value, delta):
        t = _thread()
        vals = _warp_exchange(t, mask, value, "cuda.shfl_down_sync()")
        return vals.get(t.lane + delta, value)

    @staticmethod
    def shfl_xor_sync(mask, value, lane_mask):
        t = _thread()
        vals = _warp_exchange(t, mask, value, "cuda.shfl_xor_sync()")
        return vals.get(t.lane ^ lane_mask, value)

    @staticmethod
    def ballot_sync(mask, pred):
        t = _thread()
        vals = _warp_exchange(t, mask, bool(pred), "cuda.ballot_sync()")
        return sum(1 << lane for lane, v in vals.items() if v)

    @staticmethod
    def all_sync(mask, pred):
        return int(all(_warp_exchange(_thread(), mask, bool(pred), "cuda.all_sync()").values()))

    @staticmethod
    def any_sync(mask, pred):
        return int(any(_warp_exchange(_thread(), mask, bool(pred), "cuda.any_sync()").values()))

    @staticmethod
    def match_any_sync(mask, value):
        t = _thread()
        vals = _warp_exchange(t, mask, value, "cuda.match_any_sync()")
        return np.int32(np.uint32(sum(1 << lane for lane, v in vals.items() if v == value)).view(np.int32))

    @staticmethod
    def match_all_sync(mask, value):
        t = _thread()
        vals = _warp_exchange(t, mask, value, "cuda.match_all_sync()")
        same = all(v == value for v in vals.values())
        members = sum(1 << lane for lane in vals) if same else 0
        return np.int32(np.uint32(members).view(np.int32)), same

    @staticmethod
    def lanemask_lt():
        return intrinsics.lanemask_lt(_thread().lane)

    popc = staticmethod(intrinsics.popc)
    brev = staticmethod(intrinsics.brev)
    clz = staticmethod(intrinsics.clz)
    ffs = staticmethod(intrinsics.ffs)
    fma = staticmethod(intrinsics.fma)
    cbrt = staticmethod(intrinsics.cbrt)
    selp = staticmethod(intrinsics.selp)

    @staticmethod
    def nanosleep(ns):
        """A hint to the scheduler on the GPU; nothing to wait for here."""

    @staticmethod
    def activemask():
        t = _thread()
        return sum(1 << i for i in _warp_members(t, 0xFFFFFFFF))

    @staticmethod
    def threadfence():
        """``fence.sc``: orders this thread's relaxed atomics around it (see flowdsl.sim.races)."""
        if _state.race is not None:
            _state.race.fence(_thread(), 5)  # MemoryOrder.SEQ_CST

    threadfence_block = threadfence
    threadfence_system = threadfence

    def __getattr__(self, name):
        v = getattr(_nb_cuda, name)
        if not _unmodelled(name):  # types, modules and constants are numba's own
            return v

        def unsupported(*a, **k):
            raise sim_error(UnsupportedFeatureError, (
                f"Cannot run numba.cuda.{name}: it is not modelled by the simulator yet. "
                "Avoid it in simulated kernels, or add it to flowdsl/sim/cudashim.py"))
        return unsupported


cuda = SimCuda("numba.cuda (flowdsl.sim)")

_REPLACE = {}
for _n in ("threadIdx", "blockIdx", "blockDim", "gridDim", "shared", "local", "const", "atomic", "grid",
           "gridsize", "syncthreads", "syncthreads_count", "syncthreads_and", "syncthreads_or", "syncwarp",
           "shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "ballot_sync", "all_sync",
           "any_sync", "activemask", "threadfence", "threadfence_block", "threadfence_system", "match_any_sync",
           "match_all_sync", "lanemask_lt", "popc", "brev", "clz", "ffs", "fma", "cbrt", "selp", "nanosleep"):
    if hasattr(_nb_cuda, _n):  # numba's own simulator (NUMBA_ENABLE_CUDASIM=1) puts some in kernels only
        _REPLACE[id(getattr(_nb_cuda, _n))] = getattr(cuda, _n)
_REPLACE[id(_nb_cuda)] = cuda


class _SimMath(types.ModuleType):
    """``math`` in simulated kernels: Python's, but taking NumPy scalars where numba-cuda takes any number
    (``math.ldexp(x, np.int32(e))``: Python's wants an int)."""

    def __getattr__(self, name):
        return getattr(math, name)

    @staticmethod
    def ldexp(x, e):
        r = math.ldexp(float(x), int(e))
        return type(x)(r) if isinstance(x, np.floating) else r


# numba-cuda's vector types (cuda.float32x4, its alias cuda.float4, ...): constructors of SimVector values.
for _stub, _construct in vectors.CONSTRUCTORS.items():
    for _n in (_stub.__name__, *_stub.aliases):
        setattr(SimCuda, _n, staticmethod(_construct))
    _REPLACE[id(_stub)] = _construct

_REPLACE[id(math)] = _SimMath("math (flowdsl.sim)")
try:  # numba-cuda's bfloat16 module (`from numba.cuda import bf16`): its simulated twin
    import numba.cuda.bf16 as _nb_bf16
except ImportError:  # pragma: no cover - an older numba-cuda without it
    _nb_bf16 = None
if _nb_bf16 is not None:
    _REPLACE[id(_nb_bf16)] = SimBf16


def _is_device_function(v):
    pf = getattr(v, "py_func", None)
    return pf is not None and isinstance(pf, types.FunctionType)


def simulate_function(fn, cache, debug: bool = False):
    """``fn`` rebuilt with simulated globals (device functions it calls are rebuilt too), its divisions by
    zero under numba-cuda's error model (:mod:`flowdsl.sim.division`).

    Args:
        fn: The user's Python function (a kernel's or device function's ``py_func``).
        cache: Dict reused across calls of one simulation.
        debug: The kernel's ``debug`` (Python's error model; device functions keep NumPy's, as numba-cuda's).
    """
    # Kernels made by one factory share code and globals but not their closure cells; one function may be
    # two kernels, with debug and without (numba-cuda's own tests make both).
    key = id(fn.__code__), id(fn.__globals__), tuple(id(c) for c in fn.__closure__ or ()), debug
    hit = cache.get(key)
    if hit is not None:
        return hit
    g = dict(fn.__globals__)
    # The closure's cells are filled after the function is in the cache: a device function that calls
    # itself through its closure (one made by a factory) finds itself there, not a new copy without end.
    # Cells whose value is left as it is stay the user's own (one still empty now sees its later value).
    cells = tuple(types.CellType() if _to_simulate(c) else c for c in fn.__closure__) if fn.__closure__ else None
    _refuse_unmodelled(fn)
    code = division.code_with_model(fn)
    if code is not None:
        g.update(division.model(debug))
    new = types.FunctionType(code or fn.__code__, g, fn.__name__, fn.__defaults__, cells)
    new.__kwdefaults__ = fn.__kwdefaults__
    cache[key] = new
    for mine, cell in zip(cells or (), fn.__closure__ or ()):
        if mine is not cell:
            mine.cell_contents = _sim_value(cell.cell_contents, cache)
    names = code_names(fn.__code__)
    if "round" in names and "round" not in g:  # the builtin, as numba-cuda computes it (not NumPy's)
        g["round"] = intrinsics.round_
    for k in names:
        if k not in g:
            continue
        if g[k] is np:  # NumPy as a kernel sees it: what allocates an array is refused, as the GPU's typing does
            g[k] = KERNEL_NUMPY
            continue
        r = _sim_value(g[k], cache)
        if r is not None:
            g[k] = r
    return new


class _KernelNumpy:
    """``numpy`` inside simulated kernel code: NumPy itself, but for the functions that make a new array, which
    a GPU kernel cannot call without numba's runtime: refused as compiling for a GPU refuses them, in the same
    words, unless the runtime is on (then the GPU links it, and they run here too)."""

    def __getattr__(self, name):
        if name in NUMPY_ALLOCATING and not numpy_allocation_allowed():
            def refused(*args, **kwargs):
                raise sim_error(KernelTypingError, numpy_allocation_refusal(name))
            return refused
        return getattr(np, name)


KERNEL_NUMPY = _KernelNumpy()


class _SimModule:
    """A module of device functions (``flowdsl.flow``) whose functions run simulated."""

    def __init__(self, module, cache):
        self._module, self._cache = module, cache

    def __getattr__(self, name):
        v = getattr(self._module, name)
        r = _sim_value(v, self._cache)
        return v if r is None else r


def _sim_value(v, cache):
    r = _REPLACE.get(id(v))
    if r is not None:
        return r
    if _is_device_function(v) and not getattr(v, "__flowdsl_primitive__", None):
        key = ("device", id(v))
        if key not in cache:
            cache[key] = _to_declared(v, _returning_no_new_array(simulate_function(v.py_func, cache)))
        return cache[key]
    if isinstance(v, types.ModuleType) and getattr(v, "__flowdsl_device_module__", False):
        key = ("module", id(v))
        if key not in cache:
            cache[key] = _SimModule(v, cache)
        return cache[key]
    return None


def _to_declared(v, fn):
    """``fn``, the simulated device function ``v``, taking only ``v``'s declared signatures as the GPU's lowering
    does (``v.overloads.conversions``, with numba's typing context: a float for an int32 is truncated, as numba
    casts it), and a call that converts to none is numba's typing error. Without declared signatures, ``fn``."""
    overloads = getattr(v, "overloads", None)
    if getattr(overloads, "declared", None) is None:
        return fn
    from numba.core.registry import cpu_target  # noqa: PLC0415 - numba's conversion rules, as flowdsl's launches

    casts_for: dict = {}

    @functools.wraps(fn)
    def call(*args):
        given = tuple(_typeof(a, _Purpose.argument) for a in args)
        casts = casts_for.get(given, casts_for)
        if casts is casts_for:
            casts = casts_for[given] = overloads.conversions(given, cpu_target.typing_context)
        if casts is None:
            raise sim_error(KernelTypingError, (
                f"No implementation of function {v.__name__} found for signature: {v.__name__}"
                f"({', '.join(map(str, given))}): it is declared for "
                f"{', '.join(map(str, overloads.declared_signatures()))} and these arguments convert to none of "
                "them. Pass arguments of a declared signature's types"))
        return fn(*(a if t is None else np.dtype(str(t)).type(a) for a, t in zip(args, casts)))
    return call


def _returning_no_new_array(fn):
    """``fn``, a device function, refusing to return an array that is not one of its arguments (a slice, a
    view): numba-cuda compiles without NRT, so its typing refuses that return, and the simulator must too."""
    @functools.wraps(fn)
    def device_function(*args, **kwargs):
        result = fn(*args, **kwargs)
        # Only the array itself: numba's check (typed_passes.legalize_return_type) passes tuples holding arrays.
        if isinstance(result, np.ndarray) and not any(result is a for a in args):
            raise sim_error(KernelTypingError, (
                f"Cannot return an array from device function {fn.__name__}: numba-cuda compiles without NRT "
                "and accepts only returning an array passed into the function as argument (its typing's "
                "'Only accept returning of array passed into the function as argument'). Pass the array "
                "and an offset instead, or an output array to fill"))
        return result
    return device_function


def _to_simulate(cell) -> bool:
    """Whether the cell holds what the simulator replaces (a numba.cuda name, a device function or module)."""
    try:
        v = cell.cell_contents
    except ValueError:  # empty
        return False
    return (id(v) in _REPLACE or (_is_device_function(v) and not getattr(v, "__flowdsl_primitive__", None))
            or (isinstance(v, types.ModuleType) and getattr(v, "__flowdsl_device_module__", False)))


def _unmodelled(name: str) -> bool:
    """Whether ``numba.cuda.<name>`` is a device function the simulator does not model (see SimCuda.__getattr__)."""
    if name in SimCuda.__dict__ or not hasattr(_nb_cuda, name):
        return False
    v = getattr(_nb_cuda, name)
    is_stub = isinstance(v, type) and issubclass(v, _Stub)
    return is_stub or not (isinstance(v, (_nb_types.Type, types.ModuleType, type)) or not callable(v))


def _refuse_unmodelled(fn):
    """Before the launch: the numba.cuda device functions ``fn`` names that the simulator does not model,
    refused naming each and the user's line (at the call it would be an error from inside the simulation)."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))

    def value(name):
        if name in cells:
            try:
                return cells[name].cell_contents
            except ValueError:
                return None
        return fn.__globals__.get(name)

    found = []
    undefined = []
    unfrozen = []

    def scan(code):
        previous = None
        for instr in dis.get_instructions(code):
            if instr.opname == "LOAD_GLOBAL" and instr.argval not in fn.__globals__ and \
                    not hasattr(builtins, instr.argval):
                undefined.append((instr.argval, instr.positions.lineno))
            if instr.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME"):
                v = value(instr.argval)
                if _cannot_freeze(v):
                    unfrozen.append((instr.argval, type(v), instr.positions.lineno))
                if v is _nb_cuda:
                    previous = instr
                    continue
                if isinstance(v, type) and issubclass(v, _Stub) and id(v) not in _REPLACE and \
                        getattr(_nb_cuda, v.__name__, None) is v and _unmodelled(v.__name__):
                    found.append((v.__name__, instr.positions.lineno))
            elif instr.opname in ("LOAD_ATTR", "LOAD_METHOD") and previous is not None and _unmodelled(instr.argval):
                found.append((instr.argval, instr.positions.lineno))
            previous = None
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                scan(const)
    scan(fn.__code__)
    if undefined:  # numba's typing refuses it before the launch: so does the simulator, in numba's words
        name, line = undefined[0]
        raise sim_error(KernelTypingError, (
            f"NameError: name {name!r} is not defined\n  in {fn.__qualname__} ({fn.__code__.co_filename}:{line})"))
    if unfrozen:  # numba's typing refuses a global it cannot freeze into the code: so does the simulator
        name, kind, line = unfrozen[0]
        raise sim_error(KernelTypingError, (
            f"Untyped global name {name!r}: Cannot determine Numba type of {kind}\n  in {fn.__qualname__} "
            f"({fn.__code__.co_filename}:{line}). A kernel takes numbers, tuples, enums and NumPy arrays and "
            "scalars as constants: read what it needs into such values, or pass it as an argument"))
    if found:
        name, line = found[0]
        others = sorted({n for n, _ in found} - {name})
        also = f" (nor numba.cuda.{', numba.cuda.'.join(others)})" if others else ""
        raise sim_error(UnsupportedFeatureError, (
            f"Cannot run {fn.__name__} on the simulator: it calls numba.cuda.{name} at "
            f"{os.path.basename(fn.__code__.co_filename)}:{line} ({fn.__name__}), which the simulator does not model "
            f"yet{also}. Run it on a GPU (flowdsl.init()), or leave that call out of simulated kernels"))


def _cannot_freeze(v) -> bool:
    """Whether numba's typing would refuse ``v`` as a global or closure value of device code: it freezes
    numbers, strings, tuples, enums and NumPy values as constants, and resolves modules, classes and
    callables (functions, kernels, numba-cuda's stubs); anything else (a dataclass instance, a dict) has
    no numba type."""
    if v is None or id(v) in _REPLACE or callable(v) or isinstance(v, (types.ModuleType, type, _nb_types.Type)):
        return False
    try:
        _typeof(v, _Purpose.constant)
    except Exception:  # noqa: BLE001 - numba's "cannot determine Numba type"
        return True
    return False
