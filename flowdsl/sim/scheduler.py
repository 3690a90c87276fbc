"""Seeded cooperative scheduler: simulated threads and host ranks as greenlets.

Every simulated GPU thread and every rank's host ``main`` is a greenlet. A task
runs until it reaches a synchronisation point (block barrier, LSA barrier wait,
host collective) or a spin point (``flowdsl.mem`` loads and atomics), then
hands control back to the scheduler, which picks the next runnable task with a
``random.Random(seed)``. The same seed therefore replays the same interleaving.

A rank's host ``main`` may run on an OS thread of its own instead (``spawn(...,
host_threads=True)``, :class:`HostThread`): still one task at a time, handed on
explicitly, so the same seed replays the same interleaving; but each rank keeps its
own thread-local state, which libraries with native frames need (PyTorch's grad mode
and dispatcher, pybind11's argument-loader stack: interleaved on one thread, a rank
blocked inside a torch operator and another entering one corrupt both).

When no task is runnable but some wait, the scheduler raises a
:class:`~flowdsl.sim.errors.DeadlockError` that says who waits on what and who
was expected to release it; spinning without progress for a bounded number of
rounds raises a :class:`~flowdsl.sim.errors.LivelockError`.
"""

from __future__ import annotations

import os
import random
import threading

import greenlet

from . import _state
from .errors import DeadlockError, LivelockError, sim_error
from .hints import deadlock_hints, describe_element, describe_spin, livelock_hints
from .races import _library, user_frame
from .timeouts import as_timeout

__all__ = [
    "Scheduler", "Task", "HostTask", "KernelThread", "Block", "Launch",
    "GroupBarrier", "Cond", "Wait", "where", "fmt_ids", "sim_error", "HostThread",
]

#: The HostThread running on this OS thread (unset on the simulation's own thread).
_local = threading.local()


class HostThread:
    """A host task on an OS thread of its own, driven as the scheduler drives a greenlet: ``resume`` lets
    it run, and it runs until it hands control on (:meth:`Scheduler.transfer`) or returns (control goes to
    the scheduler, as a finished greenlet's goes to its parent). Only one task runs at any time."""

    def __init__(self, sched, run):
        self.sched, self.run = sched, run
        self.go = threading.Semaphore(0)
        self.started = self.dead = self.killed = False
        self.thread = threading.Thread(target=self._main, name="flowdsl.sim host", daemon=True)

    def _main(self):
        _local.host = self
        self.go.acquire()
        try:
            if not self.killed:
                self.run()
        except greenlet.GreenletExit:
            pass
        finally:
            self.dead = True
            if not self.killed:  # back to the scheduler, as a greenlet returns to its parent
                self.sched.hand_to_main(self.sched.gl)

    def resume(self):
        if not self.started:
            self.started = True
            self.thread.start()
        self.go.release()

    def wait(self):
        """Block this thread until it is resumed; a killed one unwinds (as a collected greenlet does)."""
        self.go.acquire()
        if self.killed:
            raise greenlet.GreenletExit

    @property
    def gr_frame(self):
        """The frame where it waits (None while it is not started or has returned)."""
        if not self.started or self.dead:
            return None
        import sys  # noqa: PLC0415

        return sys._current_frames().get(self.thread.ident)

    def kill(self):
        """End a thread left waiting (the simulation is over): it unwinds from its wait."""
        if self.started and not self.dead:
            self.killed = True
            self.go.release()
            self.thread.join(timeout=10)

_SIM_DIR = os.path.dirname(os.path.abspath(__file__))
_STUBS_FILE = os.path.join(os.path.dirname(_SIM_DIR), "_stubs.py")


def where(task) -> str:
    """``file:line (function)`` of the user code where ``task`` is suspended."""
    gl = task.gl
    if task is _state.cur:
        import sys
        f = sys._getframe(1)
    else:
        f = gl.gr_frame if gl is not None else None
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_SIM_DIR) and fn != _STUBS_FILE and "greenlet" not in fn:
            return f"{os.path.basename(fn)}:{f.f_lineno} ({f.f_code.co_name}){_called_from(f)}"
        f = f.f_back
    return "?"


def _called_from(f) -> str:
    """For a frame of flowdsl's own device code (a Flow step's wait): the user's line that called into it."""
    if not _library(f.f_code.co_filename):
        return ""
    f = user_frame(f)
    if f is None or "greenlet" in f.f_code.co_filename:  # the library code is the kernel itself (a collective)
        return ""
    return f", called from your code at {os.path.basename(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"


def fmt_ids(ids) -> str:
    """Compact sorted ranges: ``[0,1,2,5]`` -> ``"0-2, 5"``."""
    ids = sorted(ids)
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(out)


class Task:
    """A schedulable greenlet. ``waiting`` is the wait record while blocked."""

    # slot, vc, clk, relf, acqp: the task's vector clock (see flowdsl.sim.races).
    # loaded_from: per window word, who had written what this task's last strong load of it returned
    # (flowdsl.wait.accepted judges the value taken, not what memory holds by the time it is accepted).
    __slots__ = ("gl", "waiting", "done", "last_spin", "recent_spins", "rank", "box", "run", "slot", "vc", "clk",
                 "relf", "acqp", "loaded_from")

    def __init__(self, rank):
        self.slot, self.vc, self.clk, self.relf, self.acqp = -1, None, 0, None, None
        self.gl = self.run = self.box = self.waiting = self.last_spin = None
        self.loaded_from = {}
        self.recent_spins = ()
        self.done = False
        self.rank = rank


class HostTask(Task):
    """A simulated rank's host program, ``main(comm)``."""

    __slots__ = ("result", "comm", "state")

    def name(self) -> str:
        return f"rank {self.rank} (host)"


class Launch:
    """One kernel launch on one rank: grid, block shape, blocks, bookkeeping."""

    def __init__(self, rank, fn, name, grid, block, args, seq):
        self.rank, self.fn, self.name = rank, fn, name
        self.grid, self.block, self.args, self.seq = grid, block, args, seq
        self.blocks = []
        self.shared = 0  # bytes of dynamic shared memory per block (k[grid, block, stream, shared])
        self.remaining = 0
        self.started = False
        self.finished = False
        self.one_d = grid[1] == grid[2] == block[1] == block[2] == 1
        self.barriers = {}  # grid-wide barriers (cuda.cg.this_grid().sync())


class Block:
    """A CTA: its threads, shared arrays and block-level barriers."""

    __slots__ = ("launch", "idx", "lin", "threads", "shared", "dynamic", "barriers", "nthreads", "lsa_barriers",
                 "stashes")

    def __init__(self, launch, idx, lin, nthreads):
        self.launch, self.idx, self.lin, self.nthreads = launch, idx, lin, nthreads
        self.threads = []
        self.shared = []
        self.dynamic = None  # the block's dynamic shared memory (bytes), made at its first use
        self.barriers = {}
        self.lsa_barriers = set()  # the LSA barrier indices it opened (a race report's advice reads them)
        self.stashes = {}  # coop.bcast's shared-memory slots: coop key -> value

    def name(self) -> str:
        return f"block {self.idx[0]}" if self.launch.one_d else f"block {self.idx}"


class KernelThread(Task):
    """One simulated CUDA thread."""

    __slots__ = ("blk", "tx", "ty", "tz", "lin", "nshared", "launch")

    def name(self) -> str:
        t = self.lin if self.launch.one_d else (self.tx, self.ty, self.tz)
        return f"rank {self.rank} {self.blk.name()} thread {t}"

    @property
    def warp(self) -> int:
        return self.lin >> 5

    @property
    def lane(self) -> int:
        return self.lin & 31


class Cond:
    """Something tasks wait on with a predicate; :meth:`notify` re-checks them."""

    __slots__ = ("waiters",)

    def __init__(self):
        self.waiters = []

    def notify(self, sched):
        if self.waiters:
            ws, self.waiters = self.waiters, []
            for w in ws:
                sched.wake(w)


class GroupBarrier:
    """``n`` tasks meet; each gets the list of values the generation collected.

    Attributes:
        expected: Number of tasks that complete a generation.
        shape: What the barrier was opened with (to detect mismatched users).
    """

    __slots__ = ("expected", "arrived", "values", "shape", "label")

    def __init__(self, expected, shape=None, label=""):
        self.expected = expected
        self.arrived = []
        self.values = []
        self.shape = shape
        self.label = label

    def arrive(self, sched, task, wait, value=None):
        """Arrive with ``value``; block until ``expected`` tasks arrived; return all values."""
        self.arrived.append(task)
        vals = self.values
        vals.append(value)
        if len(self.arrived) == self.expected:
            others = self.arrived
            self.arrived, self.values = [], []
            if sched.race is not None:
                sched.race.barrier(others)
            for o in others:
                if o is not task:
                    o.box = vals
                    sched.wake(o)
            return vals
        sched.block(task, wait)
        return task.box


class Scheduler:
    """Runs tasks cooperatively in a seeded random order.

    Args:
        seed: Seed of the interleaving.
        livelock_rounds: Spin steps without progress, per runnable task, before a livelock report.
        max_steps: Hard cap on scheduler steps (``None``: unlimited).
    """

    def __init__(self, seed=0, livelock_rounds=100, max_steps=None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.runnable = []
        self.tasks = []
        self.live = 0
        self.steps = 0
        self.stale = 0
        self.livelock_rounds = livelock_rounds
        self.max_steps = max_steps
        self.failure = None
        #: a rank's failure that another rank's own error explains (the rank that refused its collective's
        #: arguments): raised only if that error never comes
        self.deferred = None
        self.next = None
        self.gl = None
        self.host_threads = False  # host tasks on OS threads (HostThread) instead of greenlets
        self._main_go = threading.Semaphore(0)
        self._main_dest = None
        self.world = None
        self.net = None
        self.race = None
        #: address_key -> (the task that stored there last, the value): mem stores and atomics, plain
        #: stores into windows and GIN landings (the put's issuer) record it.
        self.last_writer = {}
        self.bounded_waits = {}  # task -> what it waits for (flowdsl/sim/timeouts.py)
        #: Communicators aborted from another OS thread: the loop wakes their waits on its own thread.
        self.abort_requests = []
        self.thread = threading.get_ident()  # the simulation's thread (greenlets do not cross threads)

    # ---- task life cycle -------------------------------------------------
    def add(self, task, run):
        task.run = run  # the greenlet is made when the task first runs
        self.tasks.append(task)
        self.live += 1
        self.runnable.append(task)

    def finish(self, task):
        task.done = True
        self.live -= 1
        self.stale = 0

    def wake(self, task):
        task.waiting = None
        self.stale = 0
        self.runnable.append(task)

    def block(self, task, wait):
        """Suspend ``task`` (which must be running) until someone wakes it."""
        task.waiting = wait
        self.stale = 0
        self.switch_away(task)

    # ---- handing control on: greenlets on this thread, HostThreads on theirs ------------------------
    def transfer(self, dest):
        """Run ``dest`` (a greenlet or a :class:`HostThread`) until control comes back to the caller."""
        if not self.host_threads:  # every task a greenlet: the simulator's hot path, as it always was
            dest.switch()
            return
        me = getattr(_local, "host", None)
        if me is None:  # on the simulation's thread, in a greenlet
            if isinstance(dest, HostThread):
                dest.resume()
                self._wait_on_main()
            else:
                dest.switch()
        elif isinstance(dest, HostThread):
            dest.resume()
            me.wait()
        else:
            self.hand_to_main(dest)
            me.wait()

    def hand_to_main(self, dest):
        """Let the simulation's thread run greenlet ``dest`` (from a HostThread)."""
        self._main_dest = dest
        self._main_go.release()

    def _wait_on_main(self):
        """The simulation's thread waits until a HostThread hands it a greenlet to run, and runs it."""
        self._main_go.acquire()
        dest, self._main_dest = self._main_dest, None
        if dest is not greenlet.getcurrent():
            dest.switch()

    def on_simulation_thread(self) -> bool:
        """Whether the caller runs as part of the simulation (its thread, or a rank's HostThread)."""
        host = getattr(_local, "host", None)
        return threading.get_ident() == self.thread or (host is not None and host.sched is self)

    def switch_away(self, me):
        """Run the next task chosen by the seeded RNG (directly, without the scheduler loop).

        Falls back to the scheduler greenlet when nothing is runnable, a
        failure is pending, or the step cap is reached; returns when ``me``
        is resumed.
        """
        rn = self.runnable
        net = self.net
        if net is not None and net.inflight:
            net.maybe_step(self.rr)
        n = len(rn)
        if n == 0 or self.failure is not None or (self.max_steps is not None and self.steps >= self.max_steps):
            self.transfer(self.gl)
            return
        i = int(self.rr() * n)
        t = rn[i]
        rn[i] = rn[-1]
        rn.pop()
        self.steps += 1
        _state.cur = t
        if t is me:
            return
        gl = t.gl
        if gl is None:
            # Start new greenlets from the scheduler's own (shallow) stack.
            self.next = t
            self.transfer(self.gl)
            return
        self.transfer(gl)

    def yield_spin(self, task, key):
        """A spin point: stay runnable, let others run; ``key`` identifies what was read.

        A thread that reads again one of the last few (address, value) it read is spinning, not
        progressing: a loop may poll several words in turn (both lines of an LL pack, the flags
        of an LL128 pass)."""
        seen = (key[0], key[3]) if len(key) == 4 else key  # the array itself is not compared
        if seen in task.recent_spins:
            self.stale += 1
            if self.stale > self.livelock_rounds * (len(self.runnable) + 1):
                raise self._livelock_error(task)
        else:
            self.stale = 0
            task.recent_spins = (seen, *task.recent_spins[:_RECENT_SPINS - 1])
        task.last_spin = key
        self.runnable.append(task)
        self.switch_away(task)

    def fail(self, task, exc):
        if self.failure is None:
            if getattr(exc, "refused_by", None):
                # Another rank refused the call: its UsageError says what is wrong; let it run to raise it.
                self.deferred = self.deferred or (task, exc)
                self.finish(task)
                return
            self.failure = (task, exc)

    # ---- main loop -------------------------------------------------------
    def run(self):
        self.gl = greenlet.getcurrent()
        rn = self.runnable
        rr = self.rr = self.rng.random
        max_steps = self.max_steps
        while True:
            if self.abort_requests:
                self._serve_aborts()
            t = self.next
            if t is not None:
                self.next = None
            else:
                n = len(rn)
                if n == 0:
                    net = self.net
                    if net is not None and net.inflight:
                        net.step()  # everyone waits: the network makes progress
                        continue
                    if self.deferred is not None:
                        raise self.deferred[1]
                    if self.live == 0:
                        return
                    raise self._deadlock_error()
                i = int(rr() * n)
                t = rn[i]
                rn[i] = rn[-1]
                rn.pop()
                self.steps += 1
            _state.cur = t
            gl = t.gl
            if gl is None:
                gl = t.gl = HostThread(self, t.run) if self.host_threads and isinstance(t, HostTask) \
                    else greenlet.greenlet(t.run, self.gl)
            self.transfer(gl)
            _state.cur = None
            if self.failure is not None:
                task, exc = self.failure
                raise exc
            if max_steps is not None and self.steps > max_steps:
                raise LivelockError(
                    f"Cannot finish the simulation: it ran past max_steps={max_steps} scheduler steps "
                    f"(seed={self.seed}). Look for a loop that never ends, or raise max_steps.")

    def _serve_aborts(self):
        """``comm.abort()`` called from another OS thread: wake the waits of those communicators here (their
        host code raises ``ResourceClosedError`` at its next call, as on GPUs)."""
        from . import timeouts  # noqa: PLC0415 - timeouts imports this module

        while self.abort_requests:
            timeouts.abort(self.abort_requests.pop())

    # ---- reports ---------------------------------------------------------
    def seed_line(self) -> str:
        return (f"seed={self.seed}: rerun with the same seed "
                f"(flowdsl.sim.spawn(..., seed={self.seed})) to replay this interleaving")

    def rank_summary(self, rank) -> str:
        """Where rank ``rank`` is: host state and its kernels' threads."""
        parts = []
        for t in self.tasks:
            if isinstance(t, HostTask) and t.rank == rank:
                if t.done:
                    parts.append("host returned from main")
                elif t.waiting is not None:
                    parts.append(f"host waits in {t.waiting.short()} at {where(t)}")
                else:
                    parts.append("host is runnable")
        w = self.world
        if w is not None:
            for lau in w.launches[rank]:
                if lau.finished:
                    parts.append(f"kernel {lau.name!r} (launch #{lau.seq}) finished")
                elif not lau.started:
                    parts.append(f"kernel {lau.name!r} (launch #{lau.seq}) queued, not started")
                else:
                    groups = {}
                    ndone = 0
                    for b in lau.blocks:
                        for th in b.threads:
                            if th.done:
                                ndone += 1
                            elif th.waiting is not None:
                                k = (th.waiting.short(), where(th))
                                groups.setdefault(k, []).append((b.lin, th.lin))
                    desc = [f"{ndone} threads finished"]
                    for (s, loc), members in sorted(groups.items()):
                        blocks = sorted({m[0] for m in members})
                        desc.append(f"{len(members)} threads of block(s) {fmt_ids(blocks)} wait in {s} at {loc}")
                    parts.append(f"kernel {lau.name!r} (launch #{lau.seq}): " + "; ".join(desc))
        return "; ".join(parts) if parts else "nothing running"

    def _waiting_report(self):
        groups = {}
        order = []
        for t in self.tasks:
            if t.done or t.waiting is None:
                continue
            if isinstance(t, HostTask):
                key = ("~host", t.rank, 0, 0, t.waiting.short(), where(t))
                label = f"rank {t.rank} host"
                ident = None
            else:
                key = ("kern", t.rank, t.launch.seq, t.blk.lin, t.waiting.short(), where(t))
                label = f"rank {t.rank} kernel {t.launch.name!r} {t.blk.name()}"
                ident = t.lin
            if key not in groups:
                groups[key] = (label, t, [])
                order.append(key)
            if ident is not None:
                groups[key][2].append(ident)
        lines = []
        order.sort()
        for key in order:
            label, t, ids = groups[key]
            who = f"{label} threads {fmt_ids(ids)}" if ids else label
            lines.append(f"  - {who} wait in {t.waiting.short()} at {key[-1]}")
            if key[0] == "~host" and t.waiting.short() == "comm.synchronize()":
                continue  # its kernels are listed above
            detail = t.waiting.detail(self)
            if detail:
                lines.extend("      " + d for d in detail.splitlines())
        return "\n".join(lines)

    def _deadlock_error(self):
        labels = [t.waiting.short() for t in self.tasks if not t.done and t.waiting is not None]
        msg = (f"Cannot finish the simulation: deadlock: every remaining task waits and nothing can "
               f"release them ({self.seed_line()}).\nWaiting:\n{self._waiting_report()}\n"
               + "\n".join(deadlock_hints(labels)))
        e = DeadlockError(msg)
        e.seed = self.seed
        return as_timeout(self, e)

    def _livelock_error(self, task):
        spinners = []
        for t in self.tasks:
            if not t.done and t.waiting is None and isinstance(t.last_spin, tuple):
                spinners.append(t)
        lines = []
        seen = set()
        for t in spinners[:16]:
            if len(t.last_spin) != 4:  # a GIN signal or counter, a CFT counter: named by its key
                lines.append(f"  - {t.name()} spins at {where(t)} reading {describe_spin(t.last_spin)}")
                continue
            addr, arr, index, value = t.last_spin
            addr_desc = describe_element(arr, index)
            k = (addr_desc, value)
            if k in seen:
                continue
            seen.add(k)
            lw = self.last_writer.get(addr)
            wr = (f"last written by {lw[0].name()} (value {_plain(lw[1])!r})" if lw else
                  "never written by a flowdsl.mem store/atomic in this run")
            lines.append(f"  - {t.name()} spins at {where(t)} reading {addr_desc} == {value!r}; {wr}")
        waiting = self._waiting_report()
        msg = (f"Cannot finish the simulation: livelock: threads spin for "
               f"{self.livelock_rounds} rounds without any progress ({self.seed_line()}).\n"
               f"Spinning:\n" + "\n".join(lines) +
               (f"\nWaiting:\n{waiting}" if waiting else "") + "\n" +
               "\n".join(livelock_hints([(where(t), t.last_spin) for t in spinners[:16]])))
        e = LivelockError(msg)
        e.seed = self.seed
        e.rank = task.rank
        return as_timeout(self, e)


def _plain(value):
    """A NumPy scalar as the Python number it holds (for reports)."""
    try:
        return value.item()
    except AttributeError:
        return value


#: Words a spinning thread may poll in turn and still be seen to spin.
_RECENT_SPINS = 8


class Wait:
    """Why a task is blocked: a short label and a detail callback for reports.

    Args:
        short: E.g. ``"coop.sync(cta)"``.
        detail: ``detail(sched) -> str`` explaining who should release the wait.
    """

    __slots__ = ("_short", "_detail")

    def __init__(self, short, detail=None):
        self._short = short
        self._detail = detail

    def short(self) -> str:
        return self._short

    def detail(self, sched) -> str:
        return self._detail(sched) if self._detail is not None else ""


class _BlockWait:
    """Wait record of a thread blocked in a block-level barrier (built only when blocking)."""

    __slots__ = ("b", "label", "members", "blk")

    def __init__(self, b, label, members, blk):
        self.b, self.label, self.members, self.blk = b, label, members, blk

    def short(self) -> str:
        return self.label

    def detail(self, sched) -> str:
        b, blk = self.b, self.blk
        arrived = {x.lin for x in b.arrived}
        ids = self.members if self.members is not None else range(blk.nthreads)
        groups = {}
        for i in ids:
            if i in arrived:
                continue
            th = blk.threads[i]
            st = "finished (exited the kernel)" if th.done else (
                f"waiting in {th.waiting.short()} at {where(th)}" if th.waiting is not None else "runnable")
            groups.setdefault(st, []).append(i)
        return "\n".join(f"thread{'s' if len(v) > 1 else ''} {fmt_ids(v)} of the block "
                         f"{'have' if len(v) > 1 else 'has'} not arrived: {k}" for k, v in sorted(groups.items()))


def block_sync(t, key, expected, label, value=None, shape=None, members=None, scope=None):
    """Barrier of ``expected`` threads of ``t``'s block named ``key``; returns all values.

    Args:
        t: The calling :class:`KernelThread`.
        key: Names the hardware barrier (e.g. ``("cta",)``, ``("warp", 3, mask)``).
        expected: Threads that complete it.
        label: For reports, e.g. ``"coop.sync(cta)"``.
        value: This thread's contribution (for reductions/shuffles).
        shape: What the caller expects the barrier to be; a different shape
            while threads wait is reported as a misuse.
        members: Linear thread ids expected (for the report of who is missing).
        scope: What holds the barrier: the block (default), or the launch for a grid-wide one.
    """
    blk = t.blk
    barriers = (scope if scope is not None else blk).barriers
    b = barriers.get(key)
    if b is None:
        b = barriers[key] = GroupBarrier(expected, shape, label)
    elif b.arrived:
        if b.shape != shape or b.expected != expected:
            raise sim_error(DeadlockError, (
                f"Cannot {label}: the block's barrier {key!r} is in use by {b.label} with "
                f"{b.expected} threads ({b.shape}) while this thread arrives with {expected} threads "
                f"({shape}). Use distinct barrier ids, or the same coop shape on all threads"))
    else:
        b.expected, b.shape, b.label = expected, shape, label
    arrived = b.arrived
    arrived.append(t)
    vals = b.values
    vals.append(value)
    sched = _state.sched
    if len(arrived) == expected:
        b.arrived, b.values = [], []
        if sched.race is not None:
            sched.race.barrier(arrived)
        rn = sched.runnable
        for o in arrived:
            if o is not t:
                o.box = vals
                o.waiting = None
                rn.append(o)
        sched.stale = 0
        return vals
    t.waiting = _BlockWait(b, label, members, blk)
    sched.stale = 0
    sched.switch_away(t)
    return t.box
