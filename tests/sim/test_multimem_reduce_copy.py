"""lsa.multimem_reduce_sum, multimem_copy and multimem_reduce_sum_copy (NCCL's ncclMultimem* helpers) on the
simulator: NumPy references on random inputs, outputs poisoned first, several ranks and coops, aligned and
unaligned starts; what has no multimem form is refused in the GPU's words."""

import numpy as np
import pytest
from numba import cuda

import flowdsl
import flowdsl.sim as sim
from flowdsl import MemoryOrder, coop, lsa

pytestmark = pytest.mark.sim

#: dtype name -> the NumPy dtype of the window (bfloat16 travels as uint16 bits).
DTYPES = {"int32": np.int32, "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64, "float32": np.float32,
          "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16}
POISON = {np.dtype(np.float16): np.float16(np.nan), np.dtype(np.uint16): np.uint16(0x7FC1),
          np.dtype(np.float32): np.float32(np.nan), np.dtype(np.float64): np.nan}


def _bf16_float(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def _bf16_bits(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _inputs(kind, nranks, n, seed):
    rng = np.random.default_rng(seed)
    dtype = DTYPES[kind]
    if kind == "bfloat16":
        return [_bf16_bits(rng.standard_normal(n)) for _ in range(nranks)]
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(n).astype(dtype) for _ in range(nranks)]
    return [rng.integers(-1000 if np.dtype(dtype).kind == "i" else 0, 1000, n).astype(dtype) for _ in range(nranks)]


def _sum(kind, data):
    """The switch's sum: integers wrap, float32/float64 add in their type, 16-bit floats in float32 rounded once."""
    if kind == "bfloat16":
        return _bf16_bits(np.sum([_bf16_float(d) for d in data], axis=0, dtype=np.float32))
    if kind == "float16":
        return np.sum([d.astype(np.float32) for d in data], axis=0, dtype=np.float32).astype(np.float16)
    with np.errstate(over="ignore"):
        return np.sum(data, axis=0, dtype=DTYPES[kind])


def _poison(dtype):
    return POISON.get(np.dtype(dtype), np.dtype(dtype).type(0x5A))


def _coop_of(name):
    return {"cta": coop.cta, "warp": coop.warp, "thread": coop.thread}[name]


@flowdsl.kernel
def reduce_sum_kernel(comm, win, dst, start, count):
    cta = coop.cta()
    bar = lsa.barrier(comm, cta, 0)
    bar.sync(MemoryOrder.ACQ_REL)  # every member's input is in place
    lsa.multimem_reduce_sum(cta, lsa.multimem_view(comm, win, start, count), dst, count)
    bar.sync(MemoryOrder.ACQ_REL)  # no member writes its input while another still reads it


@flowdsl.kernel
def reduce_sum_by_warps(comm, win, dst, start, count):
    bar = lsa.barrier(comm, coop.cta(), 0)
    bar.sync(MemoryOrder.ACQ_REL)
    warp = cuda.threadIdx.x // 32
    nwarps = cuda.blockDim.x // 32
    part = (count + nwarps - 1) // nwarps  # each warp its own part
    first = warp * part
    n = min(part, count - first)
    if n > 0:
        lsa.multimem_reduce_sum(coop.warp(), lsa.multimem_view(comm, win, start + first, n), dst[first:], n)
    bar.sync(MemoryOrder.ACQ_REL)


def _run_reduce_sum(kind, nranks, start, count, kernel=reduce_sum_kernel, threads=64, seed=0):
    dtype = DTYPES[kind]
    data = _inputs(kind, nranks, start + count + 3, seed)

    def main(comm):
        buf = comm.alloc(start + count + 3, dtype)
        buf.set(data[comm.rank])
        dst = np.full(count + 1, _poison(dtype), dtype)  # one past the end: untouched
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_barrier_count=1, lsa_multimem=True)
            kernel[1, threads](dc, win, dst, start, count)
            comm.synchronize()
        return dst

    want = _sum(kind, [d[start:start + count] for d in data])
    for dst in sim.spawn(main, nranks=nranks, multimem=True, seed=seed):
        np.testing.assert_array_equal(dst[:count].view(np.uint8), want.view(np.uint8))
        np.testing.assert_array_equal(dst[count:].view(np.uint8), np.full(1, _poison(dtype), dtype).view(np.uint8))


@pytest.mark.parametrize("kind", list(DTYPES))
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_reduce_sum_of_every_type_with_a_form(kind, nranks):
    """Aligned start and whole vectors: 16-byte loads where the type has them, one element at a time otherwise."""
    _run_reduce_sum(kind, nranks, start=0, count=64, seed=nranks)


@pytest.mark.parametrize("kind", ["float32", "int64", "float64"])
@pytest.mark.parametrize("start, count", [(1, 37), (4, 41), (0, 3)])
def test_reduce_sum_of_unaligned_and_partial_ranges(kind, start, count):
    """A start off a 16-byte boundary goes element by element; an aligned one leaves a tail of single elements."""
    _run_reduce_sum(kind, 3, start=start, count=count, seed=start + count)


@pytest.mark.parametrize("kind", ["float32", "bfloat16"])
def test_reduce_sum_shared_by_warps_each_with_its_own_part(kind):
    _run_reduce_sum(kind, 2, start=8, count=256, kernel=reduce_sum_by_warps, threads=128, seed=7)


@pytest.mark.parametrize("kind, start, count, message", [
    ("float16", 1, 16, "a start is 2 bytes past a 16-byte boundary"),
    ("bfloat16", 0, 12, "Cannot move 12 elements through a multimem view 16 bytes at a time: their type has no "
                        "one-element multimem form, and a start is 0 bytes past a 16-byte boundary or the count is "
                        "not a multiple of 8"),
])
def test_16_bit_floats_need_whole_aligned_vectors(kind, start, count, message):
    with pytest.raises(sim.UsageError, match=message.replace(".", r"\.")):
        _run_reduce_sum(kind, 2, start=start, count=count)


@flowdsl.kernel
def copy_kernel(comm, src, win, start, count, which):
    bar = lsa.barrier(comm, coop.cta(), 0)
    if comm.lsa_rank == which:  # one member's src reaches every member
        if cuda.threadIdx.x < 32:
            lsa.multimem_copy(coop.warp(), src, lsa.multimem_view(comm, win, start, count), count)
    bar.sync(MemoryOrder.ACQ_REL)


@flowdsl.kernel
def copy_by_threads(comm, src, win, start, count, which):
    """Each thread copies its own 16-element slice by itself (coop.thread)."""
    bar = lsa.barrier(comm, coop.cta(), 0)
    if comm.lsa_rank == which:
        first = cuda.threadIdx.x * 16
        if first < count:
            n = min(16, count - first)
            lsa.multimem_copy(coop.thread(), src[first:], lsa.multimem_view(comm, win, start + first, n), n)
    bar.sync(MemoryOrder.ACQ_REL)


@pytest.mark.parametrize("kernel", [copy_kernel, copy_by_threads])
@pytest.mark.parametrize("kind, start, count", [
    ("float32", 0, 64), ("float32", 3, 29), ("int64", 2, 33), ("uint32", 0, 7), ("float16", 8, 64),
    ("bfloat16", 0, 128), ("float64", 1, 20)])
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_copy_reaches_every_member(kernel, kind, start, count, nranks):
    dtype = DTYPES[kind]
    src = _inputs(kind, 1, count, seed=count)[0]
    size = start + count + 5
    which = nranks - 1

    def main(comm):
        buf = comm.alloc(size, dtype)
        buf.set(np.full(size, _poison(dtype), dtype))
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_barrier_count=1, lsa_multimem=True)
            kernel[1, 64](dc, src, win, start, count, which)
            comm.synchronize()
            comm.barrier()
            return buf.get()

    want = np.full(size, _poison(dtype), dtype)
    want[start:start + count] = src
    for out in sim.spawn(main, nranks=nranks, multimem=True):
        np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


@flowdsl.kernel
def all_reduce_kernel(comm, win, out_win, count):
    """Every member sums its own part of the range and stores the sum to every member: an all-reduce."""
    cta = coop.cta()
    bar = lsa.barrier(comm, cta, 0)
    bar.sync(MemoryOrder.ACQ_REL)
    part = (count + comm.lsa_size - 1) // comm.lsa_size
    part = (part + 7) // 8 * 8  # whole 16-byte vectors of 16-bit floats, and aligned starts
    first = comm.lsa_rank * part
    n = min(part, count - first)
    if n > 0:
        lsa.multimem_reduce_sum_copy(cta, lsa.multimem_view(comm, win, first, n),
                                     lsa.multimem_view(comm, out_win, first, n), n)
    bar.sync(MemoryOrder.ACQ_REL)


@pytest.mark.parametrize("kind", list(DTYPES))
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_reduce_sum_copy_is_an_all_reduce(kind, nranks):
    dtype = DTYPES[kind]
    count = 96
    data = _inputs(kind, nranks, count, seed=nranks + 11)

    def main(comm):
        buf = comm.alloc(count, dtype)
        buf.set(data[comm.rank])
        out = comm.alloc(count + 1, dtype)
        out.set(np.full(count + 1, _poison(dtype), dtype))
        with comm.register(buf) as win, comm.register(out) as out_win:
            dc = comm.device_communicator(lsa_barrier_count=1, lsa_multimem=True)
            all_reduce_kernel[1, 32](dc, win, out_win, count)
            comm.synchronize()
            return out.get()

    want = _sum(kind, data)
    for out in sim.spawn(main, nranks=nranks, multimem=True):
        np.testing.assert_array_equal(out[:count].view(np.uint8), want.view(np.uint8))
        assert out[count:].view(np.uint8).tobytes() == np.full(1, _poison(dtype), dtype).view(np.uint8).tobytes()


@flowdsl.kernel
def reduce_int8(comm, win, dst):
    lsa.multimem_reduce_sum(coop.cta(), lsa.multimem_view(comm, win), dst, 16)


@flowdsl.kernel
def copy_mixed(comm, src, win):
    lsa.multimem_copy(coop.cta(), src, lsa.multimem_view(comm, win), 4)


@pytest.mark.parametrize("kernel, win_dtype, arg, message", [
    (reduce_int8, np.int8, np.zeros(16, np.int8),
     "Cannot run flowdsl.lsa.multimem_reduce_sum on int8 elements, which no multimem form takes: "
     "flowdsl.mem.multimem_ld_reduce cannot reduce int8 elements: PTX's multimem.ld_reduce reduces"),
    (copy_mixed, np.float32, np.zeros(4, np.float64),
     "Cannot run flowdsl.lsa.multimem_copy from float64 to float32 elements: it moves one element type"),
])
def test_what_has_no_multimem_form_is_refused(kernel, win_dtype, arg, message):
    def main(comm):
        buf = comm.alloc(16, win_dtype)
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_multimem=True)
            kernel[1, 1](dc, arg, win) if kernel is copy_mixed else kernel[1, 1](dc, win, arg)
            comm.synchronize()

    with pytest.raises(flowdsl.KernelTypingError, match=message.replace("(", r"\(").replace(".", r"\.")):
        sim.spawn(main, nranks=2, multimem=True)


def test_without_a_switch_the_helpers_view_is_refused():
    def main(comm):
        buf = comm.alloc(16, np.float32)
        with comm.register(buf) as win:
            dc = comm.device_communicator(lsa_barrier_count=1)
            reduce_sum_kernel[1, 32](dc, win, np.zeros(16, np.float32), 0, 16)
            comm.synchronize()

    with pytest.raises(sim.UsageError, match=r"the device communicator has no multimem"):
        sim.spawn(main, nranks=2, multimem=True)
