"""What ``flowdsl.wait`` does in the simulator: ``poll`` notes the bounded wait a spin loop is in.

The simulator has no wall clock to time out by: a poll never gives up (unless the communicator
was aborted); when nothing can make progress, :mod:`flowdsl.sim.timeouts` reports the noted
waits as the GPU's timeout would.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import wait
from .scheduler import _SIM_DIR, _STUBS_FILE
from .semantics import current, implements
from .timeouts import note

__all__: list[str] = []


@implements("flowdsl.wait.poll")
def _poll(comm, state, what, peer, index, expected, seen):
    t = current()
    note(t, int(what), int(peer), int(index), expected, seen, frame=_caller())
    if getattr(comm.comm, "aborted", False):
        return wait.GAVE_UP
    return np.uint64((int(state) + 1) % (1 << 63))  # never GAVE_UP: the scheduler decides when nothing moves


def _caller():
    """The frame of the device code that called the primitive (the spin loop's)."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(_SIM_DIR) or f.f_code.co_filename == _STUBS_FILE):
        f = f.f_back
    return f
