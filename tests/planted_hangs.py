"""Planted hangs: programs where a peer never gets where the others wait for it.

The same host programs run on the simulator (``tests/sim/test_timeouts.py``) and on
GPUs (``tests/multigpu/timeouts_worker.py`` under torchrun); both must end with
:class:`flowdsl.DeviceTimeoutError` naming who waited for what, from which peer
(except :func:`skip_collective` on the simulator, which checks collective calls on
the host first).
Each ``main(comm)`` returns ``"ok"`` when this rank finished without a timeout, or
raises the timeout. The GIN and CFT programs (:func:`skip_gin_barrier`,
:func:`skip_cft_barrier`, :func:`never_counted`) need ranks on several nodes (GIN
across them) or sm_100 with a fabric (CFT): the simulator runs them; GPUs of one
node cannot (they are not in :data:`PROGRAMS`).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint64

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, ThreadScope, cft, coop, flow, gin, lsa, mem, wait
from flowdsl import collectives as coll

#: Seconds a GPU wait may last in these programs (the simulator needs no clock).
TIMEOUT = 2.0
#: Small staging, so a skipped collective leaves the waiter at its first slots.
CONFIG = coll.FlowConfig(channels=1, nslots=2, slot_bytes=1024, threads=64)


def skip_collective(skipper: int = 1, algorithm: str = "ring", count: int = 4099):
    """All ranks call ``all_reduce`` once (which sets up its staging: host collectives); then
    every rank but ``skipper`` calls it again. On GPUs (without ``check_collectives``) the
    others wait on the device; the simulator compares every collective call on the host
    first and raises :class:`flowdsl.CollectiveMismatchError` instead."""
    def main(comm):
        comm.wait_timeout = TIMEOUT
        x = comm.alloc(count, np.float32)
        x[...] = 1.0
        coll.all_reduce(comm, x, algorithm=algorithm, config=CONFIG)
        comm.synchronize()
        if comm.rank != skipper:
            coll.all_reduce(comm, x, algorithm=algorithm, config=CONFIG)
        comm.synchronize()
        return "ok"
    return main


@flowdsl.kernel
def ring_step(comm, stage, src, dst, n, nslots, slot_words, protocol):
    """One step of a ring collective on Flow: block 0 sends ``src`` to the next rank, block 1
    receives the previous rank's into ``dst`` (both on channel 0, connection 0)."""
    proc = flow.processor(comm, stage, None, 1, nslots, slot_words, protocol, 0)
    if cuda.blockIdx.x == 0:
        flow.send(proc, flow.connect(proc, (comm.rank + 1) % comm.nranks, 0, 0), src, 0, n)
    else:
        flow.recv(proc, flow.connect(proc, (comm.rank + comm.nranks - 1) % comm.nranks, 0, 0), dst, 0, n)


def _launching(kernel, blocks, count, skipper=-1):
    """A rank's program: ``kernel[blocks, CONFIG.threads]`` over ``count`` float32 and a staging window
    of ``CONFIG``, launched by every rank but ``skipper``; the host calls (the staging, the device
    communicator) are made by every rank."""
    def main(comm):
        comm.wait_timeout = TIMEOUT
        src, dst = comm.alloc(count, np.float32), comm.alloc(count, np.float32)
        src[...] = 1.0
        with flow.staging(comm, CONFIG, gin=False) as stage, comm.device_communicator() as dc:
            if comm.rank != skipper:
                kernel[blocks, CONFIG.threads](dc, stage, src, dst, count, CONFIG.nslots, CONFIG.slot_bytes // 8,
                                               int(CONFIG.protocol or 0))
            comm.synchronize()
        return "ok"
    return main


def skip_flow_step(skipper: int = 1, count: int = 4099):
    """Every rank but ``skipper`` launches a ring step (a collective's kernel); ``skipper`` never
    does."""
    return _launching(ring_step, 2, count, skipper)


@flowdsl.kernel
def send_then_receive(comm, stage, src, dst, n, nslots, slot_words, protocol):
    """One block per rank sends ``n`` elements to the next rank, then receives the previous one's:
    longer than the slots on the way, it deadlocks around the ring (every rank is there)."""
    proc = flow.processor(comm, stage, None, 1, nslots, slot_words, protocol, 0)
    flow.send(proc, flow.connect(proc, (comm.rank + 1) % comm.nranks, 0, 0), src, 0, n)
    flow.recv(proc, flow.connect(proc, (comm.rank + comm.nranks - 1) % comm.nranks, 0, 0), dst, 0, n)


def credit_cycle(count: int = 1024):
    """Every rank sends ``count`` float32 (more than ``CONFIG``'s two 1 KiB slots hold) before it
    receives: a cycle of full inboxes, with no peer missing (the simulator only: a cycle on GPUs
    is the same timeout, its report the plain one)."""
    return _launching(send_then_receive, 1, count)


@flowdsl.kernel
def absent_at_barrier(comm, absent):
    bar = lsa.barrier(comm, coop.cta(), 0)
    if comm.rank != absent:
        bar.sync(MemoryOrder.ACQ_REL)


def skip_barrier(absent: int = 1):
    """Every rank but ``absent`` syncs on LSA barrier 0 (``absent`` runs the kernel, skips the barrier)."""
    def main(comm):
        comm.wait_timeout = TIMEOUT
        with comm.device_communicator(lsa_barrier_count=1) as dc:
            absent_at_barrier[1, 32](dc, absent)
            comm.synchronize()
        return "ok"
    return main


@flowdsl.kernel
def absent_at_gin_barrier(comm, absent, hybrid):
    """Every rank but ``absent`` syncs on GIN barrier 0: the rail team's (``hybrid`` 0) or the world's."""
    ctx = gin.context(comm, 0)
    if comm.rank != absent:
        if hybrid == 1:
            gin.hybrid_barrier(ctx, coop.cta(), 0).sync(MemoryOrder.ACQ_REL, GinFenceLevel.NONE)
        else:
            gin.rail_barrier(ctx, coop.cta(), 0).sync(MemoryOrder.ACQ_REL, GinFenceLevel.NONE)


def skip_gin_barrier(absent: int = 1, hybrid: bool = False, abort: bool = False):
    """As :func:`skip_barrier`, on the rail team's GIN barrier or the hybrid (world) barrier; ``abort``:
    every rank calls ``comm.abort()`` after the launch instead of waiting (it returns ``"aborted"``)."""
    def main(comm):
        comm.wait_timeout = TIMEOUT
        with comm.device_communicator(barrier_count=1, rail_gin_barrier_count=1) as dc:
            absent_at_gin_barrier[1, 32](dc, absent, int(hybrid))
            return _end(comm, abort)
    return main


@flowdsl.kernel
def absent_at_cft_barrier(comm, absent):
    if comm.rank != absent:
        cft.barrier(comm, coop.warp(), 0).sync(MemoryOrder.ACQ_REL)


def skip_cft_barrier(absent: int = 1, abort: bool = False):
    """Every rank but ``absent`` syncs on CFT barrier 0 (``abort``: as in :func:`skip_gin_barrier`)."""
    def main(comm):
        comm.wait_timeout = TIMEOUT
        with comm.device_communicator(cft_barrier_count=1) as dc:
            absent_at_cft_barrier[1, 32](dc, absent)
            return _end(comm, abort)
    return main


@flowdsl.kernel
def wait_for_counted(comm, win, waiter, nbytes):
    """Rank ``waiter`` waits until ``nbytes`` of counted CFT writes have landed (none are made)."""
    state = cuda.shared.array(4, uint64, alignment=16)
    s = cft.session(comm, coop.warp(), state)
    if comm.rank == waiter:
        cft.wait_counted(s, win, 8, nbytes)
    cft.close(s)


def never_counted(waiter: int = 1, abort: bool = False):
    """Rank ``waiter`` waits for counted writes to the counter at byte 8 of its window that no
    rank makes (``abort``: as in :func:`skip_gin_barrier`)."""
    def main(comm):
        comm.wait_timeout = TIMEOUT
        buf = comm.alloc(32, np.uint64)
        buf[...] = 0
        with comm.register(buf, cft_counted=True) as win, comm.device_communicator() as dc:
            wait_for_counted[1, 32](dc, win, waiter, 64)
            return _end(comm, abort)
    return main


def _end(comm, abort: bool) -> str:
    if not abort:
        comm.synchronize()
        return "ok"
    for _ in range(10):  # host barriers: meanwhile the kernels get to their waits and block there
        comm.barrier()
    comm.abort()
    return "aborted"


@flowdsl.kernel
def wait_for_next(comm, win):
    """Thread 0 of each rank waits for flag 0 of its window, which the next rank never sets."""
    if cuda.threadIdx.x == 0:
        flags = lsa.local_view(win)
        seen = mem.load_acquire(flags, 0, ThreadScope.SYSTEM)
        state = uint64(0)
        while seen == uint64(0):
            state = wait.poll(comm, state, wait.USER, (comm.rank + 1) % comm.nranks, 0, 1, seen)
            if state == wait.GAVE_UP:
                break
            seen = mem.load_acquire(flags, 0, ThreadScope.SYSTEM)


def everyone_waits():
    """Every rank waits for its next peer, which waits too: every rank times out."""
    def main(comm):
        comm.wait_timeout = TIMEOUT
        buf = comm.alloc(8, np.uint64)
        buf[...] = 0
        with comm.register(buf) as win, comm.device_communicator() as dc:
            wait_for_next[1, 32](dc, win)
            comm.synchronize()
        return "ok"
    return main


#: name -> (program factory, what the waiting ranks' diagnosis names)
PROGRAMS = {
    "skip_collective": (skip_collective, "flow"),
    "skip_flow_step": (skip_flow_step, "flow"),
    "skip_barrier": (skip_barrier, "lsa barrier wait, barrier 0"),
    "everyone_waits": (everyone_waits, "a kernel's own wait (flowdsl.wait.poll)"),
}
