"""LSA (load/store accessible) memory: peers' windows as plain memory, barriers, reduce/copy.

A window registered with ``comm.register(buf)`` has the same layout on every
rank. Inside a kernel a rank reads and writes another LSA rank's window
directly (NVLink or PCIe P2P).

Pointers (byte offsets, as in NCCL): :func:`get_local_pointer`,
:func:`get_lsa_pointer`, :func:`get_peer_pointer`, :func:`get_team_pointer`.
Typed views (element offsets, 1-D arrays of the window's dtype or ``dtype``):
:func:`local_view`, :func:`lsa_view`, :func:`peer_view`, :func:`team_view`.
Barriers: :func:`barrier` returns a session with ``arrive(order)``,
``wait(order)`` and ``sync(order)``.
Data movement over all LSA peers, written in flowdsl itself:
:func:`reduce_sum`, :func:`copy`, :func:`reduce_sum_copy`, and through the LSA team's multicast address
(NVLink SHARP, :func:`multimem_view`): :func:`multimem_reduce_sum`, :func:`multimem_copy`,
:func:`multimem_reduce_sum_copy`.
"""

from __future__ import annotations

from ._spec import (ALL_ARCHS, ARRAY, C_COMM, C_TEAM, C_WIN, COMM, COOP, INT, LSA_SESSION, MULTIMEM_GATE, MULTIMEM_VIEW,
                    ORDER, TEAM, WINDOW, CFunction)
from ._stubs import primitive
from . import coop as _coop
from . import mem as _mem
from .enums import RedOp

__all__ = [
    "MULTIMEM_MISSING", "get_local_pointer", "get_lsa_pointer", "get_peer_pointer", "get_team_pointer",
    "local_view", "lsa_view", "peer_view", "team_view", "multimem_view",
    "barrier", "arrive", "wait", "sync",
    "reduce_sum", "copy", "reduce_sum_copy", "multimem_reduce_sum", "multimem_copy", "multimem_reduce_sum_copy",
    "multimem_partial_vectors",
]


@primitive(extern="flowdsl_get_local_pointer",
           c=CFunction("ptr", (C_WIN, ("size_t", "offset")), "ncclGetLocalPointer."),
           win=WINDOW)
def get_local_pointer(win, offset):
    """Pointer to byte ``offset`` of this rank's part of ``win`` (``ncclGetLocalPointer``)."""


@primitive(extern="flowdsl_get_lsa_pointer",
           c=CFunction("ptr", (C_WIN, ("size_t", "offset"), ("int", "lsa_peer")), "ncclGetLsaPointer."),
           win=WINDOW)
def get_lsa_pointer(win, offset, lsa_peer):
    """Pointer to byte ``offset`` of LSA rank ``lsa_peer``'s window (``ncclGetLsaPointer``)."""


@primitive(extern="flowdsl_get_peer_pointer",
           c=CFunction("ptr", (C_WIN, ("size_t", "offset"), ("int", "peer")), "ncclGetPeerPointer."),
           win=WINDOW)
def get_peer_pointer(win, offset, peer):
    """Pointer to byte ``offset`` of world rank ``peer``'s window (``ncclGetPeerPointer``).

    ``peer`` must be in this rank's LSA team.
    """


@primitive(extern="flowdsl_get_team_pointer",
           c=CFunction("ptr", (C_WIN, ("size_t", "offset"), C_TEAM, ("int", "peer")),
                       "ncclGetPeerPointer with a team."),
           win=WINDOW, team=TEAM)
def get_team_pointer(win, offset, team, peer):
    """Pointer to byte ``offset`` of ``team``'s rank ``peer`` (``ncclGetPeerPointer`` with a team)."""


@primitive(extern="flowdsl_get_local_pointer", win=WINDOW, start=INT, count=INT)
def local_view(win, start=0, count=-1, dtype=None):
    """This rank's window as a 1-D array: elements ``start .. start+count-1``.

    ``count=-1`` means "to the end of the window". ``dtype`` reinterprets the
    window (default: the dtype of the buffer it was registered from). A view
    past the end of the window traps (the simulator reports it by name).
    """


@primitive(extern="flowdsl_get_lsa_pointer", win=WINDOW, lsa_peer=INT, start=INT, count=INT)
def lsa_view(win, lsa_peer, start=0, count=-1, dtype=None):
    """LSA rank ``lsa_peer``'s window as a 1-D array (see :func:`local_view`)."""


@primitive(extern="flowdsl_get_peer_pointer", win=WINDOW, peer=INT, start=INT, count=INT)
def peer_view(win, peer, start=0, count=-1, dtype=None):
    """World rank ``peer``'s window as a 1-D array; ``peer`` must be an LSA peer."""


@primitive(extern="flowdsl_get_team_pointer", win=WINDOW, team=TEAM, peer=INT, start=INT, count=INT)
def team_view(win, team, peer, start=0, count=-1, dtype=None):
    """``team``'s rank ``peer``'s window as a 1-D array."""


#: What both paths say when a kernel makes a multimem view on a device communicator without multimem
#: (the GPU prints it and traps; the simulator raises it).
MULTIMEM_MISSING = ("flowdsl.lsa.multimem_view: the device communicator has no multimem. Make it with "
                    "comm.device_communicator(lsa_multimem=True) on GPUs with NVLink SHARP (on the simulator, "
                    "flowdsl.sim.spawn(..., multimem=True))")


@primitive(extern="flowdsl_get_lsa_multimem_pointer",
           # Pointer arithmetic: every arch builds it (archs=); the multimem instructions need sm_90.
           c=CFunction(
               "ptr", (C_WIN, ("size_t", "offset"), C_COMM), "ncclGetLsaMultimemPointer, or null when the "
               "communicator has no multimem (lsaMultimem not asked for).", archs=ALL_ARCHS),
           gate=MULTIMEM_GATE, comm=COMM, win=WINDOW, start=INT,
           count=INT)
def multimem_view(comm, win, start=0, count=-1, dtype=None):
    """The LSA team's ``win`` through its multicast address (``ncclGetLsaMultimemPointer``): elements
    ``start .. start+count-1`` (``count=-1``: to the end), of the window's dtype or ``dtype``.

    Only :mod:`flowdsl.mem`'s multimem operations take it (one access reaches every LSA team member's
    copy of the element through the NVLink switch: NVLink SHARP); it cannot be indexed. ``comm`` must
    be a device communicator made with ``lsa_multimem=True`` (a GPU without NVLink SHARP refuses that
    on the host; a kernel passed another traps, as the simulator reports). bfloat16 elements are
    viewed as uint16 bits, as flowdsl's collectives carry them.
    """


@primitive(comm=COMM, coop=COOP, index=INT)
def barrier(comm, coop, index):
    """An LSA barrier session on barrier ``index`` (``ncclLsaBarrierSession``, LSA team).

    ``index`` must be below the ``lsa_barrier_count`` the device communicator
    was created with. Every rank of the LSA team must use the same index with
    the same coop shape. Returns a session whose ``arrive``, ``wait`` and
    ``sync`` take a :class:`flowdsl.MemoryOrder`; each call is collective on
    ``coop``. The barrier's epoch is kept in NCCL's resource window, so
    sessions need no closing and later launches continue where this one ended.
    """


#: The C arguments of an LSA barrier session's calls (each opens and closes a session on the LSA team).
_BARRIER_C = (C_COMM, ("uint32", "index"), ("order", "order"))


@primitive(extern="flowdsl_lsa_barrier_arrive",
           c=CFunction("void", _BARRIER_C, "ncclLsaBarrierSession::arrive.", coop=True),
           session=LSA_SESSION, order=ORDER)
def arrive(session, order):
    """Signal this rank's arrival at the barrier; ``order`` may release."""


@primitive(extern="flowdsl_lsa_barrier_wait",
           c=CFunction("void", _BARRIER_C, "ncclLsaBarrierSession::wait, bounded (flowdsl.wait).",
                       coop=True),
           session=LSA_SESSION, order=ORDER)
def wait(session, order):
    """Wait until every LSA peer has arrived; ``order`` may acquire."""


@primitive(extern="flowdsl_lsa_barrier_sync",
           c=CFunction("void", _BARRIER_C, "ncclLsaBarrierSession::sync, its wait bounded.",
                       coop=True),
           session=LSA_SESSION, order=ORDER)
def sync(session, order):
    """``arrive`` then ``wait``."""


@primitive(coop=COOP.but("a coop"), win=WINDOW.but("a window"), dst=ARRAY.but("an output array"))
def reduce_sum(coop, comm, win, start, dst, count):
    """``dst[i] = sum over LSA ranks r of win@r[start + i]`` for ``i < count``.

    The coop's threads share the work. No barrier is implied: make the peers'
    data visible first (``lsa.barrier(...).sync(MemoryOrder.ACQUIRE)``).
    """


@primitive(coop=COOP.but("a coop"), src=ARRAY.but("an input array"), win=WINDOW.but("a window"))
def copy(coop, comm, src, win, start, count):
    """``win@r[start + i] = src[i]`` on every LSA rank ``r``, for ``i < count``."""


@primitive(coop=COOP.but("a coop"), src_win=WINDOW.but("a source window"), dst_win=WINDOW.but("a destination window"))
def reduce_sum_copy(coop, comm, src_win, src_start, dst_win, dst_start, count):
    """Sum ``src_win[src_start:]`` over LSA ranks and write the sum to every LSA rank's
    ``dst_win[dst_start:]`` (``ncclLsaReduceSumCopy``)."""


@primitive(gate=MULTIMEM_GATE, coop=COOP.but("a coop"), view=MULTIMEM_VIEW, dst=ARRAY.but("an output array"),
           count=INT)
def multimem_reduce_sum(coop, view, dst, count):
    """``dst[i] = sum over the LSA team's members m of view@m[i]`` for ``i < count``, one
    ``multimem.ld_reduce`` per access (``ncclMultimemReduceSum``); ``dst`` has ``view``'s element type.

    The types of :func:`flowdsl.mem.multimem_ld_reduce` and its ``_vec`` form with ``RedOp.SUM``: int32,
    uint32, int64, uint64 and float64 one element at a time, float32 both ways, float16 and bfloat16
    (uint16 bits) 16 bytes at a time only, so their view must start 16-byte aligned and ``count`` be a
    multiple of 8 (:func:`multimem_partial_vectors` stops the kernel otherwise). Other types are refused
    when the kernel compiles. The coop's threads share the work; no barrier is implied: make every
    member's data visible first (``lsa.barrier(...).sync(MemoryOrder.ACQUIRE)``).
    """


@primitive(gate=MULTIMEM_GATE, coop=COOP.but("a coop"), src=ARRAY.but("an input array"), view=MULTIMEM_VIEW,
           count=INT)
def multimem_copy(coop, src, view, count):
    """``view@m[i] = src[i]`` on every LSA team member ``m``, for ``i < count``, one ``multimem.st`` per access
    (``ncclMultimemCopy``); ``src`` has ``view``'s element type.

    Elements of 4 or 8 bytes one at a time or 16 bytes at a time (when the view and ``src`` start 16-byte
    aligned); 1- and 2-byte elements (float16, bfloat16 bits, int8, ...) 16 bytes at a time only, from
    aligned starts and ``count`` a multiple of ``16 // itemsize``. No barrier is implied: the members see
    the stores after an LSA barrier.
    """


@primitive(gate=MULTIMEM_GATE, coop=COOP.but("a coop"), src_view=MULTIMEM_VIEW.but("a source multimem view"),
           dst_view=MULTIMEM_VIEW.but("a destination multimem view"), count=INT)
def multimem_reduce_sum_copy(coop, src_view, dst_view, count):
    """The sum over the LSA team's members of ``src_view[i]``, stored to every member's ``dst_view[i]``, for
    ``i < count``: one ``multimem.ld_reduce`` and one ``multimem.st`` per access
    (``ncclMultimemReduceSumCopy``: an all-reduce of the range when every member calls it on its own part).
    Both views have one element type, with :func:`multimem_reduce_sum`'s forms; no barrier is implied.
    """


def multimem_partial_vectors_text(offset, count, lanes) -> str:
    """What both paths say when :func:`multimem_partial_vectors` stops a kernel."""
    return (f"Cannot move {count} elements through a multimem view 16 bytes at a time: their type has no "
            f"one-element multimem form, and a start is {offset} bytes past a 16-byte boundary or the count "
            f"is not a multiple of {lanes}. Start the views and arrays at 16-byte aligned elements and "
            f"move a multiple of {lanes} elements")


@primitive(offset=INT, count=INT, lanes=INT)
def multimem_partial_vectors(offset, count, lanes):
    """Stop the kernel: a multimem reduce or copy (:func:`multimem_reduce_sum`, ...) of elements that PTX moves
    only 16 bytes at a time was given ``count`` elements starting ``offset`` bytes past a 16-byte boundary, or
    not a multiple of ``lanes``. On the GPU the kernel prints the values and the fix and traps; the simulator
    raises a ``flowdsl.sim.UsageError`` with the same words."""


# ---- what reduce_sum, copy and reduce_sum_copy do, written in flowdsl --------------------------
# The one meaning of each: compiled for the GPU (flowdsl/lowering/lsa.py; every NCCL release, 2.28 has
# no such helpers) and run by the simulator (flowdsl/sim/lsa.py). The bulk moves in 16-byte vectors
# (mem.load_vec/store_vec) when both sides are 16-byte aligned; the rest, and unaligned ranges,
# element by element.

def _vec_add(a, b):
    """Element-wise sum of two equal-length tuples (typed per length on the GPU)."""
    return tuple(x + y for x, y in zip(a, b))


def _vector_lanes(view, start):
    """Elements per 16-byte vector, or 0 if ``view``'s dtype or ``start`` does not allow vectors."""
    size = view.itemsize
    if (size == 4 or size == 8) and (start * size) % 16 == 0:
        return 16 // size
    return 0


def reduce_sum_program(coop, comm, win, start, dst, count):
    """:func:`reduce_sum`."""
    rank = _coop.thread_rank(coop)
    nthreads = _coop.size(coop)
    npeers = comm.lsa_size
    i = rank
    while i < count:
        acc = lsa_view(win, 0, start, count)[i]
        for peer in range(1, npeers):
            acc += lsa_view(win, peer, start, count)[i]
        dst[i] = acc
        i += nthreads


def copy_program(coop, comm, src, win, start, count):
    """:func:`copy`."""
    rank = _coop.thread_rank(coop)
    nthreads = _coop.size(coop)
    for peer in range(comm.lsa_size):
        out = lsa_view(win, peer, start, count)
        i = rank
        while i < count:
            out[i] = src[i]
            i += nthreads


def reduce_sum_copy_program(coop, comm, src_win, src_start, dst_win, dst_start, count):
    """:func:`reduce_sum_copy`."""
    rank = _coop.thread_rank(coop)
    nthreads = _coop.size(coop)
    npeers = comm.lsa_size
    first = lsa_view(src_win, 0, src_start, count)
    lanes = _vector_lanes(first, src_start)
    if lanes != _vector_lanes(first, dst_start):
        lanes = 0
    done = 0
    if lanes != 0:
        nvec = count // lanes
        v = rank
        while v < nvec:
            i = v * lanes
            acc = _mem.load_vec(lsa_view(src_win, 0, src_start, count), i)
            for peer in range(1, npeers):
                acc = _vec_add(acc, _mem.load_vec(lsa_view(src_win, peer, src_start, count), i))
            for peer in range(npeers):
                _mem.store_vec(lsa_view(dst_win, peer, dst_start, count), i, acc)
            v += nthreads
        done = nvec * lanes
    i = done + rank
    while i < count:
        acc = lsa_view(src_win, 0, src_start, count)[i]
        for peer in range(1, npeers):
            acc += lsa_view(src_win, peer, src_start, count)[i]
        for peer in range(npeers):
            lsa_view(dst_win, peer, dst_start, count)[i] = acc
        i += nthreads


# ---- what the multimem helpers do, written in flowdsl -----------------------------------------------------
# NCCL's ncclMultimem* helpers. ``lanes`` (elements per 16-byte access) and ``one`` (True where the element type
# has a one-element form) are flowdsl.mem.multimem_forms' answer for the view's element type, each None where PTX
# lacks the form: the GPU compiles only the loops the type has (numba drops a branch on an argument that is
# None), the simulator takes the same branches.

def _multimem_vectors(count, lanes, offset, one):
    """How many 16-byte accesses lead (none unless the starts are aligned: ``offset``, bytes past a 16-byte
    boundary, is 0), stopping the kernel where the type has no one-element form for what they leave."""
    nvec = count // lanes if offset == 0 else 0
    if one is None and nvec * lanes != count:
        multimem_partial_vectors(offset, count, lanes)
    return nvec


def _misalignment(a, b):
    """Bytes past a 16-byte boundary of the first of two addresses that is not aligned (0: both are)."""
    off = int(a) % 16
    return off if off != 0 else int(b) % 16


def multimem_reduce_sum_program(coop, view, dst, count, lanes, one):
    """:func:`multimem_reduce_sum`."""
    rank = _coop.thread_rank(coop)
    nthreads = _coop.size(coop)
    done = 0
    if lanes is not None:
        nvec = _multimem_vectors(count, lanes, int(_mem.multimem_address(view, 0)) % 16, one)
        whole = int(_mem.address(dst, 0)) % 16 == 0  # else the sums are stored element by element
        v = rank
        while v < nvec:
            i = v * lanes
            acc = _mem.multimem_ld_reduce_vec(view, i, RedOp.SUM)
            if whole:
                _mem.store_vec(dst, i, acc)
            else:
                for k in range(lanes):
                    dst[i + k] = acc[k]
            v += nthreads
        done = nvec * lanes
    if one is not None:
        i = done + rank
        while i < count:
            dst[i] = _mem.multimem_ld_reduce(view, i, RedOp.SUM)
            i += nthreads


def multimem_store_program(coop, local, src, src_view, view, count, lanes, one):
    """:func:`multimem_copy` (``local`` True: from ``src``, a local array) and :func:`multimem_reduce_sum_copy`
    (``local`` None: the switch's sum of every rank's copy through ``src_view``), stored to every LSA rank's copy
    through ``view``; the other source is None, and the branches on ``local`` are dropped as those of ``lanes``
    and ``one`` are (numba decides a test against None of an argument that is None or a constant)."""
    rank = _coop.thread_rank(coop)
    nthreads = _coop.size(coop)
    done = 0
    if lanes is not None:
        if local is not None:
            offset = _misalignment(_mem.multimem_address(view, 0), _mem.address(src, 0))
        else:
            offset = _misalignment(_mem.multimem_address(src_view, 0), _mem.multimem_address(view, 0))
        nvec = _multimem_vectors(count, lanes, offset, one)
        v = rank
        while v < nvec:
            i = v * lanes
            if local is not None:
                _mem.multimem_store_vec(view, i, _mem.load_vec(src, i))
            else:
                _mem.multimem_store_vec(view, i, _mem.multimem_ld_reduce_vec(src_view, i, RedOp.SUM))
            v += nthreads
        done = nvec * lanes
    if one is not None:
        i = done + rank
        while i < count:
            if local is not None:
                _mem.multimem_store(view, i, src[i])
            else:
                _mem.multimem_store(view, i, _mem.multimem_ld_reduce(src_view, i, RedOp.SUM))
            i += nthreads


def multimem_helper_forms(name: str, view_dtype: str, other_dtype: str | None = None, store_only: bool = False):
    """``(lanes, one)`` of helper ``name`` (``"multimem_reduce_sum"``, ...) on elements ``view_dtype``, or the
    refusal text (a str) when the other array or view has another element type, or PTX has no form of that type
    at all (flowdsl.mem's table's words). Both paths ask this when the kernel is compiled or run."""
    full = f"flowdsl.lsa.{name}"
    if other_dtype is not None and other_dtype != view_dtype:
        return (f"Cannot run {full} from {other_dtype if store_only else view_dtype} to "
                f"{view_dtype if store_only else other_dtype} elements: it moves one element type. Pass arrays "
                "and views of one element type")
    op = None if store_only else RedOp.SUM
    lanes, one = _mem.multimem_forms(view_dtype, op)
    if lanes is None and one is None:
        stem = "multimem_store" if store_only else "multimem_ld_reduce"
        return (f"Cannot run {full} on {view_dtype} elements, which no multimem form takes: "
                f"{_mem.multimem_refusal(stem, view_dtype, op, False)}")
    return lanes, one
