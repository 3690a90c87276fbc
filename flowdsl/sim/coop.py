"""What ``flowdsl.coop`` does in the simulator: a :class:`Coop` is the threads of one block that perform
a call together, and the block barrier (or none) they sync on."""

from __future__ import annotations

import numpy as np

from ..coop import bcast_width_refusal
from ..enums import CoopKind
from .checks import KIND_CHECKS, _typeof
from .cudashim import cuda as shim
from .errors import KernelTypingError, UsageError, sim_error
from .scheduler import block_sync
from .semantics import current, implements, run

__all__ = ["Coop", "coop_sync"]

_WITHIN_WARP = (CoopKind.THREAD, CoopKind.WARP, CoopKind.LANES)


class Coop:
    """A cooperative group of threads of one block.

    Attributes:
        kind: :class:`~flowdsl.CoopKind`.
        key: Names its hardware barrier within the block.
        nthreads: Number of threads.
        trank: The creating thread's rank within it.
        members: Linear thread ids of the members (for reports).
    """

    __slots__ = ("kind", "key", "nthreads", "trank", "members", "label", "shape", "synclabel")

    def __init__(self, kind, key, nthreads, trank, members, label):
        self.kind, self.key, self.nthreads, self.trank = kind, key, nthreads, trank
        self.members, self.label = members, label
        self.shape = "cta" if key == ("cta",) else (key, nthreads)
        self.synclabel = f"coop.sync({label})"

    def sync(self):
        return run("flowdsl.coop.sync", self)

    def thread_rank(self):
        return run("flowdsl.coop.thread_rank", self)

    def size(self):
        return run("flowdsl.coop.size", self)

    def __repr__(self):
        return f"<sim Coop {self.label}>"


KIND_CHECKS.register("coop", lambda v: isinstance(v, Coop))


@implements("flowdsl.coop.thread")
def _coop_thread():
    t = current()
    return Coop(CoopKind.THREAD, None, 1, 0, [t.lin], "thread")


def _warp_lanes(t):
    base = t.warp * 32
    return [base + i for i in range(32) if base + i < t.blk.nthreads]


@implements("flowdsl.coop.warp")
def _coop_warp():
    t = current()
    mem = _warp_lanes(t)
    return Coop(CoopKind.WARP, ("warp", t.warp, 0xFFFFFFFF), len(mem), t.lane, mem, f"warp {t.warp}")


@implements("flowdsl.coop.lanes")
def _coop_lanes(mask):
    t = current()
    mask = int(mask) & 0xFFFFFFFF
    if not (mask >> t.lane) & 1:
        raise sim_error(UsageError, f"Cannot make coop.lanes({mask:#x}): the calling lane {t.lane} is not in "
                        "the mask. Only lanes in the mask may call it")
    mem = [m for m in _warp_lanes(t) if (mask >> (m & 31)) & 1]
    trank = bin(mask & ((1 << t.lane) - 1)).count("1")
    return Coop(CoopKind.LANES, ("warp", t.warp, mask), len(mem), trank, mem, f"lanes {mask:#x} of warp {t.warp}")


@implements("flowdsl.coop.tile")
def _coop_tile(n):
    n = int(n)
    if n == 1:
        return _coop_thread()
    if n == 32:
        return _coop_warp()
    return _coop_lanes(((1 << n) - 1) << (current().lane & (32 - n)))


@implements("flowdsl.coop.warp_span")
def _coop_warp_span(first_warp, nwarps, id):
    t = current()
    first_warp, nwarps, id = int(first_warp), int(nwarps), int(id)
    if not 0 <= id < 16:
        raise sim_error(UsageError, f"Cannot make coop.warp_span(..., id={id}): ids are 0..15. Pick one of them")
    if not first_warp <= t.warp < first_warp + nwarps:
        raise sim_error(UsageError, f"Cannot make coop.warp_span({first_warp}, {nwarps}, {id}): the calling "
                        f"thread is in warp {t.warp}. Only threads of the span may make it")
    lo = first_warp * 32
    mem = list(range(lo, min((first_warp + nwarps) * 32, t.blk.nthreads)))
    return Coop(CoopKind.WARP_SPAN, ("span", id), len(mem), t.lin - lo, mem,
                f"warp_span({first_warp}, {nwarps}, id={id})")


@implements("flowdsl.coop.cta")
def _coop_cta():
    t = current()
    if t.launch.block[1] != 1 or t.launch.block[2] != 1:
        raise sim_error(UsageError, f"Cannot make coop.cta(): blockDim {t.launch.block} is not 1-D. "
                        "Launch with a 1-D block")
    n = t.blk.nthreads
    return Coop(CoopKind.CTA, ("cta",), n, t.lin, None, "cta")


@implements("flowdsl.coop.sync")
def coop_sync(coop):
    t = current()
    if coop.key is None:
        return None
    block_sync(t, coop.key, coop.nthreads, coop.synclabel, None, coop.shape, coop.members)


@implements("flowdsl.coop.thread_rank")
def _coop_thread_rank(coop):
    return coop.trank


@implements("flowdsl.coop.size")
def _coop_size(coop):
    return coop.nthreads


@implements("flowdsl.coop.lane_mask")
def _coop_lane_mask(coop):
    if coop.kind == CoopKind.THREAD:
        return 1 << current().lane
    if coop.kind == CoopKind.LANES:
        return coop.key[2]
    return 0xFFFFFFFF


@implements("flowdsl.coop.is_thread")
def _coop_is_thread(coop):
    return coop.kind == CoopKind.THREAD


@implements("flowdsl.coop.within_warp")
def _coop_within_warp(coop):
    return coop.kind in _WITHIN_WARP


@implements("flowdsl.coop.coalesced")
def _coop_coalesced(coop):
    if coop is None:
        return _coop_lanes(shim.activemask())  # the active lanes, as the simulator's warp functions see them
    if coop.kind in _WITHIN_WARP:
        return coop
    return _coop_warp()


@implements("flowdsl.coop.bcast")
def _coop_bcast(coop, value, root, entry_sync):
    size = 8 if isinstance(value, (int, float)) else np.asarray(value).dtype.itemsize  # a Python number: 64-bit
    if size not in (4, 8):
        raise sim_error(KernelTypingError, bcast_width_refusal(_typeof(value)))
    t = current()
    if coop.kind == CoopKind.THREAD:
        return value
    if coop.kind in _WITHIN_WARP:
        mask = coop.key[2]
        lanes = [i for i in range(32) if (mask >> i) & 1]
        return shim.shfl_sync(mask, value, lanes[int(root)] if 0 <= int(root) < len(lanes) else 0)
    if entry_sync:
        coop_sync(coop)
    if coop.trank == int(root):
        t.blk.stashes[coop.key] = value
    coop_sync(coop)
    return t.blk.stashes.get(coop.key, value)
