"""Primitive semantics, the numba.cuda stand-in and the host API of the simulator."""


import numpy as np
import pytest
from numba import cuda, float32, int32

import flowdsl
import flowdsl.sim as sim
from flowdsl import _stubs, coop, lsa, mem, team
from flowdsl.enums import MemoryOrder, ThreadScope
from flowdsl.testing import run_ranks, run_seeds

pytestmark = pytest.mark.sim


def test_every_primitive_has_semantics():
    missing = sorted(set(_stubs.PRIMITIVES) - set(sim.SEMANTICS))
    assert missing == []


def test_every_simulation_takes_its_stubs_parameters():
    """Names, kinds and defaults: a default only the simulator had (lsa.sync's order was SEQ_CST there)
    let a kernel run on the simulator that the GPU's typing refuses."""
    import inspect

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    differ = [f"{name}{inspect.signature(sim.SEMANTICS[name])} against the stub's {inspect.signature(stub)}"
              for name, stub in sorted(_stubs.PRIMITIVES.items()) if params(sim.SEMANTICS[name]) != params(stub)]
    assert differ == []


def test_unmodelled_primitive_raises_naming_it():
    def put(win, offset, peer):
        """A primitive nobody has modelled yet."""
    put.__module__ = "flowdsl.unmodelled"  # a surface nobody has modelled (gin.put and cft.put are)
    stub = _stubs.primitive(put)
    try:
        @flowdsl.kernel
        def k(comm, win):
            stub(win, 0, 1)

        def main(comm):
            buf = comm.alloc(4, np.float32)
            with comm.register(buf) as win, comm.device_communicator() as dc:
                k[1, 1](dc, win)
                comm.synchronize()
        with pytest.raises(sim.UnsupportedFeatureError) as ei:
            run_ranks(main, nranks=2)
        assert "flowdsl.unmodelled.put is not modelled by the simulator yet" in str(ei.value)
    finally:
        del _stubs.PRIMITIVES["flowdsl.unmodelled.put"]


def test_unmodelled_numba_cuda_function():
    @flowdsl.kernel
    def k(a):
        a[1] = 1.0
        if a[0] > 0:
            cuda.ldcg(a, 0)  # a cache-hinted load: not modelled yet

    a = np.zeros(2)
    with pytest.raises(sim.UnsupportedFeatureError) as err:
        run_ranks(lambda comm: k[1, 1](a), nranks=1)
    # Refused before the launch (nothing ran: a[1] is untouched), though the call sits in a branch not taken.
    assert a[1] == 0.0
    assert ("Cannot run k on the simulator: it calls numba.cuda.ldcg at test_semantics.py:62 (k), which the "
            "simulator does not model yet. Run it on a GPU (flowdsl.init())") in str(err.value), str(err.value)


def test_primitive_outside_kernel_is_device_only():
    with pytest.raises(_stubs.DeviceOnlyError):
        coop.cta()


def test_alloc_poison_set_get_and_window_lifecycle():
    def main(comm):
        f = comm.alloc((2, 3), np.float32)
        i = comm.alloc(4, np.int32)
        assert np.isnan(f.get()).all() and (i.get() == np.int32(-1515870811)).all()
        f.set(np.arange(6, dtype=np.float32).reshape(2, 3))
        g = f.get()
        g[0, 0] = 99  # a copy
        win = comm.register(f)
        win.close()
        win.close()  # idempotent
        comm.barrier()
        return f.get()
    out = run_ranks(main, nranks=2)
    assert (out[1] == np.arange(6).reshape(2, 3)).all()


def test_register_size_mismatch_and_unknown_option():
    def main(comm):
        comm.register(comm.alloc(4 + comm.rank, np.float32))
    with pytest.raises(sim.UsageError, match="differ in size"):
        run_ranks(main, nranks=2)
    with pytest.raises(TypeError, match="unknown option"):
        run_ranks(main, nranks=2, bogus=1)


@flowdsl.kernel
def team_probe(comm, win, out):
    w, l, r = team.world(comm), team.lsa(comm), team.rail(comm)
    v = lsa.local_view(win, 0, 16)
    v[0], v[1], v[2] = w.nranks, w.rank, w.stride
    v[3], v[4], v[5] = l.nranks, l.rank, l.stride
    v[6], v[7], v[8] = r.nranks, r.rank, r.stride
    v[9] = team.rank_to_world(comm, r, 0)
    v[10] = team.rank_is_member(l, w, (comm.rank + 1) % comm.nranks)
    v[11] = team.rank_to_team(l, w, comm.rank - comm.lsa_rank)
    inner = team.inner_factor(w, 2)
    v[12] = inner.rank
    v[13] = team.outer_factor(w, 2).rank
    v[14] = team.rank_in_difference(w, l, 0)
    v[15] = team.rank_to_lsa(comm, l, l.nranks - 1)


def test_teams_two_nodes():
    def main(comm):
        buf = comm.alloc(16, np.int64)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            team_probe[1, 1](dc, win, 0)
            return buf.get()
    out = run_ranks(main, nranks=4, nodes=2)
    # rank 3: world (4,3,1), lsa (2,1,1), rail (2,1,2)
    assert list(out[3][:9]) == [4, 3, 1, 2, 1, 1, 2, 1, 2]
    assert out[3][9] == 1  # rail rank 0 of rank 3 is world rank 1
    assert out[3][10] == 0 and out[2][10] == 1  # rank 3's next (0) is off-node; rank 2's next (3) on-node
    assert out[3][11] == 0  # lsa rank of the node's first rank
    assert out[3][12] == 1 and out[3][13] == 1
    assert out[3][14] == 0 and out[0][14] == 2  # first world rank outside my LSA team
    assert out[3][15] == 1


@flowdsl.kernel
def coop_probe(comm, win):
    v = lsa.local_view(win)
    t = cuda.threadIdx.x
    w = coop.warp()
    c = coop.cta()
    s = coop.warp_span(1, 2, 3) if t >= 32 and t < 96 else coop.thread()
    ln = coop.lanes(0x0000FFFF) if t % 32 < 16 else coop.lanes(0xFFFF0000)
    w.sync()
    ln.sync()
    s.sync()
    c.sync()
    v[t] = w.thread_rank() * 1000000 + s.thread_rank() * 10000 + ln.thread_rank() * 100 + ln.size()
    v[128 + t] = c.size() + w.size() * 1000 + s.size() * 10000


@flowdsl.kernel
def coop_traits(out):
    """NCCL's coop utilities: lane masks, the compile-time traits, coalesced groups (one row a thread)."""
    t = cuda.threadIdx.x
    ln = coop.lanes(0x0000FFFF) if t % 32 < 16 else coop.lanes(0xFFFF0000)
    span = coop.warp_span(0, 2, 1)
    out[t, 0] = coop.lane_mask(coop.thread())
    out[t, 1] = coop.lane_mask(ln)
    out[t, 2] = coop.lane_mask(coop.warp()) & coop.lane_mask(span) & coop.lane_mask(coop.cta())
    out[t, 3] = coop.is_thread(coop.thread()) + 2 * coop.is_thread(coop.warp()) + 4 * coop.is_thread(coop.cta())
    out[t, 4] = coop.within_warp(ln) + 2 * coop.within_warp(coop.warp()) + 4 * coop.within_warp(span)
    out[t, 5] = coop.coalesced(span).size() * 100 + coop.coalesced(ln).size()
    out[t, 6] = coop.lane_mask(coop.coalesced())


def check_coop_traits(out):
    lanes = np.arange(64) % 32
    assert list(out[:, 0]) == list(1 << lanes)
    assert list(out[:, 1]) == [0x0000FFFF if lane < 16 else 0xFFFF0000 for lane in lanes]
    assert set(out[:, 2]) == {0xFFFFFFFF} and set(out[:, 3]) == {1} and set(out[:, 4]) == {3}
    assert set(out[:, 5]) == {32 * 100 + 16}
    assert set(out[:, 6]) == {0xFFFFFFFF}  # every lane converged at the call


@flowdsl.kernel
def coop_broadcasts(out, a):
    """coop.bcast in each coop kind: a shuffle within a warp, a shared-memory stash for spans and the CTA."""
    t = cuda.threadIdx.x
    ln = coop.lanes(0x0000FFFF) if t % 32 < 16 else coop.lanes(0xFFFF0000)
    span = coop.warp_span(0, 2, 3) if t < 64 else coop.warp_span(2, 1, 4)
    x = a[t]
    out[t, 0] = coop.bcast(coop.thread(), x, 0)
    out[t, 1] = coop.bcast(coop.warp(), x, 5)
    out[t, 2] = coop.bcast(ln, x, 2)
    out[t, 3] = coop.bcast(span, x, 7)
    out[t, 4] = coop.bcast(coop.cta(), x, 40)
    coop.sync(coop.cta())  # every thread read the stash: the next broadcast needs no entry sync
    out[t, 5] = coop.bcast(coop.cta(), x, 41, False)


def broadcast_expected(a):
    t = np.arange(96)
    return np.stack([a, a[t // 32 * 32 + 5], a[t // 32 * 32 + np.where(t % 32 < 16, 2, 18)],
                     a[np.where(t < 64, 7, 64 + 7)], np.full(96, a[40]), np.full(96, a[41])], 1)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64, np.uint64, np.float32, np.float64])
def test_coop_broadcast_in_every_coop(dtype):
    a = (np.arange(96) * 3 + 1).astype(dtype)
    if np.dtype(dtype).kind == "u":
        a[1::7] |= np.array(1 << (8 * np.dtype(dtype).itemsize - 1), dtype)  # the top bit crosses the shuffle
    out = np.zeros((96, 6), dtype)
    flowdsl.sim.spawn(lambda comm: coop_broadcasts[1, 96](out, a) or comm.synchronize(), nranks=1)
    np.testing.assert_array_equal(out, broadcast_expected(a))


def test_coop_broadcast_of_a_two_byte_value_is_refused_on_both_paths():
    @flowdsl.kernel
    def half(out):
        out[0] = coop.bcast(coop.warp(), out[1], 0)

    words = (r"flowdsl.coop.bcast requires value to be a number of 4 or 8 bytes \(int32, uint32, int64, uint64, "
             r"float32 or float64\), got int16. Convert it first")
    with pytest.raises(flowdsl.KernelTypingError, match=words):
        flowdsl.sim.spawn(lambda comm: half[1, 32](np.zeros(2, np.int16)) or comm.synchronize(), nranks=1)
    with pytest.raises(flowdsl.KernelTypingError, match=words):
        half.compile(half.argtypes_for(np.zeros(2, np.int16), nccl="2.28.9"), arch="sm_90", nccl="2.28.9")


@flowdsl.kernel
def coop_tiles(out):
    """NCCL's tiles of n lanes: masks, ranks and sizes, the traits, a broadcast in a tile, a tile's sync."""
    t = cuda.threadIdx.x
    out[t, 0] = coop.lane_mask(coop.tile(4))
    out[t, 1] = coop.tile(8).thread_rank() * 100 + coop.tile(8).size()
    out[t, 2] = coop.is_thread(coop.tile(1)) + 2 * coop.within_warp(coop.tile(32)) + 4 * coop.is_thread(coop.tile(2))
    out[t, 3] = coop.bcast(coop.tile(16), t, 3)
    coop.tile(2).sync()


def check_coop_tiles(out):
    lane = np.arange(64) % 32
    assert list(out[:, 0]) == list(0xF << (lane & ~3))
    assert list(out[:, 1]) == list((lane % 8) * 100 + 8)
    assert set(out[:, 2]) == {3}
    assert list(out[:, 3]) == list(np.arange(64) // 16 * 16 + 3)


def test_coop_tiles():
    out = np.zeros((64, 4), np.int64)
    flowdsl.sim.spawn(lambda comm: coop_tiles[1, 64](out) or comm.synchronize(), nranks=1)
    check_coop_tiles(out)


def test_a_tile_of_other_than_a_power_of_two_is_refused_on_both_paths():
    @flowdsl.kernel
    def three(out):
        out[0] = coop.tile(3).size()

    words = r"flowdsl.coop.tile requires n to be one of 1, 2, 4, 8, 16, 32, got 3. Pass one of 1, 2, 4, 8, 16, 32"
    with pytest.raises(flowdsl.KernelTypingError, match=words):
        flowdsl.sim.spawn(lambda comm: three[1, 32](np.zeros(1, np.int64)) or comm.synchronize(), nranks=1)
    with pytest.raises(flowdsl.KernelTypingError, match=words):
        three.compile(three.argtypes_for(np.zeros(1, np.int64), nccl="2.28.9"), arch="sm_90", nccl="2.28.9")


def test_coop_utilities():
    out = np.zeros((64, 7), np.int64)
    flowdsl.sim.spawn(lambda comm: coop_traits[1, 64](out) or comm.synchronize(), nranks=1)
    check_coop_traits(out)


def test_coops():
    def main(comm):
        buf = comm.alloc(256, np.int64)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            coop_probe[1, 100](dc, win)
            return buf.get()
    v = run_ranks(main, nranks=1)[0]
    assert v[5] == 5 * 1000000 + 0 + 5 * 100 + 16
    assert v[40] == 8 * 1000000 + 8 * 10000 + 8 * 100 + 16
    assert v[97] == 1 * 1000000 + 0 + 1 * 100 + 4  # last warp has 4 lanes: 96..99
    assert v[128 + 40] == 100 + 32 * 1000 + 64 * 10000
    assert v[128 + 97] == 100 + 4 * 1000 + 1 * 10000


@flowdsl.kernel
def cuda_probe(out, shared_n):
    sh = cuda.shared.array(64, int32)
    loc = cuda.local.array(2, float32)
    x, y = cuda.threadIdx.x, cuda.threadIdx.y
    tid = x + y * cuda.blockDim.x
    sh[tid] = tid
    cuda.syncthreads()
    loc[0] = sh[(tid + 1) % 64]
    lane = tid % 32
    s = cuda.shfl_down_sync(0xFFFFFFFF, tid, 1)
    xo = cuda.shfl_xor_sync(0xFFFFFFFF, lane, 1)
    ball = cuda.ballot_sync(0xFFFFFFFF, lane < 3)
    cnt = cuda.syncthreads_count(tid % 2 == 0)
    cuda.atomic.add(out, 0, 1)
    i = cuda.grid(1) if cuda.blockDim.y == 1 else tid
    out[1 + tid] = int(loc[0]) * 10 ** 6 + s * 1000 + xo + (ball == 7) * 100 + (cnt == 32) * 200


def test_numba_cuda_surface_2d_block():
    def main(comm):
        out = np.zeros(65, np.int64)
        cuda_probe[1, (16, 4)](out, 64)
        comm.synchronize()
        return out
    out = run_ranks(main, nranks=1)[0]
    assert out[0] == 64
    tid = 5
    assert out[1 + tid] == 6 * 10 ** 6 + 6 * 1000 + 4 + 300
    tid = 31  # last lane: shfl_down keeps own value
    assert out[1 + tid] == 0 * 10 ** 6 + 31 * 1000 + 30 + 300 or out[1 + tid] == 32 * 10 ** 6 + 31 * 1000 + 30 + 300


@flowdsl.kernel
def count_epochs(comm, win, rounds):
    bar = lsa.barrier(comm, coop.cta(), 0)
    v = lsa.local_view(win, 0, 4)
    for _ in range(rounds):
        bar.arrive(MemoryOrder.RELEASE)
        bar.wait(MemoryOrder.ACQUIRE)
    if cuda.threadIdx.x == 0:
        v[0] = bar.epoch if hasattr(bar, "epoch") else -1


def test_barrier_epoch_persists_across_launches():
    def main(comm):
        buf = comm.alloc(4, np.int64)
        with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=1) as dc:
            count_epochs[1, 8](dc, win, 2)
            count_epochs[1, 8](dc, win, 3)
            comm.synchronize()
            return int(buf.get()[0])
    assert run_ranks(main, nranks=3) == [5, 5, 5]


@flowdsl.kernel
def lsa_collectives(comm, src, dst, n):
    c = coop.cta()
    bar = lsa.barrier(comm, c, 0)
    bar.sync(MemoryOrder.ACQUIRE)
    out = lsa.local_view(dst, 0, n)
    lsa.reduce_sum(c, comm, src, 0, out, n)
    c.sync()
    bar.sync(MemoryOrder.ACQ_REL)
    # Each LSA rank reduces its own share and writes it to every rank (all writing all would race).
    per = (n + comm.lsa_size - 1) // comm.lsa_size
    lo = min(comm.lsa_rank * per, n)
    hi = min(lo + per, n)
    lsa.reduce_sum_copy(c, comm, src, n + lo, dst, n + lo, hi - lo)
    bar.sync(MemoryOrder.ACQ_REL)
    if comm.lsa_rank == 0:
        lsa.copy(c, comm, lsa.local_view(src, 0, n), dst, 2 * n, n)
    bar.sync(MemoryOrder.RELEASE)


def test_lsa_reduce_and_copy():
    n = 40

    def main(comm):
        s = comm.alloc(2 * n, np.float32)
        d = comm.alloc(3 * n, np.float32)
        s.set(np.arange(2 * n, dtype=np.float32) + 1000 * comm.rank)
        with comm.register(s) as sw, comm.register(d) as dw, \
                comm.device_communicator(lsa_barrier_count=1) as dc:
            lsa_collectives[1, 16](dc, sw, dw, n)
            return d.get()
    out = run_ranks(main, nranks=3)
    base = np.arange(2 * n, dtype=np.float32) * 3 + 3000
    for r in range(3):
        np.testing.assert_array_equal(out[r][:2 * n], base)
        np.testing.assert_array_equal(out[r][2 * n:], np.arange(n, dtype=np.float32))


@flowdsl.kernel
def atomics(comm, win):
    v = lsa.lsa_view(win, 0, 0, 4)
    mem.atomic_add(v, 0, 1, MemoryOrder.RELAXED, ThreadScope.SYSTEM)
    mem.red_add(v, 1, 2, MemoryOrder.RELAXED, ThreadScope.SYSTEM)
    while mem.atomic_cas(v, 2, 0, 1, MemoryOrder.ACQUIRE, ThreadScope.SYSTEM) != 0:
        pass  # lock
    x = mem.load_relaxed(v, 3, ThreadScope.SYSTEM)
    mem.store_relaxed(v, 3, x + 1, ThreadScope.SYSTEM)
    mem.fence(MemoryOrder.SEQ_CST, ThreadScope.SYSTEM)
    mem.atomic_exch(v, 2, 0, MemoryOrder.RELEASE, ThreadScope.SYSTEM)  # unlock


def _launch_on_zeros(comm, launch, n):
    """``launch(dc, win)`` over a window of ``n`` int32 zeros, between barriers; return the window's values."""
    buf = comm.alloc(n, np.int32)
    buf.set(np.zeros(n, np.int32))
    with comm.register(buf) as win, comm.device_communicator() as dc:
        comm.barrier()
        launch(dc, win)
        comm.synchronize()
        comm.barrier()
        return buf.get()


def test_mem_atomics_and_lock_under_seeds():
    def main(comm):
        return _launch_on_zeros(comm, atomics[2, 8], 4)
    for seed, out in run_seeds(main, nranks=3, seeds=range(3)).items():
        assert list(out[0]) == [48, 96, 0, 48], seed


def test_same_seed_same_interleaving():
    @flowdsl.kernel
    def order(comm, win):
        v = lsa.lsa_view(win, 0, 0, 64)
        i = mem.atomic_add(v, 0, 1, MemoryOrder.RELAXED, ThreadScope.SYSTEM)
        v[1 + i] = comm.rank * 100 + cuda.threadIdx.x

    def main(comm):
        return _launch_on_zeros(comm, order[1, 8], 64)
    a = run_ranks(main, nranks=3, seed=7)[0]
    b = run_ranks(main, nranks=3, seed=7)[0]
    c = run_ranks(main, nranks=3, seed=8)[0]
    assert (a == b).all() and not (a == c).all()
    assert sorted(a[1:25]) == sorted(r * 100 + t for r in range(3) for t in range(8))


def test_flowdsl_kernel_and_device_function_run_on_the_simulator():
    import flowdsl
    if not hasattr(flowdsl, "device"):
        pytest.skip("flowdsl.device is not available yet")

    @flowdsl.device
    def my_index():
        return cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x

    @flowdsl.kernel
    def fill(comm, win):
        v = lsa.local_view(win)
        v[my_index()] = comm.rank * 100 + my_index()

    def main(comm):
        buf = comm.alloc(8, np.int32)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            fill[2, 4, 0, 0](dc, win)
            comm.synchronize()
            return buf.get()
    out = run_ranks(main, nranks=2)
    assert list(out[1]) == [100 + i for i in range(8)]


def test_nested_spawn_and_launch_outside_spawn_are_refused():
    def main(comm):
        sim.spawn(lambda c: None, nranks=1)
    with pytest.raises(sim.UsageError, match="inside a running simulation"):
        run_ranks(main, nranks=1)


def test_numba_device_function_and_many_spinners_livelock():
    @cuda.jit(device=True)
    def lane_of(i):
        return i % cuda.warpsize

    @flowdsl.kernel
    def spin(comm, win):
        v = lsa.local_view(win, 0, 4)
        mem.store_relaxed(v, 1, lane_of(cuda.threadIdx.x), ThreadScope.DEVICE)  # atomic: every thread stores
        while mem.load_relaxed(v, 0, ThreadScope.DEVICE) == 0:
            pass

    def main(comm):
        buf = comm.alloc(4, np.int32)
        buf.set(np.zeros(4, np.int32))
        with comm.register(buf) as win, comm.device_communicator() as dc:
            spin[4, 64](dc, win)
            comm.synchronize()
    import time
    t = time.perf_counter()
    with pytest.raises(sim.LivelockError, match=r"element 0 \(int32\) == 0"):
        run_ranks(main, nranks=4, seed=3)
    assert time.perf_counter() - t < 20


@flowdsl.kernel
def vec_copy(comm, win, bad):
    src = lsa.local_view(win, 0, 8, np.float32)
    dst = lsa.lsa_view(win, (comm.lsa_rank + 1) % comm.lsa_size, 8, 8, np.float32)
    i = cuda.threadIdx.x * 4
    mem.store_vec(dst, i, mem.load_vec(src, i))
    if bad and cuda.threadIdx.x == 0 and comm.rank == 1:
        mem.load_vec(src, 2)  # misaligned


def test_vector_load_store_and_alignment():
    if not hasattr(mem, "load_vec"):
        pytest.skip("flowdsl.mem.load_vec not available")

    def main(comm, bad=0):
        buf = comm.alloc(16, np.float32)
        buf.set(np.arange(16, dtype=np.float32) + 100 * comm.rank)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            vec_copy[1, 2](dc, win, bad)
            comm.synchronize()
            return buf.get()
    out = run_ranks(main, nranks=2)
    np.testing.assert_array_equal(out[0][8:], np.arange(8) + 100)
    np.testing.assert_array_equal(out[1][8:], np.arange(8))
    with pytest.raises(sim.UsageError, match="not 16-byte aligned"):
        run_ranks(lambda c: main(c, 1), nranks=2)


@flowdsl.kernel
def element_addresses(comm, win, out):
    v = lsa.local_view(win, 0, 8, np.float32)
    out[0] = mem.address(v, 4) - mem.address(v, 0)
    out[1] = mem.address(v, 1) & 15
    out[2] = mem.address(out, 2) - mem.address(out, 0)


def test_element_addresses_for_alignment_checks():
    """mem.address: byte addresses (a window's start is 16-byte aligned, as on the GPU)."""
    def main(comm):
        buf = comm.alloc(16, np.float32)
        out = comm.alloc(4, np.uint64)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            element_addresses[1, 1](dc, win, out)
            comm.synchronize()
            return out.get()
    for got in run_ranks(main, nranks=2):
        assert list(got[:3]) == [16, 4, 16]


def test_a_simulation_takes_the_stubs_defaults_and_states_none():
    """The stub is the one home of a default: ``implements`` gives the simulation the stub's and refuses one
    that states its own or takes other parameters."""
    import inspect

    from flowdsl.errors import FlowDSLError
    from flowdsl.sim.semantics import take_stub_defaults

    assert inspect.signature(sim.SEMANTICS["flowdsl.gin.flush"]).parameters["order"].default \
        is flowdsl.MemoryOrder.ACQUIRE

    def flush(ctx, coop, order=flowdsl.MemoryOrder.SEQ_CST):
        pass

    with pytest.raises(FlowDSLError, match=r"as the simulation of flowdsl.gin.flush: it states defaults \(order\), "
                                           r"which are the stub's to give. Drop them"):
        take_stub_defaults("flowdsl.gin.flush", flush)

    def flush2(ctx, coop):
        pass

    with pytest.raises(FlowDSLError, match=r"it takes \(ctx, coop\), the stub \(ctx, coop, order=.*\)\. Take the "
                                           r"stub's parameters"):
        take_stub_defaults("flowdsl.gin.flush", flush2)
