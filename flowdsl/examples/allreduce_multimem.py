"""All-reduce over multimem (NVLink SHARP): NCCL's three multicast all-reduce kernels as flowdsl kernels.

Ports of NCCL's ``contrib/custom_algos/allreduce`` kernels, written from their algorithms. Every rank of one LSA
team holds ``lines`` 16-byte lines of float32 (four values a line) in a symmetric send window; the all-reduce sums
them over the team. The switch does the adding: one ``multimem.ld_reduce`` of a line's multicast address
(:func:`flowdsl.mem.multimem_ld_reduce_vec`) returns the line summed over every member's copy, and one
``multimem.st`` (:func:`flowdsl.mem.multimem_store_vec`) writes a line into every member's copy.

- :func:`oneshot_mc_allreduce` (NCCL's ``oneshot_mc_allreduce_kernel``): every rank loads every line reduced,
  with a grid-stride loop, into a local output array. No barrier: the host meets the other ranks before the
  launch (every input is in place) and after it (no peer still reads this rank's input when the next call
  writes it), as NCCL's driver does with ``MPI_Barrier``.
- :func:`twoshot_mc_allreduce` (``twoshot_mc_simple_allreduce_kernel``): rank ``r`` owns the ``r``-th of
  ``lsa_size`` equal chunks of the lines and the grid's blocks split it; each line of it is loaded reduced and at
  once stored into every member's receive window (reduce-scatter and all-gather fused per line). An LSA barrier
  per block (arrive with release, wait with acquire) then makes every rank's stores visible before the kernel
  ends. ``lines`` must be a multiple of ``lsa_size``.
- :func:`twoshot_mc_poison_allreduce` (``twoshot_mc_poison_allreduce_kernel``, Lamport-style completion): the
  same fused loop with no barrier in steady state. The last float (``.w``) of every receive line holds
  :data:`POISON` (a NaN's bits) until the line lands; each rank polls the ``.w`` of every line of its own copy
  (split over the active blocks, a relaxed system-scope load of it as uint32, bounded), then puts the poison back
  into the receive window of the call before, which no peer writes any more. Three receive windows rotate: call
  ``i`` receives into window ``i % 3`` and clears window ``(i + 2) % 3``; the first two calls meet at an LSA
  barrier first, so that every rank has poisoned its windows before any peer writes into them. A sum must never
  have the poison's bits as its ``.w`` (a sum of finite numbers never does).

Why the poison kernel is correct, and what the simulator models of it: a line is written with one 16-byte store
through the multicast address, and a poll that sees its ``.w`` changed takes the whole line. That holds on the
GPU because NVLink and HBM carry a 16-byte store as one transaction (PTX's memory model itself promises no more
than one access per element of a vector). flowdsl writes the line with
:func:`flowdsl.mem.multimem_store_vec_relaxed` (``multimem.st.relaxed.sys.global.v4.f32``): the simulator lands
its 16 bytes in every member's copy at one instant, each element a relaxed atomic store for the race detector,
so the relaxed poll of ``.w`` is no data race and sees the line whole or not at all. NCCL's kernel stores with
the weak ``multimem.st``; polled so, that is a data race under PTX's memory model, and the simulator reports it
(tested). The poll takes a line as this call's only after :func:`flowdsl.wait.accepted`, which on the simulator
raises :class:`flowdsl.sim.StaleDataError` when the line was written by another call.

Where this port differs from NCCL's code, and why: NCCL's kernel re-poisons, in each rank's *local* copy of the
window to clear, only the lines of that rank's own chunk; the other ranks' chunks of that copy keep the sums of
three calls before, so three calls later the poll passes over them at once and the rank may read a peer's chunk
before the peer has written it (NCCL's driver checks with the same input every call, where a stale line cannot
be told from a fresh one). Here each block re-poisons the lines it polled, so every line of a rank's own copy is
poisoned before the window is received into again; with NCCL's range the simulator reports the stale line
(tested). The re-poison is a relaxed store (:func:`flowdsl.mem.store_relaxed`) where NCCL's is a plain one: the
peers' stores into the line and this rank's polls are relaxed, nothing else orders them, and a plain store among
them is a data race.

Each ``run_*`` makes several calls on one device communicator with new random inputs each call and returns
``[(result, reference)]``: the summed lines, and NumPy's float32 sum of every rank's input in LSA rank order (the
simulated switch adds in that order; a GPU's switch may add in another, within float32 rounding). The device
communicator is made with ``lsa_multimem=True``: refused where the GPUs have no NVLink SHARP (the simulator
models a switch with ``spawn(..., multimem=True)``).
"""

from __future__ import annotations

import contextlib

import numpy as np
from numba import cuda, uint32, uint64

import flowdsl
from flowdsl import MemoryOrder, RedOp, ThreadScope, coop, lsa, mem, team, wait

__all__ = ["oneshot_mc_allreduce", "twoshot_mc_allreduce", "twoshot_mc_poison_allreduce", "POISON", "run",
           "run_oneshot", "run_twoshot", "run_poison", "main"]

#: The ``.w`` bits of a receive line that has not landed (the value NCCL's kernel uses; a NaN as float32).
POISON = 0xFFFAFFFA
_SYS = ThreadScope.SYSTEM


@flowdsl.kernel
def oneshot_mc_allreduce(comm, out, send_win, lines):
    every = lsa.multimem_view(comm, send_win)  # every member's send window at once
    for i in range(cuda.threadIdx.x + cuda.blockDim.x * cuda.blockIdx.x, lines, cuda.blockDim.x * cuda.gridDim.x):
        mem.store_vec(out, 4 * i, mem.multimem_ld_reduce_vec(every, 4 * i, RedOp.SUM))


@flowdsl.device
def _block_part(comm, lines):
    """``(first line of this rank's chunk, this block's [start, end) within the chunk, lines per block)``."""
    chunk = lines // comm.lsa_size
    per_block = (chunk + cuda.gridDim.x - 1) // cuda.gridDim.x
    start = cuda.blockIdx.x * per_block
    return comm.lsa_rank * chunk, start, min(start + per_block, chunk), per_block


@flowdsl.kernel
def twoshot_mc_allreduce(comm, send_win, recv_win, lines):
    mine, start, end, _ = _block_part(comm, lines)
    if start >= end:
        return  # a block past the chunk's end (on every rank alike)
    send = lsa.multimem_view(comm, send_win)
    recv = lsa.multimem_view(comm, recv_win)
    # Reduce-scatter and all-gather, fused per line: this rank's chunk summed and stored into every member.
    for i in range(mine + start + cuda.threadIdx.x, mine + end, cuda.blockDim.x):
        mem.multimem_store_vec(recv, 4 * i, mem.multimem_ld_reduce_vec(send, 4 * i, RedOp.SUM))
    # Every rank's stores are visible in every member once its blocks passed this barrier.
    bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
    bar.arrive(MemoryOrder.RELEASE)
    bar.wait(MemoryOrder.ACQUIRE)


@flowdsl.device
def repoison(comm, clear_win, lines, first, last):
    """The poison back into the ``.w`` of lines ``[first, last)`` of this rank's copy of ``clear_win`` (the lines
    this block polled; ``comm`` and ``lines`` tell a block which lines NCCL's kernel clears instead)."""
    old = lsa.local_view(clear_win, 0, -1, uint32)
    for i in range(first + cuda.threadIdx.x, last, cuda.blockDim.x):
        mem.store_relaxed(old, 4 * i + 3, uint32(POISON), _SYS)


@flowdsl.kernel
def twoshot_mc_poison_allreduce(comm, send_win, recv_win, clear_win, lines, first_calls):
    mine, start, end, per_block = _block_part(comm, lines)
    if start >= end:
        return
    active = (lines // comm.lsa_size + per_block - 1) // per_block  # blocks with a part of the chunk
    if first_calls:  # every rank has poisoned this window before any peer writes into it
        bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
        bar.arrive(MemoryOrder.RELEASE)
        bar.wait(MemoryOrder.ACQUIRE)
    send = lsa.multimem_view(comm, send_win)
    recv = lsa.multimem_view(comm, recv_win)
    # Reduce-scatter and all-gather, fused per line; each line lands whole in every member (its .w last poisoned).
    for i in range(mine + start + cuda.threadIdx.x, mine + end, cuda.blockDim.x):
        mem.multimem_store_vec_relaxed(recv, 4 * i, mem.multimem_ld_reduce_vec(send, 4 * i, RedOp.SUM), _SYS)
    # Poll: every line of this rank's copy, split over the active blocks, until its .w is no longer the poison.
    per_poll = (lines + active - 1) // active
    first = min(cuda.blockIdx.x * per_poll, lines)
    last = min(first + per_poll, lines)
    words = lsa.local_view(recv_win, 0, 4 * lines, uint32)
    chunk = lines // comm.lsa_size
    for i in range(first + cuda.threadIdx.x, last, cuda.blockDim.x):
        owner = team.rank_to_world(comm, team.lsa(comm), i // chunk)
        state = uint64(0)
        seen = mem.load_relaxed(words, 4 * i + 3, _SYS)
        while seen == uint32(POISON):
            state = wait.poll(comm, state, wait.USER, owner, 4 * i + 3, 0, seen)
            if state == wait.GAVE_UP:
                break
            seen = mem.load_relaxed(words, 4 * i + 3, _SYS)
        wait.accepted(words, 4 * i, 4, owner)  # the line is this call's, written by its chunk's owner
    # Clear: the lines this block polled, in the window received into a call before (no peer writes it any more).
    repoison(comm, clear_win, lines, first, last)


def _check_one_team(comm, name):
    lsa_size = getattr(comm, "lsa_size", comm.nranks)  # the simulator's; a GPU communicator does not tell yet
    if lsa_size != comm.nranks:
        raise flowdsl.UsageError(f"Cannot run {name} on {comm.nranks} ranks in LSA teams of {lsa_size}: its "
                                 "multicast address reaches one LSA team. Run it within one node")


def _inputs(comm, lines, seed):
    """Every rank's seeded float32 input (``[rank, 4 * lines]``) and NumPy's sum of them in rank order."""
    inputs = np.random.default_rng(seed).standard_normal((comm.nranks, 4 * lines)).astype(np.float32)
    reference = np.zeros(4 * lines, np.float32)
    for x in inputs:  # the order the simulated switch adds in: LSA rank 0 first
        reference += x
    return inputs, reference


def _check_lines(name, lines, multiple):
    if lines < 1 or lines % multiple:
        raise flowdsl.UsageError(f"Cannot run {name} with lines={lines}: each rank owns an equal chunk of the "
                                 f"16-byte lines. Use a positive multiple of {multiple}")


def run_oneshot(comm, lines: int = 256, blocks: int = 2, threads: int = 128, calls: int = 3, seed: int = 0):
    """``calls`` all-reduces of :func:`oneshot_mc_allreduce` on one device communicator (new inputs each);
    ``[(result, reference)]`` per call for this rank."""
    _check_one_team(comm, "oneshot_mc_allreduce")
    _check_lines("oneshot_mc_allreduce", lines, 1)
    send, out = comm.alloc(4 * lines, np.float32), comm.alloc(4 * lines, np.float32)
    results = []
    with comm.register(send) as send_win, \
            comm.device_communicator(lsa_multimem=True) as dcomm:
        for call in range(calls):
            inputs, reference = _inputs(comm, lines, seed + call)
            comm.barrier()  # no peer still reads this rank's input of the last call
            send.set(inputs[comm.rank])
            out.set(np.full(4 * lines, np.nan, np.float32))
            comm.barrier()  # every rank's input is in place before a switch reads it
            oneshot_mc_allreduce[blocks, threads](dcomm, out, send_win, lines)
            comm.synchronize()
            results.append((out.get(), reference))
    return results


def run_twoshot(comm, lines: int = 256, blocks: int = 2, threads: int = 128, calls: int = 3, seed: int = 0):
    """``calls`` all-reduces of :func:`twoshot_mc_allreduce` (new inputs each; ``lines`` a multiple of the
    ranks); as :func:`run_oneshot`."""
    _check_one_team(comm, "twoshot_mc_allreduce")
    _check_lines("twoshot_mc_allreduce", lines, comm.nranks)
    send, recv = comm.alloc(4 * lines, np.float32), comm.alloc(4 * lines, np.float32)
    results = []
    with comm.register(send) as send_win, comm.register(recv) as recv_win, \
            comm.device_communicator(lsa_barrier_count=blocks, lsa_multimem=True) as dcomm:
        for call in range(calls):
            inputs, reference = _inputs(comm, lines, seed + call)
            send.set(inputs[comm.rank])  # the kernel's barrier: no peer reads it any more
            recv.set(np.full(4 * lines, np.nan, np.float32))
            comm.barrier()  # every input in place, every rank done reading its last result
            twoshot_mc_allreduce[blocks, threads](dcomm, send_win, recv_win, lines)
            comm.synchronize()
            results.append((recv.get(), reference))
    return results


def run_poison(comm, lines: int = 256, blocks: int = 2, threads: int = 128, calls: int = 5, seed: int = 0):
    """``calls`` all-reduces of :func:`twoshot_mc_poison_allreduce` over three rotating receive windows, with no
    host barrier between them: every call's input has its own send window, all written before one host barrier
    (the kernel itself has none to tell when a peer stopped reading an input); as :func:`run_oneshot`."""
    _check_one_team(comm, "twoshot_mc_poison_allreduce")
    _check_lines("twoshot_mc_poison_allreduce", lines, comm.nranks)
    poisoned = np.zeros((lines, 4), np.float32)
    poisoned[:, 3] = np.array([POISON], np.uint32).view(np.float32)[0]
    recvs = [comm.alloc(4 * lines, np.float32) for _ in range(3)]
    for r in recvs:
        r.set(poisoned.reshape(-1))
    sends, references = [], []
    for call in range(calls):
        inputs, reference = _inputs(comm, lines, seed + call)
        sends.append(comm.alloc(4 * lines, np.float32))
        sends[-1].set(inputs[comm.rank])
        references.append(reference)
    results = []
    with contextlib.ExitStack() as windows:
        send_wins = [windows.enter_context(comm.register(s)) for s in sends]
        rotating = [windows.enter_context(comm.register(r)) for r in recvs]
        dcomm = windows.enter_context(comm.device_communicator(lsa_barrier_count=blocks, lsa_multimem=True))
        comm.barrier()  # every input written and every window poisoned before the first call
        for call in range(calls):
            twoshot_mc_poison_allreduce[blocks, threads](dcomm, send_wins[call], rotating[call % 3],
                                                         rotating[(call + 2) % 3], lines, call < 2)
            comm.synchronize()
            results.append((recvs[call % 3].get(), references[call]))  # before the next call clears it
    return results


def run(comm, lines: int = 256, blocks: int = 2, threads: int = 128, seed: int = 0):
    """The three kernels one after another on ``comm`` (``lines`` a multiple of the ranks);
    ``[(result, reference)]`` of every call of each."""
    return (run_oneshot(comm, lines, blocks, threads, seed=seed) + run_twoshot(comm, lines, blocks, threads, seed=seed)
            + run_poison(comm, lines, blocks, threads, seed=seed))


WHAT = ("every rank's float32 lines summed by the NVLink SHARP switch: one-shot, two-shot with a barrier, two-shot "
        "with poisoned lines (NCCL's contrib/custom_algos/allreduce)")


def main(argv: list[str] | None = None) -> int:
    """``python -m flowdsl.examples.allreduce_multimem``: the three kernels, checked against NumPy. On the
    simulator with a switch in the node; on GPUs without NVLink SHARP it refuses in one line (status 2)."""
    from flowdsl.examples import _cli  # noqa: PLC0415

    return _cli.main("allreduce_multimem", lambda comm: run(comm, lines=64 * comm.nranks), WHAT, argv=argv,
                     multimem=True)


if __name__ == "__main__":
    import sys

    sys.exit(main())
