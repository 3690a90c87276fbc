"""GIN on the simulator: topology, the GIN examples, semantics, and planted GIN bugs with their reports."""

import re

import numpy as np
import pytest
from numba import cuda, int64, uint64

import flowdsl
import flowdsl.sim as sim
from flowdsl import GinFenceLevel, MemoryOrder, ThreadScope, coop, gin, lsa, mem, team
from flowdsl.examples import alltoall_gin, alltoall_hybrid, gin_put, moe_gin, rmsnorm_gin, rmsnorm_hybrid
from flowdsl.testing import assert_ranks_close, run_ranks
from tests.launching import launch_refused

pytestmark = pytest.mark.sim

DELIVERIES = ["ordered", "reordered"]


# ---------------------------------------------------------------- topology
@flowdsl.kernel
def _teams(comm, out):
    w, l, r = team.world(comm), team.lsa(comm), team.rail(comm)
    i = 0
    for t in (w, l, r):
        out[i] = t.nranks
        out[i + 1] = t.rank
        out[i + 2] = t.stride
        i += 3
    out[9] = team.rank_to_world(comm, r, 0)
    out[10] = team.rank_to_world(comm, r, r.nranks - 1)
    out[11] = team.rank_to_team(r, w, comm.rank)
    out[12] = team.rank_is_member(r, w, (comm.rank + comm.lsa_size) % comm.nranks)
    out[13] = team.rank_is_member(r, w, comm.rank - comm.lsa_rank + (comm.lsa_rank + 1) % comm.lsa_size)


def test_world_lsa_rail_teams_two_nodes_of_four():
    def main(comm):
        out = comm.alloc(14, np.int64)
        _teams[1, 1](comm.device_communicator(), out)
        return out.get()
    for rank, o in enumerate(run_ranks(main, nranks=8, nodes=2)):
        node, lr = divmod(rank, 4)
        assert list(o[:9]) == [8, rank, 1, 4, lr, 1, 2, node, 4]
        assert list(o[9:]) == [lr, 4 + lr, node, 1, 0]


# ---------------------------------------------------------------- examples
@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("example", [alltoall_gin, alltoall_hybrid], ids=["gin", "hybrid"])
def test_alltoall_two_nodes_of_four(example, seed, delivery):
    assert_ranks_close(run_ranks(lambda c: example.run(c, count=64, seed=seed), nranks=8, nodes=2, seed=seed,
                                 gin_delivery=delivery), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(2, 1), (2, 2), (4, 1), (4, 2)], ids=["1x2", "2x1", "1x4", "2x2"])
@pytest.mark.parametrize("example", [alltoall_gin, alltoall_hybrid], ids=["gin", "hybrid"])
def test_alltoall_other_shapes(example, shape):
    n, nodes = shape
    for d in DELIVERIES:
        assert_ranks_close(run_ranks(lambda c: example.run(c, count=48), nranks=n, nodes=nodes, seed=5,
                                     gin_delivery=d), rtol=0, atol=0)


@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("shape", [(2, 1), (2, 2), (4, 2)], ids=["1x2", "2x1", "2x2"])
def test_gin_put_matches_numpy(shape, delivery):
    """nccl4py's CuTe GIN example: rank 0's put lands whole in the last rank's window, three calls on one device
    communicator; the other ranks' windows stay as they were."""
    n, nodes = shape
    for pairs in run_ranks(lambda c: gin_put.run(c, count=300, dst=n - 1, calls=3, seed=n), nranks=n, nodes=nodes,
                           seed=n, gin_delivery=delivery):
        for result, reference in pairs:
            np.testing.assert_array_equal(result, reference)


@flowdsl.kernel
def _gin_put_without_the_barrier(comm, send_win, recv_win, nbytes, dst):
    ctx = gin.context(comm, 0)
    cta = coop.cta()
    before = gin.read_signal(ctx, gin_put.SIGNAL)
    world = team.world(comm)
    if world.rank == 0:
        gin.put(ctx, world, dst, recv_win, 0, send_win, 0, nbytes, remote=gin.signal_inc(gin_put.SIGNAL), coop=cta)
        gin.flush(ctx, cta)
    if world.rank == dst:
        gin.wait_signal(ctx, cta, gin_put.SIGNAL, before + 1)


def test_gin_put_refuses_a_destination_that_is_not_another_rank():
    for dst in (0, 2):
        with pytest.raises(flowdsl.UsageError, match=rf"Cannot put from rank 0 to rank {dst}: the destination must be "
                                                     r"another rank, 1 to 1\. Run with at least 2 ranks"):
            sim.spawn(lambda c: gin_put.run(c, count=8, dst=dst), nranks=2, nodes=2)


def test_gin_put_without_its_barrier_is_caught(monkeypatch):
    """Without the world barrier, rank 0's put of the next call can land before the destination reads the signal's
    start: its wait then expects one increment more than will come, and the simulator says so."""
    monkeypatch.setattr(gin_put, "gin_put", _gin_put_without_the_barrier)
    caught = []
    for seed in range(4):
        try:
            sim.spawn(lambda c: gin_put.run(c, count=64, calls=3), nranks=2, nodes=2, seed=seed,
                      gin_delivery="reordered")
        except flowdsl.sim.WaitTimeoutError as exc:
            caught.append(str(exc))
    assert caught and "waited for gin.wait_signal, signal 1: expected" in caught[0]


@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (4, 2), (4, 4)], ids=["1", "1x2", "2x2", "4x1"])
def test_rmsnorm_gin_matches_numpy(shape, delivery):
    """NCCL's 07 03_rmsnorm_gin: reduce-scatter by puts, RMSNorm, all-gather by puts, world GIN barriers between."""
    n, nodes = shape
    assert_ranks_close(run_ranks(lambda c: rmsnorm_gin.run(c, tokens=3, hidden=40, seed=n), nranks=n, nodes=nodes,
                                 seed=n, gin_delivery=delivery), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (4, 2), (6, 3), (4, 4)], ids=["1", "1x2", "2x2", "3x2", "4x1"])
def test_rmsnorm_hybrid_matches_numpy(shape, delivery):
    """NCCL's 07 04_rmsnorm_hybrid: puts across nodes, LSA stores inside one, the hybrid barrier's LSA part alone
    between the reduce-scatter and the sum."""
    n, nodes = shape
    assert_ranks_close(run_ranks(lambda c: rmsnorm_hybrid.run(c, tokens=3, hidden=40, seed=n), nranks=n,
                                 nodes=nodes, seed=n, gin_delivery=delivery), rtol=1e-5, atol=1e-5)


@flowdsl.kernel
def _exchange_in_node(comm, win, out, part):
    """Each rank stores into its LSA neighbour's window, syncs one part of a hybrid barrier (0: the LSA part,
    1: the GIN part, 2: the whole session), then reads what its other neighbour stored."""
    ctx = gin.context(comm, 0)
    bar = gin.hybrid_barrier(ctx, coop.cta(), 0)
    i = cuda.threadIdx.x
    node = team.lsa(comm)
    lsa.lsa_view(win, (node.rank + 1) % node.nranks)[i] = comm.rank * 100 + i  # <node_store>
    if part == 0:
        bar.lsa_barrier().sync(MemoryOrder.ACQ_REL)
    elif part == 1:
        bar.gin_barrier().sync(MemoryOrder.ACQ_REL)
    else:
        bar.sync(MemoryOrder.ACQ_REL)
    out[i] = lsa.local_view(win)[i]  # <node_read>
    bar.sync(MemoryOrder.ACQ_REL)  # the whole session after a part: its epochs continue


@pytest.mark.parametrize("part", [0, 2], ids=["lsa_barrier", "whole"])
def test_a_hybrid_sessions_lsa_part_orders_the_nodes_stores(part):
    def main(comm):
        buf, out = comm.alloc(8, np.int64), comm.alloc(8, np.int64)
        buf.set(np.zeros(8, np.int64))
        with comm.register(buf) as win, comm.device_communicator(barrier_count=1) as dc:
            for _ in range(3):  # the parts and the session keep one barrier state across launches
                _exchange_in_node[1, 8](dc, win, out, part)
            comm.synchronize()
        return out.get(), comm.rank, comm.lsa_size
    for got, rank, ls in run_ranks(main, nranks=4, nodes=2):
        left = rank - rank % ls + (rank % ls - 1) % ls
        assert list(got) == [left * 100 + i for i in range(8)]


def test_a_hybrid_sessions_gin_part_does_not_order_the_nodes_stores():
    """The GIN part syncs the rail team (this LSA rank on every node): a store by a rank of this node is not
    ordered by it, and the race detector says so."""
    def main(comm):
        buf, out = comm.alloc(8, np.int64), comm.alloc(8, np.int64)
        with comm.register(buf) as win, comm.device_communicator(barrier_count=1) as dc:
            _exchange_in_node[1, 8](dc, win, out, 1)
            comm.synchronize()

    with pytest.raises(sim.DataRaceError) as err:
        sim.spawn(main, nranks=4, nodes=2)
    assert "test_gin.py:" in str(err.value) and "data race" in str(err.value)



@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_moe_two_nodes_of_four(seed, delivery):
    res = run_ranks(lambda c: moe_gin.run(c, seed=seed), nranks=8, nodes=2, seed=seed, gin_delivery=delivery)
    assert_ranks_close(res, rtol=1e-6)
    assert all(not np.isnan(r).any() for r, _ in res)


@pytest.mark.parametrize("backend", ["proxy", "efa_gda"])
def test_moe_one_weak_signal_per_put_passes_reordered(backend):
    assert_ranks_close(run_ranks(lambda c: moe_gin.run(c, seed=2, mode=moe_gin.WEAK_PER_PUT), nranks=8,
                                 nodes=2, seed=2, gin_delivery="reordered", gin_backend=backend), rtol=1e-6)


# ---------------------------------------------------------------- planted bugs
def _moe_bug(seed, delivery="reordered"):
    with pytest.raises(sim.GinCoverageError) as ei:
        run_ranks(lambda c: moe_gin.run(c, seed=seed, mode=moe_gin.WEAK_LAST_ONLY), nranks=8, nodes=2,
                  seed=seed, gin_delivery=delivery)
    return str(ei.value)


def test_weak_signal_after_several_puts_is_reported_and_reproduced():
    msg = _moe_bug(4)
    assert msg.startswith("Cannot read element")
    assert "has not observed a signal that covers it" in msg
    assert "the weak signal 0 covers only put #" in msg
    assert "context 0" in msg and "from rank" in msg and "window #" in msg and "byte offset" in msg
    assert "block" in msg and "thread" in msg and "seed=4" in msg
    assert re.search(r"on rank \d+ at moe_gin\.py:\d+ \(\w+\): it holds data of", msg), msg  # the reading line
    assert "Wait for a signal that covers every put" in msg
    assert _moe_bug(4) == msg                      # same seed, same report
    assert "covers only put #" in _moe_bug(4, "ordered")   # weak promises nothing even when in order


def _two_puts_then_read(nbytes, signal_inc, signal):
    """A kernel: two puts of ``nbytes`` to the next rank, the second with ``remote=signal_inc(signal)``;
    then wait for ``signal`` and read the first put's first element into ``out[0]``."""
    @flowdsl.kernel
    def two_puts_then_read(comm, src, dst, out):
        ctx = gin.context(comm, 0)
        w = team.world(comm)
        peer = (w.rank + 1) % w.nranks
        gin.put(ctx, w, peer, dst, 0, src, 0, nbytes, coop=coop.thread())
        gin.put(ctx, w, peer, dst, nbytes, src, nbytes, nbytes, remote=signal_inc(signal), coop=coop.thread())
        gin.wait_signal(ctx, coop.thread(), signal, 1)
        out[0] = lsa.local_view(dst)[0]
    return two_puts_then_read


def test_weak_coverage_names_a_put_that_had_not_landed():
    """Reading a put's destination before it lands (reordered) names it as not landed."""
    k = _two_puts_then_read(64, gin.weak_signal_inc, 3)

    def main(comm):
        a, b, out = comm.alloc(32, np.float32), comm.alloc(32, np.float32), comm.alloc(1, np.float32)
        a.set(np.arange(32, dtype=np.float32))
        with comm.register(a) as s, comm.register(b) as d, comm.device_communicator(gin_signal_count=4) as dc:
            k[1, 1](dc, s, d, out)
            comm.synchronize()
    msgs = []
    for seed in range(6):
        try:
            run_ranks(main, nranks=2, nodes=2, seed=seed, gin_delivery="reordered")
        except sim.GinCoverageError as e:
            msgs.append(str(e))
    assert len(msgs) == 6
    assert any("the weak signal 3 covers only put #1; put #0 had not landed" in m for m in msgs)


@flowdsl.kernel
def _sig5(comm, win):
    ctx = gin.context(comm, 0)
    gin.signal(ctx, team.world(comm), 0, gin.weak_signal_inc(5))


@flowdsl.kernel
def _ctr3(comm, win):
    ctx = gin.context(comm, 0)
    gin.put(ctx, team.world(comm), 0, win, 0, win, 0, 4, local=gin.counter_inc(3))


@flowdsl.kernel
def _ctx4(comm, win):
    gin.context(comm, 4)


@flowdsl.kernel
def _rail2(comm, win):
    gin.rail_barrier(gin.context(comm, 0), coop.cta(), 2).sync(MemoryOrder.ACQ_REL)


@flowdsl.kernel
def _hybrid1(comm, win):
    gin.hybrid_barrier(gin.context(comm, 0), coop.cta(), 1).sync(MemoryOrder.ACQ_REL)


@flowdsl.kernel
def _strong_on_efa(comm, win):
    ctx = gin.context(comm, 0)
    gin.put(ctx, team.world(comm), 0, win, 0, win, 0, 4, remote=gin.strong_signal_inc(0))


def _one(kern, nodes=2, **reqs):
    def main(comm):
        buf = comm.alloc(16, np.float32)
        with comm.register(buf) as win, comm.device_communicator(**reqs) as dc:
            kern[1, 1](dc, win)
            comm.synchronize()
    return main


@pytest.mark.parametrize("kern, reqs, err, text", [
    (_sig5, dict(gin_signal_count=4), sim.GinResourceError,
     "signal id 5 is beyond the 4 signals the device communicator was created with (gin_signal_count=4)"),
    (_ctr3, dict(gin_counter_count=2), sim.GinResourceError,
     "counter id 3 is beyond the 2 counters the device communicator was created with (gin_counter_count=2)"),
    (_ctx4, dict(gin_connection_type=flowdsl.GinConnectionType.FULL), sim.GinResourceError,
     "context index 4 is beyond the 4 contexts the device communicator was created with (gin_context_count=4)"),
    (_ctx4, {}, sim.GinResourceError,  # NCCL >= 2.29 enables GIN only when asked
     "Cannot make GIN context 4: the device communicator has no GIN (NCCL >= 2.29 enables GIN only when asked"),
    (_rail2, dict(rail_gin_barrier_count=2), sim.BarrierIndexError,
     "Cannot open GIN rail barrier 2: the device communicator has rail_gin_barrier_count=2"),
    (_hybrid1, dict(lsa_barrier_count=2, rail_gin_barrier_count=1), sim.BarrierIndexError,
     "lsa_barrier_count=2, rail_gin_barrier_count=1"),
])
def test_planted_index_bugs_are_reported(kern, reqs, err, text):
    msgs = []
    for _ in range(2):
        with pytest.raises(err) as ei:
            run_ranks(_one(kern, **reqs), nranks=4, nodes=2, seed=7)
        msgs.append(str(ei.value))
    assert text in msgs[0] and msgs[0].startswith("Cannot ") and "seed=7" in msgs[0]
    assert msgs[0] == msgs[1]


def test_a_device_communicator_requiring_strong_signals_is_refused_on_efa_gda_in_nccls_words():
    """NCCL requires strong signals unless told not to (ginStrongSignalsRequired), and passes over a backend
    without them: on EFA GDA alone it creates no device communicator."""
    with pytest.raises(sim.UsageError) as ei:
        run_ranks(_one(_strong_on_efa, gin_signal_count=1), nranks=2, nodes=2, gin_backend="efa_gda")
    msg = str(ei.value)
    assert ('"GIN strong signals are required, but the GIN plugin does not support them." ... "GIN: DevComm setup '
            'failed on all available backends"') in msg
    assert "the GIN backend efa_gda offers weak signals only" in msg and "Pass gin_strong_signals_required=False" in msg
    with pytest.raises(sim.UsageError, match="gin_strong_signals_required"):  # the MoE example's strong mode
        run_ranks(lambda c: moe_gin.run(c), nranks=4, nodes=2, gin_backend="efa_gda")


def test_strong_signal_on_efa_gda_is_refused():
    with pytest.raises(sim.GinBackendError) as ei:
        run_ranks(_one(_strong_on_efa, gin_signal_count=1, gin_strong_signals_required=False), nranks=2, nodes=2,
                  gin_backend="efa_gda")
    msg = str(ei.value)
    assert "flowdsl.gin.strong_signal_inc" in msg and "needs strong signals" in msg
    assert "the GIN backend efa_gda offers weak signals only (as EFA GDA does)" in msg


def test_a_strong_signal_where_the_device_communicator_does_not_require_them_is_refused():
    """NCCL leaves strong signals undefined on a device communicator made with ginStrongSignalsRequired=false."""
    with pytest.raises(sim.GinBackendError, match=r"created with gin_strong_signals_required=False, under which NCCL "
                                                  r"leaves strong signals undefined"):
        run_ranks(_one(_strong_on_efa, gin_signal_count=1, gin_strong_signals_required=False), nranks=2, nodes=2)


def test_unknown_gin_options_are_refused():
    with pytest.raises(sim.UsageError, match="gin_delivery='sorted'"):
        run_ranks(lambda c: None, nranks=1, gin_delivery="sorted")
    with pytest.raises(sim.UsageError, match=r"gin_backend='ib': it is not a GIN backend\. Use one of proxy, gdaki, "
                                             r"gpi, efa_gda"):
        run_ranks(lambda c: None, nranks=1, gin_backend="ib")


@pytest.mark.parametrize("backend", list(flowdsl.GinBackend))
def test_every_backend_of_the_gpu_runtime_is_simulated_and_named_by_the_device_communicator(backend):
    """The backends are one table (flowdsl.GinBackend) for GPUs, their GIN builds and the simulator. A
    device communicator names its backend (what a GPU launch links GIN kernels for); the MoE example
    runs on every backend whose signals it can use (a strong signal is refused on EFA GDA, above)."""
    def main(comm):
        with comm.device_communicator() as dcomm:
            named = dcomm.gin_backend
        out, ref = moe_gin.run(comm, mode=moe_gin.WEAK_PER_PUT)
        return named, out, ref

    option = backend if backend.value % 2 else backend.option  # members and names, as FlowKernel.compile takes
    for named, out, ref in run_ranks(main, nranks=4, nodes=2, seed=3, gin_delivery="reordered", gin_backend=option):
        assert named is backend
        np.testing.assert_allclose(out, ref, rtol=1e-6)


# ---------------------------------------------------------------- semantics
@flowdsl.kernel
def _ops(comm, src, dst, flag, out, it):
    ctx = gin.context(comm, 1)
    w = team.world(comm)
    peer = (w.rank + 1) % w.nranks
    th = coop.thread()
    # counter rises once the source has been read; flush waits for it
    gin.put(ctx, w, peer, dst, 0, src, 0, 16, remote=gin.signal_add(0, 5), local=gin.counter_inc(0), coop=th)
    gin.flush(ctx, th)
    out[0] = gin.read_counter(ctx, 0)
    gin.wait_counter(ctx, th, 0, 1)
    gin.wait_signal(ctx, th, 0, 5)
    v = lsa.local_view(dst)
    out[1] = v[0] + v[3]
    out[2] = gin.read_signal(ctx, 0, 3)                 # 5 over 3 bits
    gin.reset_signal(ctx, 0)
    out[3] = gin.read_signal(ctx, 0)
    # get: lands by flush
    gin.get(ctx, w, peer, src, 16, dst, 32, 8, coop=th)
    gin.flush(ctx, th)
    out[4] = v[8] + v[9]
    # put_value + VA signal, observed by a flowdsl.mem spin
    gin.put_value(ctx, w, peer, dst, 48, int64(7), remote=gin.weak_va_signal_add(flag, 0, 2), coop=th)
    f = lsa.local_view(flag, 0, -1, uint64)
    while mem.load_acquire(f, 0, ThreadScope.SYSTEM) < 2 * (it + 1):  # the flag is not reset
        pass
    out[5] = lsa.local_view(dst, 0, -1, int64)[6]
    gin.signal(ctx, w, peer, gin.strong_signal_add(1, 3), coop=th)
    gin.wait_signal(ctx, th, 1, 3)
    gin.reset_counter(ctx, 0)
    out[6] = gin.read_counter(ctx, 0)
    bar = gin.rail_barrier(ctx, coop.cta(), 0)
    bar.sync(MemoryOrder.ACQ_REL)
    bar.sync(MemoryOrder.ACQ_REL)


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_put_get_flush_counters_signals_va_and_rail_barrier(delivery):
    def main(comm):
        src, dst = comm.alloc(16, np.float32), comm.alloc(16, np.float32)
        src.set(np.arange(16, dtype=np.float32) + 100 * comm.rank)
        flag = comm.alloc(2, np.uint64)
        flag.set(np.zeros(2, np.uint64))
        out = comm.alloc(8, np.float64)
        with comm.register(src) as s, comm.register(dst) as d, comm.register(flag) as f, \
                comm.device_communicator(gin_context_count=2, gin_signal_count=2, gin_counter_count=1,
                                         rail_gin_barrier_count=1) as dc:
            _ops[1, 1](dc, s, d, f, out, 0)
            _ops[1, 1](dc, s, d, f, out, 1)  # barrier epochs carry over; signals were reset
            comm.synchronize()
        return out.get()
    for seed in (0, 1):
        res = run_ranks(main, nranks=4, nodes=2, seed=seed, gin_delivery=delivery)
        for r, o in enumerate(res):
            prev = (r - 1) % 4
            nxt = (r + 1) % 4
            assert o[0] == 1 and o[1] == 200 * prev + 3 and o[2] == 5 and o[3] == 0
            assert o[4] == 200 * nxt + 9
            assert o[5] == 7 and o[6] == 0


def test_rolling_signal_comparison():
    @flowdsl.kernel
    def k(comm, out):
        ctx = gin.context(comm, 0)
        gin.signal(ctx, team.world(comm), comm.rank, gin.weak_signal_add(0, 6), coop=coop.thread())
        gin.wait_signal(ctx, coop.thread(), 0, 260, 3)  # over 3 bits 260 is 4: 0 is below it, 6 reaches it
        out[0] = gin.read_signal(ctx, 0)

    def main(comm):
        out = comm.alloc(1, np.int64)
        k[1, 1](comm.device_communicator(gin_signal_count=1), out)
        return out.get()[0]
    assert run_ranks(main, nranks=2) == [6, 6]


def test_reordered_delivery_reorders_and_is_seeded():
    @flowdsl.kernel
    def k(comm, src, dst):
        ctx = gin.context(comm, 0)
        w = team.world(comm)
        if w.rank == 0:
            for i in range(8):
                gin.put(ctx, w, 1, dst, 0, src, i * 4, 4, remote=gin.weak_signal_inc(0), coop=coop.thread())
        else:
            gin.wait_signal(ctx, coop.thread(), 0, 8)

    def main(comm):
        a, b = comm.alloc(8, np.float32), comm.alloc(8, np.float32)
        a.set(np.arange(8, dtype=np.float32))
        with comm.register(a) as s, comm.register(b) as d, comm.device_communicator(gin_signal_count=1) as dc:
            k[1, 1](dc, s, d)
            comm.synchronize()
        return float(b.get()[0])

    def last(seed, d):
        return run_ranks(main, nranks=2, nodes=2, seed=seed, gin_delivery=d)[1]
    assert {last(s, "ordered") for s in range(6)} == {7.0}
    seen = {last(s, "reordered") for s in range(12)}
    assert len(seen) > 1
    assert last(3, "reordered") == last(3, "reordered")


_legacy_after_two_puts = _two_puts_then_read(16, gin.signal_inc, 0)


@pytest.mark.parametrize("backend, required", [("proxy", True), ("gdaki", True), ("proxy", False), ("efa_gda", False)])
def test_a_legacy_signal_is_as_strong_as_the_device_communicator_requires(backend, required):
    """NCCL makes its legacy signals strong exactly where the device communicator requires strong signals
    (``ginStrongLegacySignals = ginStrongSignalsRequired``), on any backend; EFA GDA takes only a device
    communicator that does not require them."""
    covered = required

    def main(comm):
        a, b, out = comm.alloc(8, np.float32), comm.alloc(8, np.float32), comm.alloc(1, np.float32)
        a.set(np.arange(8, dtype=np.float32) + comm.rank)
        with comm.register(a) as s, comm.register(b) as d, \
                comm.device_communicator(gin_signal_count=1, gin_strong_signals_required=required) as dc:
            _legacy_after_two_puts[1, 1](dc, s, d, out)
            comm.synchronize()
        return out.get()[0]
    run = lambda: run_ranks(main, nranks=2, nodes=2, seed=1, gin_delivery="reordered", gin_backend=backend)  # noqa: E731
    if covered:
        assert run() == [1.0, 0.0]
    else:
        with pytest.raises(sim.GinCoverageError, match="the weak signal 0 covers only put #1; put #0"):
            run()


@flowdsl.kernel
def _two_blocks_one_hybrid_index(comm):
    gin.hybrid_barrier(gin.context(comm, 0), coop.cta(), 0).sync(MemoryOrder.ACQ_REL)


def test_two_blocks_on_one_hybrid_barrier_index_are_refused_naming_the_hybrid_barrier():
    launch_refused(_two_blocks_one_hybrid_index, 2, 32, sim.SimulationError,
                   r"Cannot open hybrid barrier 0 in block \d: block \d of the same launch is using barrier 0",
                   nodes=2, barrier_count=1)


def _move_then_barrier_then_read(fence, get=False):
    """A kernel: a put of 16 bytes to the next rank with no signal (with ``get``, a get of the next rank's first 16
    bytes), a rail GIN barrier at ``fence``, then a read of element 1 of the destination."""
    @flowdsl.kernel
    def move_then_barrier_then_read(comm, src, dst, out):
        ctx = gin.context(comm, 0)
        w = team.world(comm)
        if get:
            gin.get(ctx, w, (w.rank + 1) % w.nranks, src, 0, dst, 0, 16, coop=coop.thread())
        else:
            gin.put(ctx, w, (w.rank + 1) % w.nranks, dst, 0, src, 0, 16, coop=coop.thread())
        gin.rail_barrier(ctx, coop.thread(), 0).sync(MemoryOrder.ACQ_REL, fence)
        out[0] = lsa.local_view(dst)[1]
    return move_then_barrier_then_read


def _run_moved(kernel, seed, backend="proxy", **reqs):
    """``kernel`` on 2 nodes x 1 rank, reordered, each rank's source ``10 * rank + [0, 1, 2, 3]``: what each read."""
    def main(comm):
        a, b, out = comm.alloc(4, np.float32), comm.alloc(4, np.float32), comm.alloc(1, np.float32)
        a.set(np.arange(4, dtype=np.float32) + 10 * comm.rank)
        b.set(np.full(4, np.nan, np.float32))
        with comm.register(a) as s, comm.register(b) as d, \
                comm.device_communicator(gin_signal_count=1, rail_gin_barrier_count=1, **reqs) as dc:
            kernel[1, 1](dc, s, d, out)
            comm.synchronize()
        return float(out.get()[0])
    return run_ranks(main, nranks=2, nodes=2, seed=seed, gin_delivery="reordered", gin_backend=backend)


@pytest.mark.parametrize("backend, required, fence, covered", [
    ("proxy", True, GinFenceLevel.NONE, True), ("gdaki", True, GinFenceLevel.NONE, True),
    ("proxy", False, GinFenceLevel.NONE, False), ("efa_gda", False, GinFenceLevel.NONE, False),
    ("efa_gda", False, GinFenceLevel.PUT, True), ("efa_gda", False, GinFenceLevel.PUT_GET, True)])
def test_a_gin_barrier_covers_earlier_puts_at_fence_level_put_or_where_legacy_signals_are_strong(backend, required,
                                                                                                 fence, covered):
    """NCCL's GIN barriers arrive with its legacy signals (``ncclGin_SignalInc``): at fence level NONE they follow
    the rank's earlier puts on the context where those are strong (the device communicator requires strong
    signals, NCCL's default); where they are weak, a read after the barrier of a put that no signal covered is
    reported (it was accepted before); at PUT they follow them everywhere (NCCL flushes first where signals are
    weak)."""
    def run():
        return _run_moved(_move_then_barrier_then_read(fence), 1, backend, gin_strong_signals_required=required)
    if covered:
        assert run() == [11.0, 1.0]
    else:
        with pytest.raises(sim.GinCoverageError, match=r"the weak rail GIN barrier 0's arrival \(NCCL's GIN barriers "
                                                        r"signal with its legacy signals, weak on a device communicator "
                                                        r"made with gin_strong_signals_required=False\) covers no put; "
                                                        r"put #0 had"):
            run()


@pytest.mark.parametrize("fence", [GinFenceLevel.GET, GinFenceLevel.NONE])
def test_a_gin_barrier_at_fence_level_get_returns_after_the_ranks_gets_landed(fence):
    """GET flushes after the waits (NCCL 2.32): the get's bytes are there when the barrier returns. Without
    it, reading them races with the get's landing, which the race detector reports."""
    kernel = _move_then_barrier_then_read(fence, get=True)
    if fence == GinFenceLevel.GET:
        assert _run_moved(kernel, 3) == [11.0, 1.0]
    else:
        with pytest.raises(sim.DataRaceError, match="get"):
            _run_moved(kernel, 3)


def _put_off_rail_then_hybrid_barrier(fence):
    """A kernel on 2 nodes x 2 ranks: each rank puts to the rank of the other node and the other LSA rank (not
    a member of its rail team), syncs a hybrid barrier at ``fence``, and reads what it was sent."""
    @flowdsl.kernel
    def put_off_rail(comm, src, dst, out):
        ctx = gin.context(comm, 0)
        w = team.world(comm)
        gin.put(ctx, w, w.nranks - 1 - w.rank, dst, 0, src, 0, 16, coop=coop.thread())
        gin.hybrid_barrier(ctx, coop.thread(), 0).sync(MemoryOrder.ACQ_REL, fence)
        out[0] = lsa.local_view(dst)[2]
    return put_off_rail


@pytest.mark.parametrize("fence, covered", [(GinFenceLevel.PUT, True), (GinFenceLevel.NONE, False)])
def test_a_hybrid_barrier_at_fence_level_put_covers_puts_outside_the_rail_team(fence, covered):
    """With PUT and GIN reaching every rank, NCCL 2.32's hybrid barrier is a GIN barrier over every rank, not
    LSA then rail: the rail barrier's arrivals do not follow a put to a rank outside the rail team (the
    report names that put), the dense barrier's do."""
    kernel = _put_off_rail_then_hybrid_barrier(fence)

    def main(comm):
        a, b, out = comm.alloc(4, np.float32), comm.alloc(4, np.float32), comm.alloc(1, np.float32)
        a.set(np.arange(4, dtype=np.float32) + 10 * comm.rank)
        with comm.register(a) as s, comm.register(b) as d, comm.device_communicator(barrier_count=1) as dc:
            kernel[1, 1](dc, s, d, out)
            comm.synchronize()
        return float(out.get()[0])
    run = lambda: run_ranks(main, nranks=4, nodes=2, seed=2, gin_delivery="reordered")  # noqa: E731
    if covered:
        assert run() == [32.0, 22.0, 12.0, 2.0]
    else:
        with pytest.raises(sim.GinCoverageError, match="put #0"):
            run()


@flowdsl.kernel
def _lsa_part_fenced(comm, win):
    gin.hybrid_barrier(gin.context(comm, 0), coop.thread(), 0).lsa_barrier().sync(MemoryOrder.ACQ_REL, GinFenceLevel.PUT)


def test_the_lsa_part_of_a_hybrid_session_takes_no_fence_level():
    with pytest.raises(flowdsl.KernelTypingError, match=r"syncs with sync\(order\) only: NCCL's lsaBarrier\(\)\.sync "
                                                        r"has no fence level"):
        run_ranks(_one(_lsa_part_fenced, barrier_count=1), nranks=2, nodes=2)
