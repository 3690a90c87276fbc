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
:func:`reduce_sum`, :func:`copy`, :func:`reduce_sum_copy`.
"""

from __future__ import annotations

from ._spec import ARRAY, COMM, COOP, INT, LSA_SESSION, MULTIMEM_GATE, ORDER, TEAM, WINDOW
from ._stubs import primitive
from . import coop as _coop
from . import mem as _mem

__all__ = [
    "MULTIMEM_MISSING", "get_local_pointer", "get_lsa_pointer", "get_peer_pointer", "get_team_pointer",
    "local_view", "lsa_view", "peer_view", "team_view", "multimem_view",
    "barrier", "arrive", "wait", "sync",
    "reduce_sum", "copy", "reduce_sum_copy",
]


@primitive(extern="flowdsl_get_local_pointer", win=WINDOW)
def get_local_pointer(win, offset):
    """Pointer to byte ``offset`` of this rank's part of ``win`` (``ncclGetLocalPointer``)."""


@primitive(extern="flowdsl_get_lsa_pointer", win=WINDOW)
def get_lsa_pointer(win, offset, lsa_peer):
    """Pointer to byte ``offset`` of LSA rank ``lsa_peer``'s window (``ncclGetLsaPointer``)."""


@primitive(extern="flowdsl_get_peer_pointer", win=WINDOW)
def get_peer_pointer(win, offset, peer):
    """Pointer to byte ``offset`` of world rank ``peer``'s window (``ncclGetPeerPointer``).

    ``peer`` must be in this rank's LSA team.
    """


@primitive(extern="flowdsl_get_team_pointer", win=WINDOW, team=TEAM)
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


@primitive(extern="flowdsl_get_lsa_multimem_pointer", gate=MULTIMEM_GATE, comm=COMM, win=WINDOW, start=INT,
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


@primitive(extern="flowdsl_lsa_barrier_arrive", session=LSA_SESSION, order=ORDER)
def arrive(session, order):
    """Signal this rank's arrival at the barrier; ``order`` may release."""


@primitive(extern="flowdsl_lsa_barrier_wait", session=LSA_SESSION, order=ORDER)
def wait(session, order):
    """Wait until every LSA peer has arrived; ``order`` may acquire."""


@primitive(extern="flowdsl_lsa_barrier_sync", session=LSA_SESSION, order=ORDER)
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
