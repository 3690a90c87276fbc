"""How ``flowdsl.coop`` compiles: a coop is a struct of one word (the lane mask or the packed warp span)
whose kind is part of its type; sync, thread_rank and size call the support function of that kind."""

from __future__ import annotations

from numba import cuda, int32, int64, uint32
from numba.core import types
from numba.core.errors import NumbaTypeError
from numba.cuda.extending import make_attribute_wrapper, overload, overload_method

from .. import coop as coop_api
from ..enums import CoopKind
from .checks import check, is_omitted
from .declarations import extern
from .intrinsics import make_coop
from .types import CoopType

__all__: list[str] = []

make_attribute_wrapper(CoopType, "word", "_word")

# Typers have exactly the stub's parameters; a coop of one thread, a warp or a CTA needs no word.
_thread, _warp, _cta = make_coop[CoopKind.THREAD], make_coop[CoopKind.WARP], make_coop[CoopKind.CTA]
_lanes, _warp_span = make_coop[CoopKind.LANES], make_coop[CoopKind.WARP_SPAN]


@overload(coop_api.thread)
def coop_thread():
    return lambda: _thread(0)


@overload(coop_api.warp)
def coop_warp():
    return lambda: _warp(0)


@overload(coop_api.cta)
def coop_cta():
    return lambda: _cta(0)


@overload(coop_api.tile)
def coop_tile(n):
    check(coop_api.tile, n)
    size = n.literal_value
    if size == 1:
        return lambda n: _thread(0)
    if size == 32:
        return lambda n: _warp(0)
    ones, first = uint32((1 << size) - 1), 32 - size  # lane & -size, within a warp
    return lambda n: _lanes(ones << uint32(cuda.laneid & first))


@overload(coop_api.lanes)
def coop_lanes(mask):
    check(coop_api.lanes, mask)
    return lambda mask: _lanes(mask)


@overload(coop_api.warp_span)
def coop_warp_span(first_warp, nwarps, id):
    check(coop_api.warp_span, first_warp, nwarps, id)
    return lambda first_warp, nwarps, id: _warp_span(
        (first_warp & 0xFF) | ((nwarps & 0xFF) << 8) | ((id & 0xFF) << 16))


def _coop_call(stub, coop):
    check(stub, coop)
    fn = extern(stub, coop)
    return lambda coop: fn(coop._word)


@overload_method(CoopType, "sync")
@overload(coop_api.sync)
def coop_sync(coop):
    return _coop_call(coop_api.sync, coop)


@overload_method(CoopType, "thread_rank")
@overload(coop_api.thread_rank)
def coop_thread_rank(coop):
    return _coop_call(coop_api.thread_rank, coop)


@overload_method(CoopType, "size")
@overload(coop_api.size)
def coop_size(coop):
    return _coop_call(coop_api.size, coop)


_WITHIN_WARP = (CoopKind.THREAD, CoopKind.WARP, CoopKind.LANES)


@overload(coop_api.lane_mask)
def coop_lane_mask(coop):
    check(coop_api.lane_mask, coop)
    if coop.kind == CoopKind.THREAD:
        return lambda coop: uint32(1) << uint32(cuda.laneid)
    if coop.kind == CoopKind.LANES:
        return lambda coop: uint32(coop._word)
    return lambda coop: uint32(0xFFFFFFFF)


@overload(coop_api.is_thread)
def coop_is_thread(coop):
    check(coop_api.is_thread, coop)
    answer = coop.kind == CoopKind.THREAD
    return lambda coop: answer


@overload(coop_api.within_warp)
def coop_within_warp(coop):
    check(coop_api.within_warp, coop)
    answer = coop.kind in _WITHIN_WARP
    return lambda coop: answer


@overload(coop_api.coalesced)
def coop_coalesced(coop=None):
    if is_omitted(coop) or coop is None:
        return lambda coop=None: _lanes(cuda.activemask())
    check(coop_api.coalesced, coop)
    if coop.kind in _WITHIN_WARP:
        return lambda coop=None: coop
    return lambda coop=None: _warp(0)


@overload(coop_api.bcast)
def coop_bcast(coop, value, root, entry_sync=True):
    check(coop_api.bcast, coop, value, root)
    if value.bitwidth not in (32, 64):
        raise NumbaTypeError(coop_api.bcast_width_refusal(str(value)))
    kind = coop.kind
    if kind == CoopKind.THREAD:
        return lambda coop, value, root, entry_sync=True: value
    if kind in (CoopKind.WARP, CoopKind.LANES):
        # numba-cuda's shuffle takes signed integers and floats: unsigned ones cross it as their signed bits.
        as_word = (int32 if value.bitwidth == 32 else int64) if isinstance(value, types.Integer) else value
        back = value
        whole_warp = kind == CoopKind.WARP

        def warp_bcast(coop, value, root, entry_sync=True):
            mask = uint32(0xFFFFFFFF) if whole_warp else uint32(coop._word)
            lane = root
            if not whole_warp:  # the lane of the coop's root-th member
                lane = 0
                seen = -1
                while lane < 32:
                    if (mask >> uint32(lane)) & uint32(1):
                        seen += 1
                        if seen == root:
                            break
                    lane += 1
            return back(cuda.shfl_sync(mask, as_word(value), lane))
        return warp_bcast
    span = kind == CoopKind.WARP_SPAN
    dtype = value

    def stash_bcast(coop, value, root, entry_sync=True):
        stash = cuda.shared.array(16, dtype)  # NCCL's: one slot per warp-span id, one for the CTA
        slot = (coop._word >> 16) & 0xF if span else 0
        if entry_sync:
            coop_api.sync(coop)
        if coop_api.thread_rank(coop) == root:
            stash[slot] = value
        coop_api.sync(coop)
        return stash[slot]
    return stash_bcast
