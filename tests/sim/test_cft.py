"""CFT on the simulator: the counted all-to-all on 2 nodes x 4 ranks, the fence rule, planted CFT bugs."""

import re

import numpy as np
import pytest
from numba import cuda, float32, uint64

import flowdsl
import flowdsl.sim as sim
from flowdsl import MemoryOrder, cft, coop, lsa, team
from flowdsl.examples import alltoall_cft
from flowdsl.testing import assert_ranks_close, run_ranks

pytestmark = pytest.mark.sim

DELIVERIES = ["ordered", "reordered"]


@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_counted_alltoall_two_nodes_of_four_matches_numpy(seed, delivery):
    # 300 elements: two staged chunks per peer, so several counted writes share one counter.
    assert_ranks_close(run_ranks(lambda c: alltoall_cft.run(c, count=300, seed=seed), nranks=8, nodes=2,
                                 seed=seed, gin_delivery=delivery), rtol=0, atol=0)


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_counted_alltoall_reading_the_counter_then_fencing_matches_numpy(delivery):
    assert_ranks_close(run_ranks(lambda c: alltoall_cft.run(c, count=64, mode=alltoall_cft.READ_AND_FENCE),
                                 nranks=8, nodes=2, seed=3, gin_delivery=delivery), rtol=0, atol=0)


def _missing_fence(seed, delivery="reordered"):
    with pytest.raises(sim.CftCoverageError) as ei:
        run_ranks(lambda c: alltoall_cft.run(c, count=64, mode=alltoall_cft.MISSING_FENCE), nranks=8, nodes=2,
                  seed=seed, gin_delivery=delivery)
    return str(ei.value)


def test_missing_fence_after_the_counter_read_is_reported_and_reproduced():
    msg = _missing_fence(4)
    assert msg.startswith("Cannot read element")
    assert "it holds data of counted CFT write #" in msg and "from rank" in msg and "window #" in msg
    assert "read its counter at byte 0 of window #" in msg and "flowdsl.cft.read_counter by rank" in msg
    assert "but has not fenced since: call flowdsl.cft.fence(coop)" in msg
    assert re.search(r"on rank \d+ at alltoall_cft\.py:\d+ \(\w+\): it holds data of", msg), msg  # the reading line
    assert "block" in msg and "thread" in msg and "seed=4" in msg
    assert _missing_fence(4) == msg                                  # same seed, same report
    assert "has not fenced since" in _missing_fence(4, "ordered")   # in order or not, the fence is needed


@flowdsl.device
def _thread_session(comm, state):
    """The CFT team, and a session of the calling thread over ``state``."""
    return cft.team(comm), cft.session(comm, coop.thread(), state)


@flowdsl.kernel
def _read_early(comm, win, out, wait):
    """Rank 1 reads rank 0's counted write without (wait=0) or after (wait=1) waiting for its counter."""
    state = cuda.shared.array(4, uint64, alignment=16)
    buf = cuda.shared.array(16, float32, alignment=16)
    t, s = _thread_session(comm, state)
    if t.rank == 0:
        for i in range(16):
            buf[i] = i + 1.0
        le, off = cft.le_info(comm, win, 64, t, 1)
        le, ctr = cft.le_info(comm, win, 0, t, 1)
        cft.put_counted(s, le, off, ctr, buf, 64)
        cft.submit(s)
        cft.flush(s)
    else:
        if wait == 1:
            cft.wait_counted(s, win, 0, 64)
        out[0] = lsa.local_view(win)[16]
    cft.close(s)


def _run_read_early(wait, seed):
    def main(comm):
        buf, out = comm.alloc(64, np.float32), comm.alloc(1, np.float32)
        buf.set(np.zeros(64, np.float32))
        with comm.register(buf, cft_counted=True) as w, comm.device_communicator() as dc:
            _read_early[1, 1](dc, w, out, wait)
            comm.synchronize()
        return out.get()[0]
    return run_ranks(main, nranks=2, nodes=2, seed=seed, gin_delivery="reordered")


def test_reading_counted_data_before_its_counter_names_the_write():
    msgs = []
    for seed in range(4):
        try:
            _run_read_early(0, seed)
        except sim.CftCoverageError as e:
            msgs.append(str(e))
    assert len(msgs) == 4
    assert all("counted CFT write #0 (from rank 0 to rank 1" in m for m in msgs)
    assert any("the write had not landed (its counter at byte 0 of window #" in m for m in msgs) or \
        any("has not read its counter" in m for m in msgs)
    assert _run_read_early(1, 0)[1] == 1.0


@flowdsl.kernel
def _misuse(comm, win, plain, what):
    state = cuda.shared.array(4, uint64, alignment=16)
    buf = cuda.shared.array(16, float32, alignment=16)
    t, s = _thread_session(comm, state)
    le, off = cft.le_info(comm, win, 64, t, 0)
    if what == 0:
        cft.put(s, le, 64, buf, 64)                    # a window offset where an LE offset belongs
    elif what == 1:
        le2, off2 = cft.le_info(comm, plain, 0, t, 0)
        cft.put_counted(s, le2, off2 + 16, off2, buf, 16)  # the window is not registered for counted writes
    elif what == 2:
        cft.put(s, le, off, buf, 24)                   # not a multiple of 16 bytes
    elif what == 3:
        cft.put(s, le, off, buf, 64)
        cft.flush(s)                                   # queued, never submitted
    elif what == 4:
        cft.barrier(comm, coop.thread(), 1).sync(MemoryOrder.ACQ_REL)


@pytest.mark.parametrize("what, error, text", [
    (0, sim.WindowAccessError, "it looks like a window offset: pass the le_offset from flowdsl.cft.le_info"),
    (1, sim.UsageError, "was not registered for counted writes. Register the destination with "
                        "comm.register(buf, cft_counted=True)"),
    (2, sim.UsageError, "24 bytes is not a positive multiple of 16"),
    (3, sim.UsageError, "were queued but not submitted. Call flowdsl.cft.submit(session) first"),
    (4, sim.BarrierIndexError, "Cannot open CFT barrier 1: the device communicator has cft_barrier_count=1"),
], ids=["raw-offset", "not-counted", "size", "unsubmitted", "barrier-index"])
def test_cft_misuse_is_reported(what, error, text):
    def main(comm):
        a, b = comm.alloc(64, np.float32), comm.alloc(64, np.float32)
        with comm.register(a, cft_counted=True) as w, comm.register(b) as p, \
                comm.device_communicator(cft_barrier_count=1) as dc:
            _misuse[1, 1](dc, w, p, what)
            comm.synchronize()
    with pytest.raises(error) as ei:
        run_ranks(main, nranks=2, nodes=2)
    assert text in str(ei.value)


@flowdsl.kernel
def _get_then_barrier(comm, win, out):
    """Each rank gets its right neighbour's first 16 floats, then a CFT barrier, then reads them."""
    state = cuda.shared.array(4, uint64, alignment=16)
    buf = cuda.shared.array(16, float32, alignment=16)
    t = cft.team(comm)
    s = cft.session(comm, coop.cta(), state)
    le, off = cft.peer_le_info(comm, win, 0, (comm.rank + 1) % comm.nranks)
    cft.get(s, le, off, buf, 64)
    cft.submit(s)
    cft.flush(s)
    cft.close(s)
    cft.barrier(comm, coop.cta(), 0).sync(MemoryOrder.ACQ_REL)
    for i in range(cuda.threadIdx.x, 16, cuda.blockDim.x):
        out[i] = buf[i]


def test_get_lands_in_shared_memory_at_flush():
    def main(comm):
        a, out = comm.alloc(16, np.float32), comm.alloc(16, np.float32)
        a.set(np.arange(16, dtype=np.float32) + 100 * comm.rank)
        with comm.register(a) as w, comm.device_communicator(cft_barrier_count=1) as dc:
            _get_then_barrier[1, 32](dc, w, out)
            comm.synchronize()
        return out.get()
    for d in DELIVERIES:
        for r, o in enumerate(run_ranks(main, nranks=4, nodes=2, gin_delivery=d)):
            assert list(o) == list(np.arange(16, dtype=np.float32) + 100 * ((r + 1) % 4))


@flowdsl.kernel
def _team_numbers(comm, out):
    """Each CFT team mode's (nranks, rank, stride), and the world rank of HIER_LSA peer 0."""
    flat = cft.team(comm)
    hier = cft.team(comm, cft.CftTeamMode.HIER_LSA)
    multi = cft.team(comm, mode=cft.CftTeamMode.HIER_MULTIMEM)
    for i, t in enumerate((flat, hier, multi)):
        out[3 * i], out[3 * i + 1], out[3 * i + 2] = t.nranks, t.rank, t.stride
    out[9] = team.rank_to_world(comm, hier, 0)


def _teams(nranks, nodes, **options):
    cft_caps = options.pop("cft_caps", 0)

    def main(comm):
        out = comm.alloc(10, np.int32)
        out.set(np.full(10, -7, np.int32))
        with comm.device_communicator(cft_caps=cft_caps) as dc:
            _team_numbers[1, 1](dc, out)
            comm.synchronize()
        return out.get()
    return run_ranks(main, nranks=nranks, nodes=nodes, **options)


@pytest.mark.parametrize("nodes,per_node", [(2, 2), (2, 3), (3, 2)], ids=["2x2", "2x3", "3x2"])
def test_cft_team_modes_give_ncclTeamCft_numbers_with_the_world_as_the_cft_domain(nodes, per_node):
    # The simulator's CFT domain is the world (cftSize = nranks) while its LSA teams are the nodes:
    # HIER_LSA is one rank per node (cftSize / lsaSize ranks, index cftRank / lsaSize, stride lsaSize).
    n = nodes * per_node
    for r, got in enumerate(_teams(n, nodes)):
        assert list(got[0:3]) == [n, r, 1]                        # FLAT
        assert list(got[3:6]) == [nodes, r // per_node, per_node]  # HIER_LSA
        assert list(got[6:9]) == [n, r, 1]                         # no CFT multimem: teams of one rank
        assert got[9] == r % per_node                              # HIER_LSA peer 0: this LSA rank on node 0


def test_cft_hier_multimem_is_one_rank_per_node_with_nvlink_sharp_and_cft_multimem_asked():
    for r, got in enumerate(_teams(6, 2, multimem=True, cft_caps=3)):
        assert list(got[6:9]) == [2, r // 3, 3]
    for r, got in enumerate(_teams(6, 2, multimem=True)):  # NVLink SHARP but no NCCL_CFT_MULTIMEM asked
        assert list(got[6:9]) == [6, r, 1]


@flowdsl.kernel
def _team_of_mode(comm, out, mode):
    out[0] = cft.team(comm, mode).nranks


def test_cft_team_refuses_a_mode_that_is_no_CftTeamMode():
    def main(comm):
        out = comm.alloc(1, np.int32)
        with comm.device_communicator() as dc:
            _team_of_mode[1, 1](dc, out, 5)
            comm.synchronize()
    with pytest.raises(sim.UsageError) as ei:
        run_ranks(main, nranks=2, nodes=2)
    assert "flowdsl.cft.team requires mode FLAT, HIER_MULTIMEM, HIER_LSA, got 5. Pass one of " \
           "flowdsl.cft.CftTeamMode.FLAT, HIER_MULTIMEM, HIER_LSA" in str(ei.value)
