"""Simulated memory: symmetric buffers, windows, checked window views, poison.
"""

from __future__ import annotations

import weakref

import numpy as np

from ..host.checks import numba_dtype
from ..host.streams import stream_handle
from . import _state
from .errors import UsageError, WindowAccessError, sim_error
from .races import TrackedArray
from .network import check_read

__all__ = [
    "as_dtype", "poisoned", "SymBuffer", "WindowGroup", "Closable", "Window", "WindowView", "raw",
    "address_key",
]


def as_dtype(dtype) -> np.dtype:
    """A numpy dtype from a numpy dtype, a Python/numpy type or a numba scalar type."""
    if isinstance(dtype, np.dtype):
        return dtype
    try:
        return np.dtype(dtype)
    except TypeError:
        converted = numba_dtype(dtype)
        if converted is None:
            raise
        return converted


def poison_value(dtype: np.dtype):
    """NaN for floating types, all-``0xA5`` bytes otherwise."""
    if dtype.kind in "fc":
        return np.nan
    return np.frombuffer(b"\xa5" * dtype.itemsize, dtype=dtype)[0] if dtype.kind in "iub" else 0


def poisoned(shape, dtype, cls=np.ndarray):
    """A new C-contiguous array filled with :func:`poison_value`."""
    dt = as_dtype(dtype)
    a = np.empty(shape, dt)
    if dt.kind in "fc":
        a.fill(np.nan)
    else:
        a.view(np.uint8).fill(0xA5)
    return a if cls is np.ndarray else a.view(cls)


class SymBuffer(np.ndarray):
    """A rank's symmetric buffer: a numpy array plus CuPy's ``set``/``get``.

    ``set`` and ``get`` first wait for the rank's queued kernels, as CuPy's do
    on the current stream.
    """

    __flowdsl_sim__ = True

    # The communicator is held weakly: the world keeps views of this buffer (windows, plans),
    # and a view's reference to its base is invisible to the garbage collector, so a strong
    # reference back to the communicator made a cycle that was never freed.
    _comm_ref = None

    def __array_finalize__(self, obj):
        self._comm_ref = getattr(obj, "_comm_ref", None)

    @property
    def _sim_comm(self):
        return self._comm_ref() if self._comm_ref is not None else None

    @_sim_comm.setter
    def _sim_comm(self, comm):
        self._comm_ref = weakref.ref(comm) if comm is not None else None

    def _sync(self):
        comm = self._sim_comm
        if comm is not None and _state.sched is not None:
            comm.synchronize()

    def set(self, arr, stream=None):
        """Copy host array ``arr`` into the buffer: a NumPy array of the buffer's dtype and shape,
        refused otherwise with CuPy's own errors (``TypeError``, ``ValueError``), as on a GPU."""
        stream_handle(stream, (), "set a buffer")  # refuse what the GPU refuses; a rank has one stream
        if not isinstance(arr, np.ndarray):
            raise sim_error(UsageError, "Cannot set the buffer: Only numpy.ndarray can be set to cupy.ndarray. "
                            "Pass a NumPy array (np.asarray(values, buf.dtype))")
        if arr.dtype != self.dtype:  # CuPy copies bytes: it never converts
            raise sim_error(UsageError, f"Cannot set the buffer: {arr.dtype} array cannot be set to {self.dtype} "
                            f"array. Convert it first (a.astype(np.{self.dtype}))")
        if arr.shape != self.shape:
            raise sim_error(UsageError, f"Cannot set the buffer: Shape mismatch. Old shape: {self.shape}, new "
                            f"shape: {arr.shape}. Reshape it first (a.reshape(buf.shape))")
        if not self.flags.c_contiguous:
            raise sim_error(UsageError, "Cannot set the buffer: Cannot set to non-contiguous array. Set the whole "
                            "buffer from comm.alloc")
        self._sync()
        np.copyto(self.view(np.ndarray), arr)

    def get(self, stream=None, out=None):
        """A numpy copy of the buffer (after the rank's queued kernels finished)."""
        stream_handle(stream, (), "get a buffer")
        self._sync()
        if out is not None:
            np.copyto(out, self.view(np.ndarray))
            return out
        return np.array(self.view(np.ndarray), copy=True)

    def copy_to_host(self):
        """Alias of :meth:`get` (numba device-array spelling)."""
        return self.get()


class WindowGroup:
    """One collective registration: every rank's buffer, as flat bytes."""

    def __init__(self, wid, bufs, dtype):
        self.wid = wid
        self.bytes = [np.ascontiguousarray(b).view(np.ndarray).reshape(-1).view(np.uint8) for b in bufs]
        for b, flat in zip(bufs, self.bytes):
            if not np.shares_memory(b, flat):
                raise UsageError(
                    "Cannot register a buffer: it is not contiguous. Register a buffer from comm.alloc().")
        self.nbytes = self.bytes[0].size
        self.dtype = dtype
        self.closed = False
        #: per rank, the GIN put id (int64) that last targeted each byte (None until a GIN put targets it).
        self.gin_tags = None
        #: Registered for CFT counted writes (``register(buf, cft_counted=True)``).
        self.cft_counted = False
        #: rank -> (shadow cells, byte offset) of the race detector (see flowdsl.sim.races).
        self.race_cells = None
        #: The :class:`flowdsl.flow.Staging` of a Flow staging window, or None.
        self.staging = None

    def name(self) -> str:
        return f"window #{self.wid}"


class Closable:
    """A resource that ``with`` closes at the end of the block (a window, a communicator, a device
    communicator), as the GPU runtime's do."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Window(Closable):
    """A rank's handle on a registered window (what kernels receive)."""

    __flowdsl_sim__ = True
    kind = "window"
    #: The :class:`flowdsl.flow.Staging` that :func:`flowdsl.flow.staging` made this window for, or None.
    flow_staging = None

    def __init__(self, group: WindowGroup, rank: int, comm):
        self.group, self.rank, self.comm = group, rank, comm
        self.closed = False
        self._views = {}

    @property
    def communicator(self):
        """The communicator that registered it."""
        return self.comm

    def _made_staging(self, staging) -> None:
        """Mark the window as made by :func:`flowdsl.flow.staging` (as the GPU runtime's window)."""
        self.flow_staging = staging
        self.group.staging = staging  # reports name a staging word by its place (describe_word)

    @property
    def dtype(self):
        return self.group.dtype

    @property
    def nbytes(self):
        return self.group.nbytes

    def close(self):
        """Deregister (idempotent)."""
        self.closed = True

    def __repr__(self):
        return f"<sim Window #{self.group.wid} rank {self.rank} {self.group.nbytes} bytes>"

    def own(self, op, what="the window"):
        """This window, refused unless it is the running thread's rank's (``what`` names it in the error)."""
        if self.rank != _state.cur.rank:
            raise sim_error(UsageError, f"Cannot {op}: {what} belongs to rank {self.rank}. Pass this rank's window")
        return self

    def view(self, world_rank, start, count, dtype, op):
        """A :class:`WindowView` of ``world_rank``'s memory; bounds-checked (cached)."""
        key = (world_rank, start, count, dtype)
        try:
            v = self._views.get(key)
        except TypeError:  # unhashable dtype spelling
            v, key = None, None
        if v is not None and not self.closed:
            return v
        v = self._make_view(world_rank, start, count, dtype, op)
        if key is not None:
            if len(self._views) >= 4096:
                self._views.clear()
            self._views[key] = v
        return v

    def _make_view(self, world_rank, start, count, dtype, op):
        if self.closed:
            raise sim_error(UsageError, f"Cannot {op} {self.group.name()}: it was closed. "
                            "Keep the window open (inside its `with`) while kernels use it")
        dt = self.group.dtype if dtype is None else as_dtype(dtype)
        isz = dt.itemsize
        total = self.group.nbytes // isz
        start = int(start)
        count = total - start if count is None or count == -1 else int(count)
        if start < 0 or count < 0 or start + count > total:
            raise sim_error(WindowAccessError, (
                f"Cannot {op} of {self.group.name()} on rank {world_rank}: elements "
                f"{start}..{start + count - 1} ({dt.name}, byte offset {start * isz}, {count * isz} bytes) "
                f"{'start before' if start < 0 or count < 0 else f'end past element {total - 1} of'} the window of "
                f"{total} elements ({self.group.nbytes} bytes). Check the start/count arithmetic"))
        arr = self.group.bytes[world_rank][start * isz:(start + count) * isz].view(dt)
        rc = _state.race
        if rc is None:
            return WindowView(arr, self.group, world_rank, start)
        cells, off = rc.window(self.group, world_rank)
        rc.note_grain(cells, isz)
        return WindowView(arr, self.group, world_rank, start, rc, cells, off + start * isz)


class WindowView:
    """A bounds-checked 1-D view of one rank's window memory.

    Indexing with an integer outside ``0 .. len-1`` raises
    :class:`WindowAccessError` naming the rank, block, thread, window, offset
    and size. Slices give smaller views; ``np.asarray(view)`` gives the
    underlying numpy array.
    """

    # _rc, _cells, _off0, _isz: the race detector, the window's shadow memory, this view's first byte there.
    __slots__ = ("_a", "_n", "group", "wrank", "start", "_rc", "_cells", "_off0", "_isz")
    __flowdsl_sim__ = True

    def __init__(self, arr, group, wrank, start, rc=None, cells=None, off0=0):
        self._a = arr
        self._n = arr.shape[0]
        self.group = group
        self.wrank = wrank
        self.start = start
        self._rc, self._cells, self._off0, self._isz = rc, cells, off0, arr.itemsize

    def _part(self, s, e):
        return WindowView(self._a[s:e], self.group, self.wrank, self.start + s, self._rc, self._cells,
                          self._off0 + s * self._isz)

    def __len__(self):
        return self._n

    @property
    def shape(self):
        return (self._n,)

    @property
    def size(self):
        return self._n

    @property
    def dtype(self):
        return self._a.dtype

    @property
    def itemsize(self):
        return self._isz

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)

    def __iter__(self):
        return iter(self._a)

    def __repr__(self):
        return (f"<sim WindowView {self.group.name()} rank {self.wrank} elements "
                f"{self.start}..{self.start + self._n - 1} {self._a.dtype}>")

    def describe_element(self, index) -> str:
        """A deterministic name for element ``index``, for reports."""
        i = index if not isinstance(index, tuple) else index[0]
        return f"{self.group.name()} of rank {self.wrank}, element {self.start + int(i)} ({self._a.dtype.name})"

    def _oob(self, i, op):
        dt = self._a.dtype
        total = self.group.nbytes // dt.itemsize
        off = self.start + int(i)
        raise sim_error(WindowAccessError, (
            f"Cannot {op} element {int(i)} of a view of {self.group.name()} on rank {self.wrank}: "
            f"the view has {self._n} elements (window elements {self.start}..{self.start + self._n - 1}), "
            f"so the access is at window element {off} (byte offset {off * dt.itemsize}) of a window of "
            f"{total} {dt.name} elements ({self.group.nbytes} bytes). "
            "Check the index and the loop bound against the view's length"))

    def _index(self, i, op):
        if type(i) is int or isinstance(i, (np.integer,)):
            if 0 <= i < self._n:
                return i
            self._oob(i, op)
        if isinstance(i, tuple) and len(i) == 1:
            return self._index(i[0], op)
        raise sim_error(UsageError, f"Cannot {op} a window view with index {i!r}: views are 1-D. "
                        "Index with one integer")

    def __getitem__(self, i):
        if type(i) is int and 0 <= i < self._n:
            if self.group.gin_tags is not None:
                check_read(self, i)
            if self._rc is not None:
                self._rc.read(self._cells, self._off0 + i * self._isz, self, i)
            return self._a[i]
        if isinstance(i, slice):
            s, e, st = i.indices(self._n)
            if st != 1:
                if self._rc is not None:  # a copy: its elements are read now
                    for k in range(s, e, st):
                        self._rc.read(self._cells, self._off0 + k * self._isz, self, k)
                return self._a[i]
            return self._part(s, e)
        i = self._index(i, "read")
        if self.group.gin_tags is not None:
            check_read(self, i)
        if self._rc is not None:
            self._rc.read(self._cells, self._off0 + int(i) * self._isz, self, i)
        return self._a[i]

    def __setitem__(self, i, v):
        if type(i) is int and 0 <= i < self._n:
            self._a[i] = v
            _state.sched.last_writer[(self.group.wid, self.wrank, (self.start + i) * self._isz)] = (_state.cur, v)
            if self.group.gin_tags is not None:
                self._untag(i, i + 1)
            if self._rc is not None:
                self._rc.write(self._cells, self._off0 + i * self._isz, self, i)
            return
        if isinstance(i, slice):
            self._a[i] = v
            s, e, st = i.indices(self._n)
            for k in range(s, e, st):
                self._note(k)
            if self.group.gin_tags is not None:
                self._untag(s, e)
            if self._rc is not None:
                for k in range(s, e, st):
                    self._rc.write(self._cells, self._off0 + k * self._isz, self, k)
            return
        i = self._index(i, "write")
        self._a[i] = v
        self._note(int(i))
        if self.group.gin_tags is not None:
            self._untag(i, i + 1)
        if self._rc is not None:
            self._rc.write(self._cells, self._off0 + int(i) * self._isz, self, i)

    def _note(self, i):
        """The running task stored element ``i`` last (``flowdsl.wait.accepted`` asks who wrote a line)."""
        _state.sched.last_writer[(self.group.wid, self.wrank, (self.start + i) * self._isz)] = (_state.cur, self._a[i])

    def _untag(self, lo, hi):
        """A store by a thread replaces whatever a GIN put wrote there."""
        isz = self._a.itemsize
        self.group.gin_tags[self.wrank][(self.start + lo) * isz:(self.start + hi) * isz] = 0




def raw(arr):
    """``(numpy array, checked index function)`` behind ``arr`` (a view or an ndarray)."""
    if isinstance(arr, WindowView):
        return arr._a
    if isinstance(arr, np.ndarray):
        if isinstance(arr, TrackedArray) and arr._rc is not None:
            return arr._plain  # the same memory, untracked: the primitives record their own accesses
        return arr
    raise sim_error(UsageError, f"Cannot access {type(arr).__name__} as device memory: it is not an array. "
                    "Pass a window view, a shared/local array or a buffer")


def address_key(arr, index):
    """A cheap key identifying element ``index`` of ``arr`` (same element, same key)."""
    if isinstance(arr, WindowView):
        return (arr.group.wid, arr.wrank, (arr.start + int(index)) * arr._a.itemsize)
    base = arr
    while isinstance(base.base, np.ndarray):
        base = base.base
    return (id(base), arr.__array_interface__["data"][0] - base.__array_interface__["data"][0], index)
