"""How bounded waits (``flowdsl.wait.poll``) compile.

The iteration count lives in the low bits of the wait's state and costs a few
integer operations a spin; every ``CHECK_EVERY`` spins the support library's
``flowdsl_wait_check`` reads the timer and the wait record (the same check the
library's own bounded waits make).
"""

from __future__ import annotations

from numba import int32, uint32, uint64
from numba.cuda.extending import overload

from .. import wait
from .checks import expect, expect_int
from .declarations import DECLARED
from .intrinsics import devcomm_ptr
from .types import DevCommType

__all__ = ["bind"]

_SPINS = uint64(wait.CHECK_EVERY - 1)
_START = ~_SPINS


def bind():
    """Register the overload of ``flowdsl.wait.poll``."""
    check = DECLARED["flowdsl_wait_check"]

    @overload(wait.poll)
    def _poll(comm, state, what, peer, index, expected, seen):
        expect("flowdsl.wait.poll", "a device communicator", comm, DevCommType)
        for name, ty in (("state", state), ("what", what), ("peer", peer), ("index", index),
                         ("expected", expected), ("seen", seen)):
            expect_int("flowdsl.wait.poll", name, ty)

        def impl(comm, state, what, peer, index, expected, seen):
            spins = (uint64(state) + uint64(1)) & _SPINS
            now = (uint64(state) & _START) | spins
            if spins == uint64(1):
                now = check(devcomm_ptr(comm), now, int32(what), int32(peer), uint32(index), uint64(expected),
                            uint64(seen))
            return now
        return impl
