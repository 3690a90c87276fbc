"""Simulated host side: the world of ranks, communicators, launches, ``spawn``.

Contents: :func:`spawn` (run ``main(comm)`` on every simulated rank),
:class:`World` (everything the ranks share), :class:`SimComm` (a rank's host
communicator), :class:`DevComm` (the device communicator kernels receive),
:class:`DevCommGroup` (barrier state shared by the ranks), :func:`launch`
(the kernel-launch hook that ``@flowdsl.kernel`` calls for simulated arguments).
"""

from __future__ import annotations

import gc

import numpy as np

from ..runtime.wait_record import aborted_error, resolve_timeout

from . import _state
from .cudashim import simulate_function
from .errors import CollectiveMismatchError, SimulationError, UsageError
from .memory import SymBuffer, Window, WindowGroup, poisoned
from .scheduler import Block, Cond, HostTask, KernelThread, Launch, Scheduler, Wait, fmt_ids, sim_error

__all__ = ["spawn", "World", "SimComm", "DevComm", "DevCommGroup", "launch"]

_OPTIONS = {"livelock_rounds": 100, "max_steps": None, "gin_delivery": "ordered", "gin_backend": "proxy"}
#: Requirements device_communicator() accepts (as the GPU runtime).
_REQUIREMENTS = ("lsa_barrier_count", "barrier_count", "rail_gin_barrier_count", "gin_context_count",
                 "gin_signal_count", "gin_counter_count", "gin_force_enable", "cft_barrier_count", "cft_caps")


class _Collective:
    __slots__ = ("kind", "values", "arrived", "result", "waiters", "seq")

    def __init__(self, kind, nranks, seq):
        self.kind, self.seq = kind, seq
        self.values = [None] * nranks
        self.arrived = []
        self.result = None
        self.waiters = []


class DevCommGroup:
    """LSA barrier state of one collective ``device_communicator`` call.

    ``inbox[r][i][p]`` is the epoch LSA peer ``p`` last published to rank ``r``
    for barrier ``i``; ``epoch[r][i]`` is rank ``r``'s epoch of barrier ``i``
    (kept across launches, as in NCCL's resource window).
    """

    def __init__(self, did, world, lsa_barrier_count, reqs):
        self.did = did
        self.world = world
        self.lsa_barrier_count = lsa_barrier_count
        self.reqs = reqs
        n, ls = world.nranks, world.lsa_size
        self.inbox = [[[0] * ls for _ in range(lsa_barrier_count)] for _ in range(n)]
        self.epoch = [[0] * lsa_barrier_count for _ in range(n)]
        self.conds = [[Cond() for _ in range(lsa_barrier_count)] for _ in range(n)]
        self.owner = {}


class DevComm:
    """The device communicator a kernel receives (``ncclDevComm``).

    Attributes:
        rank: World rank.
        nranks: World size.
        lsa_rank: Rank within the LSA team (this node).
        lsa_size: Size of the LSA team.
        lsa_barrier_count: Number of LSA barriers.
    """

    __flowdsl_sim__ = True

    def __init__(self, group: DevCommGroup, comm):
        self.group = group
        self.comm = comm
        self.rank = comm.rank
        self.nranks = comm.nranks
        self.lsa_rank = comm.lsa_rank
        self.lsa_size = comm.lsa_size
        self.lsa_barrier_count = group.lsa_barrier_count
        self.closed = False

    def close(self):
        """Destroy (idempotent)."""
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<sim DevComm #{self.group.did} rank {self.rank}/{self.nranks}>"


class SimComm:
    """A simulated rank's host communicator (what ``main(comm)`` receives).

    Attributes:
        rank, nranks: World rank and size.
        lsa_rank, lsa_size: Rank and size within this node (the LSA team).
        node, nodes: This rank's node and the number of nodes.
    """

    __flowdsl_sim__ = True

    def __init__(self, world, rank):
        self.world = world
        self.rank = rank
        self.nranks = world.nranks
        self.lsa_size = world.lsa_size
        self.lsa_rank = rank % world.lsa_size
        self.node = rank // world.lsa_size
        self.nodes = world.nodes
        self.closed = False

    def __repr__(self):
        return f"<sim Comm rank {self.rank}/{self.nranks}>"

    def _host(self, op):
        t = _state.cur
        if not isinstance(t, HostTask) or t.rank != self.rank:
            raise sim_error(UsageError, f"Cannot {op}: call it from rank {self.rank}'s host code "
                            "(the main function given to flowdsl.sim.spawn), not from a kernel or another rank")
        return t

    def alloc(self, shape, dtype=np.float32):
        """A symmetric buffer of ``shape``/``dtype`` filled with poison (NaN or 0xA5 bytes)."""
        self._host("alloc a buffer")
        buf = poisoned(shape, dtype, SymBuffer)
        buf._sim_comm = self
        self.world.add_region(buf, f"buffer {tuple(np.shape(buf))} of rank {self.rank}")
        return buf

    def register(self, buf, *, cft_counted=False) -> Window:
        """Register ``buf`` as a window (collective over ranks); ``cft_counted`` for CFT counted writes."""
        self._host("register a buffer")
        if not isinstance(buf, np.ndarray):
            raise sim_error(UsageError, f"Cannot register {type(buf).__name__}: not a buffer. "
                            "Register a buffer from comm.alloc()")
        c = self.world.collective(self.rank, "register", buf)
        if c.result is None:
            bufs = c.values
            sizes = [b.nbytes for b in bufs]
            if len(set(sizes)) != 1:
                c.result = sim_error(UsageError, f"Cannot register: the ranks' buffers differ in size "
                                     f"({sizes} bytes by rank). Register buffers of equal size on every rank")
            else:
                self.world.nwindows += 1
                c.result = WindowGroup(self.world.nwindows - 1, bufs, bufs[0].dtype)
                c.result.cft_counted = bool(cft_counted)
        if isinstance(c.result, Exception):
            raise c.result
        return Window(c.result, self.rank, self)

    def device_communicator(self, lsa_barrier_count=0, **reqs) -> DevComm:
        """A device communicator with ``lsa_barrier_count`` LSA barriers (collective)."""
        self._host("create a device communicator")
        unknown = sorted(set(reqs) - set(_REQUIREMENTS))
        if unknown:
            raise sim_error(UsageError, f"Cannot create a device communicator: unknown requirement(s) "
                            f"{', '.join(unknown)}. Use the known ones: {', '.join(_REQUIREMENTS)}")
        c = self.world.collective(self.rank, "device_communicator", (int(lsa_barrier_count), reqs))
        if c.result is None:
            counts = [v[0] for v in c.values]
            if len(set(counts)) != 1:
                c.result = sim_error(UsageError, f"Cannot create a device communicator: ranks asked for "
                                     f"different lsa_barrier_count {counts}. Pass the same on every rank")
            else:
                self.world.ndevcomms += 1
                c.result = DevCommGroup(self.world.ndevcomms - 1, self.world, counts[0], reqs)
        if isinstance(c.result, Exception):
            raise c.result
        return DevComm(c.result, self)

    def synchronize(self):
        """Wait until this rank's launched kernels have finished."""
        t = self._host("synchronize")
        w = self.world
        while w.pending(self.rank):
            w.sync_conds[self.rank].waiters.append(t)
            w.sched.block(t, Wait("comm.synchronize()", lambda s, r=self.rank: f"rank {r}: {s.rank_summary(r)}"))
        if getattr(self, "aborted", False):
            raise aborted_error()

    def barrier(self):
        """Host barrier among all ranks."""
        self._host("enter the host barrier")
        self.world.collective(self.rank, "barrier", None)

    def close(self):
        """Close the communicator (idempotent)."""
        self.closed = True

    # The GPU communicator's bounded-wait API (flowdsl.wait): the simulator has no clock to
    # time out by (stuck waits raise WaitTimeoutError from the scheduler); the limit is kept.
    @property
    def wait_timeout(self) -> float:
        return getattr(self, "_wait_timeout", resolve_timeout(None))

    @wait_timeout.setter
    def wait_timeout(self, seconds) -> None:
        self._wait_timeout = resolve_timeout(seconds)

    def device_error(self):
        """None: on the simulator a stuck wait ends the run with WaitTimeoutError instead."""
        return None

    def abort(self):
        """Waits of this rank's kernels in flowdsl.wait.poll give up at once; then close."""
        self.aborted = True
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class World:
    """Everything the simulated ranks share: scheduler, collectives, launches."""

    def __init__(self, nranks, nodes, sched):
        if nranks < 1 or nodes < 1 or nranks % nodes:
            raise UsageError(f"Cannot spawn {nranks} ranks on {nodes} nodes: ranks must split evenly "
                             "into nodes. Pick nranks a multiple of nodes")
        self.nranks, self.nodes = nranks, nodes
        self.lsa_size = nranks // nodes
        self.sched = sched
        self.coll_seq = [0] * nranks
        self.colls = {}
        self.launches = [[] for _ in range(nranks)]
        self.queue = [[] for _ in range(nranks)]
        self.sync_conds = [Cond() for _ in range(nranks)]
        self.nlaunch = [0] * nranks
        self.nwindows = 0
        self.ndevcomms = 0
        self.regions = []
        self.fn_cache = {}
        self.net = None

    # ---- memory names (for reports) ----------------------------------------
    def add_region(self, arr, name):
        base = arr.__array_interface__["data"][0]
        self.regions.append((base, base + arr.nbytes, name, arr))

    def name_of(self, addr):
        for lo, hi, name, _ in reversed(self.regions):
            if lo <= addr < hi:
                return name
        return None

    # ---- host collectives -------------------------------------------------
    def collective(self, rank, kind, value):
        sched = self.sched
        seq = self.coll_seq[rank]
        self.coll_seq[rank] += 1
        c = self.colls.get(seq)
        if c is None:
            c = self.colls[seq] = _Collective(kind, self.nranks, seq)
        if c.kind != kind:
            others = [r for r in c.arrived]
            raise sim_error(CollectiveMismatchError, (
                f"Cannot run host collective #{seq} ({kind}) on rank {rank}: rank(s) {fmt_ids(others)} "
                f"called {c.kind} at that position. Call the same collectives in the same order on every rank"))
        c.values[rank] = value
        c.arrived.append(rank)
        if len(c.arrived) == self.nranks:
            del self.colls[seq]
            for t in c.waiters:
                sched.wake(t)
            return c
        t = _state.cur

        def detail(s, c=c):
            missing = [r for r in range(self.nranks) if r not in c.arrived]
            return "\n".join(f"rank {r} has not called comm.{c.kind}() #{c.seq}: {s.rank_summary(r)}"
                             for r in missing)
        c.waiters.append(t)
        sched.block(t, Wait(f"comm.{kind}() (host collective #{seq})", detail))
        return c

    # ---- kernel launches -----------------------------------------------------
    def pending(self, rank):
        return bool(self.queue[rank])

    def enqueue(self, rank, fn, name, grid, block, args):
        seq = self.nlaunch[rank]
        self.nlaunch[rank] += 1
        lau = Launch(rank, fn, name, grid, block, args, seq)
        self.launches[rank].append(lau)
        self.queue[rank].append(lau)
        if len(self.queue[rank]) == 1:
            self.start(lau)

    def start(self, lau):
        sched = self.sched
        lau.started = True
        gx, gy, gz = lau.grid
        bx, by, bz = lau.block
        nth = bx * by * bz
        fn, args = lau.fn, lau.args
        lin = 0
        for z in range(gz):
            for y in range(gy):
                for x in range(gx):
                    blk = Block(lau, (x, y, z) if not lau.one_d else (x,), lin, nth)
                    lin += 1
                    lau.blocks.append(blk)
                    tl = 0
                    for tz in range(bz):
                        for ty in range(by):
                            for tx in range(bx):
                                t = KernelThread(lau.rank)
                                t.blk, t.launch = blk, lau
                                t.tx, t.ty, t.tz, t.lin = tx, ty, tz, tl
                                t.nshared = 0
                                tl += 1
                                blk.threads.append(t)
                                sched.add(t, _thread_runner(t, fn, args, self))
        lau.remaining = lin * nth
        if lau.remaining == 0:
            self.finish_launch(lau)

    def finish_launch(self, lau):
        lau.finished = True
        q = self.queue[lau.rank]
        q.pop(0)
        for b in lau.blocks:
            b.threads = b.threads  # keep for reports
        if q:
            self.start(q[0])
        self.sync_conds[lau.rank].notify(self.sched)


def _thread_runner(t, fn, args, world):
    sched = world.sched

    def run():
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - forwarded to spawn()
            import greenlet
            if isinstance(e, greenlet.GreenletExit):
                raise
            if not isinstance(e, SimulationError):
                e.add_note(f"flowdsl.sim: raised in {t.name()} of kernel {t.launch.name!r} "
                           f"at {_tb_where(e)}; seed={sched.seed} replays it")
            sched.fail(t, e)
            return
        sched.finish(t)
        lau = t.launch
        lau.remaining -= 1
        if lau.remaining == 0:
            world.finish_launch(lau)
    return run


def _tb_where(e):
    tb = e.__traceback__
    loc = "?"
    import os
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if "flowdsl" + os.sep + "sim" not in fn:
            loc = f"{os.path.basename(fn)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return loc


def _dim3(d, what):
    if isinstance(d, (int, np.integer)):
        return (int(d), 1, 1)
    d = tuple(int(x) for x in d)
    if not 1 <= len(d) <= 3:
        raise UsageError(f"Cannot launch with {what}={d}: give 1 to 3 dimensions. Use an int or a tuple")
    return d + (1,) * (3 - len(d))


def launch(kernel_obj, griddim, blockdim, stream, sharedmem, args):
    """The kernel-launch hook: queue ``kernel_obj`` on the calling rank's stream.

    Installed into ``flowdsl._stubs`` when :mod:`flowdsl.sim` is imported; the
    real ``@flowdsl.kernel`` object calls it when an argument is simulated, with
    ``stream`` already resolved to a handle by the checks the GPU launch makes
    (:mod:`flowdsl.runtime.streams`). A rank has one stream: the handle is not used.
    """
    t = _state.cur
    name = getattr(kernel_obj, "__name__", None) or getattr(getattr(kernel_obj, "py_func", None),
                                                             "__name__", "kernel")
    if not isinstance(t, HostTask):
        raise sim_error(UsageError, f"Cannot launch kernel {name!r}: no simulated rank's host code is running. "
                        "Launch it from the main function given to flowdsl.sim.spawn(...)")
    world = t.comm.world
    for a in args:
        r = getattr(a, "rank", None) if isinstance(a, (Window, DevComm)) else None
        if r is not None and r != t.rank:
            raise sim_error(UsageError, f"Cannot launch kernel {name!r} on rank {t.rank} with {a!r}: "
                            "it belongs to another rank. Pass this rank's objects")
        if getattr(a, "closed", False):
            raise sim_error(UsageError, f"Cannot launch kernel {name!r} with {a!r}: it is closed. "
                            "Launch before leaving its `with` block")
    py = getattr(kernel_obj, "py_func", kernel_obj)
    fn = simulate_function(py, world.fn_cache)
    grid, block = _dim3(griddim, "griddim"), _dim3(blockdim, "blockdim")
    if block[0] * block[1] * block[2] > 1024:
        raise sim_error(UsageError, f"Cannot launch kernel {name!r} with blockdim {blockdim}: more than 1024 "
                        "threads per block. Use at most 1024 threads per block")
    world.enqueue(t.rank, fn, name, grid, block, tuple(args))


def spawn(main, nranks=1, seed=0, nodes=1, **options):
    """Run ``main(comm)`` once per simulated rank on the CPU; return the results by rank.

    Args:
        main: ``main(comm) -> value``, the host program of one rank.
        nranks: Number of simulated ranks.
        seed: Scheduler seed; the same seed replays the same interleaving.
        nodes: Ranks split evenly into this many nodes; the LSA team is a node.
        **options: ``livelock_rounds`` (spin steps without progress, per runnable
            task, before a livelock report; default 100), ``max_steps``
            (cap on scheduler steps; default unlimited), ``gin_delivery``
            (``"ordered"``, the default: GIN operations of one context, source and
            peer land in issue order; ``"reordered"``: in a seeded random order, as
            on EFA's SRD), ``gin_backend`` (``"proxy"``, the default, ``"gdaki"``:
            strong and weak signals, legacy signals strong; ``"efa_gda"``: weak
            signals only).

    Returns:
        ``[main(comm_0), main(comm_1), ...]``.

    Raises:
        SimulationError: A problem the simulator detected (deadlock, livelock,
            window access out of bounds, barrier misuse, unsupported feature).
        Exception: Whatever a rank raised, with a note naming the rank and the seed.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"Cannot spawn: unknown option(s) {unknown}. Known options: {sorted(_OPTIONS)}")
    if _state.sched is not None:
        raise UsageError("Cannot spawn a simulation inside a running simulation: the simulator runs one "
                         "at a time. Call flowdsl.sim.spawn from plain host code")
    opts = dict(_OPTIONS, **options)
    sched = Scheduler(seed=seed, livelock_rounds=opts["livelock_rounds"], max_steps=opts["max_steps"])
    world = World(int(nranks), int(nodes), sched)
    sched.world = world
    from .gin import Network
    world.net = sched.net = Network(seed, opts["gin_delivery"], opts["gin_backend"], world)
    hosts = []
    for r in range(world.nranks):
        comm = SimComm(world, r)
        h = HostTask(r)
        h.comm = comm
        h.result = None
        hosts.append(h)
        sched.add(h, _host_runner(h, main, comm, sched))
    _state.sched = sched
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 200_000), *thresholds[1:])  # fewer GC passes over many greenlets
    try:
        sched.run()
    finally:
        gc.set_threshold(*thresholds)
        _state.sched = None
        _state.cur = None
    sched.last_stats = (sched.steps,)
    global last_run
    last_run = sched
    return [h.result for h in hosts]


last_run = None


def _host_runner(h, main, comm, sched):
    def run():
        try:
            h.result = main(comm)
            if sched.world.pending(comm.rank):
                comm.synchronize()
        except BaseException as e:  # noqa: BLE001
            import greenlet
            if isinstance(e, greenlet.GreenletExit):
                raise
            if not isinstance(e, SimulationError):
                e.add_note(f"flowdsl.sim: raised on rank {comm.rank} (host, at {_tb_where(e)}); "
                           f"seed={sched.seed} replays it")
            sched.fail(h, e)
            return
        sched.finish(h)
    return run
