"""How ``flowdsl.team`` and the device communicator's rank fields compile: each calls its support
function; a team is a struct of ``(nranks, rank, stride)`` and crosses the C ABI as those three ints."""

from __future__ import annotations

from numba import cuda
from numba.core import types
from numba.cuda.extending import overload, overload_attribute

from .. import team
from .. import team as _team  # where a parameter named team hides the module
from .checks import check
from .declarations import DECLARED, extern
from .intrinsics import array_ptr, devcomm_ptr, make_team
from .types import DevCommType

__all__ = ["team_from"]


def _overload_comm_field(name: str) -> None:
    """``comm.<name>`` of a device communicator: its support function ``flowdsl_comm_<name>``."""
    fn = DECLARED[f"flowdsl_comm_{name}"]

    @overload_attribute(DevCommType, name)
    def field(comm):
        return lambda comm: fn(devcomm_ptr(comm))


for _field in ("rank", "nranks", "lsa_rank", "lsa_size"):
    _overload_comm_field(_field)


def team_from(fn):
    """``comm -> team`` through ``fn(comm*, int out[3])`` (also ``flowdsl.cft.team``)."""
    def impl(comm):
        out = cuda.local.array(3, types.int32)
        fn(devcomm_ptr(comm), array_ptr(out))
        return make_team(out[0], out[1], out[2])
    return impl


@overload(team.world)
def team_world(comm):
    check(team.world, comm)
    return team_from(extern(team.world))


@overload(team.lsa)
def team_lsa(comm):
    check(team.lsa, comm)
    return team_from(extern(team.lsa))


@overload(team.rail)
def team_rail(comm):
    check(team.rail, comm)
    return team_from(extern(team.rail))


@overload(team.rank_to_world)
def team_rank_to_world(comm, team, rank):
    check(_team.rank_to_world, comm, team)
    fn = extern(_team.rank_to_world)
    return lambda comm, team, rank: fn(devcomm_ptr(comm), team.nranks, team.rank, team.stride, rank)


@overload(team.rank_to_lsa)
def team_rank_to_lsa(comm, team, rank):
    check(_team.rank_to_lsa, comm, team)
    fn = extern(_team.rank_to_lsa)
    return lambda comm, team, rank: fn(devcomm_ptr(comm), team.nranks, team.rank, team.stride, rank)


@overload(team.rank_is_member)
def team_rank_is_member(a, b, b_rank):
    check(team.rank_is_member, a, b)
    fn = extern(team.rank_is_member)
    return lambda a, b, b_rank: fn(a.nranks, a.rank, a.stride, b.nranks, b.rank, b.stride, b_rank) != 0


@overload(team.rank_to_team)
def team_rank_to_team(a, b, b_rank):
    check(team.rank_to_team, a, b)
    fn = extern(team.rank_to_team)
    return lambda a, b, b_rank: fn(a.nranks, a.rank, a.stride, b.nranks, b.rank, b.stride, b_rank)


@overload(team.rank_in_difference)
def team_rank_in_difference(parent, subset, index):
    check(team.rank_in_difference, parent, subset)
    fn = extern(team.rank_in_difference)
    return lambda parent, subset, index: fn(parent.nranks, parent.rank, parent.stride, subset.nranks,
                                            subset.rank, subset.stride, index)


def _factor(fn):
    def impl(parent, inner_size):
        out = cuda.local.array(3, types.int32)
        fn(parent.nranks, parent.rank, parent.stride, inner_size, array_ptr(out))
        return make_team(out[0], out[1], out[2])
    return impl


@overload(team.inner_factor)
def team_inner_factor(parent, inner_size):
    check(team.inner_factor, parent)
    return _factor(extern(team.inner_factor))


@overload(team.outer_factor)
def team_outer_factor(parent, inner_size):
    check(team.outer_factor, parent)
    return _factor(extern(team.outer_factor))
