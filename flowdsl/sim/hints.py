"""The fix a deadlock or livelock report suggests, chosen by the kind of wait.

A thread stuck on a GIN signal nobody sends needs other advice than one stuck in an LSA
barrier, a Flow connection or an LL line. :func:`deadlock_hints` reads the blocked tasks'
wait labels, :func:`livelock_hints` where the spinning threads spin (the function of
:mod:`flowdsl.flow` or the kind of value read), and each returns one line per kind found;
:func:`describe_spin` and :func:`describe_element` name what a spinning thread reads.
"""

from __future__ import annotations

import numpy as np

from . import _state

__all__ = ["deadlock_hints", "livelock_hints", "describe_spin", "describe_element"]

_HOST_COLLECTIVES = ("Call the same host collectives (comm.register, comm.device_communicator, comm.barrier and the "
                     "flowdsl.collectives calls) in the same order on every rank; a rank that returned or waits "
                     "elsewhere never arrives.")
_LSA_BARRIER = ("LSA barrier: every rank of the LSA team must arrive at the same barrier index with the same coop "
                "(as many times: a skipped or extra sync leaves the epochs apart).")
_RAIL_BARRIER = ("GIN rail barrier: every rank of the rail team must arrive at the same barrier index, as many times.")
_WORLD_BARRIER = ("GIN world barrier: every rank must arrive at the same barrier index, as many times (ranks of one "
                  "node too: the rail barrier, gin.rail_barrier, awaits one rank per node).")
_CFT_BARRIER = "CFT barrier: every rank of the CFT team must arrive at the same barrier index, as many times."
_BLOCK_BARRIER = ("Block or warp barrier: every thread of the coop (the CTA, the warp's mask) must reach the same "
                  "barrier; threads that returned or took another branch never arrive.")
_SIGNAL = ("GIN signal: no rank sends enough signals to this one: a peer must signal this rank with this signal "
           "index (gin.put(..., remote=gin.signal_inc(i)) or gin.signal) until it reaches the value waited for; "
           "check the peer, the signal index and the number of increments.")
_COUNTER = ("GIN counter: a counter rises when this rank's own puts that name it complete: issue them "
            "(gin.put(..., local=gin.counter_inc(c))) before waiting for that many.")
_FLUSH = "gin.flush waits for this rank's own outstanding GIN operations; they never completed."
_CFT_COUNTED = ("CFT counted write: the sender's put_counted to this window (and counter) never came, or carried "
                "fewer bytes than the wait expects.")
_CFT_SESSION = "CFT session: its operations never completed; a peer must take part in them."
_FLOW_READY = ("Flow (ready): a receive step waits for its sender to post the slot: the peer must run a send step "
               "on the matching connection (its remote_number is this connection's number) once for each step "
               "received, in the same launch order.")
_FLOW_CREDIT = ("Flow (credit): a send step waits for the receiver to free a slot: the peer must run the matching "
                "receive steps (as many as the sends).")
_LL_LINE = ("LL line: the reader spins until the line carries this step's flag, which its writer never stored: a "
            "peer that sends fewer steps, in another protocol, or a collective called differently on that rank.")
_SPIN = "Make sure some thread stores the value the spin loop waits for (with flowdsl.mem.store_release or an atomic)."

#: (prefix of a wait label, hint), in report order.
_WAITS = (
    ("lsa barrier", _LSA_BARRIER), ("gin rail barrier", _RAIL_BARRIER), ("gin world barrier", _WORLD_BARRIER), ("cft barrier", _CFT_BARRIER),
    ("coop.sync", _BLOCK_BARRIER), ("cuda.sync", _BLOCK_BARRIER), ("cuda.", _BLOCK_BARRIER),
    ("gin.wait_signal", _SIGNAL), ("gin.wait_counter", _COUNTER), ("gin.flush", _FLUSH),
    ("cft.wait_counted", _CFT_COUNTED), ("cft", _CFT_SESSION),
)
#: Functions of flowdsl.flow that spin, and their hint.
_FLOW_SPINS = {"_wait_ready": _FLOW_READY, "_wait_credit": _FLOW_CREDIT, "ll_read": _LL_LINE,
               "_ll_take": _LL_LINE, "ll_part": _LL_LINE, "_ll128_arrived": _LL_LINE, "_ll128_flag_wait": _LL_LINE,
               "_ll_wait": _LL_LINE,
               "ll128_part": _LL_LINE}
_FLOW_FILES = ("flow.py:", "_flow_wire.py:")


def _wait_hint(label: str) -> str | None:
    if "(host collective #" in label:
        return _HOST_COLLECTIVES
    if label == "comm.synchronize()":
        return None  # a host waits for its kernels: their own waits carry the hint
    for prefix, hint in _WAITS:
        if label.startswith(prefix):
            return hint
    return _BLOCK_BARRIER if "sync" in label else None


def deadlock_hints(labels) -> list[str]:
    """One hint per kind of wait among ``labels`` (the blocked tasks' wait labels), in a fixed order."""
    found = {_wait_hint(label) for label in labels} - {None}
    order = [_HOST_COLLECTIVES] + [hint for _, hint in _WAITS]
    return [hint for hint in dict.fromkeys(order) if hint in found] or [
        "Fix the synchronisation so that every wait is matched by an arrival."]


def livelock_hints(spins) -> list[str]:
    """One hint per kind of spin: ``spins`` are ``(where, key)`` pairs, ``where`` as
    ``"flow.py:371 (_wait_ready)"`` and ``key`` what the thread last read (a tuple whose first item
    names GIN signals, counters and CFT counters)."""
    hints = []
    for where, key in spins:
        here = where.split(", called from ", 1)[0]  # the library's frame, before the user's call into it
        function = here.rsplit("(", 1)[-1].rstrip(")") if here.startswith(_FLOW_FILES) else ""
        kind = key[0] if isinstance(key, tuple) and key and isinstance(key[0], str) else ""
        hint = (_FLOW_SPINS.get(function) or {"gin-signal": _SIGNAL, "gin-counter": _COUNTER,
                                               "cft-counter": _CFT_COUNTED}.get(kind) or _SPIN)
        if hint not in hints:
            hints.append(hint)
    return hints or [_SPIN]


def describe_spin(key) -> str:
    """What a spinning thread reads, from its spin key: a GIN signal or counter, a CFT counter."""
    kind, *rest = key
    if kind in ("gin-signal", "gin-counter") and len(rest) == 4:
        _, rank, index, value = rest
        return f"GIN {kind[4:]} {index} of rank {rank} == {value}"
    if kind == "cft-counter" and len(rest) == 4:
        wid, rank, offset, value = rest
        return f"the CFT counter at byte {offset} of window #{wid} on rank {rank} == {value}"
    return repr(key)


def describe_element(arr, index) -> str:
    """A deterministic name for element ``index`` of ``arr`` (a window view names itself)."""
    describe = getattr(arr, "describe_element", None)
    if describe is not None:
        return describe(index)
    try:
        flat = int(np.ravel_multi_index(index if isinstance(index, tuple) else (index,), arr.shape))
    except Exception:
        flat = 0
    addr = arr.__array_interface__["data"][0] + flat * arr.itemsize
    sched = _state.sched
    name = sched.world.name_of(addr) if sched is not None and sched.world is not None else None
    return f"{name or 'array'} element {index}"
