"""What ``flowdsl.gin`` does in the simulator: contexts, actions, puts, gets, signals, counters, barriers.

One :func:`~flowdsl.sim.semantics.implements` entry per primitive of :mod:`flowdsl.gin`. Operations go
over the simulated network (:mod:`flowdsl.sim.network`: in-flight operations, landing, signal
coverage); a device communicator's signals, counters and rail barrier state are its :class:`GinState`.
Arguments are checked against each primitive's spec before it runs (:mod:`flowdsl.sim.checks`), then by value here.
"""

from __future__ import annotations

import numpy as np

from ..enums import GinConnectionType, GinFenceLevel, MemoryOrder
from ..gin import DEFAULT_FENCE, FENCE_FEATURE, FENCE_NCCL, _sub_session_refusal, fence_refusal, lsa_part_fence_refusal
from . import _state
from .checks import KIND_CHECKS, barrier_index, check_index, require_release
from .coop import coop_sync
from .errors import (BarrierIndexError, GinBackendError, GinResourceError, KernelTypingError, UsageError,
                     WindowAccessError, sim_error)
from .lsa import BarrierSession, lsa_arrive, lsa_wait, open_lsa_barrier
from .network import Op
from .races import ACQUIRING, RELEASING
from .scheduler import Cond, Wait
from .semantics import current, implements
from .timeouts import note_bounded

__all__ = ["GinState", "GinContext", "Action", "GinBarrierSession", "HybridBarrierSession", "roll_ge"]

_M64 = (1 << 64) - 1
DEFAULT_CONTEXTS = 4


# ---------------------------------------------------------------- values
class Action:
    """A remote (signal) or local (counter) action value, as made by ``gin.*_signal_*``.

    Attributes:
        prim: Primitive that made it (for reports).
        kind: ``"sig"``, ``"va"`` or ``"counter"``.
        strong: Whether the signal covers earlier puts of the channel (None for a legacy signal until it is
            issued on a device communicator, which decides).
        ident: Signal or counter id (``None`` for VA signals).
        win, offset: The window and byte offset of a VA signal.
        value: Amount added.
    """

    __slots__ = ("prim", "kind", "strong", "ident", "win", "offset", "value")

    def __init__(self, prim, kind, strong, ident=None, win=None, offset=0, value=1):
        self.prim, self.kind, self.strong, self.ident = prim, kind, strong, ident
        self.win, self.offset, self.value = win, int(offset), int(value)

    def describe(self):
        what = "strong" if self.strong else "weak"
        if self.kind == "va":
            return f"{what} VA signal at byte {self.offset} of {self.win.group.name()}"
        return f"{what} signal {self.ident}"

    def __repr__(self):
        return f"<sim gin action {self.prim}>"


class GinContext:
    """``ncclGin``: GIN context ``index`` of a device communicator (refused beyond its context count)."""

    __slots__ = ("comm", "index", "state")

    def __init__(self, comm, index):
        self.comm, self.state = comm, gin_state(comm)
        if not self.state.enabled:
            raise sim_error(GinResourceError, (
                f"Cannot make GIN context {int(index)}: the device communicator has no GIN (NCCL >= 2.29 enables GIN "
                "only when asked: a gin_connection_type, gin_force_enable, or GIN resources such as "
                "gin_signal_count, for which flowdsl asks for FULL). Create it with "
                "comm.device_communicator(for_kernel=k, grid=g) (a kernel that uses GIN asks for it) or "
                "gin_connection_type=flowdsl.GinConnectionType.FULL"))
        self.index = _check_id(index, self.state.contexts, "context", f"make GIN context {int(index)}", "index")

    def __repr__(self):
        return f"<sim GIN context {self.index} of {self.comm!r}>"

class TeamBarriers:
    """The GIN barriers of one team for every rank: ``inbox[rank][index][member]`` is the last epoch that
    member's arrival brought, ``epoch[rank][index]`` the rank's own, ``cond[rank][index]`` its waits."""

    def __init__(self, nranks: int, count: int, members: int):
        self.inbox = [[[0] * members for _ in range(count)] for _ in range(nranks)]
        self.epoch = [[0] * count for _ in range(nranks)]
        self.cond = [[Cond() for _ in range(count)] for _ in range(nranks)]


class GinState:
    """GIN state of one device communicator (shared by its ranks).

    Counts come from the device communicator's requirements: ``gin_context_count``
    (default 4), ``gin_signal_count``, ``gin_counter_count``,
    ``rail_gin_barrier_count`` (and ``barrier_count``, which sets both LSA and GIN
    barrier counts for hybrid barriers), ``world_gin_barrier_count``.
    """

    def __init__(self, group):
        reqs = group.reqs
        world = group.world
        n = world.nranks
        self.group = group
        # NCCL >= 2.29 enables GIN only when asked (a connection type, or gin_force_enable; flowdsl asks for FULL
        # where GIN resources are requested): without it the device communicator has no GIN context.
        self.enabled = bool(int(reqs.get("gin_connection_type", 0)) or reqs.get("gin_force_enable"))
        self.contexts = int(reqs.get("gin_context_count", DEFAULT_CONTEXTS) or DEFAULT_CONTEXTS) if self.enabled else 0
        self.nsignals = int(reqs.get("gin_signal_count", 0))
        # NCCL makes its legacy signals (signal_inc, signal_add, the GIN barriers' arrivals) strong exactly when
        # the device communicator requires strong signals, which a backend without them refuses.
        self.legacy_strong = bool(reqs.get("gin_strong_signals_required", True))
        self.ncounters = int(reqs.get("gin_counter_count", 0))
        both = int(reqs.get("barrier_count", 0))
        self.nrail = max(int(reqs.get("rail_gin_barrier_count", 0)), both)
        self.signals = [[0] * self.nsignals for _ in range(n)]
        self.counters = [[0] * self.ncounters for _ in range(n)]
        self.sig_pending = [[[] for _ in range(self.nsignals)] for _ in range(n)]
        self.sig_cond = [Cond() for _ in range(n)]
        self.ctr_cond = [Cond() for _ in range(n)]
        self.nworld = int(reqs.get("world_gin_barrier_count", 0))
        # GIN barriers by team: each rank's inbox holds, per barrier, the last arrival of each team member
        # (the rail team's by node, the world team's by rank), its own epoch, and what its waits block on.
        # The dense barrier is a hybrid session's GIN barrier over every GIN-connected rank (NCCL 2.32, fence
        # level PUT where GIN reaches beyond the rail team): ranks ``stride`` apart.
        self.barriers = {"rail": TeamBarriers(n, self.nrail, world.nodes),
                         "world": TeamBarriers(n, self.nworld, n),
                         "dense": TeamBarriers(n, self.nrail, n)}
        kind = int(reqs.get("gin_connection_type", 0) or GinConnectionType.FULL)
        self.stride = {GinConnectionType.RAIL: world.lsa_size,
                       GinConnectionType.CUSTOM_STRIDE: int(reqs.get("gin_custom_stride", 1) or 1)}.get(kind, 1)
        self.bar_pending = [[] for _ in range(n)]


KIND_CHECKS.register("gin_context", lambda v: isinstance(v, GinContext))
KIND_CHECKS.register("remote", lambda v: isinstance(v, Action) and v.kind != "counter")
KIND_CHECKS.register("local", lambda v: isinstance(v, Action) and v.kind == "counter")


def gin_state(comm) -> GinState:
    """The GIN state of device communicator ``comm`` (made at first use)."""
    g = comm.group
    st = getattr(g, "gin", None)
    if st is None:
        st = g.gin = GinState(g)
    return st

# ---------------------------------------------------------------- helpers
def _net():
    net = _state.sched.world.net
    return net


def _check_id(ident, count, noun, op, unit="id"):
    """``ident`` as an int, refused unless it is below ``count``, how many ``noun`` ids the device communicator
    was created with (its ``gin_<noun>_count``)."""
    return check_index(ident, count, f"gin_{noun}_count", lambda i: f"Cannot {op}: {noun} {unit} {i} is beyond "
                       f"the {count} {noun}s the device communicator was created with (gin_{noun}_count={count})",
                       GinResourceError, unit)


def _check_signal(st, ident, op):
    return _check_id(ident, st.nsignals, "signal", op)


def _check_counter(st, ident, op):
    return _check_id(ident, st.ncounters, "counter", op)


def _peer(ctx, team, peer, op):
    """World rank of ``team``'s rank ``peer`` (a team checked by its spec)."""
    peer = int(peer)
    if not 0 <= peer < team.nranks:
        raise sim_error(UsageError, f"Cannot {op}: peer {peer} is outside the team of {team.nranks} ranks "
                        f"({team!r}). Use 0 <= peer < team.nranks")
    return ctx.comm.rank + (peer - team.rank) * team.stride


def _range(group, off, n, op, what, rank):
    off, n = int(off), int(n)
    if off < 0 or n < 0 or off + n > group.nbytes:
        raise sim_error(WindowAccessError, (
            f"Cannot {op}: {what} bytes {off}..{off + n - 1} ({n} bytes) lie outside {group.name()} of rank "
            f"{rank} ({group.nbytes} bytes). Check the offset and size arithmetic (GIN offsets are in bytes)"))
    return off, n


def _spans(opn, dst, nbytes, at_peer, here):
    """The two windows of a put or get, each ``(window, offset, parameter, what)``, checked: both this rank's,
    ``nbytes`` inside ``at_peer``'s part at world rank ``dst`` and inside ``here``'s part here. What its Op
    carries: ``(group, off, n, lgroup, loff)``."""
    (pwin, poff, pname, pwhat), (hwin, hoff, hname, hwhat) = at_peer, here
    pg, hg = pwin.own(opn, pname).group, hwin.own(opn, hname).group
    poff, n = _range(pg, poff, nbytes, opn, pwhat, dst)
    hoff, _ = _range(hg, hoff, nbytes, opn, hwhat, current().rank)
    return pg, poff, n, hg, hoff


def _check_remote(ctx, remote, op):
    """``remote`` checked against the device communicator, a legacy signal made as strong as it requires
    (NCCL: ``ginStrongLegacySignals = ginStrongSignalsRequired``)."""
    if remote is None:
        return None
    if remote.strong is None:
        remote = Action(remote.prim, remote.kind, ctx.state.legacy_strong, remote.ident, remote.win, remote.offset,
                        remote.value)
    elif remote.strong and not ctx.state.legacy_strong:
        raise sim_error(GinBackendError, (
            f"Cannot {op} with {remote.prim}: the device communicator was created with "
            "gin_strong_signals_required=False, under which NCCL leaves strong signals undefined. Leave that "
            "requirement out (NCCL requires strong signals by default), or use weak signals"))
    if remote.kind == "sig":
        _check_signal(ctx.state, remote.ident, f"{op} with {remote.prim}")
    else:
        g = remote.win.group
        if remote.offset % 8 or not 0 <= remote.offset <= g.nbytes - 8:
            raise sim_error(WindowAccessError, (
                f"Cannot {op} with {remote.prim}: byte offset {remote.offset} is not an 8-byte aligned u64 "
                f"inside {g.name()} ({g.nbytes} bytes). Place VA signals at 8-byte aligned offsets"))
    return remote


def _issuer(t, coop):
    key = coop.key if coop is not None and coop.key is not None else ("t", t.lin)
    return (t.rank, t.launch.seq, t.blk.lin, key)


def _sync_coop(coop):
    """The coop's threads wait for each other (a lone thread has no one to wait for)."""
    if coop is not None and coop.nthreads > 1:
        coop_sync(coop)


def _coop_issue(coop):
    """Sync a cooperative call; True on the thread that issues it."""
    if coop is None or coop.nthreads == 1:
        return True
    coop_sync(coop)
    return coop.trank == 0


# ---------------------------------------------------------------- context and actions
@implements("flowdsl.gin.context")
def _gin_context(comm, index):
    return GinContext(comm, index)


def _strong_action(prim, kind, ident=None, win=None, offset=0, value=1):
    net = _net()
    if not net.has_strong:
        raise sim_error(GinBackendError, (
            f"Cannot issue {prim}: it needs strong signals, and the GIN backend {net.backend} offers weak "
            f"signals only (as EFA GDA does). Use weak signals (one per put, and wait for each), "
            f"or run on a backend with strong signals (gin_backend='proxy' or 'gdaki')"))
    return Action(prim, kind, True, ident, win, offset, value)


@implements("flowdsl.gin.signal_inc")
def _gin_signal_inc(signal):
    return Action("flowdsl.gin.signal_inc", "sig", None, int(signal))  # strong as the device communicator says


@implements("flowdsl.gin.signal_add")
def _gin_signal_add(signal, value):
    return Action("flowdsl.gin.signal_add", "sig", None, int(signal), value=value)


@implements("flowdsl.gin.strong_signal_inc")
def _gin_strong_signal_inc(signal):
    return _strong_action("flowdsl.gin.strong_signal_inc", "sig", int(signal))


@implements("flowdsl.gin.weak_signal_inc")
def _gin_weak_signal_inc(signal):
    return Action("flowdsl.gin.weak_signal_inc", "sig", False, int(signal))


@implements("flowdsl.gin.strong_signal_add")
def _gin_strong_signal_add(signal, value):
    return _strong_action("flowdsl.gin.strong_signal_add", "sig", int(signal), value=value)


@implements("flowdsl.gin.weak_signal_add")
def _gin_weak_signal_add(signal, value):
    return Action("flowdsl.gin.weak_signal_add", "sig", False, int(signal), value=value)


@implements("flowdsl.gin.strong_va_signal_inc")
def _gin_strong_va_signal_inc(win, offset):
    p = "flowdsl.gin.strong_va_signal_inc"
    return _strong_action(p, "va", None, win, offset)


@implements("flowdsl.gin.weak_va_signal_inc")
def _gin_weak_va_signal_inc(win, offset):
    p = "flowdsl.gin.weak_va_signal_inc"
    return Action(p, "va", False, None, win, offset)


@implements("flowdsl.gin.strong_va_signal_add")
def _gin_strong_va_signal_add(win, offset, value):
    p = "flowdsl.gin.strong_va_signal_add"
    return _strong_action(p, "va", None, win, offset, value)


@implements("flowdsl.gin.weak_va_signal_add")
def _gin_weak_va_signal_add(win, offset, value):
    p = "flowdsl.gin.weak_va_signal_add"
    return Action(p, "va", False, None, win, offset, value)


@implements("flowdsl.gin.counter_inc")
def _gin_counter_inc(counter):
    return Action("flowdsl.gin.counter_inc", "counter", False, int(counter))


# ---------------------------------------------------------------- operations
@implements("flowdsl.gin.put")
def _gin_put(ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote, local, coop):
    opn = "issue flowdsl.gin.put"
    dst = _peer(ctx, team, peer, opn)
    spans = _spans(opn, dst, nbytes, (dst_win, dst_offset, "dst_win", "destination"),
                   (src_win, src_offset, "src_win", "source"))
    remote = _check_remote(ctx, remote, opn)
    if local is not None:
        _check_counter(ctx.state, local.ident, f"{opn} with flowdsl.gin.counter_inc")
    t = current()
    if not _coop_issue(coop):
        return None
    op = Op("put", t.rank, dst, ctx.index, ctx.state)
    op.group, op.off, op.n, op.lgroup, op.loff = spans
    op.remote, op.counter = remote, local
    _net().issue(op, _issuer(t, coop), t.name())
    return None


@implements("flowdsl.gin.put_value")
def _gin_put_value(ctx, team, peer, dst_win, dst_offset, value, remote, coop):
    opn = "issue flowdsl.gin.put_value"
    dst = _peer(ctx, team, peer, opn)
    dg = dst_win.own(opn, "dst_win").group
    v = value if isinstance(value, np.generic) else (np.int64(value) if isinstance(value, (int, bool))
                                                     else np.float64(value))
    data = np.frombuffer(np.asarray(v).tobytes(), np.uint8).copy()
    if data.size > 8:
        raise sim_error(UsageError, f"Cannot {opn}: the value has {data.size} bytes. Put at most 8 bytes")
    doff, n = _range(dg, dst_offset, data.size, opn, "destination", dst)
    remote = _check_remote(ctx, remote, opn)
    t = current()
    if not _coop_issue(coop):
        return None
    op = Op("value", t.rank, dst, ctx.index, ctx.state)
    op.group, op.off, op.n, op.data, op.remote, op.read = dg, doff, n, data, remote, True
    _net().issue(op, _issuer(t, coop), t.name())
    return None


@implements("flowdsl.gin.signal")
def _gin_signal(ctx, team, peer, remote, coop):
    opn = "issue flowdsl.gin.signal"
    dst = _peer(ctx, team, peer, opn)
    if remote is None:
        raise sim_error(UsageError, f"Cannot {opn}: no signal action given. Pass remote=gin.strong_signal_inc(id)")
    remote = _check_remote(ctx, remote, opn)
    t = current()
    if not _coop_issue(coop):
        return None
    op = Op("signal", t.rank, dst, ctx.index, ctx.state)
    op.remote, op.read = remote, True
    _net().issue(op, _issuer(t, coop), t.name())
    return None


@implements("flowdsl.gin.get")
def _gin_get(ctx, team, peer, remote_win, remote_offset, local_win, local_offset, nbytes, coop):
    opn = "issue flowdsl.gin.get"
    dst = _peer(ctx, team, peer, opn)
    spans = _spans(opn, dst, nbytes, (remote_win, remote_offset, "remote_win", "remote"),
                   (local_win, local_offset, "local_win", "local"))
    t = current()
    if not _coop_issue(coop):
        return None
    op = Op("get", t.rank, dst, ctx.index, ctx.state)
    op.group, op.off, op.n, op.lgroup, op.loff = spans
    _net().issue(op, _issuer(t, coop), t.name())
    return None


@implements("flowdsl.gin.flush")
def _gin_flush(ctx, coop, order):
    _flush_wait(current(), ctx, coop, order)
    _sync_coop(coop)
    return None


def _flush_wait(t, ctx, coop, order):
    """Until every operation the coop issued is done (a put's source read, a get landed)."""
    net = _net()
    key = _issuer(t, coop)
    sched = _state.sched
    cond = net.flush_cond[t.rank]
    while net.outstanding.get(key, 0) > 0:
        cond.waiters.append(t)
        sched.block(t, Wait(f"gin.flush (context {ctx.index}, {net.outstanding.get(key, 0)} operations "
                            "not yet done)"))
    _race_acquire(t, ("flush", key), order)


def roll_ge(v, least, bits):
    mask = (1 << bits) - 1
    return ((int(v) - int(least)) & mask) < (1 << (bits - 1))


# A signal's and a counter's read and wait differ only in the state they read, the labels that name it,
# and a signal's coverage records, observed where it is read: the rest is _spin_read's and _wait_rolled's.
def _spin_read(t, values, ident, bits, order, spin_key, race_key):
    """``values[ident]`` (this rank's signals or counters) to ``bits`` bits, read as a spin step named
    ``spin_key`` and the value, acquiring from ``race_key``."""
    _state.sched.yield_spin(t, spin_key + (values[ident],))
    _race_acquire(t, race_key, order)
    return values[ident] & ((1 << int(bits)) - 1)


def _wait_rolled(t, values, cond, ident, least, bits, code, wait, comm):
    """Block until ``values[ident]`` (this rank's signals or counters, woken by ``cond``) reaches ``least`` in a
    rolling comparison over ``bits`` bits: a bounded wait of ``code`` on device communicator ``comm``,
    ``wait()`` the record of each block; it gives up when ``comm`` is aborted."""
    while not roll_ge(values[ident], least, int(bits)):
        w = wait()
        if note_bounded(t, code, -1, ident, least, lambda: values[ident], w, cond, comm):
            break  # comm.abort(): the wait gives up
        cond.waiters.append(t)
        _state.sched.block(t, w)


@implements("flowdsl.gin.read_signal")
def _gin_read_signal(ctx, signal, bits, order):
    st = ctx.state
    sig = _check_signal(st, signal, "read a signal")
    t, did = current(), st.group.did
    _net().observe(t.rank, st.sig_pending[t.rank][sig])
    return _spin_read(t, st.signals[t.rank], sig, bits, order, ("gin-signal", did, t.rank, sig),
                      ("sig", did, t.rank, sig))


@implements("flowdsl.gin.read_counter")
def _gin_read_counter(ctx, counter, bits, order):
    st = ctx.state
    c = _check_counter(st, counter, "read a counter")
    t, did = current(), st.group.did
    return _spin_read(t, st.counters[t.rank], c, bits, order, ("gin-counter", did, t.rank, c),
                      ("ctr", did, t.rank, c))


@implements("flowdsl.gin.wait_signal")
def _gin_wait_signal(ctx, coop, signal, least, bits, order):
    st = ctx.state
    sig = _check_signal(st, signal, "wait for a signal")
    t = current()

    def detail(s, st=st, r=t.rank, sig=sig):
        net = s.world.net
        inc = sum(1 for o in net.inflight if o.dst == r and o.remote is not None)
        return (f"signal {sig} of rank {r} is {st.signals[r][sig]}; {inc} signalling operations are in "
                f"flight to rank {r}")
    _wait_rolled(t, st.signals[t.rank], st.sig_cond[t.rank], sig, least, bits, "GIN_SIGNAL",
                 lambda: Wait(f"gin.wait_signal(signal {sig} >= {int(least)})", detail), ctx.comm)
    _net().observe(t.rank, st.sig_pending[t.rank][sig])
    _race_acquire(t, ("sig", st.group.did, t.rank, sig), order)
    _sync_coop(coop)
    return None


@implements("flowdsl.gin.wait_counter")
def _gin_wait_counter(ctx, coop, counter, least, bits, order):
    st = ctx.state
    c = _check_counter(st, counter, "wait for a counter")
    t = current()
    values = st.counters[t.rank]
    _wait_rolled(t, values, st.ctr_cond[t.rank], c, least, bits, "GIN_COUNTER",
                 lambda: Wait(f"gin.wait_counter(counter {c} >= {int(least)}; now {values[c]})"), ctx.comm)
    _race_acquire(t, ("ctr", st.group.did, t.rank, c), order)
    _sync_coop(coop)
    return None


@implements("flowdsl.gin.reset_signal")
def _gin_reset_signal(ctx, signal):
    st = ctx.state
    sig = _check_signal(st, signal, "reset a signal")
    t = current()
    _net().observe(t.rank, st.sig_pending[t.rank][sig])
    st.signals[t.rank][sig] = 0
    return None


@implements("flowdsl.gin.reset_counter")
def _gin_reset_counter(ctx, counter):
    st = ctx.state
    c = _check_counter(st, counter, "reset a counter")
    st.counters[current().rank][c] = 0
    return None


# ---------------------------------------------------------------- barriers
class GinBarrierSession:
    """A GIN barrier session over the rail team or the world team (``ncclGinBarrierSession`` on
    ``ncclTeamTagRail`` / ``ncclTeamTagWorld``)."""

    __slots__ = ("ctx", "coop", "index", "epoch", "team")

    def __init__(self, ctx, coop, index, epoch, team="rail"):
        self.ctx, self.coop, self.index, self.epoch, self.team = ctx, coop, index, epoch, team

    def sync(self, order, fence=DEFAULT_FENCE):  # order has no default: the GPU's typing requires one
        _gin_barrier_sync(self, order, "GIN_BARRIER" if self.team == "rail" else "WORLD_GIN_BARRIER",
                          _fence_level(fence))

    def lsa_barrier(self):  # only a hybrid session has parts: the GPU's typing refuses it
        raise sim_error(KernelTypingError, _sub_session_refusal("lsa_barrier", f"{self.team}_barrier"))

    def gin_barrier(self):
        raise sim_error(KernelTypingError, _sub_session_refusal("gin_barrier", f"{self.team}_barrier"))


def _fence_level(fence) -> int:
    """``fence`` as an int, refused as the GPU's typing refuses it (a level other than NONE where the
    release simulated has none)."""
    why = fence_refusal(fence)
    if why:
        raise sim_error(KernelTypingError, why)
    if int(fence):
        require_release(FENCE_FEATURE, FENCE_NCCL)
    return int(fence)


def _team_stride(comm, team: str, st) -> int:
    """How far apart in the world ``team``'s ranks are: the rail team's an LSA team apart (this LSA rank on
    every node), the dense one's GIN's stride, the world team's 1. A member's inbox slot is its rank over it."""
    return {"rail": comm.lsa_size, "dense": st.stride}.get(team, 1)


def _team_members(comm, team: str, st, own: bool = False) -> list[tuple[int, int]]:
    """``(slot in the inbox, world rank)`` of each member of ``team`` but this rank (this rank too if ``own``)."""
    step = _team_stride(comm, team, st)
    return [(r // step, r) for r in range(comm.rank % step, comm.nranks, step) if own or r != comm.rank]


def _gin_barrier_sync(s, order, what, fence):
    """Arrive at every other member of the team (at fence level PUT this rank too), wait for all, observe.
    An arrival is a signal on the context: it covers the channel's earlier puts where NCCL's legacy
    signals are strong, and at PUT everywhere (NCCL flushes first where they are weak); at GET the
    coop's gets are flushed after the wait."""
    t = current()
    ctx, st = s.ctx, s.ctx.state
    comm = ctx.comm
    bars = st.barriers[s.team]
    coop_sync(s.coop)
    val = s.epoch + 1
    put = bool(fence & GinFenceLevel.PUT)
    me = comm.rank // _team_stride(comm, s.team, st)
    members = _team_members(comm, s.team, st, own=put)
    net = _net()
    if s.coop.trank == 0:
        rc = _state.race
        published = rc.release_vc(t, order) if rc is not None else None  # the arrival releases per its order
        strong = put or st.legacy_strong
        for _, rank in members:
            op = Op("bar", t.rank, rank, ctx.index, st)
            op.bar, op.read, op.race_vc = (s.team, s.index, me, val, strong), True, published
            net.issue(op, ("bar", t.rank), t.name())
    box = bars.inbox[t.rank][s.index]
    sched = _state.sched
    while any(box[slot] < val for slot, _ in members):
        def detail(sch, box=box, val=val, members=members, team=s.team):
            return "\n".join(f"{team} peer rank {rank} has not arrived (its arrival count here is {box[slot]}, "
                             f"need {val}): {sch.rank_summary(rank)}" for slot, rank in members if box[slot] < val)
        w = Wait(f"gin {s.team} barrier {s.index} wait (epoch {s.epoch} -> {val})", detail)
        late_slot, late = next((slot, rank) for slot, rank in members if box[slot] < val)
        cond = bars.cond[t.rank][s.index]
        if note_bounded(t, what, late, s.index, val, box[late_slot], w, cond, comm):
            break  # comm.abort(): the wait gives up
        cond.waiters.append(t)
        sched.block(t, w)
    net.observe(t.rank, st.bar_pending[t.rank])
    _race_acquire(t, (s.team, st.group.did, t.rank, s.index), order)
    if fence & GinFenceLevel.GET:
        _flush_wait(t, ctx, s.coop, _acquire_of(order))
    coop_sync(s.coop)
    s.epoch = val
    if s.coop.trank == 0:
        bars.epoch[t.rank][s.index] = val


@implements("flowdsl.gin.rail_barrier")
def _gin_barrier(ctx, coop, index):
    st = ctx.state
    index = barrier_index(index, st.nrail, "GIN rail barrier", "rail_gin_barrier_count")
    return GinBarrierSession(ctx, coop, index, st.barriers["rail"].epoch[current().rank][index])


@implements("flowdsl.gin.world_barrier")
def _gin_world_barrier(ctx, coop, index):
    st = ctx.state
    index = barrier_index(index, st.nworld, "GIN world barrier", "world_gin_barrier_count")
    return GinBarrierSession(ctx, coop, index, st.barriers["world"].epoch[current().rank][index], "world")


class HybridBarrierSession:
    """A world barrier: the LSA barrier inside the node, then the rail GIN barrier across nodes."""

    __slots__ = ("lsa", "rail")

    def __init__(self, lsa_session, rail_session):
        self.lsa, self.rail = lsa_session, rail_session

    def sync(self, order, fence=DEFAULT_FENCE):  # order has no default: the GPU's typing requires one
        fence = _fence_level(fence)
        rail, st = self.rail, self.rail.ctx.state
        if fence & GinFenceLevel.PUT and st.stride != rail.ctx.comm.lsa_size:
            # NCCL 2.32: the rail barrier's arrivals would not follow puts to ranks outside the rail team, so a
            # GIN barrier over every GIN-connected rank replaces it (after the LSA one unless GIN reaches all).
            if st.stride != 1:
                lsa_arrive(self.lsa, _release_of(order))
                lsa_wait(self.lsa, _release_of(order))
            rank = current().rank
            dense = GinBarrierSession(rail.ctx, rail.coop, rail.index, st.barriers["dense"].epoch[rank][rail.index],
                                      "dense")
            _gin_barrier_sync(dense, _acquire_of(order) if st.stride != 1 else order, "HYBRID_BARRIER", fence)
            return
        lsa_arrive(self.lsa, order)
        lsa_wait(self.lsa, order)
        _gin_barrier_sync(self.rail, order, "HYBRID_BARRIER", fence)

    def lsa_barrier(self):
        """The LSA part alone (``ncclBarrierSession::lsaBarrier()``): its ``sync`` is this node's barrier."""
        return HybridPart(self, "lsa")

    def gin_barrier(self):
        """The GIN part alone (``ncclBarrierSession::ginBarrier()``): its ``sync`` is the rail team's barrier."""
        return HybridPart(self, "rail")


class HybridPart:
    """One part of a hybrid session, sharing its state: a sync there moves the epoch the session's next sync
    starts from, as NCCL's sub-sessions are references into the session. Only ``sync``, as on the GPU."""

    __slots__ = ("session", "part")

    def __init__(self, session, part):
        self.session, self.part = session, part

    def sync(self, order, fence=None):  # order has no default: the GPU's typing requires one
        if self.part == "lsa":
            if fence is not None:
                raise sim_error(KernelTypingError, lsa_part_fence_refusal())
            lsa_arrive(self.session.lsa, order)
            lsa_wait(self.session.lsa, order)
        else:
            _gin_barrier_sync(self.session.rail, order, "HYBRID_BARRIER",
                              _fence_level(DEFAULT_FENCE if fence is None else fence))


@implements("flowdsl.gin.hybrid_barrier")
def _gin_hybrid_barrier(ctx, coop, index):
    st = ctx.state
    g = ctx.comm.group
    index = int(index)
    nlsa = max(g.lsa_barrier_count, int(g.reqs.get("barrier_count", 0)))
    if not 0 <= index < nlsa or not 0 <= index < st.nrail:
        raise sim_error(BarrierIndexError, (
            f"Cannot open hybrid barrier {index}: it needs an LSA barrier and a rail GIN barrier of that index, "
            f"and the device communicator has lsa_barrier_count={nlsa}, rail_gin_barrier_count={st.nrail}. "
            f"Create it with comm.device_communicator(barrier_count={index + 1}) (or both counts) or more, "
            "or use a smaller index"))
    if g.lsa_barrier_count < nlsa:
        _grow_lsa(g, nlsa)
    lsa_s = open_lsa_barrier(ctx.comm, coop, index, "hybrid barrier")
    assert isinstance(lsa_s, BarrierSession)
    return HybridBarrierSession(lsa_s, GinBarrierSession(ctx, coop, index,
                                                         st.barriers["rail"].epoch[current().rank][index]))


def _release_of(order):
    """NCCL's ``releaseOrderOf``: the release half of ``order`` (relaxed if it has none)."""
    return MemoryOrder.RELEASE if int(order) in RELEASING else MemoryOrder.RELAXED


def _acquire_of(order):
    """NCCL's ``acquireOrderOf``: the acquire half of ``order`` (relaxed if it has none)."""
    return MemoryOrder.ACQUIRE if int(order) in ACQUIRING else MemoryOrder.RELAXED


def _grow_lsa(g, n):
    """``barrier_count`` also provides LSA barriers: extend the LSA barrier state to ``n``."""
    ls = g.world.lsa_size
    for r in range(g.world.nranks):
        while len(g.inbox[r]) < n:
            g.inbox[r].append([0] * ls)
            g.epoch[r].append(0)
            g.conds[r].append(Cond())
    g.lsa_barrier_count = n


def _race_acquire(t, key, order):
    """``t`` waited for or read a signal, counter, flush or barrier ``key`` (acquiring unless ``order`` is relaxed)."""
    rc = _state.race
    if rc is not None:
        rc.acquire_from(t, key, MemoryOrder(int(order)))
