"""The GENK collectives and Flow's protocols on a real GPU through real NCCL (one rank).

With one rank each collective reduces to a local copy inside its program, so the
multi-rank protocol paths are also run here by a rank sending to itself through a
real connection (examples/flow_loopback.py): two blocks, hundreds of slots,
credits and flags through GPU memory. Outputs are poisoned before every call.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _poison(buf):
    import cupy

    if buf.dtype.kind == "f":
        buf.fill(np.nan)
    else:
        buf.view(cupy.uint8).fill(0xA5)


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
def test_every_collective_dtype_op_matches_numpy(comm, inplace):
    """Every program x dtype x op at one rank, at counts 0, 1, 4099 and 2**20 + 3: the matrix of
    :mod:`flowdsl.collectives.check`, which the simulator and the several-GPU tests run too."""
    import cupy

    from flowdsl.collectives import check

    failures = []
    for case in check.cases(comm.nranks, counts=(0, 1, 4099, (1 << 20) + 3), inplace=(inplace,), protocols=(None,)):
        failure = check.run_case(comm, case).failure()
        if failure is not None:
            failures.append(failure)
        cupy.get_default_memory_pool().free_all_blocks()
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("protocol", ["SIMPLE", "LL", "LL128"])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("bfloat16", "max"), ("float16", "avg"),
                                      ("int64", "prod"), ("uint8", "min")])
def test_flow_protocols_through_a_real_connection(comm, protocol, dtype, op):
    from flowdsl import Protocol
    from flowdsl.collectives import check
    from flowdsl.examples import flow_loopback

    result, expected = flow_loopback.run(comm, Protocol[protocol], dtype, op, n=100_003, seed=7)
    check.compare(result, expected, dtype, 2, f"loopback {protocol} {dtype} {op}")


def test_torch_tensors_bfloat16_and_fp8(comm):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from flowdsl import collectives as coll

    x = comm.alloc(1000, np.float32, like="torch")
    x.copy_(torch.linspace(-1, 1, 1000, device=x.device))
    b = torch.empty(1000, dtype=torch.bfloat16, device=x.device)
    b.copy_(x)
    y = torch.full_like(b, float("nan"))
    coll.all_reduce(comm, b, y, op="max", algorithm="ring")
    torch.cuda.synchronize()
    assert torch.equal(y, b)
    out = torch.full((1000,), float("nan"), device=x.device)
    coll.broadcast(comm, x, out, algorithm="ring")
    torch.cuda.synchronize()
    assert torch.equal(out, x)
    f8 = x.to(torch.float8_e4m3fn)
    f8_out = torch.full((1000,), float("nan"), device=x.device).to(torch.float8_e4m3fn)
    coll.all_reduce(comm, f8, f8_out, op="avg", algorithm="tree")
    torch.cuda.synchronize()
    assert torch.equal(f8_out.view(torch.uint8), f8.view(torch.uint8))


def test_torch_tensors_of_every_new_dtype_and_premul_sum(comm):
    """torch.int8, torch.uint32 and torch.uint64 tensors (their own dtype, no dtype=), every op with
    premul_sum's scalars host, device (a torch tensor) and mixed: the matrix's cases, like="torch"."""
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from flowdsl.collectives import check

    failures = [f for case in check.cases(comm.nranks, counts=(1, 4099), dtypes=("int8", "uint32", "uint64",
                                                                                  "bfloat16", "float8_e4m3fn"),
                                          protocols=(None,), like="torch")
                if (f := check.run_case(comm, case).failure()) is not None]
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


def test_nccl_algorithm_and_repeated_calls_agree(comm):
    """``algorithm="nccl"`` is NCCL's host collective; flowdsl's repeated (planned) calls match it."""
    import cupy

    from flowdsl import collectives as coll

    x = comm.alloc(1 << 16, np.float32)
    x.set(np.random.default_rng(3).standard_normal(1 << 16).astype(np.float32))
    a = comm.alloc(1 << 16, np.float32)
    b = comm.alloc(1 << 16, np.float32)
    for _ in range(3):  # the second and third calls take the planned fast path
        _poison(a)
        coll.all_reduce(comm, x, a, op="sum", algorithm="ring")
    coll.all_reduce(comm, x, b, op="sum", algorithm="nccl")
    comm.synchronize()
    cupy.testing.assert_array_equal(a, b)


def test_a_loop_over_fresh_arrays_does_not_grow_gpu_memory(comm):
    """Cached plans hold their arrays weakly: a training-style loop over new tensors frees them."""
    import cupy

    from flowdsl import collectives as coll

    pool = cupy.get_default_memory_pool()
    rng = np.random.default_rng(4)

    def step(algorithm):
        x = cupy.asarray(rng.standard_normal(1 << 14).astype(np.float32))
        y = cupy.full_like(x, np.nan)
        coll.all_reduce(comm, x, y, algorithm=algorithm)
        cupy.testing.assert_array_equal(y, x)  # one rank: the sum is the input

    for algorithm in ("ring", "nccl"):
        for _ in range(4):  # plans, the pool's first blocks
            step(algorithm)
        comm.synchronize()
        used = pool.used_bytes()
        for _ in range(100):
            step(algorithm)
        comm.synchronize()
        assert pool.used_bytes() <= used, f"{algorithm}: {pool.used_bytes() - used} bytes more after 100 calls"


def test_bad_input_on_the_gpu(comm):
    import cupy

    import flowdsl
    from flowdsl import collectives as coll

    x = comm.alloc(64, np.float32)
    with pytest.raises(flowdsl.UsageError, match="is not contiguous"):
        coll.all_reduce(comm, x[::2])
    with pytest.raises(flowdsl.UsageError, match="is a NumPy array in host memory"):
        coll.all_reduce(comm, x, np.zeros(64, np.float32))
    with pytest.raises(flowdsl.UsageError, match="src is float32 but dst is int32"):
        coll.all_reduce(comm, x, cupy.zeros(64, cupy.int32))
    with pytest.raises(flowdsl.UsageError, match="unknown algorithm"):
        coll.reduce(comm, x, algorithm="butterfly")


def test_all_reduce_fused_with_bias_gelu(comm):
    from flowdsl.examples import allreduce_bias_gelu

    result, reference = allreduce_bias_gelu.run(comm, count=(1 << 20) + 7, channels=32, threads=256,
                                                nslots=4, slot_bytes=64 * 1024)
    np.testing.assert_allclose(result, reference, rtol=1e-5, atol=1e-5)
