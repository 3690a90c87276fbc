"""Bounded waits on the simulator: what a GPU's timeout would have recorded, for the same programs.

The simulator has no wall clock to time out by. Instead every bounded wait notes
what it waits for (:func:`note`: ``flowdsl.wait.poll`` in spin loops, the LSA
barrier, GIN and CFT waits before they block); when the scheduler finds that nothing
can make progress (a deadlock or a livelock), :func:`as_timeout` turns its report
into a :class:`~flowdsl.sim.errors.WaitTimeoutError` whose message starts with the
diagnosis a GPU's wait record gives (:meth:`flowdsl.DeviceTimeoutError.describe`,
one record per rank: the first stuck thread of each), followed by the
simulator's own report. ``comm.abort()`` ends these waits as it ends a GPU's
(:func:`abort`: those watch the stop word): a blocked wait of an aborted
communicator gives up. The scheduler calls :func:`as_timeout`; this module imports
neither it nor the primitives' table.
"""

from __future__ import annotations

import sys

from .. import wait
from ..errors import DeviceTimeoutError
from . import _state
from .errors import WaitTimeoutError

__all__ = ["note", "note_bounded", "aborted", "abort", "as_timeout"]


def note(task, what: int, peer: int, index: int, expected, seen, wait_obj=None, frame=None, cond=None,
         comm=None) -> None:
    """``task`` waits for ``what`` (a :mod:`flowdsl.wait` code); valid while it blocks in ``wait_obj``
    (on ``cond``, for device communicator ``comm``) or, for a spin loop, while ``frame`` is on its stack."""
    notes = _state.sched.bounded_waits
    notes[task] = (what, int(peer), int(index), expected, seen, wait_obj, frame, cond, comm)


def note_bounded(task, what: str, peer, index, expected, seen, wait_obj, cond, comm) -> bool:
    """``task`` is about to block in ``wait_obj`` on ``cond``, in a wait a GPU bounds, of kind
    ``wait.<what>`` (``"LSA_BARRIER"``, ...), of device communicator ``comm``.

    Returns True when that communicator was aborted: the wait gives up instead of blocking."""
    note(task, getattr(wait, what), peer, index, expected, seen, wait_obj=wait_obj, cond=cond, comm=comm)
    return aborted(comm)


def aborted(comm) -> bool:
    """Whether the host communicator of device communicator ``comm`` was aborted (``comm.abort()``)."""
    return getattr(getattr(comm, "comm", None), "aborted", False)


def abort(host_comm) -> int:
    """``host_comm.abort()`` was called: the threads blocked in a bounded wait of its device
    communicators wake, and their waits give up (:func:`note_bounded`). Returns how many woke."""
    sched = _state.sched
    woken = 0
    for task in list(sched.bounded_waits):
        entry = _current(sched, task)
        if entry is None or entry[5] is None or getattr(entry[8], "comm", None) is not host_comm:
            continue  # not blocked in one (a polling wait gives up at its next poll)
        if task in entry[7].waiters:
            entry[7].waiters.remove(task)
        sched.wake(task)
        woken += 1
    return woken


def _on_stack(task, frame) -> bool:
    if task is _state.cur:  # the running greenlet has no gr_frame: its stack is this one
        f = sys._getframe(1)
    else:
        f = task.gl.gr_frame if task.gl is not None else None
    while f is not None:
        if f is frame:
            return True
        f = f.f_back
    return False


def _current(sched, task):
    """The bounded wait ``task`` is stuck in, or None."""
    entry = sched.bounded_waits.get(task)
    if entry is None or task.done or getattr(task, "blk", None) is None:  # a kernel thread's
        return None
    wait_obj, frame = entry[5], entry[6]
    if wait_obj is not None:
        return entry if task.waiting is wait_obj else None
    return entry if task.waiting is None and _on_stack(task, frame) else None


def as_timeout(sched, error):
    """``error`` (a deadlock or livelock report) as a :class:`WaitTimeoutError` when threads are
    stuck in bounded waits; else ``error`` itself."""
    first = {}
    for task in sched.tasks:
        entry = _current(sched, task)
        if entry is not None and task.rank not in first:
            first[task.rank] = (task, entry)
    if not first:
        return error
    records = []
    for rank in sorted(first):
        task, (what, peer, index, expected, seen, *_) = first[rank]
        seen = seen() if callable(seen) else seen
        records.append(dict(rank=rank, block=task.blk.lin, thread=task.lin,
                            primitive=wait.PRIMITIVE_NAMES.get(what, f"wait kind {what}"), index=index, peer=peer,
                            expected=int(expected), seen=int(seen)))
    context = f" ({sched.seed_line()})"
    cycle = unmirrored_ends(getattr(sched.world, "flow_connections", {})) or credit_cycle(records) or \
        crossed_ends(records)
    lines = [DeviceTimeoutError.describe("finish the simulation", **rec, context=context if i == 0 else "",
                                         fix=i == 0 and not cycle)  # the seed once, on the first line
             for i, rec in enumerate(records)]
    if cycle:
        lines.append(cycle)
    message = "\n".join(lines) + "\nThe simulator's report:\n" + str(error)
    if cycle:  # the diagnosis again where a long report ends, next to the line that raised it
        message += f"\nSo: {cycle}"
    exc = WaitTimeoutError(message, **records[0])
    exc.seed = sched.seed
    exc.rank = records[0]["rank"]
    return exc


def unmirrored_ends(ends) -> str:
    """When a rank sends to a peer on a channel as ``flow.connect(proc, peer, n, m)`` and that peer receives from
    it on that channel, but never as ``(m, n)`` (``ends``: the connections the steps started on, noted by
    ``flow.connection_ends``), what that means and its fix; else "". Only a pair whose both ends have started a
    step is judged: a peer that has not reached its receive yet is not a mismatch."""
    for (rank, peer, channel, sending), pairs in sorted(ends.items()):
        if not sending:
            continue
        theirs = ends.get((peer, rank, channel, False))
        if not theirs:
            elsewhere = sorted((c, next(iter(p.values()))) for (r, q, c, s), p in ends.items()
                               if (r, q, s) == (peer, rank, False) and c != channel)
            if elsewhere:  # the receiver takes from this rank, but on another channel
                (their_channel, their_line), line = elsewhere[0], next(iter(pairs.values()))
                return (f"The two ends of a Flow connection are on different channels: rank {rank} sends to rank "
                        f"{peer} on channel {channel} at {line}, and rank {peer} receives from rank {rank} on channel "
                        f"{their_channel} at {their_line}. Both ends of a connection use one channel: pass the same "
                        "channel= to flow.processor on both (by default a processor's channel is its block's index). "
                        "No peer is missing and a longer wait limit will not help.")
            continue
        for (number, remote), line in sorted(pairs.items()):
            if (remote, number) in theirs:
                continue
            (their_number, their_remote), their_line = sorted(theirs.items())[0]
            return (f"The two ends of a Flow connection do not mirror each other: rank {rank} sends to rank {peer} on "
                    f"channel {channel} as flow.connect(proc, {peer}, {number}, {remote}) at {line}, and rank {peer} "
                    f"receives from rank {rank} on that channel as flow.connect(proc, {rank}, {their_number}, "
                    f"{their_remote}) at {their_line}. A receiver's number is its sender's remote_number and its "
                    f"remote_number the sender's number: on rank {peer}, flow.connect(proc, {rank}, {remote}, "
                    f"{number}). No peer is missing and a longer wait limit will not help.")
    return ""


def crossed_ends(records) -> str:
    """When a rank waits for a peer's slots while that peer waits for this rank to free one (the two ends of
    one connection, each waiting for the other), what that means and its fix; else "". Both ends of one
    connection cannot wait so (the sender's slots would be the receiver's data): the sender fills an inbox the
    receiver does not read."""
    credit, ready = wait.PRIMITIVE_NAMES[wait.FLOW_CREDIT], wait.PRIMITIVE_NAMES[wait.FLOW_READY]
    waits = {(rec["rank"], rec["primitive"]): rec for rec in records if rec["peer"] >= 0}
    for (rank, kind), rec in sorted(waits.items()):
        other = waits.get((rec["peer"], credit))
        if kind == ready and other is not None and other["peer"] == rank:
            return (f"Rank {rank} waits for slots from rank {rec['peer']} on its inbox {rec['index']}, and rank "
                    f"{rec['peer']} waits for rank {rank} to free a slot of its connection {other['index']}: each "
                    "end waits for the other, so no peer is late and a longer wait limit will not help. Either the "
                    "connection numbers do not match (the sender's remote_number must be the receiver's number, "
                    "and the receiver's remote_number the sender's number: flow.connect(proc, peer, number, "
                    "remote_number)), or the two ends are on different channels (flow.processor's channel).")
    return ""


def credit_cycle(records) -> str:
    """When ranks wait for Flow credits from each other around a cycle (rank a for b's, b for c's, ...
    back to a), what that is and its fix; else "". Every rank is there: none is late, each filled the
    next one's inbox before taking from its own."""
    credit = wait.PRIMITIVE_NAMES[wait.FLOW_CREDIT]
    waits_on = {rec["rank"]: rec["peer"] for rec in records if rec["primitive"] == credit and rec["peer"] >= 0}
    for start in sorted(waits_on):
        path, rank = [start], waits_on[start]
        while rank in waits_on and rank not in path:
            path.append(rank)
            rank = waits_on[rank]
        if rank == start and len(path) > 1:
            ring = " -> ".join(f"rank {r}" for r in path + [start])
            return (f"These waits form a cycle of full inboxes ({ring}: each rank waits for the next to free a slot, "
                    "and each sent more than the next one's slots hold before receiving anything). No peer is missing "
                    "and a longer wait limit will not help. Send in chunks of at most nslots // 2 slots and receive "
                    "between them, as the ring programs do (docs/flow.md, Deadlock), or send and receive from "
                    "different blocks.")
    return ""
