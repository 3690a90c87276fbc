"""CFT (Compute Fabric Transport) in the simulator: LE-addressed puts and gets, counted writes, the fence rule.

Registers one :func:`~flowdsl.sim.semantics.implements` entry per primitive of
:mod:`flowdsl.cft` in the simulator's one semantics table. CFT operations go
over the same simulated network as GIN (:class:`~flowdsl.sim.network.Network`),
so ``gin_delivery="ordered"`` lands the operations of one (session's
communicator, source, peer) in issue order and ``"reordered"`` in a seeded
random order. An operation is queued by ``put``/``put_counted``/``get``,
enters the network at ``submit``, has its source read at a later step (shared
memory for a put, the peer's window for a get) and lands later still;
``flush`` waits until every submitted operation of the session has landed,
``flush_smem`` until their sources have been read.

Logical endpoints: ``le_info`` gives an LE id naming (window, world rank) and
an LE offset that starts at a per-window base (as NCCL's offsets start at the
window's place in the LE), so a raw window offset passed as an LE offset is
reported.

Counted writes: the destination window must be registered with
``cft_counted=True``. When the data has landed, the write's byte count is
added to the u64 counter at its counter offset. The bytes a counted write will
write are tagged with it at submit; a thread that reads them before its rank
has both read a counter value that includes the write (``read_counter`` or
``wait_counted``) and then fenced fabric to generic (``fence``, or the fence
inside an acquiring ``wait_counted``) gets a
:class:`~flowdsl.sim.errors.CftCoverageError` naming the write and which of
the two is missing.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..cft import CftTeamMode, MemProxyType
from ..enums import MemoryOrder
from . import _state
from .errors import CftCoverageError, UsageError, WindowAccessError, sim_error
from .checks import KIND_CHECKS, barrier_index
from .coop import coop_sync
from .gin import roll_ge
from .network import Op
from .memory import raw
from .races import net_what, where_now
from .scheduler import Cond, Wait
from .semantics import BarrierSession, current, implements, method_of
from .team import Team
from .timeouts import note_bounded

__all__ = ["CftState", "Session", "CftSession", "CftBarrierSession", "LE_STRIDE", "cft_multimem_size"]

#: LE ids are ``LE_STRIDE * (window id + 1) + world rank``.
LE_STRIDE = 0x1000
_M64 = (1 << 64) - 1
_ACQUIRING = (MemoryOrder.ACQUIRE, MemoryOrder.ACQ_REL, MemoryOrder.SEQ_CST, MemoryOrder.CONSUME)


def _le_base(group) -> int:
    """LE offset of byte 0 of ``group`` (distinct per window, far above any window size here)."""
    return (group.wid + 1) << 32


class CftState:
    """CFT state of one simulation run (hung on the network)."""

    def __init__(self, nranks):
        self.groups = {}
        self.sessions = {}
        self.nsessions = 0
        #: (window id, rank, counter byte offset) -> counted writes applied there, not yet read.
        self.applied = {}
        #: per rank: counted-write id -> the counter read that observed it, not fenced since.
        self.unfenced = [{} for _ in range(nranks)]
        #: per rank: ids of counted writes whose data this rank may read.
        self.covered = [set() for _ in range(nranks)]
        self.ctr_cond = [Cond() for _ in range(nranks)]


class Session:
    """The shared state of one open ``ncclCft`` session (one per coop and storage)."""

    def __init__(self, sid, rank, who, comm, coop):
        self.sid, self.rank, self.who, self.comm, self.coop = sid, rank, who, comm, coop
        self.queued = []
        self.issued = []
        self.closed = False
        self.issuer = ("cft", rank, sid)


class CftSession:
    """A thread's handle on a CFT session."""

    __slots__ = ("state", "coop", "comm")

    def __init__(self, state, coop, comm):
        self.state, self.coop, self.comm = state, coop, comm

    def __repr__(self):
        return f"<sim CFT session #{self.state.sid} of rank {self.state.rank}>"


KIND_CHECKS.register("cft_session", lambda v: isinstance(v, CftSession))


def _net():
    return _state.sched.world.net


def _cft():
    net = _net()
    st = getattr(net, "cft", None)
    if st is None:
        st = net.cft = CftState(net.world.nranks)
    return st


def _ptr(a) -> int:
    return a.__array_interface__["data"][0]


def _le(comm, win, offset, world_peer, op):
    w = win.own(op)
    g = w.group
    offset = int(offset)
    if not 0 <= offset <= g.nbytes:
        raise sim_error(WindowAccessError, f"Cannot {op}: byte offset {offset} is outside {g.name()} "
                        f"({g.nbytes} bytes). Check the offset arithmetic")
    if not 0 <= world_peer < comm.nranks:
        raise sim_error(UsageError, f"Cannot {op}: world rank {world_peer} is outside the {comm.nranks} ranks. "
                        "Use a peer of the CFT team")
    _cft().groups[g.wid] = g
    return LE_STRIDE * (g.wid + 1) + world_peer, _le_base(g) + offset


def _decode(le_id, le_offset, n, op, what):
    """(window group, world rank, window byte offset) of an LE address, checked."""
    le_id, le_offset, n = int(le_id), int(le_offset), int(n)
    g = _cft().groups.get(le_id // LE_STRIDE - 1)
    rank = le_id % LE_STRIDE
    if g is None or rank >= len(g.bytes):
        raise sim_error(UsageError, f"Cannot {op}: {le_id} is not a logical endpoint id. Pass the le_id from "
                        "flowdsl.cft.le_info(comm, win, offset, team, peer)")
    off = le_offset - _le_base(g)
    if off < 0 or off + n > g.nbytes:
        hint = (" (it looks like a window offset: pass the le_offset from flowdsl.cft.le_info)"
                if 0 <= le_offset < _le_base(g) else "")
        raise sim_error(WindowAccessError, (
            f"Cannot {op}: {what} LE offset {le_offset} ({n} bytes) is outside {g.name()} of rank {rank} "
            f"({g.nbytes} bytes){hint}. Check the offset and size arithmetic (CFT offsets are in bytes)"))
    return g, rank, off


def _session(s, op):
    """The state of open CFT session ``s`` (a session checked by its spec)."""
    if s.state.closed:
        raise sim_error(UsageError, f"Cannot {op}: CFT session #{s.state.sid} is closed. "
                        "Use it between flowdsl.cft.session(...) and flowdsl.cft.close(session)")
    return s.state


def _smem(arr, n, op, what):
    if not isinstance(arr, np.ndarray):
        raise sim_error(UsageError, f"Cannot {op}: {what} {arr!r} is not shared memory. CFT moves data between "
                        "shared memory and windows: pass a cuda.shared.array")
    n = int(n)
    if n <= 0 or n % 16:
        raise sim_error(UsageError, f"Cannot {op}: {n} bytes is not a positive multiple of 16. CFT moves "
                        "16-byte units: round the size up to a multiple of 16")
    if n > arr.nbytes:
        raise sim_error(WindowAccessError, f"Cannot {op}: {n} bytes do not fit the {what} shared array of "
                        f"{arr.nbytes} bytes. Use a larger array or fewer bytes")
    if _ptr(arr) % 16:
        raise sim_error(UsageError, f"Cannot {op}: the {what} shared array is not 16-byte aligned. Allocate it "
                        "with cuda.shared.array(shape, dtype, alignment=16)")
    return n


def _coop_issue(coop):
    if coop.nthreads == 1:
        return True
    coop_sync(coop)
    return coop.trank == 0


class _Hooks:
    """How the network reads and lands a CFT operation (see :class:`flowdsl.sim.network.Op`).

    ``counter`` is the window byte offset of a counted write's counter (None otherwise).
    """

    __slots__ = ("counter",)

    def __init__(self, counter):
        self.counter = counter

    @staticmethod
    def read(op, agent):
        """The network reads the source (``agent``: the race detector's network channel, or None)."""
        rc = _state.race
        if op.kind == "cft_get":
            op.data = op.group.bytes[op.dst][op.off:op.off + op.n].copy()
            if rc is not None:
                rc.net_window(op, agent, op.group, op.dst, op.off, op.n, False, "reading the remote data of")
        else:
            op.data = raw(op.lgroup).reshape(-1).view(np.uint8)[:op.n].copy()
            if rc is not None:
                rc.net_array(op, agent, op.lgroup, op.n, False, "reading the shared-memory source of")
        if rc is not None:  # cft.flush_smem is ordered after this
            rc.release_to(("cft-read", op.issuer), rc.release(agent))
        _net().flush_cond[op.src].notify(_state.sched)

    def land(self, op, agent):
        sched = _state.sched
        rc = _state.race
        if op.kind == "cft_get":
            raw(op.lgroup).reshape(-1).view(np.uint8)[:op.n] = op.data
            if rc is not None:
                rc.net_array(op, agent, op.lgroup, op.n, True, "landing")
                rc.release_to(("cft-land", op.issuer), rc.release(agent))
            return
        g = op.group
        g.bytes[op.dst][op.off:op.off + op.n] = op.data
        if rc is not None:
            rc.net_window(op, agent, g, op.dst, op.off, op.n, True, "landing")
            rc.release_to(("cft-land", op.issuer), rc.release(agent))
        if self.counter is None:
            if g.gin_tags is not None:  # a plain write replaces what a counted one wrote there
                g.gin_tags[op.dst][op.off:op.off + op.n] = 0
            sched.stale = 0
            return
        cell = g.bytes[op.dst][self.counter:self.counter + 8].view(np.uint64)
        cell[0] = np.uint64((int(cell[0]) + op.n) & _M64)
        if rc is not None:  # an atomic add that releases the data it counts
            cells, base = rc.window(g, op.dst)
            rc.atomic((f"{g.name()} on rank {op.dst}", base), None, True, True, MemoryOrder.RELEASE, agent,
                      net_what(op, "counting"), (cells, base + self.counter))
        st = _cft()
        st.applied.setdefault((g.wid, op.dst, self.counter), []).append(op)
        st.ctr_cond[op.dst].notify(sched)
        sched.stale = 0

    def check_read(self, net, view, i, op, t):
        st = _cft()
        if op.id in st.covered[t.rank]:
            return
        b = (view.start + int(i)) * view._a.itemsize
        counter = f"its counter at byte {self.counter} of {op.group.name()}"
        seen = st.unfenced[t.rank].get(op.id)
        if seen is not None:
            why = (f"rank {t.rank} read {counter} ({seen}) but has not fenced since: call "
                   "flowdsl.cft.fence(coop) (fabric to generic, acquire) between reading the counter and reading "
                   "the data, or wait with flowdsl.cft.wait_counted, which fences")
        elif not op.landed:
            why = f"the write had not landed ({counter} had not counted it)"
        else:
            why = f"the write had landed, but rank {t.rank} has not read {counter} since"
        raise sim_error(CftCoverageError, (
            f"Cannot read element {view.start + int(i)} ({view._a.dtype.name}, byte offset {b}) of "
            f"{view.group.name()} on rank {view.wrank} at {where_now()}: it holds data of counted CFT write "
            f"#{op.idx} (from rank "
            f"{op.src} to rank {op.dst}, issued by {op.who}), and {why}. Read the data of a counted write only "
            "after a counter value that includes it, and a fence after reading that counter"))


def _queue(s, kind, le_id, le_offset, arr, nbytes, op_name, counter_offset=None):
    st = _session(s, op_name)
    n = _smem(arr, nbytes, op_name, "destination" if kind == "cft_get" else "source")
    g, dst, off = _decode(le_id, le_offset, n, op_name, "the")
    coff = None
    if counter_offset is not None:
        if not g.cft_counted:
            raise sim_error(UsageError, (
                f"Cannot {op_name}: {g.name()} was not registered for counted writes. Register the destination "
                "with comm.register(buf, cft_counted=True) (NCCL_WIN_CFT_COUNTED)"))
        g2, _, coff = _decode(le_id, counter_offset, 8, op_name, "the counter")
        if coff % 8:
            raise sim_error(UsageError, f"Cannot {op_name}: the counter's byte offset {coff} is not 8-byte "
                            "aligned. Place counters at 8-byte aligned offsets")
        if coff < off + n and off < coff + 8:
            raise sim_error(UsageError, f"Cannot {op_name}: the counter (bytes {coff}..{coff + 7}) lies inside "
                            f"the data (bytes {off}..{off + n - 1}). Keep counters apart from the data")
    if not _coop_issue(s.coop):
        return None
    t = current()
    op = Op(kind, t.rank, dst, "cft", SimpleNamespace(group=s.comm.group))
    op.group, op.off, op.n, op.lgroup, op.hooks = g, off, n, arr, _Hooks(coff)
    st.queued.append(op)
    return None


# ---------------------------------------------------------------- teams and LEs
#: ``ncclCftCap_t``'s NCCL_CFT_MULTIMEM: the device communicator asked for CFT multimem teams.
_CFT_MULTIMEM_CAP = 0x2


def cft_multimem_size(comm) -> int:
    """``cftMultimemSize`` of a simulated device communicator: its node (the LSA team) where the simulated
    system has NVLink SHARP (``spawn(multimem=True)``) and the device communicator asked for CFT multimem
    (``cft_caps`` with NCCL_CFT_MULTIMEM, 2); else 1 (every rank its own multimem team)."""
    reqs = getattr(getattr(comm, "group", None), "reqs", None) or {}
    if int(reqs.get("cft_caps", 0)) & _CFT_MULTIMEM_CAP and comm.comm.world.multimem:
        return comm.lsa_size
    return 1


@implements("flowdsl.cft.team")
def _cft_team(comm, mode):
    # The simulator's CFT domain is the whole world (cftSize = nranks, cftRank = rank), whatever the nodes:
    # LSA teams are nodes (spawn(nodes=...)), so HIER_LSA is one rank per node, as ncclTeamCft computes it.
    mode = CftTeamMode(int(mode))
    if mode == CftTeamMode.FLAT:
        return Team(comm.nranks, comm.rank, 1)
    size = comm.lsa_size if mode == CftTeamMode.HIER_LSA else cft_multimem_size(comm)
    return Team(comm.nranks // size, comm.rank // size, size)


@implements("flowdsl.cft.le_info")
def _cft_le_info(comm, win, offset, team, peer):
    peer = int(peer)
    if not 0 <= peer < team.nranks:
        raise sim_error(UsageError, f"Cannot get LE info: peer {peer} is outside the team of {team.nranks} ranks. "
                        "Use 0 <= peer < team.nranks")
    return _le(comm, win, offset, comm.rank + (peer - team.rank) * team.stride, "get LE info")


@implements("flowdsl.cft.peer_le_info")
def _cft_peer_le_info(comm, win, offset, peer):
    return _le(comm, win, offset, int(peer), "get peer LE info")


# ---------------------------------------------------------------- sessions
@implements("flowdsl.cft.session")
def _cft_session(comm, coop, storage):
    t = current()
    if not isinstance(storage, np.ndarray) or storage.dtype != np.uint64 or storage.size < 4:
        raise sim_error(UsageError, f"Cannot open a CFT session over {storage!r}: it needs a shared u64 array of "
                        "flowdsl.cft.SESSION_WORDS (4) elements. Pass cuda.shared.array(4, uint64, alignment=16)")
    if _ptr(storage) % 16:
        raise sim_error(UsageError, "Cannot open a CFT session: its storage is not 16-byte aligned. Allocate it "
                        "with cuda.shared.array(4, uint64, alignment=16)")
    st = _cft()
    key = (t.rank, _ptr(storage))
    coop_sync(coop)
    if coop.trank == 0:
        other = st.sessions.get(key)
        if other is not None and not other.closed:
            raise sim_error(UsageError, (
                f"Cannot open a CFT session over this storage: CFT session #{other.sid} (opened by {other.who}) "
                "is still open over it. Give each concurrent session its own storage, or close the other first"))
        st.nsessions += 1
        st.sessions[key] = Session(st.nsessions, t.rank, t.name(), comm, coop)
    coop_sync(coop)
    return CftSession(st.sessions[key], coop, comm)


@implements("flowdsl.cft.put")
def _cft_put(session, le_id, le_offset, src, nbytes):
    return _queue(session, "cft_put", le_id, le_offset, src, nbytes, "queue flowdsl.cft.put")


@implements("flowdsl.cft.put_counted")
def _cft_put_counted(session, le_id, le_offset, counter_offset, src, nbytes):
    return _queue(session, "cft_put", le_id, le_offset, src, nbytes, "queue flowdsl.cft.put_counted",
                  counter_offset)


@implements("flowdsl.cft.get")
def _cft_get(session, le_id, le_offset, dst, nbytes):
    return _queue(session, "cft_get", le_id, le_offset, dst, nbytes, "queue flowdsl.cft.get")


@implements("flowdsl.cft.submit")
def _cft_submit(session):
    st = _session(session, "submit a CFT session")
    if not _coop_issue(session.coop):
        return None
    net = _net()
    t = current()
    for op in st.queued:
        net.issue(op, st.issuer, t.name())
        st.issued.append(op)
        if op.hooks.counter is not None:  # its bytes are the counted write's until a thread overwrites them
            g = op.group
            if g.gin_tags is None:
                g.gin_tags = [np.zeros(g.nbytes, np.int64) for _ in g.bytes]
            g.gin_tags[op.dst][op.off:op.off + op.n] = op.id
    st.queued = []
    return None


def _wait_ops(session, done, what, op):
    st = _session(session, op)
    coop_sync(session.coop)  # what the coop's issuing thread queued and submitted is in place
    if st.queued:
        raise sim_error(UsageError, f"Cannot {op}: {len(st.queued)} operations of CFT session #{st.sid} were "
                        "queued but not submitted. Call flowdsl.cft.submit(session) first")
    t = current()
    net = _net()
    sched = _state.sched
    while not all(done(o) for o in st.issued):
        left = sum(1 for o in st.issued if not done(o))
        net.flush_cond[t.rank].waiters.append(t)
        sched.block(t, Wait(f"{op} (CFT session #{st.sid}, {left} operations not yet {what})"))
    if _state.race is not None:
        _state.race.acquire_from(t, ("cft-land" if what == "complete" else "cft-read", st.issuer))
    coop_sync(session.coop)


@implements("flowdsl.cft.flush")
def _cft_flush(session):
    _wait_ops(session, lambda o: o.landed, "complete", "flush a CFT session")
    st = session.state
    if session.coop.trank == 0:
        st.issued = [o for o in st.issued if not o.landed]
    coop_sync(session.coop)
    return 0


@implements("flowdsl.cft.flush_smem")
def _cft_flush_smem(session):
    _wait_ops(session, lambda o: o.read, "read from shared memory", "flush_smem a CFT session")


@implements("flowdsl.cft.close")
def _cft_close(session):
    st = _session(session, "close a CFT session")
    coop_sync(session.coop)
    left = [o for o in st.issued if not o.landed] + st.queued
    if left:
        raise sim_error(UsageError, f"Cannot close CFT session #{st.sid}: {len(left)} operations are queued or "
                        "in flight. Submit and flush them before closing")
    coop_sync(session.coop)
    st.closed = True
    return None


# ---------------------------------------------------------------- counters and the fence rule
def _counter(win, offset, op):
    w = win.own(op)
    g = w.group
    offset = int(offset)
    if offset % 8 or not 0 <= offset <= g.nbytes - 8:
        raise sim_error(WindowAccessError, f"Cannot {op}: byte offset {offset} is not an 8-byte aligned u64 inside "
                        f"{g.name()} ({g.nbytes} bytes). Place counters at 8-byte aligned offsets")
    return g, offset


def _observe(rank, g, offset, fenced, how):
    """A counter read: the counted writes applied there so far become readable (after a fence)."""
    st = _cft()
    ops = st.applied.pop((g.wid, rank, offset), [])
    for op in ops:
        if fenced:
            st.covered[rank].add(op.id)
        else:
            st.unfenced[rank][op.id] = how


def _value(g, rank, offset):
    return int(g.bytes[rank][offset:offset + 8].view(np.uint64)[0])


def _race_counter(t, g, offset, order):
    """A thread's read of a counter: an atomic load of its u64 (acquiring per ``order``)."""
    rc = _state.race
    if rc is not None:
        cells, base = rc.window(g, t.rank)
        rc.atomic((f"{g.name()} on rank {t.rank}", base), None, True, False, order, loc=(cells, base + offset))


@implements("flowdsl.cft.read_counter")
def _cft_read_counter(win, offset, order):
    g, offset = _counter(win, offset, "read a CFT counter")
    t = current()
    v = _value(g, t.rank, offset)
    _state.sched.yield_spin(t, ("cft-counter", g.wid, t.rank, offset, v))
    _observe(t.rank, g, offset, False, f"flowdsl.cft.read_counter by {t.name()}")
    _race_counter(t, g, offset, MemoryOrder(int(order)))
    return _value(g, t.rank, offset)


@implements("flowdsl.cft.wait_counted")
def _cft_wait_counted(session, win, offset, expected, order, consumer):
    _session(session, "wait for a CFT counter")
    g, offset = _counter(win, offset, "wait for a CFT counter")
    t = current()
    sched = _state.sched
    st = _cft()
    while not roll_ge(_value(g, t.rank, offset), int(expected), 64):
        w = Wait(f"cft.wait_counted(counter at byte {offset} of {g.name()} >= {int(expected)} bytes; "
                 f"now {_value(g, t.rank, offset)})")
        cond = st.ctr_cond[t.rank]
        if note_bounded(t, "CFT_COUNTER", -1, offset, expected, lambda g=g, r=t.rank, o=offset: _value(g, r, o), w,
                        cond, session.comm):
            break  # comm.abort(): the wait gives up
        cond.waiters.append(t)
        sched.block(t, w)
    order = MemoryOrder(int(order))
    _observe(t.rank, g, offset, order in _ACQUIRING, f"a relaxed flowdsl.cft.wait_counted by {t.name()}")
    _race_counter(t, g, offset, order)
    coop_sync(session.coop)


def _fence(rank, order, producer):
    if producer == MemProxyType.FABRIC and order in _ACQUIRING:
        st = _cft()
        st.covered[rank].update(st.unfenced[rank])
        st.unfenced[rank].clear()


@implements("flowdsl.cft.fence")
def _cft_fence(coop, order, producer, consumer, scope):
    order = MemoryOrder(int(order))
    producer = MemProxyType(int(producer))
    _fence(current().rank, order, producer)
    if _state.race is not None:
        _state.race.fence(current(), order)
    if coop.nthreads > 1:
        coop_sync(coop)


# ---------------------------------------------------------------- barrier
class CftBarrierSession(BarrierSession):
    """A CFT barrier session over the CFT team (every rank), barrier ``index``."""

    __slots__ = ()
    arrive = method_of("flowdsl.cft.barrier_arrive")
    wait = method_of("flowdsl.cft.barrier_wait")
    sync = method_of("flowdsl.cft.barrier_sync")


KIND_CHECKS.register("cft_barrier_session", lambda v: isinstance(v, CftBarrierSession))


def _bar_state(g):
    bs = getattr(g, "cft_bar", None)
    if bs is None:
        n = g.world.nranks
        count = int(g.reqs.get("cft_barrier_count", 0))
        bs = g.cft_bar = SimpleNamespace(count=count, inbox=[[[0] * n for _ in range(count)] for _ in range(n)],
                                         epoch=[[0] * count for _ in range(n)],
                                         conds=[[Cond() for _ in range(count)] for _ in range(n)])
    return bs


@implements("flowdsl.cft.barrier")
def _cft_barrier(comm, coop, index):
    g = getattr(comm, "group", None)
    if g is None or not hasattr(g, "inbox"):
        raise sim_error(UsageError, f"Cannot open a CFT barrier on {comm!r}: it is not a device communicator. "
                        "Pass the DevComm from comm.device_communicator()")
    bs = _bar_state(g)
    index = barrier_index(index, bs.count, "CFT barrier", "cft_barrier_count")
    return CftBarrierSession(comm, coop, index, bs.epoch[current().rank][index])


def _bar_arrive(s, order):
    coop_sync(s.coop)
    if s.coop.trank == 0:
        bs = _bar_state(s.comm.group)
        me, val = s.comm.rank, s.epoch + 1
        rc = _state.race
        published = rc.release_vc(current(), order) if rc is not None else None
        for q in range(s.comm.nranks):
            if q != me:
                if rc is not None:
                    rc.release_to(("cft-bar", s.comm.group.did, q, s.index), published)
                box = bs.inbox[q][s.index]
                box[me] = max(box[me], val)
                bs.conds[q][s.index].notify(_state.sched)


def _bar_wait(s, order, producer):
    t = current()
    bs = _bar_state(s.comm.group)
    me, need = s.comm.rank, s.epoch + 1
    box = bs.inbox[me][s.index]
    arrived = True
    while any(v < need for q, v in enumerate(box) if q != me):
        def detail(sch, box=box, me=me, need=need):
            return "\n".join(f"rank {q} has not arrived (its arrival count here is {v}, need {need}): "
                             f"{sch.rank_summary(q)}" for q, v in enumerate(box) if q != me and v < need)
        w = Wait(f"cft barrier {s.index} wait (epoch {s.epoch} -> {need})", detail)
        late = next(q for q, v in enumerate(box) if q != me and v < need)  # the CFT team is the world
        cond = bs.conds[me][s.index]
        if note_bounded(t, "CFT_BARRIER", late, s.index, need, box[late], w, cond, s.comm):
            arrived = False  # comm.abort(): the wait gives up, the epoch stays (as on GPUs)
            break
        cond.waiters.append(t)
        _state.sched.block(t, w)
    _fence(me, MemoryOrder(int(order)), MemProxyType(int(producer)))
    if _state.race is not None:
        _state.race.acquire_from(t, ("cft-bar", s.comm.group.did, me, s.index), order)
    coop_sync(s.coop)
    if arrived:
        s.epoch = need
    if s.coop.trank == 0:
        bs.epoch[me][s.index] = s.epoch


@implements("flowdsl.cft.barrier_arrive")
def _cft_barrier_arrive(session, order, producer, consumer):
    _bar_arrive(session, order)


@implements("flowdsl.cft.barrier_wait")
def _cft_barrier_wait(session, order, producer, consumer):
    _bar_wait(session, order, producer)


@implements("flowdsl.cft.barrier_sync")
def _cft_barrier_sync(session, order, producer, consumer):
    _bar_arrive(session, order)
    _bar_wait(session, order, producer)
