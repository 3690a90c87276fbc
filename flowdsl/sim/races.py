"""Data-race detection in the simulator: happens-before over vector clocks (as ThreadSanitizer and FastTrack).

Every task that touches memory has a *slot* in the vector clocks: each rank's host
program, each simulated GPU thread, and each channel of the simulated network (which
reads puts' sources and lands them). A task's clock ``vc`` says, for every slot, up to
which of that slot's clock values it is ordered after; its own clock ``clk`` rises when it
releases. Barriers join the clocks of everyone who meets; a release (``store_release``, a
releasing barrier arrival, a put's issue, a signal's application) publishes a copy of the
releaser's clock and an acquire (``load_acquire``, an acquiring wait) joins it in. A relaxed
load only notes what it saw (``acqp``) until an acquiring fence (or the end of the kernel)
takes it in; a relaxed store publishes what the last releasing fence had (``relf``).

Shadow memory keeps, per element, the last plain write, the plain reads since, and the
atomic writes and reads since the last plain write, each as an epoch ``(slot, clock, who,
code or what, instruction offset or None)``. An access that conflicts with one of them (one
of the two writes, not both atomic) and is not ordered after it raises
:class:`~flowdsl.sim.errors.DataRaceError` naming both accesses.

Threads of a launch reuse the slots of the rank's previous launch: the stream orders every
earlier launch before it, so an access of an earlier user of the slot is ordered before every
access the new thread makes.

What is checked: window views (element reads and writes, slices), ``flowdsl.mem`` loads,
stores, atomics and 16-byte vectors, ``cuda.atomic``, shared arrays and buffers passed to a
kernel (:class:`TrackedArray`), and the network's reads and writes of GIN and CFT operations.
The host's own reads and writes of buffers (``buf.set``, ``buf.get``, numpy on the buffer)
are not: launches and ``synchronize`` order them with the rank's kernels.
"""

from __future__ import annotations

import os
import sys
import weakref
from array import array

import numpy as np

from ..enums import MemoryOrder
from . import _state
from .errors import DataRaceError, IndexAccessError, sim_error

__all__ = ["RaceDetector", "TrackedArray", "ACQUIRING", "RELEASING", "enabled_by_default", "ENV_VAR"]

#: Environment variable that turns race detection on ("1") or off ("0") when spawn() is not told.
ENV_VAR = "FLOWDSL_SIM_RACES"
ACQUIRING = frozenset(int(o) for o in (MemoryOrder.CONSUME, MemoryOrder.ACQUIRE, MemoryOrder.ACQ_REL,
                                       MemoryOrder.SEQ_CST))
RELEASING = frozenset(int(o) for o in (MemoryOrder.RELEASE, MemoryOrder.ACQ_REL, MemoryOrder.SEQ_CST))
_ACQ = int(MemoryOrder.ACQUIRE)

_SIM_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP = frozenset([os.path.join(_SIM_DIR, f) for f in os.listdir(_SIM_DIR) if f.endswith(".py")]
                  + [os.path.join(os.path.dirname(_SIM_DIR), "_stubs.py")])
_getframe = sys._getframe
_nd_get = np.ndarray.__getitem__
_nd_set = np.ndarray.__setitem__

# Fields of a shadow record (a list per element).
_PW, _PR, _AW, _AR, _SYNC = range(5)


def enabled_by_default() -> bool:
    """Whether spawn() detects races when not told: on, unless ``FLOWDSL_SIM_RACES=0``."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "off", "false", "no")


# ---------------------------------------------------------------- vector clocks
def _zeros(n):
    return array("q", bytes(8 * n))


def join(a, b):
    """The element-wise maximum of two clocks (a new array; ``None`` is the zero clock)."""
    if b is None or a is b:
        return a
    if a is None:
        return b
    if len(a) < len(b):
        a, b = b, a
    c = array("q", a)
    n = np.frombuffer(c, np.int64)[:len(b)]
    np.maximum(n, np.frombuffer(b, np.int64), out=n)
    return c


def full(t):
    """A copy of ``t``'s clock with its own entry: what ``t`` releases."""
    c = array("q", t.vc)
    s = t.slot
    if len(c) <= s:
        c.extend(_zeros(s + 1 - len(c)))
    c[s] = t.clk
    return c


def _ordered(e, t) -> bool:
    """Whether the access of epoch ``e`` happens before ``t``'s current point."""
    u = e[0]
    if u == t.slot:
        return True
    try:
        return t.vc[u] >= e[1]
    except IndexError:
        return False


def _site():
    """``(code, instruction offset)`` of the innermost frame outside the simulator (its line is worked
    out for a report only: ``f_lineno`` costs a scan of the line table on every access); when that frame is
    flowdsl's own code (a Flow step), a third item: the ``(code, offset)`` of the user's call into it."""
    f = _getframe(2)
    code = f.f_code
    while code.co_filename in _SKIP:
        f = f.f_back
        code = f.f_code
    if not _library(code.co_filename):
        return (code, f.f_lasti)
    caller = user_frame(f)
    return (code, f.f_lasti, None if caller is None else (caller.f_code, caller.f_lasti))


_PACKAGE_DIR = os.path.dirname(_SIM_DIR)
_EXAMPLES_DIR = os.path.join(_PACKAGE_DIR, "examples")


def _library(filename: str) -> bool:
    """flowdsl's own device code (Flow's steps, the collectives' programs), not a program written with it."""
    return filename.startswith(_PACKAGE_DIR) and not filename.startswith(_EXAMPLES_DIR)


def user_frame(f):
    """The first frame from ``f`` outward that is not flowdsl's own code (its simulator's included): the user's
    call into the library code running in ``f``; None when that code is the kernel itself (a collective)."""
    while f is not None and _library(f.f_code.co_filename):
        f = f.f_back
    return f


def where_now() -> str:
    """Where the running thread is, for a report: its innermost line outside the simulator and, when that is
    flowdsl's own code, the user's line that called it."""
    here = _where(_site())
    caller = _user_call_site()
    return f"{here}, inside flowdsl, called from your code at {caller}" if caller else here


def user_line() -> str:
    """The running thread's own line that led here: its call into flowdsl's code, else its innermost line."""
    return _user_call_site() or _where(_site())


def _fix_in_library(caller: str, other) -> str:
    """The fix when this access is flowdsl's code that the user's ``caller`` line called."""
    code = other[3]  # an access's record: (slot, clock, thread, code, instruction offset); a report's site string
    if other[4] is not None and _library(code.co_filename):
        return (f"Fix: both accesses are flowdsl's own code, so what your call at {caller} asks of it is what "
                "races. Either two blocks on the same side of one Flow connection (a connection has one sending and "
                "one receiving block per channel: give each block its own channel or connection number), or the two "
                "ends of a connection run different numbers of threads (launch both ends with the same block size: "
                "a slot's lines are split among the warps of each end)")
    return (f"Fix: your own code touches memory that flowdsl's code called at {caller} moves: order the two with "
            "a barrier (cuda.syncthreads() in one block), or use another buffer")


def _user_call_site():
    """Where the running thread's own code called into flowdsl's library code that is making the access now
    (``file:line (function)``), or None when the access is in its own code: a report then names the user's
    line that led there, not only a line of flow.py."""
    f = _getframe(1)
    while f is not None and f.f_code.co_filename in _SKIP:
        f = f.f_back
    if f is None or not _library(f.f_code.co_filename):
        return None
    f = user_frame(f)
    if f is None:  # the library code is the kernel itself (a collective)
        return None
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"


def _called_from(e) -> str:
    """For an access made in flowdsl's own code: ``, inside flowdsl, called from your code at ...`` (the user's
    call into it, recorded with the access), else nothing."""
    site = e[3] if e[4] is None else e[3:]
    caller = site[2] if isinstance(site, tuple) and len(site) > 2 else None
    if caller is None:  # the user's own line, or the library code is the kernel itself (a collective)
        return ""
    return f", inside flowdsl, called from your code at {_where(caller)}"


def _line(code, lasti):
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line
    return code.co_firstlineno


class Agent:
    """A network channel acting as a thread: it reads operations' sources and lands them.

    Its clock joins the clock of every operation it carries (at issue), so what it writes
    is ordered after what its issuers did before issuing.
    """

    __slots__ = ("slot", "vc", "clk", "relf", "acqp", "label")

    def __init__(self, slot, label):
        self.slot, self.label = slot, label
        self.vc, self.clk, self.relf, self.acqp = _zeros(1), 1, None, None

    def name(self):
        return self.label


# ---------------------------------------------------------------- tracked arrays
class TrackedArray(np.ndarray):
    """Device memory a kernel reaches as a plain array (a buffer argument, a shared array).

    Element reads and writes are checked for races; arrays derived from it by slicing are
    tracked too; any other derived array (a copy, a reshape) is not. ``_plain`` is the same
    memory as an untracked array (what the primitives' semantics read and write).
    """

    def __array_finalize__(self, obj):
        self._rc = None

    def _elem(self, i):
        """Byte offset (in the region) of element ``i``, or None when ``i`` is not one element."""
        if type(i) is int or isinstance(i, np.integer):
            if self._s0 is None:  # not 1-D: a row, not an element
                return None
            i = int(i)
            if i < 0:
                i += self._n0
            return self._off0 + i * self._s0
        if type(i) is tuple and len(i) == self.ndim and all(type(k) is int or isinstance(k, np.integer) for k in i):
            off = self._off0
            for k, n, st in zip(i, self.shape, self.strides):
                k = int(k)
                off += (k + n if k < 0 else k) * st
            return off
        return None

    def _offsets(self, i):
        """Byte offsets of the elements ``self[i]`` selects."""
        offs = np.zeros(self.shape, np.int64) + self._off0
        for axis, st in enumerate(self.strides):
            shape = [1] * self.ndim
            shape[axis] = self.shape[axis]
            offs = offs + (np.arange(self.shape[axis], dtype=np.int64) * st).reshape(shape)
        return np.asarray(offs[i]).reshape(-1).tolist()

    def __getattr__(self, name):
        # A field of a record array by name (``ary.x``), as numba-cuda and NumPy's recarray give it.
        names = self.dtype.names
        if names is not None and name in names:
            return self[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getitem__(self, i):
        try:
            v = _nd_get(self, i)
        except IndexError as e:
            raise _past_the_end(self, i, e) from None
        if type(v) is np.void and v.dtype.names is not None:  # a record: its fields by name too (rec.x)
            v = _nd_get(self._plain.view(np.recarray), i)
        rc = self._rc
        if rc is not None:
            if type(i) is int and self._s0 is not None:  # the common case: one element of a 1-D array
                rc.read(self._cells, self._off0 + (i if i >= 0 else i + self._n0) * self._s0, self, i)
                return v
            off = self._elem(i)
            if off is not None:
                rc.read(self._cells, off, self, i)
            elif isinstance(v, TrackedArray) and np.may_share_memory(v, self):  # a view: tracked in turn
                return rc.track_part(self, i)
            else:  # a copy (fancy indexing): its elements were read now
                for o in self._offsets(i):
                    rc.read(self._cells, o, self, None)
        return v

    def __setitem__(self, i, value):
        try:
            _nd_set(self, i, value)
        except IndexError as e:
            raise _past_the_end(self, i, e) from None
        rc = self._rc
        if rc is not None:
            if type(i) is int and self._s0 is not None:
                rc.write(self._cells, self._off0 + (i if i >= 0 else i + self._n0) * self._s0, self, i)
                return
            off = self._elem(i)
            if off is not None:
                rc.write(self._cells, off, self, i)
            else:
                for o in self._offsets(i):
                    rc.write(self._cells, o, self, None)

    # NumPy's own functions on a tracked array (``np.sum(x)``, ``x * 2``, ``x[a:b] += y``) read or write every
    # element of it without going through ``__getitem__``: each is recorded as such an access, so that a race
    # in them is caught as in a loop of element accesses; the computation itself runs on the plain arrays.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out", ())
        if method == "at":  # ufunc.at(a, index, ...): reads and writes the selected elements of a
            target, index = inputs[0], inputs[1]
            _accessed(inputs[2:], write=False)
            if isinstance(target, TrackedArray) and target._rc is not None:
                for o in target._offsets(index):
                    target._rc.read(target._cells, o, target, None)
                    target._rc.write(target._cells, o, target, None)
            getattr(ufunc, method)(*_plain_all(inputs), **kwargs)
            return None
        _accessed(inputs, write=False)
        _accessed(out, write=True)
        if out:
            kwargs["out"] = tuple(_plain_all(out))
        result = getattr(ufunc, method)(*_plain_all(inputs), **kwargs)
        if out:
            return out[0] if len(out) == 1 else tuple(out)
        return result

    def __array_function__(self, func, types, args, kwargs):
        if func not in _NO_DATA:
            _accessed(_arrays_in(args, kwargs), write=False)
            _accessed(_arrays_in((kwargs.get("out"),), {}), write=True)
        return func._implementation(*_plain_all(args), **dict(zip(kwargs, _plain_all(kwargs.values()))))



#: NumPy functions that read no element of their arrays (shapes, types, memory overlap).
_NO_DATA = frozenset(f for f in (getattr(np, n, None) for n in (
    "may_share_memory", "shares_memory", "shape", "ndim", "size", "result_type", "iscomplexobj", "isrealobj",
    "min_scalar_type", "can_cast", "broadcast_shapes", "empty_like")) if f is not None)


def _plain_all(values):
    return [v.view(np.ndarray) if isinstance(v, TrackedArray) else v for v in values]


def _arrays_in(args, kwargs):
    found = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, TrackedArray):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(a for a in v if isinstance(a, TrackedArray))
    return found


def _accessed(values, write: bool) -> None:
    """Every element of each tracked array among ``values``, read (or written) by the running thread."""
    for a in values:
        if isinstance(a, TrackedArray) and a._rc is not None:
            access = a._rc.write if write else a._rc.read
            for o in a._offsets(Ellipsis):
                access(a._cells, o, a, None)


def _past_the_end(arr, index, err):
    """An index outside ``arr`` (a buffer, a shared array) as an error naming the array: on a GPU the access
    reads or writes whatever lies beyond it."""
    return sim_error(IndexAccessError, (
        f"Cannot access element {index!r} of {arr._name or 'an array'} (shape {arr.shape}) at "
        f"{_where(_site())}: {err}. On a GPU "
        "this reads or writes past the array. Keep the index inside the shape (for dynamic shared memory, "
        "launch with enough bytes: k[grid, block, stream, nbytes])"))


def _ptr(a) -> int:
    return a.__array_interface__["data"][0]


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


# ---------------------------------------------------------------- the detector
class RaceDetector:
    """Vector clocks of one simulation run, and the shadow memory of everything it tracks.

    Args:
        seed: The run's seed (named in reports).
        world: The simulated world (names memory in reports).
    """

    def __init__(self, seed, world=None):
        self.seed, self.world = seed, world
        self.nslots = 0
        self.slot_clk = []
        self.pools = {}
        self.done_vc = {}
        self.regions = {}
        self._finalizers = []
        #: id(cells) -> the smallest element size of the views and arrays made over that region.
        self.grain = {}
        self.agents = {}
        self.sync = {}
        self._memo = {}

    # ---- slots and clocks ------------------------------------------------------
    def _new_slot(self):
        self.nslots += 1
        self.slot_clk.append(0)
        return self.nslots - 1

    def add_host(self, task):
        task.slot, task.vc, task.clk = self._new_slot(), _zeros(1), 1

    def agent(self, key, label):
        """The network channel ``key``'s agent (made on first use)."""
        a = self.agents.get(key)
        if a is None:
            a = self.agents[key] = Agent(self._new_slot(), label or net_label(key))
        return a

    def _join(self, a, b):
        """``join(a, b)``, remembered: threads that met at a barrier share one clock and acquire the
        same things, so the same joins recur (the memo holds its arrays: their ids stay theirs)."""
        if b is None or a is b:
            return a
        if a is None:
            return b
        memo = self._memo
        key = (id(a), id(b))
        m = memo.get(key)
        if m is not None and m[0] is a and m[1] is b:
            return m[2]
        r = join(a, b)
        if len(memo) >= 1024:
            memo.clear()
        memo[key] = (a, b, r)
        return r

    def _join_into(self, t, vc):
        t.vc = self._join(t.vc, vc)

    def release(self, t):
        """What ``t`` publishes by a release now (its clock then rises)."""
        c = full(t)
        t.clk += 1
        return c

    def release_vc(self, t, order):
        """What a store of ``order`` by ``t`` publishes: all of ``t`` if releasing, else its last release fence."""
        return self.release(t) if int(order) in RELEASING else t.relf

    def acquire(self, t, vc, order=_ACQ):
        """``t`` reads what ``vc`` published: joined now if ``order`` acquires, else at its next acquire fence."""
        if vc is None:
            return
        if int(order) in ACQUIRING:
            self._join_into(t, vc)
        else:
            t.acqp = self._join(t.acqp, vc)

    def release_to(self, key, vc):
        """Join ``vc`` into the synchronisation object ``key`` (a barrier inbox, a signal, a counter)."""
        if vc is not None:
            self.sync[key] = self._join(self.sync.get(key), vc)

    def acquire_from(self, t, key, order=_ACQ):
        self.acquire(t, self.sync.get(key), _ACQ if order is None else order)

    def fence(self, t, order):
        """A fence of ``order``: the acquire part takes in what relaxed loads saw; the release part
        is what later relaxed stores publish."""
        order = int(order)
        if order in ACQUIRING and t.acqp is not None:
            self._join_into(t, t.acqp)
            t.acqp = None
        if order in RELEASING:
            t.relf = self.release(t)

    def barrier(self, tasks):
        """Everyone in ``tasks`` met: each is ordered after everything any of them did before."""
        bases = {}
        top = 0
        for p in tasks:
            bases[id(p.vc)] = p.vc
            if p.slot > top:
                top = p.slot
        vals = list(bases.values())
        j = vals[0]
        for v in vals[1:]:
            j = join(j, v)
        j = array("q", j)
        if len(j) <= top:
            j.extend(_zeros(top + 1 - len(j)))
        for p in tasks:
            j[p.slot] = p.clk
        for p in tasks:
            p.vc = j
            p.clk += 1

    # ---- launches ----------------------------------------------------------------
    def enqueue(self, host, launch):
        """A launch is ordered after what its host did before launching it."""
        launch.race_start = self.release(host)

    def start(self, launch, threads):
        """Give the threads of ``launch`` slots (reusing the rank's) and their first clock."""
        pool = self.pools.setdefault(launch.rank, [])
        while len(pool) < len(threads):
            pool.append(self._new_slot())
        base = join(launch.race_start, self.done_vc.get(launch.rank))
        slot_clk = self.slot_clk
        for t, s in zip(threads, pool):
            t.slot, t.vc, t.clk = s, base, slot_clk[s] + 1
        launch.race_base = base
        launch.race_ends = {}
        launch.race_clks = []

    def thread_done(self, t):
        """The end of a kernel fences: what the thread's relaxed loads saw is taken in."""
        if t.acqp is not None:
            self._join_into(t, t.acqp)
            t.acqp = None
        lau = t.launch
        lau.race_ends[id(t.vc)] = t.vc
        lau.race_clks.append((t.slot, t.clk))
        self.slot_clk[t.slot] = t.clk

    def launch_done(self, launch):
        vc = launch.race_base
        for v in launch.race_ends.values():
            vc = self._join(vc, v)
        vc = array("q", vc)
        top = max((s for s, _ in launch.race_clks), default=-1)
        if len(vc) <= top:
            vc.extend(_zeros(top + 1 - len(vc)))
        for s, c in launch.race_clks:
            vc[s] = c
        self.done_vc[launch.rank] = vc
        launch.race_ends = launch.race_clks = None

    def synchronize(self, host, rank):
        """``comm.synchronize()`` returned: the host is ordered after the rank's finished kernels."""
        self._join_into(host, self.done_vc.get(rank))

    # ---- memory regions ------------------------------------------------------------
    def region(self, arr):
        """``(cells, byte offset of arr[0] in them)``: the shadow memory of ``arr``'s allocation."""
        root = _root(arr)
        key = id(root)
        cells = self.regions.get(key)
        if cells is None:
            cells = self.regions[key] = {}
            # Its memory may be reused by a later allocation: forget it when it is freed.
            self._finalizers.append(weakref.finalize(root, self._forget, key, id(cells)))
        return cells, _ptr(arr) - _ptr(root)

    def close(self):
        """The run is over: drop the shadow memory (buffers that outlive the run keep no hold on it)."""
        for f in self._finalizers:
            f.detach()
        self._finalizers = []
        self.regions.clear()
        self.grain.clear()
        self.sync.clear()
        self._memo.clear()

    def _forget(self, key, cells_id):
        self.regions.pop(key, None)
        self.grain.pop(cells_id, None)

    def note_grain(self, cells, itemsize):
        """A view or array of ``itemsize``-byte elements was made over the region ``cells``."""
        g = self.grain.get(id(cells))
        if g is None or itemsize < g:
            self.grain[id(cells)] = itemsize

    def window(self, group, rank):
        """``(cells, byte offset)`` of rank ``rank``'s memory of a window group."""
        cache = group.race_cells
        if cache is None:
            cache = group.race_cells = {}
        r = cache.get(rank)
        if r is None:
            r = cache[rank] = self.region(group.bytes[rank])
        return r

    def track(self, arr, name=None):
        """``arr`` as a :class:`TrackedArray` whose element accesses are checked."""
        t = arr.view(TrackedArray)
        t._cells, t._off0 = self.region(arr)
        self.note_grain(t._cells, arr.itemsize)
        t._plain = arr.view(np.ndarray)
        t._name = name
        t._s0, t._n0 = (arr.strides[0], arr.shape[0]) if arr.ndim == 1 else (None, 0)
        t._rc = self
        return t

    def track_part(self, whole, index):
        """``whole[index]``, a view, tracked as ``whole`` is.

        Made from ``whole``'s plain array, so its ``.base`` chain reaches the buffer only: NumPy's
        garbage collection does not follow ``.base``, and a view whose base was ``whole`` (or the
        view itself, for its plain array) kept ``whole`` and through ``_rc`` the whole simulated
        world alive whenever the view sat in a cycle (a kernel's frame a bounded wait noted)."""
        plain = _nd_get(whole._plain, index)
        part = plain.view(TrackedArray)
        self.note_grain(whole._cells, part.itemsize)
        part._cells = whole._cells
        part._off0 = whole._off0 + _ptr(part) - _ptr(whole)
        part._plain = plain
        part._name = whole._name
        part._s0, part._n0 = (part.strides[0], part.shape[0]) if part.ndim == 1 else (None, 0)
        part._rc = self
        return part

    def locate(self, arr, index):
        """``(cells, byte offset)`` of element ``index`` of a view or tracked array, or None."""
        cells = getattr(arr, "_cells", None)
        if cells is None:
            return None
        if isinstance(arr, TrackedArray):
            off = arr._elem(index)
            return None if off is None else (cells, off)
        return cells, arr._off0 + int(index) * arr._isz

    # ---- accesses by the running thread ------------------------------------------------------
    # read() and write() run on every element access: _ordered() is inlined there, and _site() is called
    # only at an element's first access in an epoch.
    def read(self, cells, off, obj, idx):
        """A plain read by the running thread."""
        t = _state.cur
        slot = t.slot
        rec = cells.get(off)
        if rec is not None:
            pr = rec[1]
            if pr.__class__ is tuple and pr[0] == slot and pr[1] == t.clk:
                return  # read in this epoch already
            vc = t.vc
            w = rec[0]
            if w is not None and w[0] != slot and (w[0] >= len(vc) or vc[w[0]] < w[1]):
                self._race(t, "read", obj, idx, off, w, "write", None)
            if rec[2]:
                for e in rec[2].values():
                    if not _ordered(e, t):
                        self._race(t, "read", obj, idx, off, e, "atomic write", None)
        e = (slot, t.clk, t, *_site())  # where the user read, unless a primitive read for them
        if rec is None:
            cells[off] = [None, e, None, None, None]
        elif pr is None or (pr.__class__ is tuple and (pr[0] == slot or (pr[0] < len(vc) and vc[pr[0]] >= pr[1]))):
            rec[1] = e
        elif pr.__class__ is tuple:
            rec[1] = {pr[0]: pr, slot: e}
        else:
            pr[slot] = e

    def write(self, cells, off, obj, idx):
        """A plain write by the running thread."""
        t = _state.cur
        slot = t.slot
        rec = cells.get(off)
        if rec is not None:
            w, pr = rec[0], rec[1]
            if w is not None and w[0] == slot and w[1] == t.clk and pr is None and rec[2] is None \
                    and rec[3] is None:
                return  # written in this epoch already, nothing since
            vc = t.vc
            if w is not None and w[0] != slot and (w[0] >= len(vc) or vc[w[0]] < w[1]):
                self._race(t, "write", obj, idx, off, w, "write", None)
            if pr is not None:
                if pr.__class__ is not tuple:
                    self._check_write(t, rec, obj, idx, off, False, None)
                elif pr[0] != slot and (pr[0] >= len(vc) or vc[pr[0]] < pr[1]):
                    self._race(t, "write", obj, idx, off, pr, "read", None)
            if rec[2] is not None or rec[3] is not None:
                self._check_write(t, rec, obj, idx, off, False, None)
        e = (slot, t.clk, t, *_site())  # where the user wrote, unless a primitive wrote for them
        if rec is None:
            cells[off] = [e, None, None, None, None]
        else:
            rec[0] = e
            rec[1] = rec[2] = rec[3] = rec[4] = None

    def _check_write(self, t, rec, obj, idx, off, atomic, site):
        kind = "atomic write" if atomic else "write"
        w = rec[_PW]
        if w is not None and not _ordered(w, t):
            self._race(t, kind, obj, idx, off, w, "write", site)
        pr = rec[_PR]
        if pr is not None:
            for e in ((pr,) if pr.__class__ is tuple else pr.values()):
                if not _ordered(e, t):
                    self._race(t, kind, obj, idx, off, e, "read", site)
        if not atomic:
            for field, other in ((_AW, "atomic write"), (_AR, "atomic read")):
                d = rec[field]
                if d:
                    for e in d.values():
                        if not _ordered(e, t):
                            self._race(t, kind, obj, idx, off, e, other, site)

    def atomic(self, obj, index, load, store, order, t=None, site=None, loc=None):
        """An atomic access of element ``index`` of ``obj``: a load (acquiring per ``order``), a
        store (releasing per ``order``), or both (a read-modify-write)."""
        if loc is None:
            loc = self.locate(obj, index)
        if t is None:
            t = _state.cur
        if loc is None:
            return self._sync_only(t, load, store, order)
        cells, off = loc
        rec = cells.get(off)
        if rec is None:
            rec = cells[off] = [None, None, None, None, None]
        e = (t.slot, t.clk, t, site if site is not None else _site(), None)
        w = rec[_PW]
        if w is not None and not _ordered(w, t):
            self._race(t, "atomic " + ("read-modify-write" if load and store else "read" if load else "write"),
                       obj, index, off, w, "write", e[3])
        if load:
            d = rec[_AR]
            if d is None:
                d = rec[_AR] = {}
            d[t.slot] = e
            self.acquire(t, rec[_SYNC], order)
        if store:
            self._check_write(t, rec, obj, index, off, True, e[3])
            d = rec[_AW]
            if d is None:
                d = rec[_AW] = {}
            d[t.slot] = e
            rec[_PR] = None
            v = self.release_vc(t, order)
            rec[_SYNC] = join(rec[_SYNC], v) if load else v  # an RMW continues the release sequence

    def _sync_only(self, t, load, store, order):
        """An atomic on untracked memory (a thread's local array) still orders as its ``order`` says."""
        if load:
            self.acquire(t, None, order)
        if store and int(order) in RELEASING:
            self.release(t)

    # ---- accesses by the network ------------------------------------------------------------
    def net_event(self, op):
        """The network's channel of ``op`` acts for it: its agent, ordered after ``op``'s issue."""
        a = self.agent(op.chan.key, None)
        if op.race_vc is not None:
            self._join_into(a, op.race_vc)
        a.clk += 1
        return a

    def net_range(self, agent, cells, off, n, write, obj, what):
        """The network reads (or writes) bytes ``off .. off+n-1`` of a region for an operation.

        Threads access a region through views and arrays whose elements are ``grain`` bytes or
        larger and start at multiples of their size, so the network's access is recorded at every
        ``grain`` bytes the range overlaps.
        """
        rd = not write
        g = self.grain.get(id(cells), 1)
        e = (agent.slot, agent.clk, agent, what, None)
        for o in range(off - off % g, off + n, g):
            rec = cells.get(o)
            if rec is None:
                cells[o] = [e, None, None, None, None] if write else [None, e, None, None, None]
                continue
            if rd:
                w = rec[_PW]
                if w is not None and not _ordered(w, agent):
                    self._race(agent, "read", obj, o, o, w, "write", what)
                for e in (rec[_AW] or {}).values():
                    if not _ordered(e, agent):
                        self._race(agent, "read", obj, o, o, e, "atomic write", what)
                pr = rec[_PR]
                if pr is None or (pr.__class__ is tuple and _ordered(pr, agent)):
                    rec[_PR] = e
                elif pr.__class__ is tuple:
                    rec[_PR] = {pr[0]: pr, agent.slot: e}
                else:
                    pr[agent.slot] = e
            else:
                self._check_write(agent, rec, obj, o, o, False, what)
                rec[_PW] = e
                rec[_PR] = rec[_AW] = rec[_AR] = rec[_SYNC] = None

    def net_window(self, op, agent, group, rank, off, n, write, action):
        """The network (``agent``, acting for ``op``) reads or writes ``n`` bytes of a window at ``off``."""
        cells, base = self.window(group, rank)
        self.net_range(agent, cells, base + off, n, write, (f"{group.name()} on rank {rank}", base),
                       net_what(op, action))

    def net_array(self, op, agent, arr, n, write, action):
        """The network reads or writes the first ``n`` bytes of a tracked array (CFT's shared memory)."""
        if isinstance(arr, TrackedArray) and arr._rc is self:
            self.net_range(agent, arr._cells, arr._off0, n, write, (arr._name, arr._off0), net_what(op, action))

    def issued(self, op):
        """``op`` was issued by the running thread: the network's handling of it comes after."""
        t = _state.cur
        op.race_site = _site()
        if op.bar is None:
            op.race_vc = self.release(t)
        op.race_done = op.race_vc

    # ---- reports --------------------------------------------------------------------------
    def _race(self, t, kind, obj, idx, off, other, other_kind, site):
        if site is None:
            site = _site()
        now = (t.slot, t.clk, t, site, None)
        loc = _describe(obj, idx, off, self.world)
        caller = _user_call_site()
        msg = (f"Cannot {_VERB[kind]} {loc}: data race. "
               f"Nothing orders these two accesses, and {_why(kind, other_kind)}:\n"
               f"  this access:    {kind} by {_who(now)}"
               f"{f', inside flowdsl, called from your code at {caller}' if caller else ''}\n"
               f"  earlier access: {other_kind} by {_who(other)}{_called_from(other)}\n"
               f"{_fix_in_library(caller, other) if caller else _fix(t, other, kind, other_kind)} (seed={self.seed}: rerun with "
               f"flowdsl.sim.spawn(..., seed={self.seed}) to replay this interleaving)")
        e = DataRaceError(msg)
        e.seed = self.seed
        e.rank = getattr(t, "rank", None)
        e.accesses = (_who(now), _who(other))
        raise e


_VERB = {"read": "read", "write": "write", "atomic read": "read", "atomic write": "write",
         "atomic read-modify-write": "update"}


class NetSite:
    """Where the network's access comes from: ``action`` on ``op`` (formatted for a report only)."""

    __slots__ = ("op", "action")

    def __init__(self, op, action):
        self.op, self.action = op, action

    def __str__(self):
        op = self.op
        site = getattr(op, "race_site", None)
        at = f" at {_where(site)}" if site is not None else ""
        return f"{self.action} {op.name()} (issued by {op.who}{at})"


net_what = NetSite


def net_label(key):
    """The agent of network channel ``key`` = (device communicator, context, source rank, peer), for reports."""
    did, ctx, src, dst = key
    via = "CFT" if ctx == "cft" else f"GIN context {ctx}"
    return f"the network ({via} of device communicator #{did}, rank {src} -> rank {dst})"


def _why(kind, other_kind):
    if "atomic" in kind or "atomic" in other_kind:
        return "one of them is a plain (non-atomic) access (atomics race only with plain accesses)"
    if kind == "write" and other_kind == "write":
        return "both write"
    return "one of them writes"


def _where(site):
    if isinstance(site, (str, NetSite)):
        return str(site)
    code, lasti = site[0], site[1]
    return f"{os.path.basename(code.co_filename)}:{_line(code, lasti)} ({code.co_name})"


def _who(e):
    t, site = e[2], (e[3] if e[4] is None else (e[3], e[4]))
    if isinstance(t, Agent):
        return f"{t.name()}, {site}"
    launch = getattr(t, "launch", None)
    what = f" of kernel {launch.name!r} (launch #{launch.seq})" if launch is not None else ""
    return f"{t.name()}{what} at {_where(site)}"


def _describe(obj, idx, off, world):
    a = getattr(obj, "_a", None)
    if a is not None and hasattr(obj, "group"):  # a window view
        if idx is None:
            return f"byte offset {off} of {obj.group.name()} on rank {obj.wrank}"
        i = obj.start + int(idx)
        return (f"element {i} ({a.dtype.name}, byte offset {i * a.itemsize}) of {obj.group.name()} "
                f"on rank {obj.wrank}")
    if isinstance(obj, tuple):  # (label, byte offset of its first byte): bytes the network moves
        label, base = obj
        return f"byte {off - base} of {label}"
    if isinstance(obj, TrackedArray):
        if idx is None:  # one element of a slice assignment: its flat index in the array
            idx = (off - obj._off0) // obj.itemsize
        return f"element {idx} ({obj.dtype.name}) of {obj._name or 'a device array'}"
    return f"byte offset {off} of an array"


#: Where both threads add into one element, ordering them is not the fix an accumulation wants.
_ATOMIC_UPDATE = (" If both threads update the element (a sum, a count), make each update one atomic instead, "
                  "which needs no ordering: cuda.atomic.add, or flowdsl.mem.atomic_add / red_add.")


def _fix(t, other, kind, other_kind):
    o = other[2]
    if t.acqp is not None and _ordered(other, _View(t.slot, t.acqp)):
        return ("Fix: this thread did read what the other published, but without acquiring it: make that load, "
                "wait or barrier acquire (flowdsl.mem.load_acquire; order=MemoryOrder.ACQUIRE for a wait; a "
                "barrier's sync or wait with MemoryOrder.ACQ_REL or ACQUIRE, not RELEASE or RELAXED), or put a "
                "flowdsl.mem.fence(MemoryOrder.ACQUIRE, ...) after it.")
    if isinstance(o, Agent) or isinstance(t, Agent):
        net_kind = other_kind if isinstance(o, Agent) else kind
        if net_kind == "read":
            return ("Fix: a put's source must not change until the network has read it: wait for that "
                    "(gin.flush, gin.wait_counter on the put's counter_inc, cft.flush_smem) before writing "
                    "it again, and finish writing it (a barrier, or a release, before the put) before issuing.")
        return ("Fix: a put's destination belongs to the network until a signal that covers the put is "
                "observed: wait for it with acquire order (gin.wait_signal, a GIN barrier, cft.wait_counted "
                "or cft.read_counter then cft.fence) before reading or writing there, and do not put into "
                "memory the receiver still reads (wait for its credit, signal or barrier first).")
    same_block = (getattr(t, "blk", None) is not None and getattr(o, "blk", None) is t.blk)
    if same_block:
        return ("Fix: both threads are in one block: put a barrier between the two accesses "
                "(cuda.syncthreads(), or coop.sync() of a coop holding both threads), or publish with "
                "flowdsl.mem.store_release and read the flag with flowdsl.mem.load_acquire." + _ATOMIC_UPDATE)
    if getattr(t, "rank", None) == getattr(o, "rank", None):
        return ("Fix: the threads are in different blocks, which no block barrier orders: publish with "
                "flowdsl.mem.store_release (or a release fence before a relaxed store) and read the flag "
                "with flowdsl.mem.load_acquire (or an acquire fence after a relaxed load)." + _ATOMIC_UPDATE)
    mine, theirs = (getattr(getattr(x, "blk", None), "lsa_barriers", None) for x in (t, o))
    if mine and theirs and not mine & theirs:
        return (f"Fix: both blocks sync on LSA barriers, but on different ones ({t.blk.name()} of rank {t.rank} on "
                f"index {', '.join(map(str, sorted(mine)))}, {o.blk.name()} of rank {o.rank} on index "
                f"{', '.join(map(str, sorted(theirs)))}): a barrier orders only the threads that sync on the same "
                "index. Have the blocks whose data the other reads sync on one index (the same index on every "
                "rank, lsa.barrier(comm, coop, i).sync(MemoryOrder.ACQ_REL)), or read only what the blocks of "
                "your own index wrote.")
    return ("Fix: order the accesses across ranks: an LSA barrier between them whose arrive releases and "
            "whose wait acquires (lsa.barrier(...).sync(MemoryOrder.ACQ_REL); a sync with ACQUIRE or RELAXED "
            "releases nothing written before it), or a flag written with "
            "flowdsl.mem.store_release and read with flowdsl.mem.load_acquire, or a GIN signal waited "
            "for with acquire order.")


class _View:
    """A clock seen as a task (to ask whether it covers an access)."""

    __slots__ = ("slot", "vc")

    def __init__(self, slot, vc):
        self.slot, self.vc = slot, vc
