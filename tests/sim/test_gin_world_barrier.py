"""The world team's GIN barrier (``gin.world_barrier``, NCCL's ``ncclGinBarrierSession`` on ``ncclTeamTagWorld``):
every rank's arrival, also from ranks of its own node, is awaited; the rail barrier awaits one rank per node, so
a port that takes it for NCCL's world barrier passes at one rank per node and fails beyond (the trap the old
name ``gin.barrier`` set: it is refused now, naming the three barriers)."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
import flowdsl.sim as sim
from flowdsl import MemoryOrder, coop, gin, team
from flowdsl.testing import run_ranks
from tests.launching import launch_refused, launching

pytestmark = pytest.mark.sim


@flowdsl.kernel
def _signals_then_world_barrier(comm, out, rounds):
    """Each round: a strong signal to every other rank, then the world barrier on the same context. The barrier's
    arrivals are strongly ordered after the signals, so once it returns every rank's signals of the round are here."""
    ctx = gin.context(comm, 0)
    world = team.world(comm)
    me, n = world.rank, world.nranks
    bar = gin.world_barrier(ctx, coop.cta(), 0)
    for r in range(rounds):
        for peer in range(n):
            if peer != me:
                gin.signal(ctx, world, peer, gin.strong_signal_inc(0))
        bar.sync(MemoryOrder.ACQ_REL)
        out[r] = gin.read_signal(ctx, 0)


def _run(nranks, nodes, seed, delivery, rounds=3):
    def main(comm):
        out = comm.alloc(rounds, np.uint64)
        with comm.device_communicator(gin_signal_count=1, world_gin_barrier_count=1) as dc:
            _signals_then_world_barrier[1, 1](dc, out, rounds)
            comm.synchronize()
        return out.get()
    return run_ranks(main, nranks=nranks, nodes=nodes, seed=seed, gin_delivery=delivery)


@pytest.mark.parametrize("nranks, nodes", [(4, 2), (4, 1), (6, 3), (2, 2)])
@pytest.mark.parametrize("delivery", ["ordered", "reordered"])
def test_every_ranks_arrival_is_awaited(nranks, nodes, delivery):
    # After round r's barrier every rank's round-r signal is here; round r+1's may be too (a rank that left the
    # barrier first may signal again before this one reads), round r+2's cannot (it waits for this rank).
    for seed in (0, 3):
        for got in _run(nranks, nodes, seed, delivery):
            least = (nranks - 1) * np.arange(1, 4, dtype=np.uint64)
            assert np.all(got >= least) and np.all(got <= least + (nranks - 1)), (got, least)


@flowdsl.kernel
def _world_index_2(comm):
    gin.world_barrier(gin.context(comm, 0), coop.cta(), 2).sync(MemoryOrder.ACQ_REL)


def test_an_index_beyond_the_count_is_refused():
    launch_refused(_world_index_2, 1, 1, sim.BarrierIndexError,
                   r"Cannot open GIN world barrier 2: the device communicator has world_gin_barrier_count=2 "
                   r"\(valid indices 0\.\.1\)", nranks=4, nodes=2, world_gin_barrier_count=2)


@flowdsl.kernel
def _world_barrier_unless_last(comm):
    world = team.world(comm)
    if world.rank != world.nranks - 1:
        gin.world_barrier(gin.context(comm, 0), coop.cta(), 0).sync(MemoryOrder.ACQ_REL)


def test_a_rank_that_never_arrives_is_named():
    main = launching(_world_barrier_unless_last, 1, 1, for_kernel=_world_barrier_unless_last, grid=1)
    with pytest.raises(sim.DeadlockError) as caught:
        run_ranks(main, nranks=4, nodes=2)
    assert "waited for gin world barrier sync, barrier 0 from peer rank 3: expected 1, last seen 0" in str(caught.value)
    assert "world peer rank 3 has not arrived (its arrival count here is 0, need 1)" in str(caught.value)


def test_the_kernel_derives_its_world_barriers():
    assert _world_barrier_unless_last.requirements(8) == {"world_gin_barrier_count": 8,
                                                          "gin_connection_type": flowdsl.GinConnectionType.FULL}


@flowdsl.kernel
def _put_only(comm, win):
    ctx = gin.context(comm, 0)
    world = team.world(comm)
    gin.put(ctx, world, (world.rank + 1) % world.nranks, win, 8, win, 0, 4)  # bytes 0-3 here to 8-11 there
    gin.flush(ctx, coop.cta())


def test_a_kernel_that_uses_gin_asks_for_it_and_refuses_it_off():
    """NCCL >= 2.29 enables GIN only when asked: a kernel that makes a GIN context asks for FULL connections
    (a put with no signal, counter or barrier asks for no GIN resource), unless another type is named; NONE is
    refused naming the kernel."""
    def main(comm, **asked):
        buf = comm.alloc(4, np.float32)
        with comm.register(buf) as win, comm.device_communicator(for_kernel=_put_only, grid=1, **asked) as dc:
            _put_only[1, 1](dc, win)
            comm.synchronize()
            return dict(dc.group.reqs)["gin_connection_type"]
    assert run_ranks(main, nranks=2, nodes=2) == [flowdsl.GinConnectionType.FULL] * 2
    rail = flowdsl.GinConnectionType.RAIL
    assert run_ranks(lambda comm: main(comm, gin_connection_type=rail), nranks=2, nodes=2) == [rail] * 2
    with pytest.raises(sim.UsageError, match="Cannot create a device communicator for _put_only: it uses GIN, and "
                                             "gin_connection_type NONE leaves GIN off"):
        run_ranks(lambda comm: main(comm, gin_connection_type=flowdsl.GinConnectionType.NONE), nranks=2, nodes=2)


def test_the_old_name_is_refused_naming_the_teams():
    with pytest.raises(AttributeError, match=r"flowdsl.gin has no barrier: name the team, as NCCL does\. "
                                             r"flowdsl.gin.rail_barrier is NCCL's rail GIN barrier"):
        gin.barrier  # noqa: B018
