"""Simulated host side: the world of ranks, communicators, launches, ``spawn``.
"""

from __future__ import annotations

import gc

import sys

import greenlet
import numpy as np

from ..host import checks
from ..host.arrays import is_torch
from ..host.timeouts import aborted_error, resolve_timeout
from . import _state, timeouts
from .cudashim import simulate_function
from .._release import SUPPORTED_RELEASES, arch_cc, format_version, parse_version
from .._targets import checked_arch
from ..enums import GinBackend
from ..errors import ResourceClosedError
from ..errors import UsageError as _UsageErrorBase
from .errors import (CollectiveMismatchError, DeadlockError, KernelTypingError, LivelockError, SimulationError,
                     StalledError, UnsupportedFeatureError, UsageError, sim_error)
from .network import Network
from .memory import Closable, SymBuffer, Window, WindowGroup, poisoned
from .races import RaceDetector, enabled_by_default
from .watchdog import Watchdog
from .scheduler import Block, Cond, HostTask, HostThread, KernelThread, Launch, Scheduler, Wait, fmt_ids

__all__ = ["spawn", "World", "SimComm", "DevComm", "DevCommGroup", "launch", "SimulatedOverload"]

#: Where every empty buffer of comm.alloc lies: CuPy gives all its empty arrays one address (0).
_EMPTY = np.empty(16, np.uint8)
_OPTIONS = {"livelock_rounds": 100, "max_steps": None, "gin_delivery": "ordered", "gin_backend": "proxy",
            "races": None, "host_threads": False, "stall_seconds": 30.0, "multimem": False,
            "gin_connections": "full", "nccl": None, "arch": None}


class _Collective:
    """One host collective position: the ranks that arrived, their values and what they called."""

    __slots__ = ("kind", "values", "arrived", "result", "waiters", "seq", "labels")

    def __init__(self, kind, nranks, seq):
        self.kind, self.seq = kind, seq
        self.values = [None] * nranks
        self.labels = [None] * nranks  # what each rank called, for reports ("comm.register()")
        self.arrived = []
        self.result = None
        self.waiters = []

    def label(self) -> str:
        return self.labels[self.arrived[0]]

    def callers(self) -> str:
        """"rank 0 called comm.register(), ranks 1, 2 called comm.barrier()"."""
        by_label = {}
        for r in self.arrived:
            by_label.setdefault(self.labels[r], []).append(r)
        return ", ".join(f"{_ranks(rs)} called {label}" for label, rs in by_label.items())


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


class DevComm(Closable):
    """The device communicator a kernel receives (``ncclDevComm``).

    Attributes:
        rank: World rank.
        nranks: World size.
        lsa_rank: Rank within the LSA team (this node).
        lsa_size: Size of the LSA team.
        lsa_barrier_count: Number of LSA barriers.
        gin_backend: The simulated GIN backend (``spawn(gin_backend=...)``), a
            :class:`flowdsl.GinBackend` as on GPUs.
        gin_context_count: The GIN contexts a kernel may use (``gin_context_count``, default 4), as
            kernels read it: ``comm.gin_context_count``.
    """

    __flowdsl_sim__ = True
    kind = "device communicator"

    def __init__(self, group: DevCommGroup, comm):
        self.group = group
        self.comm = comm
        self.rank = comm.rank
        self.nranks = comm.nranks
        self.lsa_rank = comm.lsa_rank
        self.lsa_size = comm.lsa_size
        self.lsa_barrier_count = group.lsa_barrier_count
        self.gin_backend = GinBackend.from_option(comm.world.net.backend)
        self.closed = False

    @property
    def gin_context_count(self) -> int:
        from .gin import gin_state  # noqa: PLC0415 - GIN state is made at first use, as its primitives make it

        return gin_state(self).contexts

    @property
    def communicator(self):
        """The communicator that created it."""
        return self.comm

    def close(self):
        """Destroy (idempotent)."""
        self.closed = True

    def __repr__(self):
        return f"<sim DevComm #{self.group.did} rank {self.rank}/{self.nranks}>"


class SimComm(Closable):
    """A simulated rank's host communicator (what ``main(comm)`` receives).

    Attributes:
        rank: World rank.
        nranks: World size.
        lsa_rank: Rank within this node (the LSA team).
        lsa_size: Number of ranks in this node.
        node: This rank's node.
        nodes: The number of nodes.
    """

    __flowdsl_sim__ = True
    #: The collectives compare every call's arguments across ranks on the simulator, always (a
    #: mismatch is a CollectiveMismatchError naming both calls); on GPUs with ``init(check_collectives=True)``.
    check_collectives = True
    memory_device = "cpu"
    device = None  # no CUDA device: host memory stands for the rank's GPU memory
    cuda_graphs = False
    #: NCCL's host communicator on GPUs; the simulator has none (``algorithm="nccl"`` is refused there).
    nccl = None

    def __init__(self, world, rank):
        self.world = world
        self.rank = rank
        self.nranks = world.nranks
        self.lsa_size = world.lsa_size
        self.lsa_rank = rank % world.lsa_size
        self.node = rank // world.lsa_size
        self.nodes = world.nodes
        self.closed = False
        self._allocations = []  # (first byte, end, buffer) of comm.alloc's buffers
        self._resources = []  # windows and device communicators, closed with the communicator

    def __repr__(self):
        return f"<sim Comm rank {self.rank}/{self.nranks}>"

    def _open(self, op):
        """The calling host task, after refusing ``op`` on a closed communicator (as the GPU runtime)."""
        t = self._host(op)
        try:
            checks.communicator_open(self.closed, op)
        except Exception as e:  # noqa: BLE001 - re-raised naming the rank and the seed
            raise sim_error(type(e), str(e)) from None
        return t

    def _host(self, op):
        t = _state.cur
        if not isinstance(t, HostTask) or t.rank != self.rank:
            raise sim_error(UsageError, f"Cannot {op}: call it from rank {self.rank}'s host code "
                            "(the main function given to flowdsl.sim.spawn), not from a kernel or another rank")
        return t

    @property
    def own_thread(self) -> bool:
        """Whether this rank's host code has an OS thread of its own (``spawn(..., host_threads=True)``, or the
        only rank), keeping its own thread-local state, as PyTorch needs."""
        return self.world.sched.host_threads or self.nranks == 1

    def alloc(self, shape, dtype=np.float32, *, like="cupy"):
        """A symmetric buffer of ``shape``/``dtype`` filled with poison (NaN or 0xA5 bytes).

        ``like="cupy"``: a NumPy array with CuPy's ``set``/``get``; ``like="torch"``: a CPU
        PyTorch tensor over the same memory (``comm.synchronize()`` before reading it on the
        host: a tensor does not wait for the rank's kernels). Checked as on GPUs.
        """
        self._open("allocate symmetric memory")
        dtype, shape, like = _checked(checks.alloc_dtype, dtype), _checked(checks.alloc_shape, shape), \
            _checked(checks.alloc_like, like)
        buf = poisoned(shape, dtype, SymBuffer)
        if buf.size == 0:  # as CuPy's: every empty array at one address (a GPU run found code taking two for one)
            buf = _EMPTY[:0].view(dtype).reshape(np.shape(buf)).view(SymBuffer)
        buf._sim_comm = self
        self.world.add_region(buf, f"buffer {tuple(np.shape(buf))} of rank {self.rank}")
        base = buf.__array_interface__["data"][0]
        self._allocations.append((base, base + buf.nbytes, buf))
        if like == "torch":
            return checks.torch_module("allocate symmetric memory with like='torch'").from_numpy(
                buf.view(np.ndarray))
        return buf

    def _registrable(self, buf) -> np.ndarray:
        """``buf`` as a NumPy view of this rank's symmetric memory, refused as the GPU runtime refuses it."""
        if is_torch(buf) and not buf.is_cuda:
            buf = buf.numpy()  # like="torch" buffers: a view of the same memory
        elif not isinstance(buf, np.ndarray):
            raise sim_error(UsageError, str(checks.not_a_buffer_error(buf)))
        if not getattr(buf, "__flowdsl_sim__", False) and not any(lo <= _address(buf) < hi
                                                                   for lo, hi, _ in self._allocations):
            raise sim_error(UsageError, str(checks.host_array_error(buf)))
        _checked(checks.register_layout, buf.shape, buf.strides, buf.itemsize)
        lo = _address(buf)
        if not any(a <= lo and lo + buf.nbytes <= b for a, b, _ in self._allocations):
            raise sim_error(UsageError, checks.NOT_FROM_ALLOC)
        return buf

    def register(self, buf, *, cft_counted=False) -> Window:
        """Register ``buf`` as a window (collective over ranks); ``cft_counted`` for CFT counted writes."""
        self._open("register a window")
        buf = self._registrable(buf)
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
        win = Window(c.result, self.rank, self)
        self.track(win)
        return win

    def track(self, resource) -> None:
        self._resources.append(resource)

    def device_communicator(self, *, for_kernel=None, grid=None, **requirements) -> DevComm:
        """A device communicator (collective), as the GPU runtime's: ``requirements`` such as
        ``lsa_barrier_count``, and what ``for_kernel`` (a ``@flowdsl.kernel``) needs at ``grid``."""
        self._open("create a device communicator")
        reqs = _checked(checks.device_requirements, requirements, for_kernel, grid, self.world.gin_support,
                        frozenset({GinBackend.from_option(self.world.net.backend)}))
        if self.world.nccl is not None:  # the simulated release's requirement fields, as its GPU build has them
            _checked(checks.refuse_lacking, reqs, requirements,
                     checks.REQUIREMENTS_LACKING[format_version(self.world.nccl)], self.world.nccl)
        if reqs.get("lsa_multimem") and not self.world.multimem:
            raise sim_error(UsageError, str(checks.multimem_unavailable(
                "this simulated system has no NVLink SHARP (flowdsl.sim.spawn(..., multimem=False), the default, "
                "as GPUs without an NVSwitch)")))
        lsa_barrier_count = reqs.pop("lsa_barrier_count", 0)
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
        dc = DevComm(c.result, self)
        self.track(dc)
        return dc

    def synchronize(self):
        """Wait until this rank's launched kernels have finished."""
        self._wait_for_kernels(self._host("synchronize"))
        if getattr(self, "aborted", False):
            raise aborted_error()

    def _wait_for_kernels(self, t):
        w = self.world
        while w.pending(self.rank):
            w.sync_conds[self.rank].waiters.append(t)
            w.sched.block(t, Wait("comm.synchronize()", lambda s, r=self.rank: f"rank {r}: {s.rank_summary(r)}"))
        if w.sched.race is not None:
            w.sched.race.synchronize(t, self.rank)
        self._raise_kernel_error()

    def _raise_kernel_error(self):
        """An exception a kernel thread of this rank raised, raised here once its kernels are done (numba-cuda
        delivers a kernel's exception to the host that waits for it: its simulator always, a GPU in debug
        mode)."""
        err, self.world.kernel_errors[self.rank] = self.world.kernel_errors[self.rank], None
        if err is not None:
            raise err

    def free(self, buf) -> None:
        """Release a buffer from :meth:`alloc` now (windows over it must be closed first), as on GPUs:
        a later register of it is refused."""
        self._open("free a buffer")
        view = buf.numpy() if is_torch(buf) and not buf.is_cuda else buf
        lo = _address(view) if isinstance(view, np.ndarray) else None
        entry = next((a for a in self._allocations if lo is not None and (a[0] <= lo < a[1] or a[2] is view)), None)
        if entry is None:
            raise sim_error(UsageError, "Cannot free this buffer: it was not allocated by comm.alloc on this "
                            "communicator.")
        if any(isinstance(r, Window) and not r.closed and entry[0] <= _address(r.group.bytes[self.rank]) < entry[1]
               for r in self._resources):
            raise sim_error(UsageError, "Cannot free this buffer: a window is still registered over it. Close it "
                            "first.")
        self._allocations = [a for a in self._allocations if a is not entry]  # by identity: empty ones share a base

    @property
    def open_resources(self) -> list:
        """Resources not yet closed (windows, device communicators, symmetric buffers), as on GPUs."""
        return [r for r in self._resources if not r.closed] + [a[2] for a in self._allocations]

    def barrier(self):
        """Host barrier among all ranks."""
        self._open("enter the host barrier")
        self.world.collective(self.rank, "barrier", None)

    def exchange(self, words, stream=None, *, label: str = "comm.exchange()") -> np.ndarray:
        """Every rank's ``words`` as an ``(nranks, len)`` array, once every rank called it (a host
        rendezvous; ``stream`` is the rank's one stream). Collective."""
        self._open(f"call {label}")
        mine = np.ascontiguousarray(words, np.int64).reshape(-1).copy()
        rows = list(self.world.collective(self.rank, "collective", mine, label).values)
        if len({row.size for row in rows}) > 1:
            raise sim_error(UsageError, f"Cannot finish {label}: the ranks exchanged {sorted({r.size for r in rows})} "
                            "words. Exchange the same number on every rank")
        return np.stack(rows)

    def close(self):
        """Close the communicator, its device communicators and windows (idempotent); later
        ``alloc``, ``register``, ``device_communicator`` and launches with them are refused."""
        if self.closed:
            return
        if isinstance(_state.cur, HostTask) and self.world.pending(self.rank):
            # As the GPU runtime, which synchronizes before releasing (after abort() too: the
            # kernels' waits give up at once, and abort reports nothing).
            self._wait_for_kernels(self._host("close the communicator"))
        for res in reversed(self._resources):
            res.close()
        self._resources.clear()
        self.closed = True

    # The GPU communicator's bounded-wait API (flowdsl.wait): the simulator has no clock to
    # time out by (stuck waits raise WaitTimeoutError from the scheduler); the limit is kept.
    @property
    def wait_timeout(self) -> float:
        return getattr(self, "_wait_timeout", resolve_timeout(None))

    @property
    def supports_multimem(self) -> bool:
        """Whether ``device_communicator(lsa_multimem=True)`` would be accepted: the simulated system has NVLink
        SHARP (``spawn(..., multimem=True)``), as the GPU communicator's property says of its GPU."""
        return bool(self.world.multimem)

    @wait_timeout.setter
    def wait_timeout(self, seconds) -> None:
        self._wait_timeout = resolve_timeout(seconds)

    @property
    def cft_missing(self) -> str | None:
        """What kernels using ``flowdsl.cft`` with counted writes lack here, as the GPU communicator's property
        says it: the simulator models CFT (its CFT domain is the whole world) unless it simulates a release
        before NCCL 2.32 (``spawn(nccl=...)``) or a GPU before sm_100 (``spawn(arch=...)``); None where they run.""" 
        from ..cft import COUNTED_GATE  # noqa: PLC0415 - counted writes: NCCL 2.32, sm_100

        has, arch = self.world.nccl, self.world.arch
        missing = []
        if has is not None and has < COUNTED_GATE.nccl:
            missing.append(f"NCCL >= 2.32 (counted writes; this run simulates NCCL {format_version(has)}: "
                           f"flowdsl.sim.spawn(nccl='{format_version(has)}'))")
        if arch is not None and arch_cc(arch) < COUNTED_GATE.min_cc:
            missing.append(f"an sm_100 or newer GPU (this run simulates {arch}: flowdsl.sim.spawn(arch='{arch}'))")
        return "needs " + "; ".join(missing) if missing else None

    def device_error(self):
        """None: on the simulator a stuck wait ends the run with WaitTimeoutError instead."""
        return None

    def abort(self):
        """Every bounded wait of this rank's kernels gives up at once (as on GPUs); then close."""
        if self.closed:
            return
        self.aborted = True
        sched = self.world.sched
        if not sched.on_simulation_thread() or not isinstance(_state.cur, HostTask):
            # From another thread (a watchdog, as on GPUs) or outside this rank's host code: the waits wake
            # on the simulation's thread, and the host code's next call raises ResourceClosedError.
            sched.abort_requests.append(self)
            return
        timeouts.abort(self)  # the blocked ones wake; polling ones give up at their next poll
        try:
            self.close()  # waits for the kernels, which now leave their polling waits
        except ResourceClosedError:  # what that wait says of an aborted communicator
            self.close()  # the kernels are done: now it releases


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
        #: per rank, the first exception a kernel thread raised that the host has not been given yet
        self.kernel_errors = [None] * nranks
        self.nlaunch = [0] * nranks
        self.nwindows = 0
        self.ndevcomms = 0
        self.regions = []
        self.fn_cache = {}
        self.net = None
        self.returned = set()  # ranks whose host program returned
        self.multimem = False  # NVLink SHARP in each node (spawn(multimem=True))
        self.nccl = None  # the NCCL release kernels are simulated for (spawn(nccl=...)); None: the newest
        self.arch = None  # the GPU arch kernels are simulated for (spawn(arch=...)); None: any

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
    def collective(self, rank, kind, value, label=None):
        """Rank ``rank`` arrives at its next host collective (``kind``, e.g. ``"register"``; ``label``
        names the call in reports); returns the :class:`_Collective` once every rank arrived.

        Raises:
            CollectiveMismatchError: Another rank called another kind of host collective at this
                position, or returned from its program without calling it.
        """
        sched = self.sched
        label = label or f"comm.{kind}()"
        seq = self.coll_seq[rank]
        self.coll_seq[rank] += 1
        c = self.colls.get(seq)
        if c is None:
            c = self.colls[seq] = _Collective(kind, self.nranks, seq)
        if c.kind != kind:
            raise _mismatch(label, f"Cannot call {label} on rank {rank}: it is host collective #{seq} of this rank, "
                            f"and {c.callers()} there. Call the same collectives in the same order on every rank")
        c.values[rank], c.labels[rank] = value, label
        c.arrived.append(rank)
        if len(c.arrived) == self.nranks:
            del self.colls[seq]
            if sched.race is not None:  # a host collective orders every rank's host after every other's
                sched.race.barrier(c.waiters + [_state.cur])
            for t in c.waiters:
                sched.wake(t)
            return c
        returned = sorted(self.returned - set(c.arrived))
        if returned:
            raise _mismatch(c.label(), _skipped(c, returned))
        t = _state.cur

        def detail(s, c=c):
            missing = [r for r in range(self.nranks) if r not in c.arrived]
            return "\n".join(f"rank {r} has not called {c.label()} (host collective #{c.seq}): {s.rank_summary(r)}"
                             for r in missing)
        c.waiters.append(t)
        sched.block(t, Wait(f"{label} (host collective #{seq})", detail))
        return c

    def host_returned(self, rank):
        """Rank ``rank``'s program returned: refuse host collectives other ranks wait in for it."""
        self.returned.add(rank)
        for c in self.colls.values():
            if rank not in c.arrived:
                raise _mismatch(c.label(), _skipped(c, [rank]))

    # ---- kernel launches -----------------------------------------------------
    def pending(self, rank):
        return bool(self.queue[rank])

    def enqueue(self, rank, fn, name, grid, block, args, shared=0):
        seq = self.nlaunch[rank]
        self.nlaunch[rank] += 1
        lau = Launch(rank, fn, name, grid, block, args, seq)
        lau.shared = shared  # bytes of dynamic shared memory per block
        if self.sched.race is not None:
            self.sched.race.enqueue(_state.cur, lau)
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
        threads = []
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
                                threads.append(t)
                                sched.add(t, _thread_runner(t, fn, args, self))
        if sched.race is not None:
            sched.race.start(lau, threads)
        lau.remaining = lin * nth
        if lau.remaining == 0:
            self.finish_launch(lau)

    def finish_launch(self, lau):
        lau.finished = True
        if self.sched.race is not None:
            self.sched.race.launch_done(lau)
        q = self.queue[lau.rank]
        q.pop(0)
        for b in lau.blocks:
            b.threads = b.threads  # keep for reports
        if q:
            self.start(q[0])
        self.sync_conds[lau.rank].notify(self.sched)


def _skipped(c, ranks) -> str:
    who = _ranks(ranks)
    waiting = f"{_ranks(c.arrived)} wait{'s' if len(c.arrived) == 1 else ''}"
    return (f"Cannot finish {who}'s program: {waiting} in {c.label()} (host collective #{c.seq}), "
            f"and {who} returned from main without calling it. Call the same collectives in the same order on "
            "every rank")


def _mismatch(label, text) -> CollectiveMismatchError:
    e = sim_error(CollectiveMismatchError, text)
    e.collective = label.removeprefix("flowdsl.collectives.")
    return e


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {fmt_ids(ranks)}"


def _gin_connections(option):
    """The :class:`flowdsl.GinConnectionType` of ``spawn(gin_connections=...)``."""
    from ..enums import GinConnectionType  # noqa: PLC0415

    names = {"full": GinConnectionType.FULL, "rail": GinConnectionType.RAIL, "none": GinConnectionType.NONE}
    if option not in names:
        raise UsageError(f"Cannot spawn with gin_connections={option!r}: pass \"full\" (every rank, the default), "
                         "\"rail\" (the rail team only) or \"none\" (no GIN-capable network card)")
    return names[option]


def _checked(check, *args):
    """``check(*args)``, its UsageError re-raised naming the rank and the seed."""
    try:
        return check(*args)
    except _UsageErrorBase as e:
        raise sim_error(UsageError, str(e)) from None



def _address(arr) -> int:
    return arr.__array_interface__["data"][0]


def _run_task(sched, task, body, where, raised=None) -> bool:
    """Run ``body()`` as ``task`` and finish it: True when it returned. An exception goes to the scheduler
    (``spawn`` raises it); one the simulator did not raise gets a note of where (``where(place)``, ``place``
    its file and line) and of the seed that replays it. A greenlet's exit passes on. ``raised``: where a
    kernel thread's own exception goes instead (one the simulator did not raise); the thread then ends."""
    try:
        body()
    except greenlet.GreenletExit:
        raise
    except RecursionError as e:  # a device function calling itself without end (or too deep for Python)
        place = _tb_where(e)
        err = UnsupportedFeatureError(
            f"Cannot go on {where(place)}: a device function's recursion went deeper than the simulator follows "
            f"(Python's limit of "
            f"{sys.getrecursionlimit()} frames, each device call a few). On a GPU each thread's stack is "
            "cudaLimitStackSize bytes (1 KiB by default), which a deep recursion overflows sooner: bound the depth, "
            f"or write the recursion as a loop (seed={sched.seed})")
        sched.fail(task, err)
        return False
    except BaseException as e:  # noqa: BLE001 - forwarded to spawn()
        e = _argument_of_another_kind(task, e) or _library_refusal(task, e) or e
        if raised is not None and isinstance(e, Exception) and not isinstance(e, SimulationError):
            raised(e)
            sched.finish(task)
            return True
        if not isinstance(e, SimulationError):
            e.add_note(f"flowdsl.sim: raised {where(_tb_where(e))}; seed={sched.seed} replays it")
        else:  # its message names the rank and the seed; the host line that raised it, as for the others
            e.add_note(f"flowdsl.sim: raised {where(_tb_where(e))}")
        sched.fail(task, e)
        return False
    sched.finish(task)
    return True


def _library_refusal(task, e):
    """A refusal by flowdsl's own code that kernel code ran (a Flow processor over a window flow.staging did not
    make), as a simulator error of its class naming the thread, not a kernel's own exception (those end their
    thread and reach the host at its next synchronize, as numba-cuda delivers them); else None."""
    from ..errors import FlowDSLError  # noqa: PLC0415

    if getattr(task, "launch", None) is None or not isinstance(e, FlowDSLError) or isinstance(e, SimulationError):
        return None
    from ..errors import KernelTypingError as Typing  # noqa: PLC0415

    err = sim_error(KernelTypingError if isinstance(e, Typing) else UsageError, str(e))
    err.__cause__ = None
    return err.with_traceback(e.__traceback__)


def _argument_of_another_kind(task, e):
    """An attribute missing from a launch's argument (a window where the kernel reads a device communicator's
    ``lsa_size``: arguments passed in another order) as the GPU refuses it, a typing error naming the argument
    and its parameter; else None."""
    launch = getattr(task, "launch", None)
    if launch is None:
        return None
    obj = getattr(e, "obj", None) if isinstance(e, AttributeError) else None
    if isinstance(e, TypeError) and str(e).endswith("object is not subscriptable"):  # a window indexed as an array
        kind = str(e).split("'")[1] if str(e).count("'") >= 2 else ""
        of_kind = [a for a in launch.args if type(a).__name__ == kind]
        obj = of_kind[0] if len(of_kind) == 1 else None
    if obj is None or isinstance(obj, np.ndarray):
        return None
    index = next((i for i, a in enumerate(launch.args) if a is obj), None)
    if index is None:
        return None
    import inspect  # noqa: PLC0415

    try:
        params = list(inspect.signature(launch.fn).parameters)
    except (TypeError, ValueError):
        params = []
    param = f" ({params[index]})" if index < len(params) else ""
    order = f" ({', '.join(params)})" if params else ""
    kind = type(obj).__name__
    what = (f"Unknown attribute {e.name!r} of type {kind}: argument {index}{param} of kernel {launch.name!r} is a "
            f"{kind}, which has no {e.name!r}") if isinstance(e, AttributeError) else (
            f"Cannot index argument {index}{param} of kernel {launch.name!r}: it is a {kind}, which a kernel reads "
            "through a view (lsa.local_view(win), lsa.lsa_view(win, peer)), not by index")
    err = sim_error(KernelTypingError, (
        f"{what}. A launch passes its arguments in the order of the kernel's parameters{order}: check that order "
        "(compiling for a GPU refuses this kernel the same way)"))
    err.__cause__ = e
    return err.with_traceback(e.__traceback__)


def _kernel_exception(t, e, where, seed):
    """``e``, raised by kernel thread ``t``, as numba-cuda gives it to the host: the same class, its message
    led by the thread's and block's indices (``tid=[3, 0, 0] ctaid=[0, 0, 0]: ...``), noting where it was
    raised and the seed that replays it."""
    b = (*t.blk.idx, 0, 0)[:3]  # a 1-D launch's blocks keep their x alone
    lead = f"tid={[t.tx, t.ty, t.tz]} ctaid={list(b)}"
    try:
        out = type(e)(f"{lead}: {e}" if str(e) else lead)
    except Exception:  # noqa: BLE001 - a class that takes other arguments: the exception itself
        out = e
    for note in getattr(e, "__notes__", []):
        out.add_note(note)
    out.add_note(f"flowdsl.sim: raised {where(_tb_where(e))}; seed={seed} replays it")
    out.__cause__ = None if out is e else e.__cause__
    return out.with_traceback(e.__traceback__)


def _thread_runner(t, fn, args, world):
    sched = world.sched

    def run():
        where = lambda place: f"in {t.name()} of kernel {t.launch.name!r} at {place}"  # noqa: E731

        def raised(e):  # the thread ends; its launch goes on, and the rank's host gets the first such exception
            if world.kernel_errors[t.rank] is None:
                world.kernel_errors[t.rank] = _kernel_exception(t, e, where, sched.seed)

        if not _run_task(sched, t, lambda: fn(*args), where, raised):
            return
        if sched.race is not None:
            sched.race.thread_done(t)
        lau = t.launch
        lau.remaining -= 1
        if lau.remaining == 0:
            world.finish_launch(lau)
    return run


def _tb_where(e):
    """Where ``e`` was raised in the user's code: the innermost frame outside the flowdsl package (a host
    call into flowdsl's collectives is the user's line that made it), else the innermost outside the
    simulator."""
    import os
    import sysconfig
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    simulator = os.path.dirname(os.path.abspath(__file__)) + os.sep
    # Installed libraries and the standard library (an assert of NumPy's testing raises inside NumPy).
    installed = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                       for k in ("stdlib", "platstdlib", "purelib", "platlib")})
    user = outside_sim = "?"
    tb = e.__traceback__
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        place = f"{os.path.basename(fn)}:{tb.tb_lineno}"
        if not os.path.abspath(fn).startswith((package, *installed)):
            user = place
        if not os.path.abspath(fn).startswith(simulator):
            outside_sim = place
        tb = tb.tb_next
    return user if user != "?" else outside_sim


def _dim3(d, what):
    if isinstance(d, (int, np.integer)):
        return (int(d), 1, 1)
    d = tuple(int(x) for x in d)
    if not 1 <= len(d) <= 3:
        raise UsageError(f"Cannot launch with {what}={d}: give 1 to 3 dimensions. Use an int or a tuple")
    return d + (1,) * (3 - len(d))


def launch(kernel_obj, griddim, blockdim, stream, sharedmem, args, wait=False):
    """The kernel-launch hook: queue ``kernel_obj`` on the calling rank's stream (``wait``: and wait for it,
    as a GPU launch that copies host arrays back does).

    Installed into ``flowdsl._stubs`` when :mod:`flowdsl.sim` is imported; the
    real ``@flowdsl.kernel`` object calls it when an argument is simulated, with
    ``stream`` already resolved to a handle by the checks the GPU launch makes
    (:mod:`flowdsl.host.streams`). A rank has one stream: the handle is not used.
    """
    t = _state.cur
    name = getattr(kernel_obj, "__name__", None) or getattr(getattr(kernel_obj, "py_func", None),
                                                             "__name__", "kernel")
    if not isinstance(t, HostTask):
        raise sim_error(UsageError, f"Cannot launch kernel {name!r}: no simulated rank's host code is running. "
                        "Launch it from the main function given to flowdsl.sim.spawn(...)")
    world = t.comm.world
    for i, a in enumerate(args):
        r = getattr(a, "rank", None) if isinstance(a, (Window, DevComm)) else None
        if r is not None and r != t.rank:
            raise sim_error(UsageError, f"Cannot launch kernel {name!r} on rank {t.rank} with {a!r}: "
                            "it belongs to another rank. Pass this rank's objects")
        if isinstance(a, (Window, DevComm)) and a.closed:  # as the GPU runtime words it
            kind = "window" if isinstance(a, Window) else "device communicator"
            raise sim_error(ResourceClosedError, str(checks.resource_closed(kind, f"launch {name} (argument {i})")))
    # like="torch" buffers are CPU tensors here: kernels see NumPy views of the same memory
    args = tuple(a.numpy() if is_torch(a) and not a.is_cuda else a for a in args)
    py = getattr(kernel_obj, "py_func", kernel_obj)
    fn = simulate_function(py, world.fn_cache, debug=bool(getattr(kernel_obj, "debug", False)))
    grid, block = _dim3(griddim, "griddim"), _dim3(blockdim, "blockdim")
    if block[0] * block[1] * block[2] > 1024:
        raise sim_error(UsageError, f"Cannot launch kernel {name!r} with blockdim {blockdim}: more than 1024 "
                        "threads per block. Use at most 1024 threads per block")
    args = tuple(args)
    if world.sched.race is not None:  # buffers passed to the kernel: their element accesses are checked
        args = tuple(world.sched.race.track(a, world.name_of(_data_ptr(a)) or f"a buffer of rank {t.rank}")
                     if isinstance(a, np.ndarray) else a for a in args)
    world.enqueue(t.rank, fn, name, grid, block, args, int(sharedmem or 0))
    if wait:
        t.comm._wait_for_kernels(t)


class SimulatedOverload:
    """A kernel's code for one signature on the simulator (``kernel.overloads[sig]`` inside a simulated rank):
    numba-cuda's loaded kernel where the simulator has the answer; the GPU's own figures of compiled code
    (registers, local memory, SASS) are refused by name, as the simulator compiles nothing."""

    def __init__(self, kernel, argtypes):
        self._kernel, self.argtypes = kernel, tuple(argtypes)

    def __repr__(self):
        return f"<simulated code of {getattr(self._kernel, '__name__', 'kernel')} for {self.argtypes}>"

    def max_cooperative_grid_blocks(self, blockdim) -> int:
        """The most blocks of ``blockdim`` a cooperative launch may have: 1, which every GPU holds (a block
        that fits a GPU is resident alone), 0 for a block no GPU launches. The simulator runs every block of
        a launch at once, so ``cuda.cg.this_grid().sync()`` works at any grid size here; how many blocks a
        real GPU keeps resident (its SMs, the kernel's registers and shared memory) it does not model."""
        block = _dim3(blockdim, "blockdim")
        return 1 if block[0] * block[1] * block[2] <= 1024 else 0

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise sim_error(UnsupportedFeatureError, (
            f"Cannot read {name} of kernel {getattr(self._kernel, '__name__', '?')!r} on the simulator: it is a "
            "figure of the kernel's code compiled for a GPU (numba-cuda's loaded kernel), and the simulator "
            "compiles nothing. Read it on a GPU (flowdsl.init()), where kernel.overloads holds numba-cuda's "
            "loaded kernels"))


def _data_ptr(a):
    return a.__array_interface__["data"][0]


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
            strong and weak signals; ``"efa_gda"``: weak signals only, so a device
            communicator there must not require strong ones), ``races`` (detect data races: ``True``/``False``; default
            on, unless the environment variable ``FLOWDSL_SIM_RACES=0``; see
            ``flowdsl.sim.races``), ``host_threads`` (``True``: each rank's ``main`` runs on an
            OS thread of its own, one at a time as before, so that it keeps its own thread-local
            state: what PyTorch programs need, ``flowdsl.torch``'s operators among them; default
            ``False``, greenlets on the caller's thread), ``stall_seconds`` (seconds a kernel thread may
            run without reaching a point where the simulator switches threads, such as a loop spinning on a
            plain load, before :class:`flowdsl.sim.StalledError`; default 30, 0: never), ``multimem``
            (``True``: each node's GPUs share an NVSwitch with NVLink SHARP, so device communicators may ask
            for ``lsa_multimem`` and kernels use ``flowdsl.lsa.multimem_view``; default ``False``, as GPUs
            without one, where that request is refused), ``gin_connections`` (what the simulated network
            connects, NCCL's ``ncclCommProperties.ginConnectionType``: ``"full"``, the default, every rank;
            ``"rail"``, the rail team only, where NCCL refuses a device communicator that asks for ``FULL``;
            ``"none"``, no GIN-capable network card, where NCCL refuses one that asks for GIN at all), ``nccl``
            (the NCCL release kernels are simulated for, ``"2.28.9"`` or a tuple: what a GPU build for it
            refuses when the kernel compiles — ``gin.get``, strong and VA signals, the world GIN barrier, a
            GIN barrier's fence levels PUT and GET on 2.28, CFT before 2.31 — is refused when it runs, in the
            same words, as a :class:`flowdsl.FeatureUnavailableError`; default ``None``, the newest release
            flowdsl builds for, which refuses nothing), ``arch`` (the GPU kernels are simulated for,
            ``"sm_90"``: what a build for it refuses — CFT below sm_100, multimem below sm_90 — is refused the
            same way; default ``None``, any GPU).

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
    nranks = checks.count_of(nranks, "nranks", f"spawn {nranks!r} ranks")
    nodes = checks.count_of(nodes, "nodes", f"spawn {nranks} ranks on {nodes!r} nodes")
    sched = Scheduler(seed=seed, livelock_rounds=opts["livelock_rounds"], max_steps=opts["max_steps"])
    sched.host_threads = bool(opts["host_threads"])
    world = World(nranks, nodes, sched)
    world.multimem = bool(opts["multimem"])
    world.nccl = None if opts["nccl"] is None else parse_version(opts["nccl"])
    world.arch = None if opts["arch"] is None else checked_arch(opts["arch"], "spawn a simulation")
    if world.nccl is not None and format_version(world.nccl) not in SUPPORTED_RELEASES:
        raise UsageError(f"Cannot spawn a simulation of NCCL {format_version(world.nccl)}: flowdsl builds for NCCL "
                         f"{', '.join(SUPPORTED_RELEASES)}. Pass one of them")
    world.gin_support = _gin_connections(opts["gin_connections"])
    sched.world = world
    world.net = sched.net = Network(seed, opts["gin_delivery"], opts["gin_backend"], world)
    races = enabled_by_default() if opts["races"] is None else bool(opts["races"])
    if races:
        sched.race = RaceDetector(seed, world)
    hosts = []
    for r in range(world.nranks):
        comm = SimComm(world, r)
        h = HostTask(r)
        h.comm = comm
        h.result = None
        hosts.append(h)
        if sched.race is not None:
            sched.race.add_host(h)
        sched.add(h, _host_runner(h, main, comm, sched))
    _state.sched = sched
    _state.race = sched.race
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 200_000), *thresholds[1:])  # fewer GC passes over many greenlets
    try:
        try:
            with Watchdog(sched, opts["stall_seconds"]):
                sched.run()
        except StalledError:
            raise
        except (DeadlockError, LivelockError) as stuck:
            # A kernel thread that raised left its block's barriers short: its exception is the cause.
            raised = next((e for e in sched.world.kernel_errors if e is not None), None)
            if raised is None:
                raise
            raised.add_note(f"flowdsl.sim: the simulation then could not go on: {str(stuck).splitlines()[0]}")
            raise raised from None
        results = [h.result for h in hosts]
        global last_run
        last_run = {"steps": sched.steps, "threads": sum(1 for t in sched.tasks if isinstance(t, KernelThread)),
                    "seed": sched.seed}  # counters only: the scheduler holds the whole world
    finally:
        gc.set_threshold(*thresholds)
        for h in hosts:  # a rank's thread left waiting (a failure ended the run) unwinds
            if isinstance(h.gl, HostThread):
                h.gl.kill()
        if sched.race is not None:
            sched.race.close()
        _state.sched = None
        _state.race = None
        _state.cur = None
        held = sum(region[3].nbytes for region in world.regions)
        sched = world = hosts = comm = h = None  # noqa: F841 - this frame's references, before collecting
        if held >= _COLLECT_BYTES:
            gc.collect()
    return results


#: A finished world holding this much simulated memory is collected at once: its objects form
#: cycles (communicators, windows, tasks), and the garbage collector's own passes count objects,
#: not bytes, so repeated spawns of large worlds (the default FlowConfig stages 121 MiB a rank)
#: would pile up before one ran. Smaller worlds are left to those passes (a full pass costs ~0.1 s).
_COLLECT_BYTES = 64 << 20

last_run = None


def _host_runner(h, main, comm, sched):
    def body():
        h.result = main(comm)
        if sched.world.pending(comm.rank):
            comm.synchronize()
        comm._raise_kernel_error()  # one no synchronize took
        sched.world.host_returned(comm.rank)

    def run():
        _run_task(sched, h, body, lambda place: f"on rank {comm.rank} (host, at {place})")
    return run
