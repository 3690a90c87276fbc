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

from ._stubs import primitive

__all__ = [
    "get_local_pointer", "get_lsa_pointer", "get_peer_pointer", "get_team_pointer",
    "local_view", "lsa_view", "peer_view", "team_view",
    "barrier", "arrive", "wait", "sync",
    "reduce_sum", "copy", "reduce_sum_copy",
]


@primitive
def get_local_pointer(win, offset):
    """Pointer to byte ``offset`` of this rank's part of ``win`` (``ncclGetLocalPointer``)."""


@primitive
def get_lsa_pointer(win, offset, lsa_peer):
    """Pointer to byte ``offset`` of LSA rank ``lsa_peer``'s window (``ncclGetLsaPointer``)."""


@primitive
def get_peer_pointer(win, offset, peer):
    """Pointer to byte ``offset`` of world rank ``peer``'s window (``ncclGetPeerPointer``).

    ``peer`` must be in this rank's LSA team.
    """


@primitive
def get_team_pointer(win, offset, team, peer):
    """Pointer to byte ``offset`` of ``team``'s rank ``peer`` (``ncclGetPeerPointer`` with a team)."""


@primitive
def local_view(win, start=0, count=-1, dtype=None):
    """This rank's window as a 1-D array: elements ``start .. start+count-1``.

    ``count=-1`` means "to the end of the window". ``dtype`` reinterprets the
    window (default: the dtype of the buffer it was registered from). A view
    past the end of the window traps (the simulator reports it by name).
    """


@primitive
def lsa_view(win, lsa_peer, start=0, count=-1, dtype=None):
    """LSA rank ``lsa_peer``'s window as a 1-D array (see :func:`local_view`)."""


@primitive
def peer_view(win, peer, start=0, count=-1, dtype=None):
    """World rank ``peer``'s window as a 1-D array; ``peer`` must be an LSA peer."""


@primitive
def team_view(win, team, peer, start=0, count=-1, dtype=None):
    """``team``'s rank ``peer``'s window as a 1-D array."""


@primitive
def barrier(comm, coop, index):
    """An LSA barrier session on barrier ``index`` (``ncclLsaBarrierSession``, LSA team).

    ``index`` must be below the ``lsa_barrier_count`` the device communicator
    was created with. Every rank of the LSA team must use the same index with
    the same coop shape. Returns a session whose ``arrive``, ``wait`` and
    ``sync`` take a :class:`flowdsl.MemoryOrder`; each call is collective on
    ``coop``. The barrier's epoch is kept in NCCL's resource window, so
    sessions need no closing and later launches continue where this one ended.
    """


@primitive
def arrive(session, order):
    """Signal this rank's arrival at the barrier; ``order`` may release."""


@primitive
def wait(session, order):
    """Wait until every LSA peer has arrived; ``order`` may acquire."""


@primitive
def sync(session, order):
    """``arrive`` then ``wait``."""


@primitive
def reduce_sum(coop, comm, win, start, dst, count):
    """``dst[i] = sum over LSA ranks r of win@r[start + i]`` for ``i < count``.

    The coop's threads share the work. No barrier is implied: make the peers'
    data visible first (``lsa.barrier(...).sync(MemoryOrder.ACQUIRE)``).
    """


@primitive
def copy(coop, comm, src, win, start, count):
    """``win@r[start + i] = src[i]`` on every LSA rank ``r``, for ``i < count``."""


@primitive
def reduce_sum_copy(coop, comm, src_win, src_start, dst_win, dst_start, count):
    """Sum ``src_win[src_start:]`` over LSA ranks and write the sum to every LSA rank's
    ``dst_win[dst_start:]`` (``ncclLsaReduceSumCopy``)."""
