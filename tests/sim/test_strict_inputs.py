"""What the GPU runtime refuses, the simulator refuses, with the same message.

Each bad input runs against both host sides: the simulator (``flowdsl.sim.spawn``) and the
GPU runtime (``flowdsl.init()``, one rank; skipped without a GPU). Both call the one set of
checks in :mod:`flowdsl.host.checks` (and the collectives' own), so one expected message
serves both.
"""

import importlib.util
import re

import numpy as np
import pytest

import flowdsl
import flowdsl.sim as sim
from flowdsl import collectives as coll
from flowdsl.examples.allgather_lsa import allgather_lsa

pytestmark = pytest.mark.sim

HAS_TORCH = importlib.util.find_spec("torch") is not None


class _Simulator:
    """``run(fn)``: ``fn(comm)`` on one simulated rank; its exception propagates."""

    def run(self, fn):
        return sim.spawn(fn, nranks=1)[0]


class _Gpu:
    """``run(fn)``: ``fn(comm)`` on a one-rank GPU communicator."""

    def run(self, fn):
        with flowdsl.init() as comm:
            return fn(comm)


@pytest.fixture(params=["simulator", pytest.param("gpu", marks=pytest.mark.gpu)])
def host(request):
    return _Simulator() if request.param == "simulator" else _Gpu()


def _x(comm, shape=64):
    x = comm.alloc(shape, np.float32)
    x.set(np.arange(np.prod(shape), dtype=np.float32).reshape(shape))
    return x


# ---- register --------------------------------------------------------------------------------------

@pytest.mark.parametrize("make,error", [
    (lambda comm: np.zeros(8, np.float32),
     "Cannot register ndarray: it is a NumPy array in host memory, and symmetric windows need memory from "
     "comm.alloc"),
    (lambda comm: [1.0, 2.0], "Cannot register list: pass a buffer from comm.alloc(shape, dtype)."),
    (lambda comm: comm.alloc(8, np.float32) + 1,
     "Cannot register this buffer: symmetric windows need memory from comm.alloc (ncclMemAlloc) of this "
     "communicator"),
    (lambda comm: comm.alloc(0, np.float32),
     "Cannot register an empty buffer (shape (0,), 0 bytes): a window covers at least one element"),
    (lambda comm: comm.alloc((4, 4), np.float32).T,
     "Cannot register a non-contiguous array: windows cover contiguous memory"),
], ids=["numpy", "list", "not-from-alloc", "zero-size", "transposed"])
def test_register_refuses(host, make, error):
    with pytest.raises(flowdsl.UsageError) as ei:
        host.run(lambda comm: comm.register(make(comm)))
    assert str(ei.value).startswith(error)


def test_register_of_a_reshaped_allocation_is_accepted(host):
    def main(comm):
        buf = comm.alloc(64, np.float32)
        with comm.register(buf.reshape(8, 8)) as win:
            return win.nbytes
    assert host.run(main) == 256


# ---- buf.set: CuPy's rules (it copies bytes, never converts) --------------------------------------

@pytest.mark.parametrize("value,error,match", [
    (np.zeros(4, np.float64), TypeError, "float64 array cannot be set to float32 array"),
    (np.zeros(4, np.int32), TypeError, "int32 array cannot be set to float32 array"),
    (np.zeros((2, 2), np.float32), ValueError, r"Shape mismatch. Old shape: \(4,\), new shape: \(2, 2\)"),
    (np.zeros(5, np.float32), ValueError, r"Shape mismatch. Old shape: \(4,\), new shape: \(5,\)"),
    ([0.0, 1.0, 2.0, 3.0], TypeError, "Only numpy.ndarray can be set to cupy.ndarray"),
], ids=["float64", "int32", "2x2", "5", "list"])
def test_set_refuses_another_dtype_or_shape(host, value, error, match):
    def main(comm):
        buf = comm.alloc(4, np.float32)
        buf.set(np.full(4, 7, np.float32))
        try:
            buf.set(value)
        finally:
            np.testing.assert_array_equal(buf.get(), np.full(4, 7, np.float32))  # left as it was
    with pytest.raises(error, match=match):
        host.run(main)


# ---- alloc ----------------------------------------------------------------------------------------

SUPPORTED = ("float16, float32, float64, int8, uint8, int16, uint16, int32, uint32, int64, uint64")


@pytest.mark.parametrize("dtype,error", [
    (np.float128, f"Cannot allocate symmetric memory of dtype float128: supported dtypes are {SUPPORTED}."),
    (None, f"Cannot allocate symmetric memory of dtype None: name an element type. Supported dtypes are "
           f"{SUPPORTED}."),
    (object, f"Cannot allocate symmetric memory of dtype object: supported dtypes are {SUPPORTED}."),
    ("nope", f"Cannot allocate symmetric memory of dtype 'nope': it is not a dtype. Supported dtypes are "
             f"{SUPPORTED}."),
    (np.complex64, "Cannot allocate symmetric memory of dtype complex64: supported dtypes are"),
], ids=["float128", "None", "object", "nope", "complex64"])
def test_alloc_refuses_dtype(host, dtype, error):
    with pytest.raises(flowdsl.UsageError) as ei:
        host.run(lambda comm: comm.alloc(4, dtype))
    assert str(ei.value).startswith(error)


@pytest.mark.parametrize("shape", [-1, 2.5, (4, -2), "4"])
def test_alloc_refuses_shape(host, shape):
    with pytest.raises(flowdsl.UsageError, match=r"Cannot allocate symmetric memory of shape .*: give an int or a "
                                                 r"tuple of non-negative ints"):
        host.run(lambda comm: comm.alloc(shape, np.float32))


def test_alloc_refuses_like(host):
    with pytest.raises(flowdsl.UsageError, match="Cannot allocate: like must be 'cupy' or 'torch', got 'numpy'"):
        host.run(lambda comm: comm.alloc(4, np.float32, like="numpy"))


@pytest.mark.skipif(HAS_TORCH, reason="PyTorch is installed: test_alloc_like_torch covers like='torch'")
def test_alloc_like_torch_without_torch_says_how_to_install_it(host):
    with pytest.raises(flowdsl.UsageError, match=r"Cannot allocate symmetric memory with like='torch': PyTorch is "
                                                 r"not installed. Install it \(pip install torch\)"):
        host.run(lambda comm: comm.alloc(4, np.float32, like="torch"))


@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch (pip install torch), which is not installed")
def test_alloc_like_torch(host):
    """A tensor over symmetric memory: registered, all-reduced in place, read back."""
    import torch

    values = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)

    def main(comm):
        t = comm.alloc((3, 8), np.float32, like="torch")
        assert isinstance(t, torch.Tensor) and tuple(t.shape) == (3, 8) and t.dtype == torch.float32
        t.copy_(torch.from_numpy(values))
        with comm.register(t) as win:
            assert win.nbytes == values.nbytes
        coll.all_reduce(comm, t)
        comm.synchronize()
        return t.cpu().numpy().copy()
    np.testing.assert_array_equal(host.run(main), values)  # one rank: the sum is the input


# ---- collectives ----------------------------------------------------------------------------------

def _transposed_dst(comm):
    coll.all_reduce(comm, _x(comm, (8, 8)), comm.alloc((8, 8), np.float32).T)


def _transposed_in_place(comm):
    coll.all_reduce(comm, _x(comm, (8, 8)).T)


@pytest.mark.parametrize("call,error", [
    (_transposed_dst, "Cannot all_reduce: dst is not contiguous (shape (8, 8), strides (4, 32) bytes). Pass a "
                      "contiguous array"),
    (_transposed_in_place, "Cannot all_reduce: src is not contiguous (shape (8, 8), strides (4, 32) bytes)"),
    (lambda comm: coll.broadcast(comm, _x(comm), root=1.5),
     "Cannot broadcast: root must be an int rank (0..0), got 1.5 (float)"),
    (lambda comm: coll.broadcast(comm, _x(comm), root="1"),
     "Cannot broadcast: root must be an int rank (0..0), got '1' (str)"),
    (lambda comm: coll.reduce(comm, _x(comm), root=None),
     "Cannot reduce: root must be an int rank (0..0), got None (NoneType)"),
    (lambda comm: coll.reduce(comm, _x(comm), root=1),
     "Cannot reduce: root 1 is not a rank of this communicator (0..0)"),
    (lambda comm: coll.all_reduce(comm, _x(comm), op=None),
     "Cannot all_reduce: unknown op None. Use one of sum, prod, min, max, avg"),
    (lambda comm: coll.reduce_scatter(comm, _x(comm), comm.alloc(64, np.float32), op=None),
     "Cannot reduce_scatter: unknown op None. Use one of sum, prod, min, max, avg"),
], ids=["transposed-dst", "transposed-in-place", "root-float", "root-str", "root-None", "root-range", "op-None",
        "op-None-reduce-scatter"])
def test_collective_refuses(host, call, error):
    with pytest.raises(flowdsl.UsageError) as ei:
        host.run(call)
    assert str(ei.value).startswith(error)


# ---- a closed communicator ------------------------------------------------------------------------

def _closed(then):
    def main(comm):
        src, out = comm.alloc(256, np.float32), comm.alloc(256, np.float32)
        win, dc = comm.register(out), comm.device_communicator(lsa_barrier_count=1)
        comm.close()
        then(comm, src, win, dc)
    return main


@pytest.mark.parametrize("then,error", [
    (lambda comm, src, win, dc: comm.alloc(4, np.float32),
     "Cannot allocate symmetric memory: the communicator was closed"),
    (lambda comm, src, win, dc: comm.register(src), "Cannot register a window: the communicator was closed"),
    (lambda comm, src, win, dc: comm.device_communicator(),
     "Cannot create a device communicator: the communicator was closed"),
    (lambda comm, src, win, dc: allgather_lsa[1, 256](dc, src, win, 256),
     "Cannot launch allgather_lsa (argument 0): this device communicator was closed. Create a new one."),
    (lambda comm, src, win, dc: coll.all_reduce(comm, src),
     "Cannot run a collective: the communicator is closed, and with it its device communicator"),
], ids=["alloc", "register", "device_communicator", "launch", "collective"])
def test_closed_communicator_refuses(host, then, error):
    with pytest.raises(flowdsl.FlowDSLError) as ei:
        host.run(_closed(then))
    assert str(ei.value).startswith(error)
    assert isinstance(ei.value, flowdsl.UsageError if "collective" in error else flowdsl.ResourceClosedError)


def test_closed_window_refuses_a_launch(host):
    def main(comm):
        src, out = comm.alloc(256, np.float32), comm.alloc(256, np.float32)
        win = comm.register(out)
        win.close()
        with comm.device_communicator(lsa_barrier_count=1) as dc:
            allgather_lsa[1, 256](dc, src, win, 256)
    with pytest.raises(flowdsl.ResourceClosedError) as ei:
        host.run(main)
    assert str(ei.value).startswith("Cannot launch allgather_lsa (argument 2): this window was closed.")


# ---- launch shapes: CUDA's limits -----------------------------------------------------------------

@pytest.mark.parametrize("grid,block,error", [
    ((1, 65536), 256, "the grid's y extent 65536 is beyond CUDA's limit of 65535 (a grid is at most "
                      "2147483647 x 65535 x 65535)"),
    ((1, 1, 70000), 256, "the grid's z extent 70000 is beyond CUDA's limit of 65535"),
    (2**31, 256, "the grid's x extent 2147483648 is beyond CUDA's limit of 2147483647"),
    (1, (32, 1, 65), "the block's z extent 65 is beyond CUDA's limit of 64"),
    (1, 1025, "the block's x extent 1025 is beyond CUDA's limit of 1024"),
    (1, (32, 32, 2), "the block (32, 32, 2) has 2048 threads, more than CUDA's 1024 per block"),
    (0, 256, "the grid must be a positive int or a tuple of up to 3 positive ints, got 0"),
    (1, 2.5, "blockdim must be a sequence of integers, got [2.5]. Give the block as a positive int or a tuple"),
    ((1, 2, 3, 4), 1, "griddim must be a sequence of 1, 2 or 3 integers, got [1, 2, 3, 4]. Give the grid as"),
], ids=["grid-y", "grid-z", "grid-x", "block-z", "block-x", "block-threads", "grid-0", "block-float", "grid-4d"])
def test_launch_shape_beyond_cuda_limits_is_refused(host, grid, block, error):
    def main(comm):
        out = comm.alloc(256, np.float32)
        with comm.register(out) as win, comm.device_communicator(lsa_barrier_count=1) as dc:
            allgather_lsa[grid, block](dc, comm.alloc(256, np.float32), win, 256)
    with pytest.raises(flowdsl.UsageError) as ei:
        host.run(main)
    assert str(ei.value).startswith(f"Cannot launch allgather_lsa: {error}")


def test_the_limits_themselves_are_accepted():
    import flowdsl.host.checks as checks

    assert checks.launch_shape((2**31 - 1, 65535, 65535), (32, 32), "k") == ((2**31 - 1, 65535, 65535),
                                                                            (32, 32, 1))
    assert checks.launch_shape(1, (1, 16, 64), "k") == ((1, 1, 1), (1, 16, 64))


# ---- rank counts ----------------------------------------------------------------------------------

@pytest.mark.parametrize("nranks,shown", [(0, "0"), (2.5, "2.5 (float)"), ("2", "'2' (str)"), (-1, "-1")])
def test_spawn_refuses_rank_counts(nranks, shown):
    with pytest.raises(flowdsl.UsageError, match=rf"nranks must be an int >= 1, got {re.escape(shown)}"):
        sim.spawn(lambda comm: None, nranks=nranks)


@pytest.mark.gpu
@pytest.mark.parametrize("nranks,shown", [(0, "0"), (2.5, "2.5 (float)"), ("2", "'2' (str)")])
def test_init_refuses_rank_counts(nranks, shown):
    with pytest.raises(flowdsl.UsageError, match=rf"Cannot initialise a communicator: nranks must be an int >= 1, "
                                                 rf"got {re.escape(shown)}"):
        flowdsl.init(nranks=nranks, rank=0)


def test_spawn_refuses_node_counts():
    with pytest.raises(flowdsl.UsageError, match=r"nodes must be an int >= 1, got 1.5 \(float\)"):
        sim.spawn(lambda comm: None, nranks=2, nodes=1.5)
    with pytest.raises(flowdsl.UsageError, match="Cannot spawn 3 ranks on 2 nodes: ranks must split evenly"):
        sim.spawn(lambda comm: None, nranks=3, nodes=2)
