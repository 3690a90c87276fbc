"""What ``flowdsl.lsa`` does in the simulator: pointers and views of peers' windows, LSA barriers,
reduce and copy (the programs of ``flowdsl/lsa.py``)."""

from __future__ import annotations

import numpy as np

from .. import lsa
from . import _state
from .checks import KIND_CHECKS, barrier_index
from .memory import raw
from .errors import BarrierIndexError, KernelTypingError, UsageError, WindowAccessError, sim_error
from .scheduler import Wait
from .coop import coop_sync
from . import semantics
from .semantics import current, implements, method_of
from .timeouts import note_bounded

__all__ = ["Pointer", "MultimemView", "BarrierSession", "lsa_barrier", "lsa_arrive", "lsa_wait"]


class Pointer:
    """A simulated device pointer: byte ``offset`` into ``rank``'s part of a window."""

    __slots__ = ("window", "rank", "offset")

    def __init__(self, window, rank, offset):
        self.window, self.rank, self.offset = window, rank, int(offset)

    def __add__(self, n):
        return Pointer(self.window, self.rank, self.offset + int(n))

    def __repr__(self):
        return f"<sim Pointer {self.window.group.name()} rank {self.rank} +{self.offset}>"


def _lsa_to_world(win, lsa_peer, op):
    comm = win.comm
    lsa_peer = int(lsa_peer)
    if not 0 <= lsa_peer < comm.lsa_size:
        raise sim_error(UsageError, f"Cannot {op}: LSA peer {lsa_peer} is outside the LSA team of "
                        f"{comm.lsa_size} ranks. Use 0 <= lsa_peer < comm.lsa_size")
    return comm.rank - comm.lsa_rank + lsa_peer


def _world_lsa_check(win, peer, op):
    comm = win.comm
    peer = int(peer)
    base = comm.rank - comm.lsa_rank
    if not base <= peer < base + comm.lsa_size:
        raise sim_error(UsageError, f"Cannot {op}: world rank {peer} is not in rank {comm.rank}'s LSA team "
                        f"(ranks {base}..{base + comm.lsa_size - 1}). Reach other nodes with GIN, not LSA")
    return peer


def _check_ptr_offset(win, offset, op):
    if not 0 <= int(offset) <= win.group.nbytes:
        raise sim_error(WindowAccessError, f"Cannot {op}: byte offset {int(offset)} is outside "
                        f"{win.group.name()} ({win.group.nbytes} bytes). Check the offset arithmetic")


@implements("flowdsl.lsa.get_local_pointer")
def _lsa_get_local_pointer(win, offset):
    w = win.own("get a local pointer")
    _check_ptr_offset(w, offset, "get a local pointer")
    return Pointer(w, w.rank, offset)


@implements("flowdsl.lsa.get_lsa_pointer")
def _lsa_get_lsa_pointer(win, offset, lsa_peer):
    w = win.own("get an LSA pointer")
    _check_ptr_offset(w, offset, "get an LSA pointer")
    return Pointer(w, _lsa_to_world(w, lsa_peer, "get an LSA pointer"), offset)


@implements("flowdsl.lsa.get_peer_pointer")
def _lsa_get_peer_pointer(win, offset, peer):
    w = win.own("get a peer pointer")
    _check_ptr_offset(w, offset, "get a peer pointer")
    return Pointer(w, _world_lsa_check(w, peer, "get a peer pointer"), offset)


@implements("flowdsl.lsa.get_team_pointer")
def _lsa_get_team_pointer(win, offset, team, peer):
    w = win.own("get a team pointer")
    _check_ptr_offset(w, offset, "get a team pointer")
    world = w.rank + (int(peer) - team.rank) * team.stride
    return Pointer(w, _world_lsa_check(w, world, "get a team pointer"), offset)


@implements("flowdsl.lsa.local_view")
def _lsa_local_view(win, start, count, dtype):
    w = win.own("make a local view")
    return w.view(w.rank, start, count, dtype, "make a local view")


@implements("flowdsl.lsa.lsa_view")
def _lsa_lsa_view(win, lsa_peer, start, count, dtype):
    w = win.own("make an LSA view")
    return w.view(_lsa_to_world(w, lsa_peer, "make an LSA view"), start, count, dtype,
                  f"make an LSA view (lsa_peer {int(lsa_peer)})")


@implements("flowdsl.lsa.peer_view")
def _lsa_peer_view(win, peer, start, count, dtype):
    w = win.own("make a peer view")
    return w.view(_world_lsa_check(w, peer, "make a peer view"), start, count, dtype, "make a peer view")


@implements("flowdsl.lsa.team_view")
def _lsa_team_view(win, team, peer, start, count, dtype):
    w = win.own("make a team view")
    world = w.rank + (int(peer) - team.rank) * team.stride
    return w.view(_world_lsa_check(w, world, "make a team view"), start, count, dtype, "make a team view")


class MultimemView:
    """A simulated multimem view (:func:`flowdsl.lsa.multimem_view`): one window view per LSA team member,
    in LSA rank order, the copies the NVLink switch reaches through one multicast address. Only
    ``flowdsl.mem``'s multimem operations take it; indexing it is refused as the GPU's typing refuses it."""

    __slots__ = ("members", "dtype")
    __flowdsl_sim__ = True

    def __init__(self, members):
        self.members = members
        self.dtype = np.asarray(members[0]).dtype

    def __len__(self):
        return len(self.members[0])

    def _refuse(self, *args):
        raise sim_error(KernelTypingError, "Cannot index a multimem view (flowdsl.lsa.multimem_view): a plain load or "
                        "store of a multimem address is undefined. Use flowdsl.mem.multimem_ld_reduce, multimem_store "
                        "or multimem_red (or their _vec forms), or an LSA view (flowdsl.lsa.lsa_view) of one member")

    __getitem__ = __setitem__ = _refuse

    def __repr__(self):
        return f"<sim MultimemView {self.members[0].group.name()} x{len(self.members)} {self.dtype.name}>"


@implements("flowdsl.lsa.multimem_view")
def _lsa_multimem_view(comm, win, start, count, dtype):
    w = win.own("make a multimem view")
    if not comm.group.reqs.get("lsa_multimem"):
        raise sim_error(UsageError, lsa.MULTIMEM_MISSING)
    base = comm.rank - comm.lsa_rank
    return MultimemView([w.view(base + p, start, count, dtype, "make a multimem view") for p in range(comm.lsa_size)])


KIND_CHECKS.register("multimem", lambda v: isinstance(v, MultimemView))


class BarrierSession(semantics.BarrierSession):
    """A thread's LSA barrier session (``ncclLsaBarrierSession``) on one index.

    Attributes:
        comm: The :class:`~flowdsl.sim.host.DevComm`.
        coop: The :class:`Coop` performing it.
        index: Barrier index.
        epoch: This thread's copy of the barrier's epoch.
    """

    __slots__ = ()

    arrive = method_of("flowdsl.lsa.arrive")
    wait = method_of("flowdsl.lsa.wait")
    sync = method_of("flowdsl.lsa.sync")


KIND_CHECKS.register("lsa_session", lambda v: isinstance(v, BarrierSession))


@implements("flowdsl.lsa.barrier")
def lsa_barrier(comm, coop, index):
    return open_lsa_barrier(comm, coop, index, "LSA barrier")


def open_lsa_barrier(comm, coop, index, what):
    """:func:`lsa_barrier`, its refusals naming ``what`` opened it (an LSA barrier, a hybrid barrier's part)."""
    t = current()
    g = comm.group
    index = barrier_index(index, g.lsa_barrier_count, "LSA barrier", "lsa_barrier_count")
    # Two different blocks of one launch must not use the same barrier index at once.
    okey = (t.rank, index)
    owner = g.owner.get(okey)
    me = (t.launch.seq, t.blk.lin)
    if owner is not None and owner[0] == t.launch.seq and owner[1] != t.blk.lin:
        other = owner[2]
        if not all(th.done for th in other.threads):
            raise sim_error(BarrierIndexError, (
                f"Cannot open {what} {index} in {t.blk.name()}: {other.name()} of the same launch is "
                f"using barrier {index}. Give every concurrently running block its own barrier index"))
    g.owner[okey] = me + (t.blk,)
    t.blk.lsa_barriers.add(index)
    return BarrierSession(comm, coop, index, g.epoch[t.rank][index])


def _bar_detail(session, t):
    def detail(s):
        g = session.comm.group
        comm = session.comm
        need = session.epoch + 1
        base = comm.rank - comm.lsa_rank
        box = g.inbox[comm.rank][session.index]
        lines = []
        for p in range(comm.lsa_size):
            if p == comm.lsa_rank or box[p] >= need:
                continue
            r = base + p
            lines.append(f"peer rank {r} has not arrived (its arrival count here is {box[p]}, need {need}); "
                         f"rank {r} was expected to call arrive on LSA barrier {session.index}: "
                         f"{s.rank_summary(r)}")
        return "\n".join(lines)
    return detail


@implements("flowdsl.lsa.arrive")
def lsa_arrive(session, order):
    coop = session.coop
    coop_sync(coop)
    if coop.trank == 0:
        comm = session.comm
        g = comm.group
        base = comm.rank - comm.lsa_rank
        val = session.epoch + 1
        sched = _state.sched
        rc = sched.race
        if rc is not None:  # the arrival publishes the coop's accesses if its order releases
            published = rc.release_vc(current(), order)
        for p in range(comm.lsa_size):
            if p != comm.lsa_rank:
                if rc is not None:
                    rc.release_to(("lsa", g.did, base + p, session.index), published)
                box = g.inbox[base + p][session.index]
                if box[comm.lsa_rank] < val:
                    box[comm.lsa_rank] = val
                g.conds[base + p][session.index].notify(sched)
    return None


@implements("flowdsl.lsa.wait")
def lsa_wait(session, order):
    t = current()
    comm = session.comm
    g = comm.group
    need = session.epoch + 1
    box = g.inbox[comm.rank][session.index]
    me = comm.lsa_rank
    sched = _state.sched
    cond = g.conds[comm.rank][session.index]
    while any(v < need for p, v in enumerate(box) if p != me):
        w = Wait(f"lsa barrier {session.index} wait (epoch {session.epoch} -> {need}) of devcomm #{g.did}",
                 _bar_detail(session, t))
        late = next(p for p, v in enumerate(box) if p != me and v < need)
        if note_bounded(t, "LSA_BARRIER", comm.rank - me + late, session.index, need, box[late], w, cond, comm):
            break  # comm.abort(): the wait gives up
        cond.waiters.append(t)
        sched.block(t, w)
    if sched.race is not None:
        sched.race.acquire_from(t, ("lsa", g.did, comm.rank, session.index), order)
    coop_sync(session.coop)
    session.epoch = need
    if session.coop.trank == 0:
        g.epoch[comm.rank][session.index] = need
    return None


@implements("flowdsl.lsa.sync")
def _lsa_sync(session, order):
    lsa_arrive(session, order)
    lsa_wait(session, order)


# reduce_sum, copy and reduce_sum_copy: the flowdsl programs that state their meaning (also what the
# GPU compiles), run by the simulated threads.
implements("flowdsl.lsa.reduce_sum")(lsa.reduce_sum_program)
implements("flowdsl.lsa.copy")(lsa.copy_program)
implements("flowdsl.lsa.reduce_sum_copy")(lsa.reduce_sum_copy_program)


# The multimem helpers: the same programs, with the forms of the view's element type (flowdsl.mem's table).

def _forms(name, view, other, store_only=False):
    """``(lanes, one)`` for the program, or the refusal the GPU's typing makes, raised (the spec's checks of the
    arguments' kinds have run)."""
    other_dtype = other.dtype if isinstance(other, MultimemView) else raw(other).dtype
    forms = lsa.multimem_helper_forms(name, view.dtype.name, other_dtype.name, store_only)
    if isinstance(forms, str):
        raise sim_error(KernelTypingError, forms)
    return forms


@implements("flowdsl.lsa.multimem_reduce_sum")
def _lsa_multimem_reduce_sum(coop, view, dst, count):
    lanes, one = _forms("multimem_reduce_sum", view, dst)
    lsa.multimem_reduce_sum_program(coop, view, dst, int(count), lanes, one)


@implements("flowdsl.lsa.multimem_copy")
def _lsa_multimem_copy(coop, src, view, count):
    lanes, one = _forms("multimem_copy", view, src, store_only=True)
    lsa.multimem_store_program(coop, True, src, None, view, int(count), lanes, one)


@implements("flowdsl.lsa.multimem_reduce_sum_copy")
def _lsa_multimem_reduce_sum_copy(coop, src_view, dst_view, count):
    lanes, one = _forms("multimem_reduce_sum_copy", src_view, dst_view)
    lsa.multimem_store_program(coop, None, None, src_view, dst_view, int(count), lanes, one)


@implements("flowdsl.lsa.multimem_partial_vectors")
def _lsa_multimem_partial_vectors(offset, count, lanes):
    raise sim_error(UsageError, lsa.multimem_partial_vectors_text(int(offset), int(count), int(lanes)))
