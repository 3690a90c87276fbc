"""Multimem (NVLink SHARP) on the simulator: a multimem view reaches every LSA team member's copy; what
PTX's multimem instructions lack is refused in the GPU's words; a system without a switch refuses the
device communicator's request."""

import numpy as np
import pytest
from numba import cuda

import flowdsl
import flowdsl.sim as sim
from flowdsl import RedOp, ThreadScope, lsa, mem
from flowdsl.enums import MemoryOrder

pytestmark = pytest.mark.sim

N = 64


def _bf16_bits(x):
    """float32 -> bfloat16 bits, rounded to nearest even (an independent NumPy reference)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_float(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


@flowdsl.kernel
def ld_reduce_scalars(comm, win, out, op_sum, op_min, op_max):
    bar = lsa.barrier(comm, flowdsl.coop.cta(), 0)
    bar.sync(MemoryOrder.ACQ_REL)
    mm = lsa.multimem_view(comm, win)
    i = cuda.threadIdx.x
    if i < out.shape[1]:
        out[0, i] = mem.multimem_ld_reduce(mm, i, RedOp.SUM)
        out[1, i] = mem.multimem_ld_reduce(mm, i, RedOp.MIN)
        out[2, i] = mem.multimem_ld_reduce(mm, i, RedOp.MAX)
    bar.sync(MemoryOrder.ACQ_REL)


@flowdsl.kernel
def ld_reduce_float_sums(comm, win, out):
    bar = lsa.barrier(comm, flowdsl.coop.cta(), 0)
    bar.sync(MemoryOrder.ACQ_REL)
    mm = lsa.multimem_view(comm, win)
    i = cuda.threadIdx.x
    if i < out.shape[0]:
        out[i] = mem.multimem_ld_reduce(mm, i, RedOp.SUM)
    bar.sync(MemoryOrder.ACQ_REL)


def _run_scalars(nranks, dtype, seed=0):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    data = [rng.integers(max(info.min, -1 << 40), min(info.max, 1 << 40), N, dtype=dtype, endpoint=True)
            for _ in range(nranks)]

    def main(comm):
        buf = comm.alloc(N, dtype)
        buf.set(data[comm.rank])
        out = np.full((3, N), 7, dtype)
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_barrier_count=1, lsa_multimem=True)
            ld_reduce_scalars[1, N](dc, win, out, 0, 0, 0)
            comm.synchronize()
        return out

    results = sim.spawn(main, nranks=nranks, multimem=True, seed=seed)
    stacked = np.stack(data)
    with np.errstate(over="ignore"):
        want = np.stack([stacked.sum(axis=0, dtype=dtype), stacked.min(axis=0), stacked.max(axis=0)])
    for out in results:
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64, np.uint64])
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_ld_reduce_of_integers_combines_every_members_element(dtype, nranks):
    _run_scalars(nranks, dtype, seed=nranks)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ld_reduce_sums_floats(dtype):
    rng = np.random.default_rng(3)
    data = [rng.standard_normal(N).astype(dtype) for _ in range(3)]

    def main(comm):
        buf = comm.alloc(N, dtype)
        buf.set(data[comm.rank])
        out = np.full(N, np.nan, dtype)
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_barrier_count=1, lsa_multimem=True)
            ld_reduce_float_sums[1, N](dc, win, out)
            comm.synchronize()
        return out

    for out in sim.spawn(main, nranks=3, multimem=True):
        np.testing.assert_allclose(out, np.sum(data, axis=0), rtol=1e-6)


@flowdsl.kernel
def all_reduce_vec(comm, win, out, op):
    """Each thread owns 16 bytes: ld_reduce them, store the result to every member (an all-reduce)."""
    bar = lsa.barrier(comm, flowdsl.coop.cta(), 0)
    bar.sync(MemoryOrder.ACQ_REL)
    mm = lsa.multimem_view(comm, win)
    lanes = 16 // mem.itemsize(out)
    i = (cuda.threadIdx.x + comm.lsa_rank * cuda.blockDim.x) * lanes
    if i < out.shape[0]:
        mem.multimem_store_vec(mm, i, mem.multimem_ld_reduce_vec(mm, i, op))
    bar.sync(MemoryOrder.ACQ_REL)
    j = cuda.threadIdx.x
    while j < out.shape[0]:
        out[j] = lsa.local_view(win)[j]
        j += cuda.blockDim.x


@pytest.mark.parametrize("kind", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op", [RedOp.SUM, RedOp.MIN, RedOp.MAX])
def test_vector_ld_reduce_then_store_is_an_all_reduce(kind, op):
    if kind == "float32" and op != RedOp.SUM:
        pytest.skip("float32 has SUM only (refusal tested below)")
    nranks, threads = 4, 4
    dtype = np.uint16 if kind == "bfloat16" else np.dtype(kind)
    lanes = 16 // np.dtype(dtype).itemsize
    n = nranks * threads * lanes
    rng = np.random.default_rng(int(op) + 10)
    floats = [rng.standard_normal(n).astype(np.float32) for _ in range(nranks)]
    data = [_bf16_bits(f) if kind == "bfloat16" else f.astype(dtype) for f in floats]

    def main(comm):
        buf = comm.alloc(n, dtype)
        buf.set(data[comm.rank])
        out = np.zeros(n, dtype)
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_barrier_count=1, lsa_multimem=True)
            all_reduce_vec[1, threads](dc, win, out, op)
            comm.synchronize()
        return out

    # The reference: each member's value exactly as float32, combined in float32, rounded once.
    wide = np.stack([_bf16_float(d) if kind == "bfloat16" else d.astype(np.float32) for d in data])
    combined = {RedOp.SUM: wide.sum(axis=0), RedOp.MIN: wide.min(axis=0), RedOp.MAX: wide.max(axis=0)}[op]
    for out in sim.spawn(main, nranks=nranks, multimem=True):
        if kind == "bfloat16":
            got, want = _bf16_float(out), _bf16_float(_bf16_bits(combined))
        else:
            got, want = out.astype(np.float32), combined.astype(dtype).astype(np.float32)
        tol = 0 if op != RedOp.SUM else (1e-6 if kind == "float32" else 0)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@flowdsl.kernel
def reds(comm, win, values):
    mm = lsa.multimem_view(comm, win)
    i = cuda.threadIdx.x
    if i < values.shape[0]:
        mem.multimem_red(mm, i, values[i], RedOp.SUM)


def test_red_adds_into_every_members_copy():
    rng = np.random.default_rng(5)
    adds = [rng.integers(-1000, 1000, N).astype(np.int64) for _ in range(3)]
    start = rng.integers(-1000, 1000, N).astype(np.int64)

    def main(comm):
        buf = comm.alloc(N, np.int64)
        buf.set(start)
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_multimem=True)
            comm.barrier()
            reds[1, N](dc, win, adds[comm.rank])
            comm.synchronize()
            comm.barrier()
            return buf.get()

    for out in sim.spawn(main, nranks=3, multimem=True):
        np.testing.assert_array_equal(out, start + np.sum(adds, axis=0))


@flowdsl.kernel
def store_without_barrier(comm, win, value):
    mm = lsa.multimem_view(comm, win)
    if cuda.threadIdx.x == 0:
        mem.multimem_store(mm, 0, value)


def test_races_of_multimem_stores_are_reported():
    """Two ranks' multimem stores reach each other's copy with nothing ordering them: a data race on the
    GPU, reported by the simulator naming both."""
    def main(comm):
        buf = comm.alloc(4, np.int32)
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_multimem=True)
            store_without_barrier[1, 1](dc, win, comm.rank + 1)
            comm.synchronize()

    with pytest.raises(sim.DataRaceError):
        sim.spawn(main, nranks=2, multimem=True)


@flowdsl.kernel
def publish_and_poll(comm, win, relaxed, out):
    """LSA rank 0 stores 16 bytes into every member's copy through the multicast address; every rank polls the
    last word of its own copy (relaxed, system scope) until it is no longer 0, then reads the 16 bytes."""
    mine = lsa.local_view(win)
    if comm.lsa_rank == 0:
        mm = lsa.multimem_view(comm, win)
        v = (np.uint32(11), np.uint32(22), np.uint32(33), np.uint32(44))
        if relaxed:
            mem.multimem_store_vec_relaxed(mm, 0, v, ThreadScope.SYSTEM)
        else:
            mem.multimem_store_vec(mm, 0, v)
    while mem.load_relaxed(mine, 3, ThreadScope.SYSTEM) == 0:
        pass
    for k in range(3):
        out[k] = mem.load_relaxed(mine, k, ThreadScope.SYSTEM)


def _publish(relaxed, nranks=3, seed=0):
    def main(comm):
        buf = comm.alloc(4, np.uint32)
        buf.set(np.zeros(4, np.uint32))
        out = comm.alloc(3, np.uint32)
        with comm.register(buf) as win, comm.device_communicator(lsa_multimem=True) as dc:
            publish_and_poll[1, 1](dc, win, relaxed, out)
            comm.synchronize()
            return out.get()
    return sim.spawn(main, nranks=nranks, multimem=True, seed=seed, races=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_relaxed_16_byte_multimem_store_lands_whole_for_a_poller(seed):
    """multimem.st.relaxed.sys.v4: every member's copy gets the 16 bytes at one instant, so a poll of the last
    word that sees it sees the other three too; relaxed on both sides, no data race."""
    for got in _publish(True, seed=seed):
        np.testing.assert_array_equal(got, [11, 22, 33])


def test_a_weak_multimem_store_that_a_peer_polls_is_a_data_race():
    """multimem.st (weak) polled by a relaxed load: a data race under PTX's memory model, named as one."""
    with pytest.raises(sim.DataRaceError, match=r"(?s)atomic read.*publish_and_poll.*write"):
        _publish(False, nranks=2, seed=1)


def test_a_system_without_a_switch_refuses_multimem():
    def main(comm):
        comm.device_communicator(lsa_multimem=True)

    with pytest.raises(flowdsl.UsageError, match=r"lsa_multimem=True: this simulated system has no NVLink SHARP.*"
                                                   r"spawn\(\.\.\., multimem=True\)"):
        sim.spawn(main, nranks=2)


@flowdsl.kernel
def view_only(comm, win, out):
    mm = lsa.multimem_view(comm, win)
    out[0] = mem.multimem_ld_reduce(mm, 0, RedOp.SUM)


def test_a_communicator_without_multimem_is_refused_at_the_view():
    def main(comm):
        buf = comm.alloc(4, np.int32)
        with comm.register(buf) as win:
            dc = comm.device_communicator()
            view_only[1, 1](dc, win, np.zeros(1, np.int32))
            comm.synchronize()

    with pytest.raises(sim.UsageError, match=r"the device communicator has no multimem\. Make it with "
                                             r"comm\.device_communicator\(lsa_multimem=True\)"):
        sim.spawn(main, nranks=2, multimem=True)


@flowdsl.kernel
def max_of_floats(comm, win, out):
    mm = lsa.multimem_view(comm, win)
    out[0] = mem.multimem_ld_reduce(mm, 0, RedOp.MAX)


@flowdsl.kernel
def half_one_at_a_time(comm, win, out):
    mm = lsa.multimem_view(comm, win)
    out[0] = mem.multimem_ld_reduce(mm, 0, RedOp.SUM)


@flowdsl.kernel
def indexed(comm, win, out):
    mm = lsa.multimem_view(comm, win)
    out[0] = mm[0]


@pytest.mark.parametrize("kernel, dtype, message", [
    (max_of_floats, np.float32, "flowdsl.mem.multimem_ld_reduce cannot reduce float32 elements with MAX: PTX's "
                                "multimem.ld_reduce has SUM for them"),
    (half_one_at_a_time, np.float16, "flowdsl.mem.multimem_ld_reduce cannot reduce float16 elements this way: PTX's "
                                     "multimem.ld_reduce takes them 16 bytes at a time: use "
                                     "flowdsl.mem.multimem_ld_reduce_vec"),
    (indexed, np.int32, "Cannot index a multimem view"),
])
def test_what_ptx_lacks_is_refused_in_the_gpus_words(kernel, dtype, message):
    def main(comm):
        buf = comm.alloc(8, dtype)
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_multimem=True)
            kernel[1, 1](dc, win, np.zeros(1, dtype))
            comm.synchronize()

    with pytest.raises(flowdsl.KernelTypingError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        sim.spawn(main, nranks=2, multimem=True)


def test_a_kernel_that_makes_multimem_views_asks_for_multimem():
    assert view_only.requirements(1) == {"lsa_multimem": True}
