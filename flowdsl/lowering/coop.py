"""How ``flowdsl.coop`` compiles: a coop is a struct of one word (the lane mask or the packed warp span)
whose kind is part of its type; sync, thread_rank and size call the support function of that kind."""

from __future__ import annotations

from numba.cuda.extending import make_attribute_wrapper, overload, overload_method

from .. import coop
from ..enums import CoopKind
from .checks import check
from .declarations import extern
from .intrinsics import make_coop
from .types import CoopType

__all__: list[str] = []

make_attribute_wrapper(CoopType, "word", "_word")

# Typers have exactly the stub's parameters; a coop of one thread, a warp or a CTA needs no word.
_thread, _warp, _cta = make_coop[CoopKind.THREAD], make_coop[CoopKind.WARP], make_coop[CoopKind.CTA]
_lanes, _warp_span = make_coop[CoopKind.LANES], make_coop[CoopKind.WARP_SPAN]


@overload(coop.thread)
def coop_thread():
    return lambda: _thread(0)


@overload(coop.warp)
def coop_warp():
    return lambda: _warp(0)


@overload(coop.cta)
def coop_cta():
    return lambda: _cta(0)


@overload(coop.lanes)
def coop_lanes(mask):
    check(coop.lanes, mask)
    return lambda mask: _lanes(mask)


@overload(coop.warp_span)
def coop_warp_span(first_warp, nwarps, id):
    check(coop.warp_span, first_warp, nwarps, id)
    return lambda first_warp, nwarps, id: _warp_span(
        (first_warp & 0xFF) | ((nwarps & 0xFF) << 8) | ((id & 0xFF) << 16))


def _coop_call(stub, c):
    check(stub, c)
    fn = extern(stub, c)
    return lambda c: fn(c._word)


@overload_method(CoopType, "sync")
@overload(coop.sync)
def coop_sync(c):
    return _coop_call(coop.sync, c)


@overload_method(CoopType, "thread_rank")
@overload(coop.thread_rank)
def coop_thread_rank(c):
    return _coop_call(coop.thread_rank, c)


@overload_method(CoopType, "size")
@overload(coop.size)
def coop_size(c):
    return _coop_call(coop.size, c)
