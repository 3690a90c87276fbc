"""How the device communicator's rank fields compile (each calls its support function), and teams made by a
support function (:func:`team_from`, which ``flowdsl.cft.team`` uses). The ``flowdsl.team`` primitives are
lowered from their specs (``generic.py``): a team is a struct of ``(nranks, rank, stride)`` and crosses the C ABI
as those three ints."""

from __future__ import annotations

from numba import cuda
from numba.core import types
from numba.cuda.extending import overload_attribute

from .declarations import DECLARED
from .intrinsics import array_ptr, devcomm_ptr, make_team
from .types import DevCommType

__all__ = ["team_from"]


def _overload_comm_field(name: str) -> None:
    """``comm.<name>`` of a device communicator: its support function ``flowdsl_comm_<name>``."""
    fn = DECLARED[f"flowdsl_comm_{name}"]

    @overload_attribute(DevCommType, name)
    def field(comm):
        return lambda comm: fn(devcomm_ptr(comm))


for _field in ("rank", "nranks", "lsa_rank", "lsa_size", "gin_context_count"):
    _overload_comm_field(_field)


def team_from(fn):
    """``comm -> team`` through ``fn(comm*, int out[3])`` (also ``flowdsl.cft.team``)."""
    def impl(comm):
        out = cuda.local.array(3, types.int32)
        fn(devcomm_ptr(comm), array_ptr(out))
        return make_team(out[0], out[1], out[2])
    return impl
