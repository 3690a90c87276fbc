"""All-to-all within an LSA team, in 16-byte elements: NCCL's two LSA designs as flowdsl kernels.

Ports of NCCL's ``contrib/custom_algos/alltoall`` kernels. Every rank sends ``count`` 16-byte elements (four
uint32 each) to every LSA rank: block ``d`` of ``send`` (a plain device array) goes to slot ``rank`` of rank
``d``'s receive window. The grid splits the elements into one chunk per block; a block's warps take the
destinations round-robin (warp ``w`` sends to rank ``w % n``, several warps split a destination's chunk when the
block has more warps than ranks), so every link carries data at once, and a warp's lanes copy consecutive
16-byte elements with one 16-byte load and one 16-byte store each.

- :func:`alltoall_lsa` (NCCL's ``lsa_simple_alltoall``): push, then an LSA barrier per block (arrive with
  release, wait with acquire): after it this rank's slots hold what every rank sent. NCCL's sample has no
  barrier before the pushes; here one (acquire) keeps a rank that is a launch ahead from writing into a window
  whose owner still reads the last result.
- :func:`alltoall_lsa_poison` (NCCL's ``lsa_poison_alltoall``, Lamport-style completion): no barrier in steady
  state. The last uint32 (``.w``) of every element is a sentinel: the receive window holds :data:`POISON` there
  until the element lands, and the sender writes the element with one 16-byte relaxed store
  (:func:`flowdsl.mem.store_vec_relaxed`), so a ``.w`` that is no longer the poison means the whole element is
  there (NVLink and HBM carry a 16-byte store whole; the simulator lands it at once). The receiver polls the
  ``.w`` of each of its slots (bounded), then puts the poison back into the buffer of the previous call, which
  no peer writes any more: three windows rotate (call ``i`` receives into window ``i % 3`` and clears window
  ``(i + 2) % 3``), and a peer is at most one call ahead. The first two calls still meet at a barrier, so that
  every rank has poisoned its windows before any peer writes. Data must never have the poison as ``.w``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint32, uint64

import flowdsl
from flowdsl import MemoryOrder, ThreadScope, coop, lsa, mem, wait

__all__ = ["alltoall_lsa", "alltoall_lsa_poison", "POISON", "run", "run_poison"]

#: The sentinel ``.w`` of an element that has not landed (the value NCCL's kernel uses).
POISON = 0xFFFAFFFA
_SYS = ThreadScope.SYSTEM


@flowdsl.device
def _chunk(count):
    """This block's elements ``[start, end)`` of each rank's ``count``."""
    size = (count + cuda.gridDim.x - 1) // cuda.gridDim.x
    start = cuda.blockIdx.x * size
    return start, min(start + size, count)


@flowdsl.device
def push(comm, send, win, count, relaxed):
    """This warp's share of the block's chunk, to each destination it takes: element ``i`` of block ``d`` of
    ``send`` (uint32, four per element) into slot ``rank`` of rank ``d``'s window. ``relaxed``: one 16-byte
    relaxed store per element (another rank polls it), else a plain one."""
    start, end = _chunk(count)
    n = comm.lsa_size
    warps, warp, lane = cuda.blockDim.x // 32, cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
    per_dest = max(1, warps // n)
    part = (end - start + per_dest - 1) // per_dest
    first = start + (warp // n) % per_dest * part
    last = min(first + part, end)
    for dest in range(warp % n, n, warps):
        slot = lsa.lsa_view(win, dest, 4 * (comm.lsa_rank * count), 4 * count)
        for i in range(first + lane, last, 32):
            v = mem.load_vec(send, 4 * (dest * count + i))
            if relaxed:
                mem.store_vec_relaxed(slot, 4 * i, v, _SYS)
            else:
                mem.store_vec(slot, 4 * i, v)


@flowdsl.kernel
def alltoall_lsa(comm, send, win, count):
    bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQUIRE)  # no peer still reads the last result
    push(comm, send, win, count, False)
    bar.arrive(MemoryOrder.RELEASE)
    bar.wait(MemoryOrder.ACQUIRE)


@flowdsl.kernel
def alltoall_lsa_poison(comm, send, win, clear, count, first_calls):
    if first_calls:  # every rank has poisoned this window before any peer writes into it
        bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
        bar.arrive(MemoryOrder.RELEASE)
        bar.wait(MemoryOrder.ACQUIRE)
    push(comm, send, win, count, True)
    start, end = _chunk(count)
    mine, old = lsa.local_view(win), clear
    for t in range(cuda.threadIdx.x, comm.lsa_size * (end - start), cuda.blockDim.x):
        w = 4 * (t // (end - start) * count + start + t % (end - start)) + 3
        state = uint64(0)
        seen = mem.load_relaxed(mine, w, _SYS)
        while seen == uint32(POISON):
            state = wait.poll(comm, state, wait.USER, t // (end - start), w, 0, seen)
            if state == wait.GAVE_UP:
                break
            seen = mem.load_relaxed(mine, w, _SYS)
    for t in range(cuda.threadIdx.x, comm.lsa_size * (end - start), cuda.blockDim.x):
        w = 4 * (t // (end - start) * count + start + t % (end - start)) + 3
        mem.store_relaxed(old, w, uint32(POISON), _SYS)


def _inputs(comm, count, seed):
    """Every rank's seeded send blocks (``[src][dst]``, uint32, never the poison as ``.w``) and this rank's
    send array."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(0, POISON, (comm.nranks, comm.nranks, count, 4), dtype=np.uint32)
    send = comm.alloc(comm.nranks * count * 4, np.uint32)
    send.set(inputs[comm.rank].reshape(-1))
    return inputs, send


def _check_one_team(comm, name):
    lsa_size = getattr(comm, "lsa_size", comm.nranks)  # the simulator's; a GPU communicator does not tell yet
    if lsa_size != comm.nranks:
        raise flowdsl.UsageError(f"Cannot run {name} on {comm.nranks} ranks in LSA teams of {lsa_size}: it "
                                 "writes every rank's memory directly. Run it within one node")


def run(comm, count: int = 256, blocks: int = 2, threads: int = 128, calls: int = 2, seed: int = 0):
    """``calls`` all-to-alls of :func:`alltoall_lsa` (new inputs each) on ``comm``; returns ``[(result,
    reference)]`` per call for this rank: its receive window (slot ``s`` from rank ``s``), and what NumPy
    takes from every rank's inputs."""
    _check_one_team(comm, "alltoall_lsa")
    recv = comm.alloc(comm.nranks * count * 4, np.uint32)
    out = []
    with comm.register(recv) as win, comm.device_communicator(lsa_barrier_count=blocks) as dcomm:
        for call in range(calls):
            inputs, send = _inputs(comm, count, seed + call)
            alltoall_lsa[blocks, threads](dcomm, send, win, count)
            comm.synchronize()
            out.append((recv.get(), inputs[:, comm.rank].reshape(-1)))
    return out


def run_poison(comm, count: int = 256, blocks: int = 2, threads: int = 128, calls: int = 5, seed: int = 0):
    """``calls`` all-to-alls of :func:`alltoall_lsa_poison` over three rotating windows; as :func:`run`."""
    _check_one_team(comm, "alltoall_lsa_poison")
    size = comm.nranks * count * 4
    bufs = [comm.alloc(size, np.uint32) for _ in range(3)]
    for b in bufs:
        b.set(np.full(size, POISON, np.uint32))
    out = []
    with comm.register(bufs[0]) as w0, comm.register(bufs[1]) as w1, comm.register(bufs[2]) as w2, \
            comm.device_communicator(lsa_barrier_count=blocks) as dcomm:
        windows = (w0, w1, w2)
        for call in range(calls):
            inputs, send = _inputs(comm, count, seed + call)
            alltoall_lsa_poison[blocks, threads](dcomm, send, windows[call % 3], bufs[(call + 2) % 3], count,
                                                 call < 2)
            comm.synchronize()
            out.append((bufs[call % 3].get(), inputs[:, comm.rank].reshape(-1)))
    return out


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("alltoall_lsa", run,
               "all-to-all of 16-byte elements within an LSA team, a barrier per call (NCCL's "
               "lsa_simple_alltoall)")
