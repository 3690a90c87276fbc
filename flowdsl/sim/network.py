"""The simulated network that GIN and CFT operations cross: in flight, read, landed, observed.

A put is queued when issued (:meth:`Network.issue`); at later scheduler steps (seeded, reproducible)
the network first reads its source (then ``counter_inc`` rises at the sender) and later lands it
(its bytes are written into the peer's window, then its remote action applies).
``gin_delivery="ordered"`` lands the operations of one (context, source rank, peer) channel in issue
order; ``"reordered"`` in a seeded random order (like EFA's SRD).

Signal coverage: a strong signal is applied only once its put and every earlier put of the channel
have landed; a weak one covers its own put only. The bytes a put writes are tagged with the put at
issue; a thread that reads tagged bytes before its rank has observed (``wait_signal``/``read_signal``,
a GIN or hybrid barrier, whose arrivals are NCCL's legacy signals: strong where the device communicator
requires strong signals, NCCL's default) a signal
covering that put gets a
:class:`~flowdsl.sim.errors.GinCoverageError` that names the put and why it was not covered. What
each primitive does with the network is in :mod:`flowdsl.sim.gin` and :mod:`flowdsl.sim.cft`.
"""

from __future__ import annotations

import random

import numpy as np

from ..enums import GinBackend, MemoryOrder
from . import _state
from .errors import GinCoverageError, UsageError, sim_error
from .races import net_what, where_now
from .scheduler import Cond

__all__ = ["Network", "Op", "Channel", "BACKENDS", "DELIVERIES", "check_read", "note_load"]

#: GIN backends (flowdsl.GinBackend, the GPU runtime's table): name -> whether strong signals exist.
BACKENDS = {b.option: b.strong_signals for b in GinBackend}
#: Delivery orders of the simulated network.
DELIVERIES = ("ordered", "reordered")
#: Probability that the network makes one step of progress at a scheduler step.
LAND_RATE = 0.3
_M64 = (1 << 64) - 1


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
                 "applied", "hooks", "race_vc", "race_done", "race_site", "writer")

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
        self.has_strong = BACKENDS[backend]
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
        op.writer = _state.cur  # the landed words' writer (flowdsl.wait.accepted asks who wrote a line)
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
            writers, wid = _state.sched.last_writer, op.group.wid
            for b in range(-(-op.off // 4) * 4, op.off + op.n, 4):  # every element of 4 bytes or more
                writers[(wid, op.dst, b)] = (op.writer, None)
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
        if op.bar is not None:  # gin.py decides: legacy-signal strength, or a PUT fence level
            return op.bar[4]
        return op.remote.strong

    def _arrival(self, op):
        """How a report names a barrier arrival ``op``, and why it is weak where it is."""
        team, index = op.bar[0], op.bar[1]
        if op.bar[4]:
            return f"{team} GIN barrier {index}'s arrival"
        return (f"weak {team} GIN barrier {index}'s arrival (NCCL's GIN barriers signal with its legacy signals, "
                "weak on a device communicator made with gin_strong_signals_required=False)")

    def _apply(self, op):
        op.applied = True
        st = op.state
        sched = _state.sched
        rec = _Rec(op, self._strong(op), op.remote.describe() if op.remote is not None else self._arrival(op),
                   self.step_no)
        rc = _state.race
        if rc is not None:  # what the signal or arrival publishes: the channel's work up to now
            agent = rc.net_event(op)
            published = rc.release(agent)
        if op.bar is not None:
            team, index, member, val, _ = op.bar
            bars = st.barriers[team]
            box = bars.inbox[op.dst][index]
            if rc is not None:
                rc.release_to((team, st.group.did, op.dst, index), published)
            if box[member] < val:
                box[member] = val
            st.bar_pending[op.dst].append(rec)
            bars.cond[op.dst][index].notify(sched)
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
            self.observe(_state.cur.rank, recs)

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
            f"{view.group.name()} on rank {view.wrank} at {where_now()}: it holds data of {op.long()}, and rank "
            f"{t.rank} has not "
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
                covers = "no put" if o.kind == "bar" else f"only {o.name()}"
                return f"the {r.what} covers {covers}; {op.name()} {status}"
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


def check_read(view, i):
    """Hook for :class:`~flowdsl.sim.memory.WindowView` reads of GIN-tagged windows."""
    s = _state.sched
    if s is not None and s.world is not None and s.world.net is not None:
        s.world.net.check_read(view, i)


def note_load(array, index):
    """Hook for ``flowdsl.mem`` loads of a window view: coverage check and VA-signal observation."""
    s = _state.sched
    net = s.world.net if s is not None and s.world is not None else None
    if net is None:
        return
    if net.va_pending:
        net.observe_va(array, index)
    if array.group.gin_tags is not None:
        net.check_read(array, index)

