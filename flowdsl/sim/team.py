"""What ``flowdsl.team`` does in the simulator: a :class:`Team` is ``(nranks, rank, stride)``."""

from __future__ import annotations

from .checks import KIND_CHECKS
from .errors import UsageError, sim_error
from .semantics import implements

__all__ = ["Team"]


class Team:
    """``ncclTeam``: ``nranks`` ranks, this rank's index ``rank``, world ``stride``."""

    __slots__ = ("nranks", "rank", "stride")

    def __init__(self, nranks, rank, stride):
        self.nranks, self.rank, self.stride = int(nranks), int(rank), int(stride)

    def __repr__(self):
        return f"Team(nranks={self.nranks}, rank={self.rank}, stride={self.stride})"

    def __eq__(self, other):
        return isinstance(other, Team) and (self.nranks, self.rank, self.stride) == \
            (other.nranks, other.rank, other.stride)


KIND_CHECKS.register("team", lambda v: isinstance(v, Team))


@implements("flowdsl.team.world")
def _team_world(comm):
    return Team(comm.nranks, comm.rank, 1)


@implements("flowdsl.team.lsa")
def _team_lsa(comm):
    return Team(comm.lsa_size, comm.lsa_rank, 1)


@implements("flowdsl.team.rail")
def _team_rail(comm):
    return Team(comm.nranks // comm.lsa_size, comm.rank // comm.lsa_size, comm.lsa_size)


@implements("flowdsl.team.rank_to_world")
def _team_rank_to_world(comm, team, rank):
    return comm.rank + (int(rank) - team.rank) * team.stride


@implements("flowdsl.team.rank_to_lsa")
def _team_rank_to_lsa(comm, team, rank):
    return comm.lsa_rank + (int(rank) - team.rank) * team.stride


@implements("flowdsl.team.rank_is_member")
def _team_rank_is_member(a, b, b_rank):
    w = (int(b_rank) - b.rank) * b.stride
    q, m = divmod(w, a.stride)
    ar = a.rank + q
    return 0 <= ar < a.nranks and m == 0


@implements("flowdsl.team.rank_to_team")
def _team_rank_to_team(a, b, b_rank):
    w = (int(b_rank) - b.rank) * b.stride
    return a.rank + w // a.stride


@implements("flowdsl.team.inner_factor")
def _team_inner_factor(parent, inner_size):
    return Team(inner_size, parent.rank % inner_size, parent.stride)


@implements("flowdsl.team.outer_factor")
def _team_outer_factor(parent, inner_size):
    return Team(parent.nranks // inner_size, parent.rank // inner_size, parent.stride * inner_size)


@implements("flowdsl.team.rank_in_difference")
def _team_rank_in_difference(parent, subset, index):
    # The index-th rank of parent (in order) that is not a member of subset.
    index = int(index)
    k = 0
    for r in range(parent.nranks):
        if not _team_rank_is_member(subset, parent, r):
            if k == index:
                return r
            k += 1
    raise sim_error(UsageError, f"Cannot take rank_in_difference index {index}: the difference has {k} ranks. "
                    "Use an index below its size")
