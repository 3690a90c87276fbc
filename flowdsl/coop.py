"""Cooperative groups: which threads perform a collective call together.

Mirrors NCCL's ``ncclCoop*`` types. A coop is a value made inside a kernel
and passed to collective primitives (barriers, reduce/copy).
"""

from __future__ import annotations

from ._spec import COOP, INT, WORD, CFunction
from ._stubs import primitive

__all__ = ["thread", "warp", "lanes", "tile", "warp_span", "cta", "sync", "thread_rank", "size", "lane_mask", "is_thread",
           "within_warp", "coalesced", "bcast"]


@primitive
def thread():
    """The calling thread alone (``ncclCoopThread``)."""


@primitive
def warp():
    """The calling thread's whole warp, 32 lanes (``ncclCoopWarp``)."""


@primitive(mask=INT)
def lanes(mask):
    """The lanes of this warp set in ``mask`` (``ncclCoopLanes``); all must call."""


@primitive(n=INT.but("a power of two from 1 to 32", choices=(1, 2, 4, 8, 16, 32), constant=True))
def tile(n):
    """This thread's tile of ``n`` lanes (NCCL's ``ncclCoopTile<n>``): lanes ``lane & -n`` to ``(lane & -n) + n - 1``
    of its warp, every one of which must call. ``tile(1)`` is :func:`thread`, ``tile(32)`` is :func:`warp`; the
    others are :func:`lanes` of the tile's mask. ``n``: a constant power of two."""


@primitive(first_warp=INT, nwarps=INT, id=INT)
def warp_span(first_warp, nwarps, id):
    """Warps ``first_warp .. first_warp+nwarps-1`` of this CTA (``ncclCoopWarpSpan``).

    ``id`` (0..15) names the named hardware barrier the span syncs on; two spans
    with the same id must not be in a collective at the same time.
    """


@primitive
def cta():
    """Every thread of this CTA (``ncclCoopCta``); ``blockDim`` must be 1-D."""


@primitive(extern="flowdsl_coop_sync",
           c=CFunction("void", (), "Barrier among the coop's threads.", coop=True),
           coop=COOP)
def sync(coop):
    """Barrier among the coop's threads (``__syncthreads``, ``__syncwarp``, ``bar.sync``)."""


@primitive(extern="flowdsl_coop_thread_rank",
           c=CFunction("int", (), "This thread's index in the coop.", coop=True),
           coop=COOP)
def thread_rank(coop):
    """This thread's index within the coop, ``0 .. size(coop)-1``."""


@primitive(extern="flowdsl_coop_size",
           c=CFunction("int", (), "Number of threads in the coop.", coop=True),
           coop=COOP)
def size(coop):
    """Number of threads in the coop."""


@primitive(coop=COOP)
def lane_mask(coop):
    """The lanes of this thread's warp in the coop, as a 32-bit mask (``ncclCoopGetLaneMask``): its own lane's
    bit for ``thread()``, the mask of ``lanes(mask)``, every lane for a warp, a warp span and a CTA."""


@primitive(coop=COOP)
def is_thread(coop):
    """Whether the coop is one thread, known when the kernel compiles (``ncclCoopIsThread``)."""


@primitive(coop=COOP)
def within_warp(coop):
    """Whether the coop lies within one warp (a thread, a warp, lanes), known when the kernel compiles
    (``ncclCoopWithinWarp``)."""


@primitive
def coalesced(coop=None):
    """Threads of this warp safe to use together (``ncclCoopCoalesced``): without a coop, the lanes active at the
    call (``lanes(activemask())``); a coop within a warp is itself; a warp span or a CTA gives this thread's
    warp."""


@primitive(coop=COOP, value=WORD, root=INT)
def bcast(coop, value, root, entry_sync=True):
    """The ``value`` of the coop's thread ``root`` (its ``thread_rank``), returned to every thread of the coop
    (``ncclCoopBcast``): a warp shuffle within a warp; through a shared-memory stash between two syncs of the
    coop for a warp span or a CTA (``entry_sync=False`` leaves out the first, where no thread can still be
    reading an earlier broadcast's stash). ``value``: a number of 4 or 8 bytes."""


def bcast_width_refusal(got: str) -> str:
    """Why a value of another size is refused (the GPU's typing and the simulator say the same)."""
    return (f"flowdsl.coop.bcast requires value to be a number of 4 or 8 bytes (int32, uint32, int64, uint64, float32 "
            f"or float64), got {got}. Convert it first, e.g. int32(x) or float32(x)")
