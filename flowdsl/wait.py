"""Bounded device-side waits: every spin in flowdsl gives up after the communicator's timeout.

A spin loop that waits for a peer (a flag, a counter, a signal, a barrier) calls
:func:`poll` once per iteration with what it waits for. Every :data:`CHECK_EVERY`
iterations ``poll`` reads the GPU's ``%globaltimer`` and the device communicator's
*wait record* (host-mapped memory the host reads while kernels run): when the
communicator was aborted (``comm.abort()``), or when this wait has lasted longer
than the timeout (``flowdsl.init(wait_timeout=...)``, ``FLOWDSL_WAIT_TIMEOUT``),
``poll`` returns :data:`GAVE_UP` and the loop must stop waiting. The first wait to
time out writes the record (rank, block, thread, what it waited on, the expected
and last seen value, the peer); from then on every wait of the communicator gives
up at its next check, so the kernel runs to its end (no trap: a trap would poison
the CUDA context) and the host raises :class:`flowdsl.DeviceTimeoutError` from the
record at ``comm.synchronize()``. Results of a kernel that gave up are garbage.

The loop shape, in any kernel (``comm`` is the device communicator)::

    state = uint64(0)
    seen = mem.load_acquire(flags, i, ThreadScope.SYSTEM)
    while seen < expected:
        state = wait.poll(comm, state, wait.USER, peer, i, expected, seen)
        if state == wait.GAVE_UP:
            break
        seen = mem.load_acquire(flags, i, ThreadScope.SYSTEM)

The waits inside the support library (LSA barriers, ``gin.wait_signal``,
``gin.wait_counter``, GIN and hybrid barriers, ``cft.wait_counted``, CFT barriers)
use the same check and record. On
the simulator, a planted hang in a bounded wait raises
:class:`flowdsl.sim.WaitTimeoutError` (a :class:`flowdsl.DeviceTimeoutError`) with the
same diagnosis.
"""

from __future__ import annotations

import numpy as np

from ._spec import COMM, INT, MEM_ARRAY, CFunction
from ._stubs import primitive

__all__ = ["poll", "accepted", "GAVE_UP", "CHECK_EVERY", "PRIMITIVE_NAMES", "USER", "FLOW_CREDIT", "FLOW_READY", "LL_LINE",
           "LL128_LINE", "LSA_BARRIER", "GIN_SIGNAL", "GIN_COUNTER", "GIN_BARRIER", "HYBRID_BARRIER", "CFT_COUNTER",
           "CFT_BARRIER", "WORLD_GIN_BARRIER"]

#: Tells the simulator that this module's functions are device code.
__flowdsl_device_module__ = True

#: What :func:`poll` returns once the wait must stop (the communicator gave up or was aborted).
GAVE_UP = np.uint64(0xFFFFFFFFFFFFFFFF)
#: Spins between two reads of the timer and the record (a power of two): the hot path pays a counter.
CHECK_EVERY = 1024

# What a wait waits on (the record's ``primitive`` field; the values are shared with prebuilt/src).
USER = 0
FLOW_CREDIT = 1
FLOW_READY = 2
LL_LINE = 3
LL128_LINE = 4
LSA_BARRIER = 5
GIN_SIGNAL = 6
GIN_COUNTER = 7
GIN_BARRIER = 8
HYBRID_BARRIER = 9
CFT_COUNTER = 10
CFT_BARRIER = 11
WORLD_GIN_BARRIER = 12

#: Record code -> what the diagnosis calls it (the ``index`` field says which one).
PRIMITIVE_NAMES = {
    USER: "a kernel's own wait (flowdsl.wait.poll), index",
    FLOW_CREDIT: "flow credit (the receiver freeing a slot) on connection",
    FLOW_READY: "flow ready flag or signal (the sender posting a slot) on connection",
    LL_LINE: "LL line flag, line",
    LL128_LINE: "LL128 line flag, line",
    LSA_BARRIER: "lsa barrier wait, barrier",
    GIN_SIGNAL: "gin.wait_signal, signal",
    GIN_COUNTER: "gin.wait_counter, counter",
    GIN_BARRIER: "gin rail barrier sync, barrier",
    HYBRID_BARRIER: "gin hybrid barrier sync, barrier",
    CFT_COUNTER: "cft.wait_counted, counter at byte offset",
    CFT_BARRIER: "cft barrier wait, barrier",
    WORLD_GIN_BARRIER: "gin world barrier sync, barrier",
}


@primitive(extern="flowdsl_wait_check",
           c=CFunction("uint64", (("ptr", "record"), ("uint64", "state"), ("int", "what"), ("int", "peer"),
                       ("uint32", "index"), ("uint64", "expected"), ("uint64", "seen")),
                       "One check of a bounded wait (flowdsl.wait.poll): the wait's next state, or all ones to "
                       "give up."),
           comm=COMM, state=INT, what=INT, peer=INT, index=INT, expected=INT,
           seen=INT)
def poll(comm, state, what, peer, index, expected, seen):
    """One iteration of a bounded wait; returns the wait's next ``state`` or :data:`GAVE_UP`.

    Start a wait with ``state = uint64(0)`` and pass back what ``poll`` returned.
    ``what`` says what is waited on (:data:`USER` in a kernel's own loops), ``peer`` the
    world rank expected to act (-1: none in particular), ``index`` which flag, signal or
    barrier, ``expected`` and ``seen`` the awaited and the last read value: they go into
    the record when this wait is the first to time out. Costs a counter per iteration;
    every :data:`CHECK_EVERY` iterations one ``%globaltimer`` read and two loads of
    host-mapped memory.
    """


@primitive(view=MEM_ARRAY, index=INT, count=INT, peer=INT)
def accepted(view, index, count, peer):
    """Says that the ``count`` words ``view[index:index+count]`` that a wait just took as fresh (an LL
    line whose flag matched, an LL128 line, a one-shot line) were written by world rank ``peer``
    for this very call. A wait that takes data by a flag ends with it.

    Costs nothing on the GPU (no code), where a stale line cannot be told from a fresh one. The
    simulator knows who wrote each word in which launch: a word written by another rank, or in
    another call (the writer's launch number is not the reader's: every rank makes the same
    calls), raises :class:`flowdsl.sim.StaleDataError` naming the line, the writer's and the
    reader's calls. That is how a flag the two ends count differently (per block, per grid, or
    one that wraps onto an old line) is caught where the bits happen to match.
    """
