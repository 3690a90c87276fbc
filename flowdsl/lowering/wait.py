"""How bounded waits (``flowdsl.wait.poll``) compile.

The iteration count lives in the low bits of the wait's state and costs a few
integer operations a spin; every ``CHECK_EVERY`` spins the support library's
``flowdsl_wait_check`` reads the timer and the wait record (the same check the
library's own bounded waits make). The check gets the communicator's wait record alone
(:func:`flowdsl.lowering.intrinsics.wait_record_ptr`): a function that waits keeps one word of
the communicator live, not the ~26 of its struct, so Flow's out-of-line waits and steps are
not passed the rest.
"""

from __future__ import annotations

from numba import int32, uint32, uint64
from numba.cuda.extending import overload

from .. import wait
from .checks import check
from .declarations import extern
from .intrinsics import wait_record_ptr

__all__: list[str] = []

_SPINS = uint64(wait.CHECK_EVERY - 1)
_START = ~_SPINS


@overload(wait.poll)
def wait_poll(comm, state, what, peer, index, expected, seen):
    check(wait.poll, comm, state, what, peer, index, expected, seen)
    fn = extern(wait.poll)

    def impl(comm, state, what, peer, index, expected, seen):
        spins = (uint64(state) + uint64(1)) & _SPINS
        now = (uint64(state) & _START) | spins
        if spins == uint64(1):
            now = fn(wait_record_ptr(comm), now, int32(what), int32(peer), uint32(index), uint64(expected),
                     uint64(seen))
        return now
    return impl


@overload(wait.accepted)
def wait_accepted(view, index, count, peer):
    check(wait.accepted, view, index, count, peer)

    def impl(view, index, count, peer):  # the simulator's check only: no code on the GPU
        return None
    return impl
