"""GIN (GPU-initiated networking) in the simulator: contexts, puts, signals, counters, barriers.

Registers one :func:`~flowdsl.sim.semantics.implements` entry per primitive of
:mod:`flowdsl.gin` in the simulator's one semantics table. The network is a
:class:`Network` of in-flight operations owned by the simulated world: a put
is queued when issued; at later scheduler steps (seeded, reproducible) the
network first reads its source (then ``counter_inc`` rises at the sender) and
later lands it (its bytes are written into the peer's window, then its remote
action applies). ``gin_delivery="ordered"`` lands the operations of one
(context, source rank, peer) channel in issue order; ``"reordered"`` in a
seeded random order (like EFA's SRD).

Signal coverage: a strong signal is applied only once its put and every
earlier put of the channel have landed; a weak one covers its own put only.
The bytes a put writes are tagged with the put at issue; a thread that reads
tagged bytes before its rank has observed (``wait_signal``/``read_signal``, a
GIN or hybrid barrier) a signal covering that put gets a
:class:`~flowdsl.sim.errors.GinCoverageError` that names the put and why it
was not covered.

Contents: :class:`Network` (in-flight operations, landing, coverage),
:class:`Op` (one operation), :class:`Channel`, :class:`GinState` (signals,
counters and barrier state of one device communicator), :class:`GinContext`,
:class:`Action` (a remote/local action value), :class:`GinBarrierSession`,
:class:`HybridBarrierSession`, :data:`BACKENDS`, :data:`DELIVERIES`, and one
implementation per primitive of ``flowdsl.gin``.
"""

from __future__ import annotations

import random

import numpy as np

from ..enums import GinBackend, MemoryOrder
from . import _state
from .errors import (BarrierIndexError, GinBackendError, GinCoverageError, GinResourceError, UsageError,
                     WindowAccessError)
from .memory import Window, WindowView
from .races import net_what
from .scheduler import Cond, Wait, sim_error
from .semantics import (BarrierSession, Team, _coop_sync, _cur, _lsa_arrive, _lsa_barrier, _lsa_wait, _note_bounded,
                        implements)

__all__ = ["Network", "Op", "Channel", "GinState", "GinContext", "Action", "GinBarrierSession",
           "HybridBarrierSession", "BACKENDS", "DELIVERIES"]

#: GIN backends (flowdsl.GinBackend, the GPU runtime's table): name -> whether legacy signals are strong,
#: whether strong signals exist.
BACKENDS = {b.option: (b.legacy_strong, b.strong_signals) for b in GinBackend}
#: Delivery orders of the simulated network.
DELIVERIES = ("ordered", "reordered")
#: Probability that the network makes one step of progress at a scheduler step.
LAND_RATE = 0.3
_M64 = (1 << 64) - 1
DEFAULT_CONTEXTS = 4


# ---------------------------------------------------------------- values
class Action:
    """A remote (signal) or local (counter) action value, as made by ``gin.*_signal_*``.

    Attributes:
        prim: Primitive that made it (for reports).
        kind: ``"sig"``, ``"va"`` or ``"counter"``.
        strong: Whether the signal covers earlier puts of the channel.
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
    """``ncclGin``: GIN context ``index`` of a device communicator."""

    __slots__ = ("comm", "index", "state")

    def __init__(self, comm, index, state):
        self.comm, self.index, self.state = comm, index, state

    def __repr__(self):
        return f"<sim GIN context {self.index} of {self.comm!r}>"


class Op:
    """One GIN operation in flight.

    Attributes:
        id: Network-wide id (1-based).
        kind: ``"put"``, ``"value"``, ``"signal"``, ``"get"``, ``"bar"``.
        src, dst: World ranks (issuer, peer).
        chan: Its :class:`Channel`; ``idx`` its issue index there.
        issuer: Flush key of the issuing coop.
    """

    __slots__ = ("id", "kind", "src", "dst", "ctx", "chan", "idx", "data", "group", "off", "n", "remote",
                 "counter", "read", "landed", "issuer", "state", "bar", "lgroup", "loff", "who", "landed_step",
                 "applied", "hooks", "race_vc", "race_done", "race_site")

    def __init__(self, kind, src, dst, ctx, state):
        self.kind, self.src, self.dst, self.ctx, self.state = kind, src, dst, ctx, state
        self.data = self.group = self.remote = self.counter = self.bar = self.lgroup = None
        self.off = self.n = self.loff = 0
        self.read = self.landed = self.applied = False
        self.landed_step = None
        #: Race detection: the issuer's clock at issue, the clock of its completion, where it was issued.
        self.race_vc = self.race_done = self.race_site = None
        #: Set by other transports on the same network (CFT): read(op), land(op), check_read(...).
        self.hooks = None

    def name(self):
        return f"put #{self.idx}" if self.kind in ("put", "value") else f"{self.kind} #{self.idx}"

    def long(self):
        return (f"{self.name()} (from rank {self.src}, context {self.ctx}, to rank {self.dst}, "
                f"issued by {self.who})")


class Channel:
    """The operations of one (device communicator, context, source rank, peer) in issue order."""

    __slots__ = ("key", "next_idx", "prefix", "landed", "pending", "deferred", "ops")

    def __init__(self, key):
        self.key = key
        self.next_idx = 0
        self.prefix = 0          # every op with idx < prefix has landed
        self.landed = set()
        self.pending = []        # issued, not landed, in issue order
        self.deferred = []       # landed ops whose strong action waits for earlier ops
        self.ops = {}


class GinState:
    """GIN state of one device communicator (shared by its ranks).

    Counts come from the device communicator's requirements: ``gin_context_count``
    (default 4), ``gin_signal_count``, ``gin_counter_count``,
    ``rail_gin_barrier_count`` (and ``barrier_count``, which sets both LSA and GIN
    barrier counts for hybrid barriers).
    """

    def __init__(self, group):
        reqs = group.reqs
        world = group.world
        n = world.nranks
        self.group = group
        self.contexts = int(reqs.get("gin_context_count", DEFAULT_CONTEXTS) or DEFAULT_CONTEXTS)
        self.nsignals = int(reqs.get("gin_signal_count", 0))
        self.ncounters = int(reqs.get("gin_counter_count", 0))
        both = int(reqs.get("barrier_count", 0))
        self.nrail = max(int(reqs.get("rail_gin_barrier_count", 0)), both)
        self.signals = [[0] * self.nsignals for _ in range(n)]
        self.counters = [[0] * self.ncounters for _ in range(n)]
        self.sig_pending = [[[] for _ in range(self.nsignals)] for _ in range(n)]
        self.sig_cond = [Cond() for _ in range(n)]
        self.ctr_cond = [Cond() for _ in range(n)]
        self.nodes = world.nodes
        self.rail_inbox = [[[0] * world.nodes for _ in range(self.nrail)] for _ in range(n)]
        self.rail_epoch = [[0] * self.nrail for _ in range(n)]
        self.rail_cond = [[Cond() for _ in range(self.nrail)] for _ in range(n)]
        self.bar_pending = [[] for _ in range(n)]


def gin_state(comm, op) -> GinState:
    g = getattr(comm, "group", None)
    if g is None or not hasattr(g, "inbox"):
        raise sim_error(UsageError, f"Cannot {op} on {comm!r}: it is not a device communicator. "
                        "Pass the DevComm from comm.device_communicator()")
    st = getattr(g, "gin", None)
    if st is None:
        st = g.gin = GinState(g)
    return st


class _Rec:
    """A signal application: which puts it covers (for observation and reports)."""

    __slots__ = ("op", "strong", "what", "step")

    def __init__(self, op, strong, what, step):
        self.op, self.strong, self.what, self.step = op, strong, what, step


class Network:
    """The simulated GIN network of one run: in-flight operations and what each rank has observed.

    Args:
        seed: Seeds the landing order (with the scheduler's seed: reproducible).
        delivery: ``"ordered"`` or ``"reordered"``.
        backend: ``"proxy"``, ``"gdaki"``, ``"gpi"`` or ``"efa_gda"`` (:attr:`flowdsl.GinBackend.option`).
    """

    def __init__(self, seed, delivery, backend, world):
        if delivery not in DELIVERIES:
            raise UsageError(f"Cannot spawn with gin_delivery={delivery!r}: it is not a delivery order. "
                             f"Use one of {', '.join(DELIVERIES)}")
        if GinBackend.from_option(backend) is None:  # the names flowdsl.FlowKernel.compile(gin_backend=) takes
            raise UsageError(f"Cannot spawn with gin_backend={backend!r}: it is not a GIN backend. "
                             f"Use one of {', '.join(BACKENDS)}")
        backend = GinBackend.from_option(backend).option
        self.rng = random.Random(f"gin-{seed}")
        self.reordered = delivery == "reordered"
        self.delivery, self.backend = delivery, backend
        self.legacy_strong, self.has_strong = BACKENDS[backend]
        self.world = world
        self.inflight = []
        self.ops = {}
        self.nops = 0
        self.channels = {}
        n = world.nranks
        self.outstanding = {}
        self.flush_cond = [Cond() for _ in range(n)]
        self.obs_prefix = [{} for _ in range(n)]
        self.obs_weak = [set() for _ in range(n)]
        self.obs_log = [[] for _ in range(n)]
        self.va_pending = {}
        self.step_no = 0

    # ---- issue ---------------------------------------------------------------
    def channel(self, key):
        ch = self.channels.get(key)
        if ch is None:
            ch = self.channels[key] = Channel(key)
        return ch

    def issue(self, op, issuer, who):
        self.nops += 1
        op.id = self.nops
        ch = self.channel((op.state.group.did, op.ctx, op.src, op.dst))
        op.chan, op.idx = ch, ch.next_idx
        ch.next_idx += 1
        ch.pending.append(op)
        ch.ops[op.idx] = op
        op.issuer, op.who = issuer, who
        self.ops[op.id] = op
        self.inflight.append(op)
        self.outstanding[issuer] = self.outstanding.get(issuer, 0) + 1
        rc = _state.race
        if rc is not None:
            rc.issued(op)
        if op.kind in ("put", "value") and op.n:
            tags = op.group.gin_tags
            if tags is None:
                tags = op.group.gin_tags = [np.zeros(op.group.nbytes, np.int64) for _ in op.group.bytes]
            tags[op.dst][op.off:op.off + op.n] = op.id
        if op.read:
            self._done_reading(op)

    # ---- progress ------------------------------------------------------------
    def maybe_step(self, rr):
        if rr() < LAND_RATE:
            self.step()

    def step(self):
        """Make one step of progress: read one operation's source, or land one operation."""
        infl = self.inflight
        op = infl[int(self.rng.random() * len(infl))]
        if not self.reordered:
            op = op.chan.pending[0]
        self.step_no += 1
        sched = _state.sched
        sched.stale = 0
        if not op.read:
            self._read(op)
        else:
            self._land(op)

    def _read(self, op):
        op.read = True
        rc = _state.race
        agent = rc.net_event(op) if rc is not None else None
        if op.hooks is not None:
            op.hooks.read(op, agent)
        elif op.kind == "put":
            op.data = op.lgroup.bytes[op.src][op.loff:op.loff + op.n].copy()
            if rc is not None:
                rc.net_window(op, agent, op.lgroup, op.src, op.loff, op.n, False, "reading the source of")
        elif op.kind == "get":
            op.data = op.group.bytes[op.dst][op.off:op.off + op.n].copy()
            if rc is not None:
                rc.net_window(op, agent, op.group, op.dst, op.off, op.n, False, "reading the remote data of")
        if rc is not None:
            op.race_done = rc.release(agent)
        self._done_reading(op)

    def _done_reading(self, op):
        rc = _state.race
        if op.counter is not None:
            st = op.state
            c = op.counter.ident
            st.counters[op.src][c] = (st.counters[op.src][c] + 1) & _M64
            if rc is not None:
                rc.release_to(("ctr", st.group.did, op.src, c), op.race_done)
            st.ctr_cond[op.src].notify(_state.sched)
        if op.kind != "get" and op.hooks is None:  # hooked ops are done when they land
            self._flush_done(op)

    def _flush_done(self, op):
        self.outstanding[op.issuer] -= 1
        rc = _state.race
        if rc is not None:  # gin.flush by the issuer is ordered after this
            rc.release_to(("flush", op.issuer), op.race_done)
        self.flush_cond[op.src].notify(_state.sched)

    def _land(self, op):
        op.landed = True
        op.landed_step = self.step_no
        self.inflight.remove(op)
        ch = op.chan
        ch.pending.remove(op)
        rc = _state.race
        agent = rc.net_event(op) if rc is not None else None
        if op.hooks is not None:
            op.hooks.land(op, agent)
            if rc is not None:
                op.race_done = rc.release(agent)
            self._flush_done(op)
        elif op.kind in ("put", "value") and op.n:
            op.group.bytes[op.dst][op.off:op.off + op.n] = op.data
            if rc is not None:
                rc.net_window(op, agent, op.group, op.dst, op.off, op.n, True, "landing")
        elif op.kind == "get":
            op.lgroup.bytes[op.src][op.loff:op.loff + op.n] = op.data
            if rc is not None:
                rc.net_window(op, agent, op.lgroup, op.src, op.loff, op.n, True, "landing")
                op.race_done = rc.release(agent)
            self._flush_done(op)
        ch.landed.add(op.idx)
        while ch.prefix in ch.landed:
            ch.landed.discard(ch.prefix)
            ch.prefix += 1
        if op.remote is not None or op.bar is not None:
            if self._strong(op) and ch.prefix <= op.idx:
                ch.deferred.append(op)
            else:
                self._apply(op)
        if ch.deferred:
            ready = [d for d in ch.deferred if ch.prefix > d.idx]
            if ready:
                ch.deferred = [d for d in ch.deferred if ch.prefix <= d.idx]
                for d in ready:
                    self._apply(d)

    def _strong(self, op):
        if op.bar is not None:
            return True
        return op.remote.strong

    def _apply(self, op):
        op.applied = True
        st = op.state
        sched = _state.sched
        rec = _Rec(op, self._strong(op), op.remote.describe() if op.remote is not None else "barrier arrival",
                   self.step_no)
        rc = _state.race
        if rc is not None:  # what the signal or arrival publishes: the channel's work up to now
            agent = rc.net_event(op)
            published = rc.release(agent)
        if op.bar is not None:
            index, node, val = op.bar
            box = st.rail_inbox[op.dst][index]
            if rc is not None:
                rc.release_to(("rail", st.group.did, op.dst, index), published)
            if box[node] < val:
                box[node] = val
            st.bar_pending[op.dst].append(rec)
            st.rail_cond[op.dst][index].notify(sched)
            return
        a = op.remote
        if a.kind == "sig":
            if rc is not None:
                rc.release_to(("sig", st.group.did, op.dst, a.ident), published)
            st.signals[op.dst][a.ident] = (st.signals[op.dst][a.ident] + a.value) & _M64
            st.sig_pending[op.dst][a.ident].append(rec)
            st.sig_cond[op.dst].notify(sched)
        else:
            g = a.win.group
            cell = g.bytes[op.dst][a.offset:a.offset + 8].view(np.uint64)
            cell[0] = np.uint64((int(cell[0]) + a.value) & _M64)
            if rc is not None:  # an atomic add that releases, as a flag store
                cells, base = rc.window(g, op.dst)
                rc.atomic((f"{g.name()} on rank {op.dst}", base), None, True, True, MemoryOrder.RELEASE, agent,
                          net_what(op, f"applying the {a.describe()} of"), (cells, base + a.offset))
            self.va_pending.setdefault((g.wid, op.dst, a.offset), []).append(rec)
            sched.stale = 0

    # ---- observation and coverage ----------------------------------------------
    def observe(self, rank, recs):
        pref, weak, log = self.obs_prefix[rank], self.obs_weak[rank], self.obs_log[rank]
        for r in recs:
            op = r.op
            if r.strong:
                k = op.chan.key
                if pref.get(k, -1) < op.idx:
                    pref[k] = op.idx
            else:
                weak.add(op.id)
            log.append(r)
        recs.clear()

    def observe_va(self, win_view, index):
        a = win_view._a
        off = (win_view.start + int(index)) * a.itemsize
        recs = self.va_pending.get((win_view.group.wid, win_view.wrank, off - off % 8))
        if recs:
            self.observe(_cur().rank, recs)

    def covered(self, rank, op):
        return self.obs_prefix[rank].get(op.chan.key, -1) >= op.idx or op.id in self.obs_weak[rank]

    def check_read(self, view, i):
        """Report a read of bytes of a put whose covering signal the reading rank has not observed."""
        t = _state.cur
        if t is None or not hasattr(t, "blk"):
            return
        b = (view.start + int(i)) * view._a.itemsize
        pid = int(view.group.gin_tags[view.wrank][b])
        if not pid:
            return
        op = self.ops[pid]
        if op.hooks is not None:
            op.hooks.check_read(self, view, i, op, t)
            return
        if self.covered(t.rank, op):
            return
        raise sim_error(GinCoverageError, (
            f"Cannot read element {view.start + int(i)} ({view._a.dtype.name}, byte offset {b}) of "
            f"{view.group.name()} on rank {view.wrank}: it holds data of {op.long()}, and rank {t.rank} has not "
            f"observed a signal that covers it: {self.why(t.rank, op)}. Wait for a signal that covers every put "
            "you read (a strong signal after the last put, or one signal per put) before reading its data"))

    def why(self, rank, op):
        """Why ``op`` is not covered for ``rank`` (deterministic text)."""
        status = ("had not landed" if not op.landed else
                  "had landed, but nothing this rank observed covers it")
        ch = op.chan
        for r in reversed(self.obs_log[rank]):
            o = r.op
            if o.chan is ch and not r.strong and o.idx > op.idx:
                return f"the {r.what} covers only {o.name()}; {op.name()} {status}"
        pend = []
        st = op.state
        for sig in range(st.nsignals):
            for r in st.sig_pending[rank][sig]:
                o = r.op
                if o.chan is ch and (o.idx == op.idx or (r.strong and o.idx >= op.idx)):
                    pend.append(f"{r.what} (applied, but not read since by this rank)")
        if pend:
            return f"{op.name()} {status}; it is covered by the " + ", ".join(pend)
        if op.remote is None:
            return (f"{op.name()} carries no signal and no later strong signal of its channel was observed; "
                    f"{op.name()} {status}")
        return f"its own {op.remote.describe()} has not been observed; {op.name()} {status}"


# ---------------------------------------------------------------- helpers
def _net():
    net = _state.sched.world.net
    return net


def _ctx(ctx, op):
    if not isinstance(ctx, GinContext):
        raise sim_error(UsageError, f"Cannot {op}: {ctx!r} is not a GIN context. "
                        "Make one with flowdsl.gin.context(comm, index)")
    return ctx


def _check_signal(st, ident, op):
    ident = int(ident)
    if not 0 <= ident < st.nsignals:
        raise sim_error(GinResourceError, (
            f"Cannot {op}: signal id {ident} is beyond the {st.nsignals} signals the device communicator was "
            f"created with (gin_signal_count={st.nsignals}). Create it with "
            f"comm.device_communicator(gin_signal_count={ident + 1}) or more, or use a smaller id"))
    return ident


def _check_counter(st, ident, op):
    ident = int(ident)
    if not 0 <= ident < st.ncounters:
        raise sim_error(GinResourceError, (
            f"Cannot {op}: counter id {ident} is beyond the {st.ncounters} counters the device communicator "
            f"was created with (gin_counter_count={st.ncounters}). Create it with "
            f"comm.device_communicator(gin_counter_count={ident + 1}) or more, or use a smaller id"))
    return ident


def _peer(ctx, team, peer, op):
    if not isinstance(team, Team):
        raise sim_error(UsageError, f"Cannot {op}: {team!r} is not a team. Pass flowdsl.team.world(comm), "
                        "team.lsa(comm) or team.rail(comm)")
    peer = int(peer)
    if not 0 <= peer < team.nranks:
        raise sim_error(UsageError, f"Cannot {op}: peer {peer} is outside the team of {team.nranks} ranks "
                        f"({team!r}). Use 0 <= peer < team.nranks")
    return ctx.comm.rank + (peer - team.rank) * team.stride


def _window(win, op, what):
    if not isinstance(win, Window):
        raise sim_error(UsageError, f"Cannot {op}: {what} {win!r} is not a window. "
                        "Pass a window from comm.register()")
    t = _cur()
    if win.rank != t.rank:
        raise sim_error(UsageError, f"Cannot {op}: {what} belongs to rank {win.rank}. Pass this rank's window")
    return win.group


def _range(group, off, n, op, what, rank):
    off, n = int(off), int(n)
    if off < 0 or n < 0 or off + n > group.nbytes:
        raise sim_error(WindowAccessError, (
            f"Cannot {op}: {what} bytes {off}..{off + n - 1} ({n} bytes) lie outside {group.name()} of rank "
            f"{rank} ({group.nbytes} bytes). Check the offset and size arithmetic (GIN offsets are in bytes)"))
    return off, n


def _check_remote(ctx, remote, op):
    if remote is None:
        return None
    if not isinstance(remote, Action) or remote.kind == "counter":
        raise sim_error(UsageError, f"Cannot {op} with remote={remote!r}: it is not a signal action. "
                        "Pass flowdsl.gin.strong_signal_inc(id) or another signal action")
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


def _coop_issue(coop):
    """Sync a cooperative call; True on the thread that issues it."""
    if coop is None or coop.nthreads == 1:
        return True
    _coop_sync(coop)
    return coop.trank == 0


def _order(order, default=MemoryOrder.ACQUIRE):
    return default if order is None else order


# ---------------------------------------------------------------- context and actions
@implements("flowdsl.gin.context")
def _gin_context(comm, index=0):
    st = gin_state(comm, "make a GIN context")
    index = int(index)
    if not 0 <= index < st.contexts:
        raise sim_error(GinResourceError, (
            f"Cannot make GIN context {index}: context index {index} is beyond the {st.contexts} contexts the "
            f"device communicator was created with (gin_context_count={st.contexts}). Create it with "
            f"comm.device_communicator(gin_context_count={index + 1}) or more, or use a smaller index"))
    return GinContext(comm, index, st)


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
    return Action("flowdsl.gin.signal_inc", "sig", _net().legacy_strong, int(signal))


@implements("flowdsl.gin.signal_add")
def _gin_signal_add(signal, value):
    return Action("flowdsl.gin.signal_add", "sig", _net().legacy_strong, int(signal), value=value)


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


def _va_win(win, prim):
    if not isinstance(win, Window):
        raise sim_error(UsageError, f"Cannot make {prim}: {win!r} is not a window. Pass a window from "
                        "comm.register()")
    return win


@implements("flowdsl.gin.strong_va_signal_inc")
def _gin_strong_va_signal_inc(win, offset):
    p = "flowdsl.gin.strong_va_signal_inc"
    return _strong_action(p, "va", None, _va_win(win, p), offset)


@implements("flowdsl.gin.weak_va_signal_inc")
def _gin_weak_va_signal_inc(win, offset):
    p = "flowdsl.gin.weak_va_signal_inc"
    return Action(p, "va", False, None, _va_win(win, p), offset)


@implements("flowdsl.gin.strong_va_signal_add")
def _gin_strong_va_signal_add(win, offset, value):
    p = "flowdsl.gin.strong_va_signal_add"
    return _strong_action(p, "va", None, _va_win(win, p), offset, value)


@implements("flowdsl.gin.weak_va_signal_add")
def _gin_weak_va_signal_add(win, offset, value):
    p = "flowdsl.gin.weak_va_signal_add"
    return Action(p, "va", False, None, _va_win(win, p), offset, value)


@implements("flowdsl.gin.counter_inc")
def _gin_counter_inc(counter):
    return Action("flowdsl.gin.counter_inc", "counter", False, int(counter))


# ---------------------------------------------------------------- operations
@implements("flowdsl.gin.put")
def _gin_put(ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote=None, local=None,
             coop=None):
    opn = "issue flowdsl.gin.put"
    ctx = _ctx(ctx, opn)
    dst = _peer(ctx, team, peer, opn)
    dg = _window(dst_win, opn, "dst_win")
    sg = _window(src_win, opn, "src_win")
    t = _cur()
    doff, n = _range(dg, dst_offset, nbytes, opn, "destination", dst)
    soff, _ = _range(sg, src_offset, nbytes, opn, "source", t.rank)
    _check_remote(ctx, remote, opn)
    if local is not None:
        if not isinstance(local, Action) or local.kind != "counter":
            raise sim_error(UsageError, f"Cannot {opn} with local={local!r}: it is not a counter action. "
                            "Pass flowdsl.gin.counter_inc(id)")
        _check_counter(ctx.state, local.ident, f"{opn} with flowdsl.gin.counter_inc")
    if not _coop_issue(coop):
        return None
    op = Op("put", t.rank, dst, ctx.index, ctx.state)
    op.group, op.off, op.n, op.lgroup, op.loff = dg, doff, n, sg, soff
    op.remote, op.counter = remote, local
    _net().issue(op, _issuer(t, coop), t.name())
    return None


@implements("flowdsl.gin.put_value")
def _gin_put_value(ctx, team, peer, dst_win, dst_offset, value, remote=None, coop=None):
    opn = "issue flowdsl.gin.put_value"
    ctx = _ctx(ctx, opn)
    dst = _peer(ctx, team, peer, opn)
    dg = _window(dst_win, opn, "dst_win")
    v = value if isinstance(value, np.generic) else (np.int64(value) if isinstance(value, (int, bool))
                                                     else np.float64(value))
    data = np.frombuffer(np.asarray(v).tobytes(), np.uint8).copy()
    if data.size > 8:
        raise sim_error(UsageError, f"Cannot {opn}: the value has {data.size} bytes. Put at most 8 bytes")
    doff, n = _range(dg, dst_offset, data.size, opn, "destination", dst)
    _check_remote(ctx, remote, opn)
    t = _cur()
    if not _coop_issue(coop):
        return None
    op = Op("value", t.rank, dst, ctx.index, ctx.state)
    op.group, op.off, op.n, op.data, op.remote, op.read = dg, doff, n, data, remote, True
    _net().issue(op, _issuer(t, coop), t.name())
    return None


@implements("flowdsl.gin.signal")
def _gin_signal(ctx, team, peer, remote, coop=None):
    opn = "issue flowdsl.gin.signal"
    ctx = _ctx(ctx, opn)
    dst = _peer(ctx, team, peer, opn)
    if remote is None:
        raise sim_error(UsageError, f"Cannot {opn}: no signal action given. Pass remote=gin.strong_signal_inc(id)")
    _check_remote(ctx, remote, opn)
    t = _cur()
    if not _coop_issue(coop):
        return None
    op = Op("signal", t.rank, dst, ctx.index, ctx.state)
    op.remote, op.read = remote, True
    _net().issue(op, _issuer(t, coop), t.name())
    return None


@implements("flowdsl.gin.get")
def _gin_get(ctx, team, peer, remote_win, remote_offset, local_win, local_offset, nbytes, coop=None):
    opn = "issue flowdsl.gin.get"
    ctx = _ctx(ctx, opn)
    dst = _peer(ctx, team, peer, opn)
    rg = _window(remote_win, opn, "remote_win")
    lg = _window(local_win, opn, "local_win")
    t = _cur()
    roff, n = _range(rg, remote_offset, nbytes, opn, "remote", dst)
    loff, _ = _range(lg, local_offset, nbytes, opn, "local", t.rank)
    if not _coop_issue(coop):
        return None
    op = Op("get", t.rank, dst, ctx.index, ctx.state)
    op.group, op.off, op.n, op.lgroup, op.loff = rg, roff, n, lg, loff
    _net().issue(op, _issuer(t, coop), t.name())
    return None


@implements("flowdsl.gin.flush")
def _gin_flush(ctx, coop, order=None):
    ctx = _ctx(ctx, "flush")
    t = _cur()
    net = _net()
    key = _issuer(t, coop)
    sched = _state.sched
    cond = net.flush_cond[t.rank]
    while net.outstanding.get(key, 0) > 0:
        cond.waiters.append(t)
        sched.block(t, Wait(f"gin.flush (context {ctx.index}, {net.outstanding.get(key, 0)} operations "
                            "not yet done)"))
    _race_acquire(t, ("flush", key), order)
    if coop is not None and coop.nthreads > 1:
        _coop_sync(coop)
    return None


def _roll_ge(v, least, bits):
    mask = (1 << bits) - 1
    return ((int(v) - int(least)) & mask) < (1 << (bits - 1))


@implements("flowdsl.gin.read_signal")
def _gin_read_signal(ctx, signal, bits=64, order=None):
    ctx = _ctx(ctx, "read a signal")
    st = ctx.state
    sig = _check_signal(st, signal, "read a signal")
    t = _cur()
    _net().observe(t.rank, st.sig_pending[t.rank][sig])
    _state.sched.yield_spin(t, ("gin-signal", st.group.did, t.rank, sig, st.signals[t.rank][sig]))
    _race_acquire(t, ("sig", st.group.did, t.rank, sig), order)
    return st.signals[t.rank][sig] & ((1 << int(bits)) - 1)


@implements("flowdsl.gin.wait_signal")
def _gin_wait_signal(ctx, coop, signal, least, bits=64, order=None):
    ctx = _ctx(ctx, "wait for a signal")
    st = ctx.state
    sig = _check_signal(st, signal, "wait for a signal")
    t = _cur()
    sched = _state.sched
    bits = int(bits)
    while not _roll_ge(st.signals[t.rank][sig], least, bits):
        st.sig_cond[t.rank].waiters.append(t)

        def detail(s, st=st, r=t.rank, sig=sig):
            net = s.world.net
            inc = sum(1 for o in net.inflight if o.dst == r and o.remote is not None)
            return (f"signal {sig} of rank {r} is {st.signals[r][sig]}; {inc} signalling operations are in "
                    f"flight to rank {r}")
        w = Wait(f"gin.wait_signal(signal {sig} >= {int(least)})", detail)
        _note_bounded(t, "GIN_SIGNAL", -1, sig, least, lambda st=st, r=t.rank: st.signals[r][sig], w)
        sched.block(t, w)
    _net().observe(t.rank, st.sig_pending[t.rank][sig])
    _race_acquire(t, ("sig", st.group.did, t.rank, sig), order)
    if coop is not None and coop.nthreads > 1:
        _coop_sync(coop)
    return None


@implements("flowdsl.gin.reset_signal")
def _gin_reset_signal(ctx, signal):
    ctx = _ctx(ctx, "reset a signal")
    st = ctx.state
    sig = _check_signal(st, signal, "reset a signal")
    t = _cur()
    _net().observe(t.rank, st.sig_pending[t.rank][sig])
    st.signals[t.rank][sig] = 0
    return None


@implements("flowdsl.gin.read_counter")
def _gin_read_counter(ctx, counter, bits=56, order=None):
    ctx = _ctx(ctx, "read a counter")
    st = ctx.state
    c = _check_counter(st, counter, "read a counter")
    t = _cur()
    _state.sched.yield_spin(t, ("gin-counter", st.group.did, t.rank, c, st.counters[t.rank][c]))
    _race_acquire(t, ("ctr", st.group.did, t.rank, c), order)
    return st.counters[t.rank][c] & ((1 << int(bits)) - 1)


@implements("flowdsl.gin.wait_counter")
def _gin_wait_counter(ctx, coop, counter, least, bits=56, order=None):
    ctx = _ctx(ctx, "wait for a counter")
    st = ctx.state
    c = _check_counter(st, counter, "wait for a counter")
    t = _cur()
    sched = _state.sched
    while not _roll_ge(st.counters[t.rank][c], least, int(bits)):
        st.ctr_cond[t.rank].waiters.append(t)
        w = Wait(f"gin.wait_counter(counter {c} >= {int(least)}; now {st.counters[t.rank][c]})")
        _note_bounded(t, "GIN_COUNTER", -1, c, least, lambda st=st, r=t.rank: st.counters[r][c], w)
        sched.block(t, w)
    _race_acquire(t, ("ctr", st.group.did, t.rank, c), order)
    if coop is not None and coop.nthreads > 1:
        _coop_sync(coop)
    return None


@implements("flowdsl.gin.reset_counter")
def _gin_reset_counter(ctx, counter):
    ctx = _ctx(ctx, "reset a counter")
    st = ctx.state
    c = _check_counter(st, counter, "reset a counter")
    st.counters[_cur().rank][c] = 0
    return None


# ---------------------------------------------------------------- barriers
def _check_rail_index(st, index, what):
    index = int(index)
    if not 0 <= index < st.nrail:
        raise sim_error(BarrierIndexError, (
            f"Cannot open {what} {index}: the device communicator has rail_gin_barrier_count={st.nrail} "
            f"(valid indices 0..{st.nrail - 1}). Create it with "
            f"comm.device_communicator(rail_gin_barrier_count={index + 1}) or more, or use a smaller index"))
    return index


class GinBarrierSession:
    """A rail GIN barrier session (``ncclGinBarrierSession`` on the rail team)."""

    __slots__ = ("ctx", "coop", "index", "epoch")

    def __init__(self, ctx, coop, index, epoch):
        self.ctx, self.coop, self.index, self.epoch = ctx, coop, index, epoch

    def sync(self, order=MemoryOrder.SEQ_CST):
        _rail_sync(self, order)


def _rail_sync(s, order, what="GIN_BARRIER"):
    """Arrive at every rail peer (a strongly ordered message on the context), wait for all, observe."""
    t = _cur()
    ctx, st = s.ctx, s.ctx.state
    comm = ctx.comm
    _coop_sync(s.coop)
    val = s.epoch + 1
    node, ls = comm.rank // comm.lsa_size, comm.lsa_size
    net = _net()
    if s.coop.trank == 0:
        rc = _state.race
        published = rc.release_vc(t, order) if rc is not None else None  # the arrival releases per its order
        for p in range(st.nodes):
            if p != node:
                op = Op("bar", t.rank, comm.lsa_rank + p * ls, ctx.index, st)
                op.bar, op.read, op.race_vc = (s.index, node, val), True, published
                net.issue(op, ("bar", t.rank), t.name())
    box = st.rail_inbox[t.rank][s.index]
    sched = _state.sched
    while any(v < val for p, v in enumerate(box) if p != node):
        st.rail_cond[t.rank][s.index].waiters.append(t)

        def detail(sch, box=box, node=node, val=val, comm=comm):
            return "\n".join(f"rail peer rank {comm.lsa_rank + p * ls} (node {p}) has not arrived (its arrival "
                             f"count here is {v}, need {val}): {sch.rank_summary(comm.lsa_rank + p * ls)}"
                             for p, v in enumerate(box) if p != node and v < val)
        w = Wait(f"gin rail barrier {s.index} wait (epoch {s.epoch} -> {val})", detail)
        late = next(p for p, v in enumerate(box) if p != node and v < val)
        _note_bounded(t, what, comm.lsa_rank + late * ls, s.index, val, box[late], w)
        sched.block(t, w)
    net.observe(t.rank, st.bar_pending[t.rank])
    _race_acquire(t, ("rail", st.group.did, t.rank, s.index), order)
    _coop_sync(s.coop)
    s.epoch = val
    if s.coop.trank == 0:
        st.rail_epoch[t.rank][s.index] = val


@implements("flowdsl.gin.barrier")
def _gin_barrier(ctx, coop, index):
    ctx = _ctx(ctx, "open a GIN barrier")
    st = ctx.state
    index = _check_rail_index(st, index, "GIN rail barrier")
    return GinBarrierSession(ctx, coop, index, st.rail_epoch[_cur().rank][index])


class HybridBarrierSession:
    """A world barrier: the LSA barrier inside the node, then the rail GIN barrier across nodes."""

    __slots__ = ("lsa", "rail")

    def __init__(self, lsa_session, rail_session):
        self.lsa, self.rail = lsa_session, rail_session

    def sync(self, order=MemoryOrder.SEQ_CST):
        _lsa_arrive(self.lsa, order)
        _lsa_wait(self.lsa, order)
        _rail_sync(self.rail, order, "HYBRID_BARRIER")


@implements("flowdsl.gin.hybrid_barrier")
def _gin_hybrid_barrier(ctx, coop, index):
    ctx = _ctx(ctx, "open a hybrid barrier")
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
    lsa_s = _lsa_barrier(ctx.comm, coop, index)
    assert isinstance(lsa_s, BarrierSession)
    return HybridBarrierSession(lsa_s, GinBarrierSession(ctx, coop, index, st.rail_epoch[_cur().rank][index]))


def _grow_lsa(g, n):
    """``barrier_count`` also provides LSA barriers: extend the LSA barrier state to ``n``."""
    from .scheduler import Cond as _Cond
    ls = g.world.lsa_size
    for r in range(g.world.nranks):
        while len(g.inbox[r]) < n:
            g.inbox[r].append([0] * ls)
            g.epoch[r].append(0)
            g.conds[r].append(_Cond())
    g.lsa_barrier_count = n


def _race_acquire(t, key, order):
    """``t`` waited for or read a signal, counter, flush or barrier ``key`` (acquiring unless ``order`` is relaxed)."""
    rc = _state.race
    if rc is not None:
        rc.acquire_from(t, key, MemoryOrder.ACQUIRE if order is None else order)


def check_read(view, i):
    """Hook for :class:`~flowdsl.sim.memory.WindowView` reads of GIN-tagged windows."""
    s = _state.sched
    if s is not None and s.world is not None and s.world.net is not None:
        s.world.net.check_read(view, i)


def note_load(array, index):
    """Hook for ``flowdsl.mem`` loads: coverage check and VA-signal observation."""
    if isinstance(array, WindowView):
        s = _state.sched
        net = s.world.net if s is not None and s.world is not None else None
        if net is None:
            return
        if net.va_pending:
            net.observe_va(array, index)
        if array.group.gin_tags is not None:
            net.check_read(array, index)
