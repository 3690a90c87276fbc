"""What ``flowdsl.wait`` does in the simulator: ``poll`` notes the bounded wait a spin loop is in;
``accepted`` checks that what a wait took by its flag was written for the reader's call.

The simulator has no wall clock to time out by: a poll never gives up (unless the communicator
was aborted); when nothing can make progress, :mod:`flowdsl.sim.timeouts` reports the noted
waits as the GPU's timeout would.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import wait
from .._flow_staging import describe_word
from . import _state
from .errors import StaleDataError, sim_error
from .memory import WindowView, address_key
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


@implements("flowdsl.wait.accepted")
def _accepted(view, index, count, peer):
    t = current()
    writers, loaded = _state.sched.last_writer, t.loaded_from
    for k in range(int(index), int(index) + int(count)):
        key = address_key(view, k)
        # What the thread's last strong load of the word returned: the value the wait took (memory may
        # hold this call's data by now, stored over the stale line after the load).
        record = loaded[key] if key in loaded else writers.get(key)
        if record is None and not isinstance(view, WindowView):
            continue  # a kernel's own array: its plain stores are not recorded
        writer = record[0] if record is not None else None
        launch = getattr(writer, "launch", None)
        if launch is None or writer.rank != int(peer) or launch.seq != t.launch.seq:
            raise _stale(view, k, int(peer), writer, t)


def _stale(view, k, peer, writer, t) -> StaleDataError:
    if not isinstance(view, WindowView):
        where = f"word {k} of a device array"
    else:
        word = (view.start + k) * view.itemsize // 8
        place = "" if view.group.staging is None else f" ({describe_word(view.group.staging, word)})"
        where = f"word {word}{place} of {view.group.name()} on rank {view.wrank}"
    reader = f"{t.name()} (kernel {t.launch.name!r}, launch #{t.launch.seq} of rank {t.rank})"
    if writer is None:
        who = "no kernel of this run wrote it (zeroed or host memory)"
    elif getattr(writer, "launch", None) is None:
        who = f"{writer.name()} wrote it last, outside any kernel"
    else:
        who = (f"{writer.name()} wrote it last, in kernel {writer.launch.name!r} (launch #{writer.launch.seq} of "
               f"rank {writer.rank})")
    if isinstance(view, WindowView):  # the raw word: reading it through the view would count as an access
        word = np.asarray(view)[k:k + 1]
        who += f" (it holds {int(word.view(f'u{word.itemsize}')[0]):#x})"
    expect = f"rank {peer}'s launch #{t.launch.seq}"
    err = sim_error(StaleDataError, (
        f"Cannot take {where} as fresh data from rank {peer}: {who}, but {reader} waited for what "
        f"{expect} writes. Its flag matched by accident: the writer and the reader count flags differently "
        "(a counter per block or per grid, one that depends on the call's count or dtype, or one that wraps onto "
        "an old line). Fix: derive the flag from a count both ends keep for the whole connection or window, on "
        "the device, that never repeats while an old line can still hold it (flowdsl.flow.ll_flag and "
        "ll_cleans; docs/flow.md, Freshness)"))
    err.writer = None if writer is None else who
    err.reader = reader
    return err
