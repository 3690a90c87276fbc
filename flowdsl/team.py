"""Teams: sets of ranks described by ``(nranks, rank, stride)`` (NCCL's ``ncclTeam``).

Each is one call of its support function, lowered from its spec (``returns=``: ``flowdsl/lowering/generic.py``).
"""

from __future__ import annotations

from ._spec import C_COMM, C_TEAM, COMM, TEAM, TEAMS, CFunction
from ._stubs import primitive

#: A team's C result: its three fields, written through an ``int*``.
_OUT = ("int_out", "out")

__all__ = [
    "world", "lsa", "rail", "rank_to_world", "rank_to_lsa", "rank_is_member",
    "rank_to_team", "inner_factor", "outer_factor", "rank_in_difference",
]


@primitive(extern="flowdsl_team_world",
           c=CFunction("void", (C_COMM, _OUT), "ncclTeamWorld."),
           returns="team", comm=COMM)
def world(comm):
    """Every rank of the communicator (``ncclTeamWorld``)."""


@primitive(extern="flowdsl_team_lsa",
           c=CFunction("void", (C_COMM, _OUT), "ncclTeamLsa."),
           returns="team", comm=COMM)
def lsa(comm):
    """The ranks whose memory this GPU can load and store (``ncclTeamLsa``)."""


@primitive(extern="flowdsl_team_rail",
           c=CFunction("void", (C_COMM, _OUT), "ncclTeamRail."),
           returns="team", comm=COMM)
def rail(comm):
    """The ranks with this rank's LSA index in every LSA team (``ncclTeamRail``)."""


@primitive(extern="flowdsl_team_rank_to_world",
           c=CFunction("int", (C_COMM, C_TEAM, ("int", "rank")), "ncclTeamRankToWorld."),
           returns="value", comm=COMM, team=TEAM)
def rank_to_world(comm, team, rank):
    """World rank of ``team``'s rank ``rank`` (``ncclTeamRankToWorld``)."""


@primitive(extern="flowdsl_team_rank_to_lsa",
           c=CFunction("int", (C_COMM, C_TEAM, ("int", "rank")), "ncclTeamRankToLsa."),
           returns="value", comm=COMM, team=TEAM)
def rank_to_lsa(comm, team, rank):
    """LSA rank of ``team``'s rank ``rank`` (``ncclTeamRankToLsa``)."""


@primitive(extern="flowdsl_team_rank_is_member",
           c=CFunction("int", (("team", "a"), ("team", "b"), ("int", "b_peer")),
                       "ncclTeamRankIsMember (0 or 1)."),
           returns="bool", a=TEAMS, b=TEAMS)
def rank_is_member(a, b, b_rank):
    """Whether ``b``'s rank ``b_rank`` belongs to team ``a`` (``ncclTeamRankIsMember``)."""


@primitive(extern="flowdsl_team_rank_to_team",
           c=CFunction("int", (("team", "a"), ("team", "b"), ("int", "b_peer")), "ncclTeamRankToTeam."),
           returns="value", a=TEAMS, b=TEAMS)
def rank_to_team(a, b, b_rank):
    """``a``'s rank of ``b``'s rank ``b_rank`` (``ncclTeamRankToTeam``)."""


@primitive(extern="flowdsl_team_inner_factor",
           c=CFunction("void", (C_TEAM, ("int", "inner_size"), _OUT), "ncclTeamInnerFactor."),
           returns="team", parent=TEAM)
def inner_factor(parent, inner_size):
    """The block of ``inner_size`` consecutive ranks holding this rank (``ncclTeamInnerFactor``)."""


@primitive(extern="flowdsl_team_outer_factor",
           c=CFunction("void", (C_TEAM, ("int", "inner_size"), _OUT), "ncclTeamOuterFactor."),
           returns="team", parent=TEAM)
def outer_factor(parent, inner_size):
    """The ranks at this rank's position in every inner block (``ncclTeamOuterFactor``)."""


@primitive(extern="flowdsl_team_rank_in_difference",
           c=CFunction("int", (("team", "parent"), ("team", "subset"), ("int", "index")),
                       "ncclTeamRankInDifference."),
           returns="value", parent=TEAMS, subset=TEAMS)
def rank_in_difference(parent, subset, index):
    """The ``index``-th rank of ``parent`` that is not in ``subset`` (``ncclTeamRankInDifference``)."""
