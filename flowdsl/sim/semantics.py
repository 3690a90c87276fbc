"""The one place that defines what every flowdsl primitive does in the simulator.

:data:`SEMANTICS` maps a primitive's name (``flowdsl.lsa.barrier``, the key
of ``flowdsl._stubs.PRIMITIVES``) to its implementation, registered with
:func:`implements`. :func:`dispatch` is the hook the stubs call; a primitive
with no entry raises :class:`~flowdsl.sim.errors.UnsupportedFeatureError`
naming it. Adding a primitive (GIN, CFT, Flow...) is one ``@implements``
function here (or in a module that imports this one).

Values made by primitives: :class:`Coop` (``c.sync()``, ``c.thread_rank()``,
``c.size()``), :class:`Team` (``nranks``, ``rank``, ``stride``),
:class:`BarrierSession` (``arrive``/``wait``/``sync``), :class:`Pointer`.

Contents: :data:`SEMANTICS`, :func:`implements`, :func:`dispatch`,
:class:`Coop`, :class:`Team`, :class:`BarrierSession`, :class:`Pointer`, and
one implementation per primitive of ``flowdsl.coop``, ``flowdsl.team``,
``flowdsl.lsa`` and ``flowdsl.mem`` (``flowdsl.gin``'s entries are registered
into the same table by :mod:`flowdsl.sim.gin`).
"""

from __future__ import annotations

from typing import Any, Callable

from .. import _stubs
from ..enums import CoopKind, MemoryOrder
from . import _state
from .errors import BarrierIndexError, UnsupportedFeatureError, UsageError, WindowAccessError
from .memory import Window, WindowView, address_key, raw
from .scheduler import KernelThread, Wait, block_sync, sim_error

__all__ = ["SEMANTICS", "implements", "dispatch", "Coop", "Team", "BarrierSession", "Pointer"]

#: primitive name -> implementation (same arguments as the stub).
SEMANTICS: dict[str, Callable[..., Any]] = {}


def implements(name: str):
    """Register the decorated function as the semantics of primitive ``name``."""
    def deco(fn):
        SEMANTICS[name] = fn
        return fn
    return deco


def dispatch(name, *args, **kwargs):
    """The hook ``flowdsl._stubs`` calls: run primitive ``name`` for the current thread."""
    impl = SEMANTICS.get(name)
    if impl is None:
        raise sim_error(UnsupportedFeatureError, (
            f"Cannot run {name}: {name} is not modelled by the simulator yet. "
            "Run this kernel on a GPU, or add its semantics to flowdsl/sim/semantics.py"))
    if not isinstance(_state.cur, KernelThread):
        raise _stubs.DeviceOnlyError(
            f"{name}() is a device function: call it inside a kernel; no simulated kernel thread is running "
            "(launch the kernel from a main function run by flowdsl.sim.spawn(...))")
    return impl(*args, **kwargs)


def _cur() -> KernelThread:
    return _state.cur


# ---------------------------------------------------------------- coop
class Coop:
    """A cooperative group of threads of one block.

    Attributes:
        kind: :class:`~flowdsl.CoopKind`.
        key: Names its hardware barrier within the block.
        nthreads: Number of threads.
        trank: The creating thread's rank within it.
        members: Linear thread ids of the members (for reports).
    """

    __slots__ = ("kind", "key", "nthreads", "trank", "members", "label", "shape", "synclabel")

    def __init__(self, kind, key, nthreads, trank, members, label):
        self.kind, self.key, self.nthreads, self.trank = kind, key, nthreads, trank
        self.members, self.label = members, label
        self.shape = "cta" if key == ("cta",) else (key, nthreads)
        self.synclabel = f"coop.sync({label})"

    def sync(self):
        return SEMANTICS["flowdsl.coop.sync"](self)

    def thread_rank(self):
        return SEMANTICS["flowdsl.coop.thread_rank"](self)

    def size(self):
        return SEMANTICS["flowdsl.coop.size"](self)

    def __repr__(self):
        return f"<sim Coop {self.label}>"


@implements("flowdsl.coop.thread")
def _coop_thread():
    t = _cur()
    return Coop(CoopKind.THREAD, None, 1, 0, [t.lin], "thread")


def _warp_lanes(t):
    base = t.warp * 32
    return [base + i for i in range(32) if base + i < t.blk.nthreads]


@implements("flowdsl.coop.warp")
def _coop_warp():
    t = _cur()
    mem = _warp_lanes(t)
    return Coop(CoopKind.WARP, ("warp", t.warp, 0xFFFFFFFF), len(mem), t.lane, mem, f"warp {t.warp}")


@implements("flowdsl.coop.lanes")
def _coop_lanes(mask):
    t = _cur()
    mask = int(mask) & 0xFFFFFFFF
    if not (mask >> t.lane) & 1:
        raise sim_error(UsageError, f"Cannot make coop.lanes({mask:#x}): the calling lane {t.lane} is not in "
                        "the mask. Only lanes in the mask may call it")
    mem = [m for m in _warp_lanes(t) if (mask >> (m & 31)) & 1]
    trank = bin(mask & ((1 << t.lane) - 1)).count("1")
    return Coop(CoopKind.LANES, ("warp", t.warp, mask), len(mem), trank, mem, f"lanes {mask:#x} of warp {t.warp}")


@implements("flowdsl.coop.warp_span")
def _coop_warp_span(first_warp, nwarps, id):
    t = _cur()
    first_warp, nwarps, id = int(first_warp), int(nwarps), int(id)
    if not 0 <= id < 16:
        raise sim_error(UsageError, f"Cannot make coop.warp_span(..., id={id}): ids are 0..15. Pick one of them")
    if not first_warp <= t.warp < first_warp + nwarps:
        raise sim_error(UsageError, f"Cannot make coop.warp_span({first_warp}, {nwarps}, {id}): the calling "
                        f"thread is in warp {t.warp}. Only threads of the span may make it")
    lo = first_warp * 32
    mem = list(range(lo, min((first_warp + nwarps) * 32, t.blk.nthreads)))
    return Coop(CoopKind.WARP_SPAN, ("span", id), len(mem), t.lin - lo, mem,
                f"warp_span({first_warp}, {nwarps}, id={id})")


@implements("flowdsl.coop.cta")
def _coop_cta():
    t = _cur()
    if t.launch.block[1] != 1 or t.launch.block[2] != 1:
        raise sim_error(UsageError, f"Cannot make coop.cta(): blockDim {t.launch.block} is not 1-D. "
                        "Launch with a 1-D block")
    n = t.blk.nthreads
    return Coop(CoopKind.CTA, ("cta",), n, t.lin, None, "cta")


@implements("flowdsl.coop.sync")
def _coop_sync(coop):
    t = _cur()
    if coop.key is None:
        return None
    block_sync(t, coop.key, coop.nthreads, coop.synclabel, None, coop.shape, coop.members)


@implements("flowdsl.coop.thread_rank")
def _coop_thread_rank(coop):
    return coop.trank


@implements("flowdsl.coop.size")
def _coop_size(coop):
    return coop.nthreads


# ---------------------------------------------------------------- team
class Team:
    """``ncclTeam``: ``nranks`` ranks, this rank's index ``rank``, world ``stride``."""

    __slots__ = ("nranks", "rank", "stride")

    def __init__(self, nranks, rank, stride):
        self.nranks, self.rank, self.stride = int(nranks), int(rank), int(stride)

    def __repr__(self):
        return f"Team(nranks={self.nranks}, rank={self.rank}, stride={self.stride})"

    def __eq__(self, other):
        return isinstance(other, Team) and (self.nranks, self.rank, self.stride) == \
            (other.nranks, other.rank, other.stride)


@implements("flowdsl.team.world")
def _team_world(comm):
    return Team(comm.nranks, comm.rank, 1)


@implements("flowdsl.team.lsa")
def _team_lsa(comm):
    return Team(comm.lsa_size, comm.lsa_rank, 1)


@implements("flowdsl.team.rail")
def _team_rail(comm):
    return Team(comm.nranks // comm.lsa_size, comm.rank // comm.lsa_size, comm.lsa_size)


@implements("flowdsl.team.rank_to_world")
def _team_rank_to_world(comm, team, rank):
    return comm.rank + (int(rank) - team.rank) * team.stride


@implements("flowdsl.team.rank_to_lsa")
def _team_rank_to_lsa(comm, team, rank):
    return comm.lsa_rank + (int(rank) - team.rank) * team.stride


@implements("flowdsl.team.rank_is_member")
def _team_rank_is_member(a, b, b_rank):
    w = (int(b_rank) - b.rank) * b.stride
    q, m = divmod(w, a.stride)
    ar = a.rank + q
    return 0 <= ar < a.nranks and m == 0


@implements("flowdsl.team.rank_to_team")
def _team_rank_to_team(a, b, b_rank):
    w = (int(b_rank) - b.rank) * b.stride
    return a.rank + w // a.stride


@implements("flowdsl.team.inner_factor")
def _team_inner_factor(parent, inner_size):
    return Team(inner_size, parent.rank % inner_size, parent.stride)


@implements("flowdsl.team.outer_factor")
def _team_outer_factor(parent, inner_size):
    return Team(parent.nranks // inner_size, parent.rank // inner_size, parent.stride * inner_size)


@implements("flowdsl.team.rank_in_difference")
def _team_rank_in_difference(parent, subset, index):
    # The index-th rank of parent (in order) that is not a member of subset.
    index = int(index)
    k = 0
    for r in range(parent.nranks):
        if not _team_rank_is_member(subset, parent, r):
            if k == index:
                return r
            k += 1
    raise sim_error(UsageError, f"Cannot take rank_in_difference index {index}: the difference has {k} ranks. "
                    "Use an index below its size")


# ---------------------------------------------------------------- lsa
class Pointer:
    """A simulated device pointer: byte ``offset`` into ``rank``'s part of a window."""

    __slots__ = ("window", "rank", "offset")

    def __init__(self, window, rank, offset):
        self.window, self.rank, self.offset = window, rank, int(offset)

    def __add__(self, n):
        return Pointer(self.window, self.rank, self.offset + int(n))

    def __repr__(self):
        return f"<sim Pointer {self.window.group.name()} rank {self.rank} +{self.offset}>"


def _win(win, op):
    if not isinstance(win, Window):
        raise sim_error(UsageError, f"Cannot {op}: {win!r} is not a window. Pass a window from comm.register()")
    t = _cur()
    if win.rank != t.rank:
        raise sim_error(UsageError, f"Cannot {op}: the window belongs to rank {win.rank}. "
                        "Pass this rank's window")
    return win


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
    w = _win(win, "get a local pointer")
    _check_ptr_offset(w, offset, "get a local pointer")
    return Pointer(w, w.rank, offset)


@implements("flowdsl.lsa.get_lsa_pointer")
def _lsa_get_lsa_pointer(win, offset, lsa_peer):
    w = _win(win, "get an LSA pointer")
    _check_ptr_offset(w, offset, "get an LSA pointer")
    return Pointer(w, _lsa_to_world(w, lsa_peer, "get an LSA pointer"), offset)


@implements("flowdsl.lsa.get_peer_pointer")
def _lsa_get_peer_pointer(win, offset, peer):
    w = _win(win, "get a peer pointer")
    _check_ptr_offset(w, offset, "get a peer pointer")
    return Pointer(w, _world_lsa_check(w, peer, "get a peer pointer"), offset)


@implements("flowdsl.lsa.get_team_pointer")
def _lsa_get_team_pointer(win, offset, team, peer):
    w = _win(win, "get a team pointer")
    _check_ptr_offset(w, offset, "get a team pointer")
    world = w.rank + (int(peer) - team.rank) * team.stride
    return Pointer(w, _world_lsa_check(w, world, "get a team pointer"), offset)


@implements("flowdsl.lsa.local_view")
def _lsa_local_view(win, start=0, count=-1, dtype=None):
    w = _win(win, "make a local view")
    return w.view(w.rank, start, count, dtype, "make a local view")


@implements("flowdsl.lsa.lsa_view")
def _lsa_lsa_view(win, lsa_peer, start=0, count=-1, dtype=None):
    w = _win(win, "make an LSA view")
    return w.view(_lsa_to_world(w, lsa_peer, "make an LSA view"), start, count, dtype,
                  f"make an LSA view (lsa_peer {int(lsa_peer)})")


@implements("flowdsl.lsa.peer_view")
def _lsa_peer_view(win, peer, start=0, count=-1, dtype=None):
    w = _win(win, "make a peer view")
    return w.view(_world_lsa_check(w, peer, "make a peer view"), start, count, dtype, "make a peer view")


@implements("flowdsl.lsa.team_view")
def _lsa_team_view(win, team, peer, start=0, count=-1, dtype=None):
    w = _win(win, "make a team view")
    world = w.rank + (int(peer) - team.rank) * team.stride
    return w.view(_world_lsa_check(w, world, "make a team view"), start, count, dtype, "make a team view")


class BarrierSession:
    """A thread's LSA barrier session (``ncclLsaBarrierSession``) on one index.

    Attributes:
        comm: The :class:`~flowdsl.sim.host.DevComm`.
        coop: The :class:`Coop` performing it.
        index: Barrier index.
        epoch: This thread's copy of the barrier's epoch.
    """

    __slots__ = ("comm", "coop", "index", "epoch")

    def __init__(self, comm, coop, index, epoch):
        self.comm, self.coop, self.index, self.epoch = comm, coop, index, epoch

    def arrive(self, order=MemoryOrder.SEQ_CST):
        return SEMANTICS["flowdsl.lsa.arrive"](self, order)

    def wait(self, order=MemoryOrder.SEQ_CST):
        return SEMANTICS["flowdsl.lsa.wait"](self, order)

    def sync(self, order=MemoryOrder.SEQ_CST):
        return SEMANTICS["flowdsl.lsa.sync"](self, order)


@implements("flowdsl.lsa.barrier")
def _lsa_barrier(comm, coop, index):
    t = _cur()
    g = getattr(comm, "group", None)
    if g is None or not hasattr(g, "inbox"):
        raise sim_error(UsageError, f"Cannot open an LSA barrier on {comm!r}: it is not a device communicator. "
                        "Pass the DevComm from comm.device_communicator()")
    index = int(index)
    if not 0 <= index < g.lsa_barrier_count:
        raise sim_error(BarrierIndexError, (
            f"Cannot open LSA barrier {index}: the device communicator has lsa_barrier_count="
            f"{g.lsa_barrier_count} (valid indices 0..{g.lsa_barrier_count - 1}). "
            f"Create it with comm.device_communicator(lsa_barrier_count={index + 1}) or more, or use a smaller index"))
    # Two different blocks of one launch must not use the same barrier index at once.
    okey = (t.rank, index)
    owner = g.owner.get(okey)
    me = (t.launch.seq, t.blk.lin)
    if owner is not None and owner[0] == t.launch.seq and owner[1] != t.blk.lin:
        other = owner[2]
        if not all(th.done for th in other.threads):
            raise sim_error(BarrierIndexError, (
                f"Cannot open LSA barrier {index} in {t.blk.name()}: {other.name()} of the same launch is "
                f"using barrier {index}. Give every concurrently running block its own barrier index"))
    g.owner[okey] = me + (t.blk,)
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
def _lsa_arrive(session, order=MemoryOrder.SEQ_CST):
    coop = session.coop
    _coop_sync(coop)
    if coop.trank == 0:
        comm = session.comm
        g = comm.group
        base = comm.rank - comm.lsa_rank
        val = session.epoch + 1
        sched = _state.sched
        rc = sched.race
        if rc is not None:  # the arrival publishes the coop's accesses if its order releases
            published = rc.release_vc(_cur(), order)
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
def _lsa_wait(session, order=MemoryOrder.SEQ_CST):
    t = _cur()
    comm = session.comm
    g = comm.group
    need = session.epoch + 1
    box = g.inbox[comm.rank][session.index]
    me = comm.lsa_rank
    sched = _state.sched
    cond = g.conds[comm.rank][session.index]
    while any(v < need for p, v in enumerate(box) if p != me):
        cond.waiters.append(t)
        w = Wait(f"lsa barrier {session.index} wait (epoch {session.epoch} -> {need}) of devcomm #{g.did}",
                 _bar_detail(session, t))
        late = next(p for p, v in enumerate(box) if p != me and v < need)
        _note_bounded(t, "LSA_BARRIER", comm.rank - me + late, session.index, need, box[late], w)
        sched.block(t, w)
    if sched.race is not None:
        sched.race.acquire_from(t, ("lsa", g.did, comm.rank, session.index), order)
    _coop_sync(session.coop)
    session.epoch = need
    if session.coop.trank == 0:
        g.epoch[comm.rank][session.index] = need
    return None


def _note_bounded(task, what, peer, index, expected, seen, wait_obj):
    """``task`` blocks in a wait a GPU bounds (see flowdsl/sim/timeouts.py)."""
    from .. import wait  # noqa: PLC0415
    from .timeouts import note  # noqa: PLC0415 (imports this module)

    note(task, getattr(wait, what), peer, index, expected, seen, wait_obj=wait_obj)


@implements("flowdsl.lsa.sync")
def _lsa_sync(session, order=MemoryOrder.SEQ_CST):
    _lsa_arrive(session, order)
    _lsa_wait(session, order)


def _lsa_members(comm, win):
    base = comm.rank - comm.lsa_rank
    return [base + p for p in range(comm.lsa_size)]


@implements("flowdsl.lsa.reduce_sum")
def _lsa_reduce_sum(coop, comm, win, start, dst, count):
    w = _win(win, "reduce_sum")
    count, start = int(count), int(start)
    views = [w.view(r, start, count, None, "reduce_sum") for r in _lsa_members(comm, w)]
    out = dst
    for i in range(coop.trank, count, coop.nthreads):
        acc = views[0][i]
        for v in views[1:]:
            acc = acc + v[i]
        out[i] = acc


@implements("flowdsl.lsa.copy")
def _lsa_copy(coop, comm, src, win, start, count):
    w = _win(win, "copy")
    count, start = int(count), int(start)
    views = [w.view(r, start, count, None, "copy") for r in _lsa_members(comm, w)]
    for i in range(coop.trank, count, coop.nthreads):
        x = src[i]
        for v in views:
            v[i] = x


@implements("flowdsl.lsa.reduce_sum_copy")
def _lsa_reduce_sum_copy(coop, comm, src_win, src_start, dst_win, dst_start, count):
    sw = _win(src_win, "reduce_sum_copy")
    dw = _win(dst_win, "reduce_sum_copy")
    count = int(count)
    members = _lsa_members(comm, sw)
    sv = [sw.view(r, int(src_start), count, None, "reduce_sum_copy") for r in members]
    dv = [dw.view(r, int(dst_start), count, None, "reduce_sum_copy") for r in members]
    for i in range(coop.trank, count, coop.nthreads):
        acc = sv[0][i]
        for v in sv[1:]:
            acc = acc + v[i]
        for v in dv:
            v[i] = acc


# ---------------------------------------------------------------- mem
_MEM_INT = "iu"


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
    t = _cur()
    sched = _state.sched
    addr = address_key(arr, index)
    try:
        v = value.item()
    except AttributeError:
        v = value
    sched.last_writer[addr] = (t.name(), v)
    sched.stale = 0


def _gin_load(array, i):
    from .gin import note_load
    note_load(array, i)


def _load(array, index, order, name):
    a, i = _elem(array, index, name)
    v = a[i]
    _spin_point(array, i, v)
    if isinstance(array, WindowView):
        _gin_load(array, i)  # after the spin point: observes what the returned value includes
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
        rc.fence(_cur(), order)
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


@implements("flowdsl.mem.address")
def _mem_address(array, index):
    import numpy as np  # noqa: PLC0415

    a = raw(array)
    start = array.start if isinstance(array, WindowView) else 0
    if isinstance(array, WindowView):  # windows are laid out from a 16-byte aligned base, as on the GPU
        return np.uint64((start + int(index)) * a.itemsize)
    return np.uint64(a.__array_interface__["data"][0] + int(index) * a.itemsize)


@implements("flowdsl.mem.store_vec")
def _mem_store_vec(array, index, values):
    a, i, n = _vec(array, index, "store_vec")
    if len(values) != n:
        raise sim_error(UsageError, f"Cannot store_vec {len(values)} values: a 16-byte vector of "
                        f"{a.dtype.name} has {n}. Pass a tuple of {n} values")
    a[i:i + n] = values
    _vec_access(array, i, n, True)



def _scalar_dtype(value):
    import numpy as np  # noqa: PLC0415

    if isinstance(value, np.generic):
        return value.dtype
    return np.dtype(np.float64) if isinstance(value, float) else np.dtype(np.int64)


@implements("flowdsl.mem.to_bits")
def _mem_to_bits(value):
    import numpy as np  # noqa: PLC0415

    source = _scalar_dtype(value)
    unsigned = np.dtype(f"u{source.itemsize}")
    return np.uint64(np.array(value, dtype=source).view(unsigned)[()])


@implements("flowdsl.mem.from_bits")
def _mem_from_bits(bits, dtype):
    import numpy as np  # noqa: PLC0415

    from .memory import as_dtype  # noqa: PLC0415

    target = as_dtype(dtype)
    low = np.array(int(bits) & ((1 << (8 * target.itemsize)) - 1), dtype=f"u{target.itemsize}")
    return low.view(target)[()]
